#include "node/swarm_end_report.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

using ::testing::HasSubstr;

SwarmView Finished() {
  SwarmView v;
  v.standing = SwarmStanding::kSwarmFinished;
  v.here = {7, "0123old", 28};
  v.furthest = {10, "5796abcdef", 36};
  v.holders = {"n0", "n1", "n3"};
  return v;
}

TEST(SwarmEndReportTest, ReachabilityFieldsNameEachMembersVerdict) {
  std::vector<peer::v1::MemberEntry> table(3);
  table[0].set_id("n0");
  table[1].set_id("n1");
  table[1].set_reachability(peer::v1::REACHABILITY_REACHABLE);
  table[2].set_id("n2");
  table[2].set_reachability(peer::v1::REACHABILITY_UNREACHABLE);
  EXPECT_EQ(ReachabilityFields(table, "n2").Dump(),
            R"({"reachability":"unreachable","members_reachability":)"
            R"({"n0":"unknown","n1":"reachable","n2":"unreachable"}})");
}

TEST(SwarmEndReportTest, TheSwarmFinishedWithoutThisNode) {
  EXPECT_EQ(EndedApartMessage(Finished(), {"n2", 7, 70, absl::ZeroDuration()}),
            "starling node: n2 ended apart from the swarm: it reached round 7 "
            "(step 70), but the swarm went on to round 10 without it and has "
            "left; n0, n1, n3 hold the final model (5796abcd); this node's "
            "model is not the swarm's final one (exit 3; --train_alone "
            "trains on alone instead)");
  SwarmView one = Finished();
  one.holders = {"n0"};
  EXPECT_THAT(EndedApartMessage(one, {"n2", 7, 70, absl::ZeroDuration()}),
              HasSubstr("; n0 holds the final model (5796abcd)"));
}

TEST(SwarmEndReportTest, CutOffNamesThePauseAndWhoDidNotAnswer) {
  SwarmView v = Finished();
  v.standing = SwarmStanding::kCutOff;
  v.furthest = {8, "later123x", 30};
  v.holders = {"n0", "n3"};
  v.unreachable.resize(2);
  v.unreachable[0].set_id("n0");
  v.unreachable[1].set_id("n3");
  EXPECT_EQ(
      EndedApartMessage(v, {"n2", 7, 70, absl::Milliseconds(31260)}),
      "starling node: n2 ended apart from the swarm: this process was paused "
      "for 31.2s and none of n0, n3 has answered since; the swarm was last "
      "seen at round 8 (model later123, on n0, n3) and may have finished "
      "without this node, which stops at round 7 (step 70); this node's "
      "model is not the swarm's final one (exit 3; --train_alone trains on "
      "alone instead)");
}

TEST(SwarmEndReportTest, TheModelIsTheSwarmsOnlyOnTheFurthestStateInIt) {
  SwarmView v = Finished();
  v.standing = SwarmStanding::kInSwarm;
  v.here = v.furthest;
  v.holders = {"n0", "n2"};
  EXPECT_EQ(SwarmFinalFields(v, false, false).Dump(),
            R"({"swarm_final_round":10,"swarm_final_hash":"5796abcdef",)"
            R"("swarm_final_holders":["n0","n2"],"swarm_standing":"in_swarm",)"
            R"("model_is_swarms":true,"trained_alone":false})");
  EXPECT_THAT(SwarmFinalFields(v, /*apart=*/true, false).Dump(),
              HasSubstr(R"("model_is_swarms":false)"));
  EXPECT_THAT(SwarmFinalFields(v, false, /*trained_alone=*/true).Dump(),
              HasSubstr(R"("model_is_swarms":false,"trained_alone":true)"));
  // Behind the furthest state it knows of: not the swarm's model.
  EXPECT_THAT(
      SwarmFinalFields(Finished(), false, false).Dump(),
      HasSubstr(
          R"("swarm_standing":"swarm_finished","model_is_swarms":false)"));
}

}  // namespace
}  // namespace starling
