// Unit tests of `starling sim`'s process group without processes
// (node/sim_processes.h): each node's command line, the stages in which the
// sim stops its nodes (time injected), and how a failed node is named.
#include "node/sim_processes.h"

#include <signal.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using Action = StopStages::Action;

NodeLaunch Launch() {
  NodeLaunch l;
  l.dir = "/runs/sim";
  l.ids = {"n0", "n1", "n2", "n5"};  // n5 joins
  l.initial = 3;
  l.addresses = {"127.0.0.1:1000", "127.0.0.1:1001", "127.0.0.1:1002",
                 "127.0.0.1:1003"};
  l.elastic = true;
  l.partition_file = "/runs/sim/partition";
  l.common = {"--steps=100", "--run_id=r"};
  return l;
}

TEST(SimProcessesTest, AStartingNodeWaitsForAllAndPeersWithTheOthers) {
  EXPECT_THAT(NodeArgs(Launch(), 1, /*restart=*/false, /*has_checkpoint=*/true),
              ElementsAre("starling", "node", "--listen=127.0.0.1:1001",
                          "--peers=127.0.0.1:1000,127.0.0.1:1002",
                          "--node_id=n1", "--min_members=3",
                          "--partition_file=/runs/sim/partition", "--shard=1/4",
                          "--out=/runs/sim/n1", "--steps=100", "--run_id=r"));
}

TEST(SimProcessesTest, ALateNodeJoinsWithoutQuorumAndResumesIfItCan) {
  std::vector<std::string> joiner = NodeArgs(Launch(), 3, false, false);
  EXPECT_THAT(joiner, Contains("--min_members=1"));
  EXPECT_THAT(joiner, Contains("--shard=3/4"));
  EXPECT_EQ(joiner.back(), "--resume=false");
  std::vector<std::string> restart = NodeArgs(Launch(), 0, true, true);
  EXPECT_THAT(restart, Contains("--min_members=1"));
  EXPECT_EQ(restart.back(), "--resume=true");
}

TEST(SimProcessesTest, PerNodeFlagsGoToTheirNodeOnly) {
  NodeLaunch l = Launch();
  l.elastic = false;
  l.slow = {{"n2", 4}};
  l.poison = {{"n2", "nan@2-4"}};
  l.drift = {{"n0", 400}};
  l.snapshot_every = 20;
  EXPECT_THAT(NodeArgs(l, 2, false, false),
              ElementsAre("starling", "node", "--listen=127.0.0.1:1002",
                          "--peers=127.0.0.1:1000,127.0.0.1:1001",
                          "--shard=2/4", "--out=/runs/sim/n2", "--slowdown=4",
                          "--test_poison=nan@2-4", "--drift=never",
                          "--steps=100", "--run_id=r", "--snapshot_every=20"));
  std::vector<std::string> n0 = NodeArgs(l, 0, false, false);
  EXPECT_THAT(n0, Contains("--drift=400"));
  EXPECT_THAT(n0, Not(Contains(HasSubstr("--slowdown"))));
  EXPECT_THAT(n0, Not(Contains(HasSubstr("--node_id"))));
}

// --metrics_port=P and --health_port=P of the sim: node K serves on P+K
// (joiners too), so that the nodes on one host do not collide; 0 stays 0
// (each node any free port) and -1 gives no flag.
TEST(SimProcessesTest, NodeKGetsMetricsAndHealthPortPlusK) {
  NodeLaunch l = Launch();
  l.metrics_port = 9100;
  l.health_port = 0;
  EXPECT_THAT(NodeArgs(l, 0, false, false), Contains("--metrics_port=9100"));
  EXPECT_THAT(NodeArgs(l, 2, false, false), Contains("--metrics_port=9102"));
  EXPECT_THAT(NodeArgs(l, 3, false, false), Contains("--metrics_port=9103"));
  EXPECT_THAT(NodeArgs(l, 2, false, false), Contains("--health_port=0"));
  l.health_port = -1;
  EXPECT_THAT(NodeArgs(l, 1, false, false),
              Not(Contains(HasSubstr("--health_port"))));
}

TEST(SimProcessesTest, ShapedLinksNameEachPeerByAddress) {
  NodeLaunch l = Launch();
  absl::StatusOr<SimLinks> links = ParseSimLinks("100,n1=10", "", l.ids);
  ASSERT_TRUE(links.ok()) << links.status();
  l.links = *links;
  std::vector<std::string> args = NodeArgs(l, 1, false, false);
  EXPECT_THAT(args, Contains(HasSubstr("--link_bandwidth_mbps=")));
  EXPECT_THAT(args, Contains(AllOf(HasSubstr("--link_bandwidth_mbps=100"),
                                   HasSubstr("127.0.0.1:1000"))));
}

TEST(SimProcessesTest, CtrlCStopsAfterTheRoundThenLeavesThenKills) {
  StopStages stages;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_THAT(stages.Step(t0, 0, 0, false), IsEmpty());
  EXPECT_THAT(stages.Step(t0, SIGINT, 1, false),
              ElementsAre(Action::kStopAfterRound));
  EXPECT_THAT(stages.Step(t0 + absl::Seconds(44), SIGINT, 1, false), IsEmpty());
  EXPECT_THAT(stages.Step(t0 + absl::Seconds(46), SIGINT, 1, false),
              ElementsAre(Action::kLeaveNow));
  EXPECT_THAT(stages.Step(t0 + absl::Seconds(60), SIGINT, 1, false), IsEmpty());
  EXPECT_THAT(stages.Step(t0 + absl::Seconds(76), SIGINT, 1, false),
              ElementsAre(Action::kKill));
}

TEST(SimProcessesTest, ASecondCtrlCLeavesAtOnce) {
  StopStages stages;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  stages.Step(t0, SIGINT, 1, false);
  EXPECT_THAT(stages.Step(t0 + absl::Seconds(2), SIGINT, 2, false),
              ElementsAre(Action::kLeaveNow));
  EXPECT_THAT(stages.Step(t0 + absl::Seconds(3), SIGINT, 2, false), IsEmpty());
}

TEST(SimProcessesTest, AfterAFailureTheOthersAreKilledTenSecondsOn) {
  StopStages stages;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_THAT(stages.Step(t0, 0, 0, true), IsEmpty());
  // A Ctrl-C now changes nothing: the nodes were told to stop already.
  EXPECT_THAT(stages.Step(t0 + absl::Seconds(5), SIGINT, 1, true), IsEmpty());
  EXPECT_THAT(stages.Step(t0 + absl::Seconds(11), SIGINT, 1, true),
              ElementsAre(Action::kKill));
}

TEST(SimProcessesTest, AFailedNodeIsNamedWithItsErrorOrItsSignal) {
  EXPECT_EQ(FailedNodeMessage("n2", 1,
                              "loading\nstarling node: error: peer gone\n"
                              "swarm: closing\n",
                              "/r/n2/node.log"),
            "starling sim: node n2 failed (exit 1): starling node: error: "
            "peer gone\n  its log: /r/n2/node.log");
  EXPECT_EQ(FailedNodeMessage("n1", 1, "a\nlast line\n", "/r/n1/node.log"),
            "starling sim: node n1 failed (exit 1): last line\n  its log: "
            "/r/n1/node.log");
  EXPECT_THAT(FailedNodeMessage("n0", 128 + SIGKILL, "x\n", "/l"),
              HasSubstr("node n0 was killed by signal 9 (Killed; kill -9 or "
                        "the kernel's out-of-memory killer"));
  EXPECT_THAT(FailedNodeMessage("n0", 128 + SIGSEGV, "", "/l"),
              HasSubstr("was killed by signal 11 (Segmentation fault); its "
                        "last log line: \n"));
}

TEST(SimProcessesTest, ALeaveTheSimAskedForIsNoFailure) {
  EXPECT_TRUE((NodeExit{0, 0, false}.ok()));
  EXPECT_TRUE((NodeExit{0, 1, true}.ok()));
  EXPECT_FALSE((NodeExit{0, 1, false}.ok()));
}

}  // namespace
}  // namespace starling
