// Integration tests of a DiLoCo member that is late at the end of a run, on
// real `starling node` processes over loopback: n2 of four is frozen
// (SIGSTOP, a laptop asleep) or its training stalls through the last
// rounds, while the others finish. Lingering members let it catch up to
// the swarm's final model; without them it stops with exit code 3
// (kExitEndedApart) and says which round the swarm finished at and who
// holds that model; with --train_alone it trains on alone and its summary
// says so. It never exits 0 on a model of its own that it calls the
// swarm's. (gossip/swarm_end.h has the rules.)
#include <signal.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness/node_group.h"
#include "tests/harness/run_files.h"

namespace starling {
namespace {

using ::starling::testing::Field;
using ::starling::testing::Members;
using ::starling::testing::NodeGroup;
using ::starling::testing::ReadJson;
using ::starling::testing::TinyTextFlags;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::vector<std::string> kIds = {"n0", "n1", "n2", "n3"};
const std::vector<std::string> kOthers = {"n0", "n1", "n3"};

// Four nodes, 100 steps of H=10: rounds 0-9, and the swarm's final state
// is round 10's. nK trains shard k of 4 and joins through n0.
class LateSwarm : public NodeGroup {
 public:
  explicit LateSwarm(const std::string& name)
      : NodeGroup(name, absl::StrCat(TinyTextFlags(60000),
                                     " --steps=100 --inner_steps=10"
                                     " --shard_mode=contiguous --threads=1"
                                     " --eval_every=0 --suspect_timeout=1"
                                     " --chunk_bytes=1024 --insecure --run_id=",
                                     name)) {}

  // Starts the four, n2 with `late` on top of `common`.
  void StartFour(const std::string& common, const std::string& late) {
    for (int k = 0; k < 4; ++k) {
      NodeGroup::Start(kIds[k],
                       absl::StrCat("--min_members=4 --shard=", k, "/4 ",
                                    common, k == 2 ? " " + late : ""),
                       k == 0 ? "" : "n0");
    }
  }
  // Node `id`'s summary.json "final" object.
  google::protobuf::Struct Final(const std::string& id) const {
    return Field(ReadJson(Out(id) + "/summary.json"), "final").struct_value();
  }
  // The hash of round 9 (the last) as node `id` committed it.
  std::string LastRoundHash(const std::string& id) const {
    std::map<int, std::string> hashes = RoundHashes(id);
    return hashes.count(9) ? hashes[9] : "";
  }
};

std::vector<std::string> Strings(const google::protobuf::Value& list) {
  std::vector<std::string> out;
  for (const auto& v : list.list_value().values()) {
    out.push_back(v.string_value());
  }
  return out;
}

// The others' runs end on the swarm's final model, and their summaries say
// it is theirs.
void ExpectOthersFinished(LateSwarm& s) {
  for (const std::string& id : kOthers) {
    EXPECT_EQ(s.Wait(id), 0) << id << ":\n" << s.LogText(id);
    const google::protobuf::Struct fin = s.Final(id);
    EXPECT_EQ(Field(fin, "swarm_final_round").number_value(), 10) << id;
    EXPECT_EQ(Field(fin, "swarm_final_hash").string_value(),
              s.LastRoundHash("n0"))
        << id;
    EXPECT_TRUE(Field(fin, "model_is_swarms").bool_value()) << id;
    EXPECT_EQ(s.FinalHash(id), s.FinalHash("n0")) << id;
  }
}

// Frozen before its READY of round 7 until the others are done with round
// 9 and linger, n2 wakes, is told STALE, fetches the final state from a
// lingering member and ends on the swarm's model, which its summary says.
// The others leave once it has (not after the whole --linger_seconds).
TEST(LateMemberTest, AMemberFrozenThroughTheLastRoundsCatchesUpFromTheLinger) {
  LateSwarm s("late-linger");
  s.StartFour("--linger_seconds=300", "--test_crash_at=freeze:ready@7");
  ASSERT_TRUE(s.WaitStopped("n2", absl::Seconds(60))) << s.LogText("n2");
  for (const std::string& id : kOthers) {
    ASSERT_TRUE(s.WaitForEvent(id, "\"linger\"", absl::Seconds(90)))
        << id << " did not finish and linger:\n"
        << s.LogText(id);
    EXPECT_EQ(s.RoundHashes(id).count(9), 1u) << s.LogText(id);
  }
  const auto lingered = s.Events("n0", "linger");
  ASSERT_EQ(lingered.size(), 1u);
  EXPECT_EQ(Field(lingered[0], "waiting_for").string_value(), "n2");
  s.Signal("n2", SIGCONT);
  EXPECT_EQ(s.Wait("n2"), 0) << s.LogText("n2");
  ExpectOthersFinished(s);
  // n2 ran none of rounds 7-9: it took the state after them.
  EXPECT_EQ(s.RoundHashes("n2").count(7), 0u) << s.LogText("n2");
  EXPECT_FALSE(s.Events("n2", "state_transfer").empty()) << s.LogText("n2");
  EXPECT_EQ(s.FinalHash("n2"), s.FinalHash("n0"));
  const google::protobuf::Struct fin = s.Final("n2");
  EXPECT_TRUE(Field(fin, "model_is_swarms").bool_value());
  EXPECT_EQ(Field(fin, "swarm_final_round").number_value(), 10);
  EXPECT_EQ(Field(fin, "swarm_standing").string_value(), "in_swarm");
  EXPECT_FALSE(Field(fin, "trained_alone").bool_value());
}

// The same freeze with lingering off: the others leave as they finish, and
// n2 wakes to find nobody. It runs no round alone and stops with exit code
// 3, saying it was cut off and on which round it stopped.
// SIGTERM ends a linger at once: n0, lingering for the frozen n2 with
// --linger_seconds=3000, leaves when told to; the wait below would give up
// (-1) long before the linger ran out. Its model is still the swarm's.
TEST(LateMemberTest, SigtermEndsALingerAtOnce) {
  LateSwarm s("late-sigterm");
  s.StartFour("--linger_seconds=3000", "--test_crash_at=freeze:ready@7");
  ASSERT_TRUE(s.WaitStopped("n2", absl::Seconds(60))) << s.LogText("n2");
  ASSERT_TRUE(s.WaitForEvent("n0", "\"linger\"", absl::Seconds(90)))
      << s.LogText("n0");
  s.Signal("n0", SIGTERM);
  EXPECT_NE(s.Wait("n0", absl::Seconds(120)), -1) << s.LogText("n0");
  EXPECT_TRUE(Field(s.Final("n0"), "model_is_swarms").bool_value());
  EXPECT_EQ(s.RoundHashes("n0").count(9), 1u) << s.LogText("n0");
  s.Signal("n2", SIGCONT);
}

TEST(LateMemberTest, WithoutALingerAFrozenMemberStopsApartWithExitCode3) {
  LateSwarm s("late-no-linger");
  s.StartFour("--linger_seconds=0", "--test_crash_at=freeze:ready@7");
  ASSERT_TRUE(s.WaitStopped("n2", absl::Seconds(60))) << s.LogText("n2");
  ExpectOthersFinished(s);  // all three exited: the swarm is gone
  s.Signal("n2", SIGCONT);
  EXPECT_EQ(s.Wait("n2"), 3) << s.LogText("n2");
  const std::string log = s.LogText("n2");
  EXPECT_THAT(log, HasSubstr("n2 ended apart from the swarm: this process was "
                             "paused for"));
  EXPECT_THAT(log, HasSubstr("none of n0, n1, n3 has answered since"));
  EXPECT_THAT(log, HasSubstr("which stops at round 7"));
  EXPECT_EQ(s.RoundHashes("n2").count(7), 0u) << log;
  const google::protobuf::Struct fin = s.Final("n2");
  EXPECT_FALSE(Field(fin, "model_is_swarms").bool_value());
  EXPECT_EQ(Field(fin, "swarm_standing").string_value(), "cut_off");
  EXPECT_EQ(s.Events("n2", "apart").size(), 1u);
}

// n2's training stalls in round 7 while its gossip goes on; the others,
// not lingering, finish, wait the usual straggler time for it, and leave,
// telling it goodbye. Their LEFT entries carry their final round and
// model: awake, n2 names them and stops with exit code 3.
TEST(LateMemberTest, WithEveryoneGoneTheMessageNamesTheFinalRoundAndHolders) {
  LateSwarm s("late-gone");
  s.StartFour("--linger_seconds=0 --round_deadline=1 --round_timeout=5",
              "--test_stall=75:30");
  ExpectOthersFinished(s);
  EXPECT_EQ(s.Wait("n2"), 3) << s.LogText("n2");
  const std::string log = s.LogText("n2");
  EXPECT_THAT(log, HasSubstr(absl::StrCat(
                       "n2 ended apart from the swarm: it reached round 7 "
                       "(step 70), but the swarm went on to round 10 without "
                       "it and has left; n0, n1, n3 hold the final model (",
                       s.LastRoundHash("n0").substr(0, 8), ")")));
  EXPECT_EQ(s.RoundHashes("n2").count(7), 0u) << log;
  const google::protobuf::Struct fin = s.Final("n2");
  EXPECT_EQ(Field(fin, "swarm_final_round").number_value(), 10);
  EXPECT_EQ(Field(fin, "swarm_final_hash").string_value(),
            s.LastRoundHash("n0"));
  EXPECT_THAT(Strings(Field(fin, "swarm_final_holders")),
              ElementsAre("n0", "n1", "n3"));
  EXPECT_EQ(Field(fin, "swarm_standing").string_value(), "swarm_finished");
  EXPECT_FALSE(Field(fin, "model_is_swarms").bool_value());
}

// As above, with --train_alone: n2 runs rounds 7-9 by itself, exits 0, and
// its summary says it trained alone on a model that is not the swarm's.
TEST(LateMemberTest, TrainAloneOnPurposeIsSaidInTheSummary) {
  LateSwarm s("late-alone");
  s.StartFour("--linger_seconds=0 --round_deadline=1 --round_timeout=5",
              "--test_stall=75:30 --train_alone");
  ExpectOthersFinished(s);
  EXPECT_EQ(s.Wait("n2"), 0) << s.LogText("n2");
  EXPECT_THAT(s.LogText("n2"),
              HasSubstr("trained alone after the swarm was gone: not the "
                        "swarm's model"));
  EXPECT_EQ(s.Events("n2", "train_alone").size(), 1u);
  for (const auto& ev : s.Events("n2", "round")) {
    if (Field(ev, "round").number_value() >= 7) {
      EXPECT_THAT(Members(ev), ElementsAre("n2"));
    }
  }
  const google::protobuf::Struct fin = s.Final("n2");
  EXPECT_TRUE(Field(fin, "trained_alone").bool_value());
  EXPECT_FALSE(Field(fin, "model_is_swarms").bool_value());
  EXPECT_EQ(Field(fin, "swarm_final_hash").string_value(),
            s.LastRoundHash("n0"));
  EXPECT_NE(s.FinalHash("n2"), s.FinalHash("n0"));
}

}  // namespace
}  // namespace starling
