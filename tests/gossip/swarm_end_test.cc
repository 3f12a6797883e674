#include "gossip/swarm_end.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gossip/test_members.h"

namespace starling {
namespace {

using peer::v1::MEMBER_ALIVE;
using peer::v1::MEMBER_DEAD;
using peer::v1::MEMBER_LEFT;
using peer::v1::MEMBER_SUSPECT;
using peer::v1::MemberEntry;
using peer::v1::MemberState;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Member `id` in `state` at `round` on lineage `lineage`, of weight `w`.
MemberEntry At(const std::string& id, MemberState state, int64_t round,
               const std::string& lineage, int64_t w = 0) {
  MemberEntry e = TestMember(id, state, 1, round);
  e.set_lineage(lineage);
  e.set_member_rounds(w);
  return e;
}

// n2 was stopped at round 7 while the others went on to round 10 and
// left: the swarm finished without it, and n0, n1, n3 hold the model.
TEST(SwarmEndTest, MembersThatLeftAheadFinishedWithoutThisNode) {
  const std::vector<MemberEntry> table = {
      At("n0", MEMBER_LEFT, 10, "final", 36),
      At("n1", MEMBER_LEFT, 10, "final", 36),
      At("n2", MEMBER_ALIVE, 7, "old", 28),
      At("n3", MEMBER_LEFT, 10, "final", 36)};
  const SwarmView v = JudgeSwarm(table, "n2", {});
  EXPECT_EQ(v.standing, SwarmStanding::kSwarmFinished);
  EXPECT_EQ(v.here.round, 7);
  EXPECT_EQ(v.furthest.round, 10);
  EXPECT_EQ(v.furthest.lineage, "final");
  EXPECT_THAT(v.holders, ElementsAre("n0", "n1", "n3"));
  EXPECT_FALSE(v.HoldsFurthest());
}

// At the same round, a heavier lineage that left is ahead too: this node
// ran the last round apart, and the others left on theirs.
TEST(SwarmEndTest, AHeavierLineageThatLeftAtTheSameRoundIsAhead) {
  const std::vector<MemberEntry> table = {
      At("n0", MEMBER_LEFT, 10, "theirs", 36),
      At("n1", MEMBER_ALIVE, 10, "mine", 28)};
  EXPECT_EQ(JudgeSwarm(table, "n1", {}).standing,
            SwarmStanding::kSwarmFinished);
}

// A live member can still hand the state over (it catches up first), and
// one that left on a signal behind this node or beside it is no sign.
TEST(SwarmEndTest, InTheSwarmWhileAnotherMemberIsLiveOrNoneLeftAhead) {
  std::vector<MemberEntry> table = {At("n0", MEMBER_LEFT, 10, "final", 36),
                                    At("n1", MEMBER_SUSPECT, 9, "old", 30),
                                    At("n2", MEMBER_ALIVE, 7, "old", 28)};
  EXPECT_EQ(JudgeSwarm(table, "n2", {}).standing, SwarmStanding::kInSwarm);
  table = {At("n0", MEMBER_LEFT, 5, "a", 10), At("n1", MEMBER_LEFT, 7, "b", 28),
           At("n2", MEMBER_ALIVE, 7, "b", 28)};
  const SwarmView v = JudgeSwarm(table, "n2", {});
  EXPECT_EQ(v.standing, SwarmStanding::kInSwarm);
  EXPECT_TRUE(v.HoldsFurthest());
  EXPECT_THAT(v.holders, ElementsAre("n1", "n2"));
}

// The others crashed while this node ran on: it holds the best lineage
// there is, and goes on (no pause of its own; a pause noticed with nobody
// live leaves PausedWith empty, see MembershipGossip::NotePause).
TEST(SwarmEndTest, ALoneSurvivorOfCrashesIsStillTheSwarm) {
  const std::vector<MemberEntry> table = {At("n0", MEMBER_DEAD, 3, "x", 9),
                                          At("n1", MEMBER_ALIVE, 5, "y", 14)};
  EXPECT_EQ(JudgeSwarm(table, "n1", {}).standing, SwarmStanding::kInSwarm);
}

// Paused (SIGSTOP) with n0 and n3 live; since then neither answered and
// both are dead here: cut off, the last seen state named.
TEST(SwarmEndTest, PausedAndNobodyAnsweredSinceIsCutOff) {
  std::vector<MemberEntry> table = {At("n0", MEMBER_DEAD, 8, "later", 30),
                                    At("n2", MEMBER_ALIVE, 7, "old", 26),
                                    At("n3", MEMBER_DEAD, 8, "later", 30)};
  const SwarmView v = JudgeSwarm(table, "n2", {"n0", "n3"});
  EXPECT_EQ(v.standing, SwarmStanding::kCutOff);
  EXPECT_EQ(v.furthest.round, 8);
  EXPECT_THAT(v.holders, ElementsAre("n0", "n3"));
  ASSERT_EQ(v.unreachable.size(), 2u);
  EXPECT_EQ(v.unreachable[1].id(), "n3");
  EXPECT_FALSE(v.waking);
  // Not while one of them is still only suspected (it may answer yet): it
  // is waking, and runs no round until that is decided.
  table[0].set_state(MEMBER_SUSPECT);
  const SwarmView waking = JudgeSwarm(table, "n2", {"n0", "n3"});
  EXPECT_EQ(waking.standing, SwarmStanding::kInSwarm);
  EXPECT_TRUE(waking.waking);
  // Once one answers (PausedWith is empty again) it is simply in the swarm.
  EXPECT_FALSE(JudgeSwarm(table, "n2", {}).waking);
  // Nor when they said goodbye: their LEFT entries carry their final
  // state, and this node, at the same place, is on it.
  table = {At("n0", MEMBER_LEFT, 7, "old", 26),
           At("n2", MEMBER_ALIVE, 7, "old", 26)};
  const SwarmView left = JudgeSwarm(table, "n2", {"n0"});
  EXPECT_EQ(left.standing, SwarmStanding::kInSwarm);
  EXPECT_THAT(left.unreachable, IsEmpty());
  EXPECT_FALSE(left.waking);
}

// The furthest state counts dead members too, for the summary: a side of
// a partition that finished heavier and is unreachable now.
TEST(SwarmEndTest, TheFurthestStateCountsEveryMember) {
  const std::vector<MemberEntry> table = {
      At("n0", MEMBER_DEAD, 10, "heavy", 40),
      At("n1", MEMBER_ALIVE, 10, "light", 30)};
  const SwarmView v = JudgeSwarm(table, "n1", {});
  EXPECT_EQ(v.standing, SwarmStanding::kInSwarm);
  EXPECT_EQ(v.furthest.lineage, "heavy");
  EXPECT_FALSE(v.HoldsFurthest());
}

TEST(SwarmEndTest, StandingNames) {
  EXPECT_STREQ(SwarmStandingName(SwarmStanding::kInSwarm), "in_swarm");
  EXPECT_STREQ(SwarmStandingName(SwarmStanding::kSwarmFinished),
               "swarm_finished");
  EXPECT_STREQ(SwarmStandingName(SwarmStanding::kCutOff), "cut_off");
}

}  // namespace
}  // namespace starling
