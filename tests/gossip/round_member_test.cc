// The member's decisions in a round (RoundMemberState) and when it calls
// its running attempt off by itself (CallOffReason), on a fake clock: no
// sockets, no threads.
#include <string>
#include <vector>

#include "gossip/round_member_state.h"
#include "gtest/gtest.h"
#include "tests/gossip/test_members.h"

namespace starling {
namespace {

using peer::v1::ControlMessage;
using peer::v1::MemberEntry;
using K = peer::v1::ControlMessage;
using Verdict = RoundMemberState::Verdict;

MemberEntry Entry(const std::string& id, int64_t round = 3) {
  return TestMember(id, peer::v1::MEMBER_ALIVE, 1, round);
}

ControlMessage Plan(const std::string& from, int attempt,
                    const std::vector<std::string>& members) {
  ControlMessage m;
  m.set_from(from);
  m.set_kind(K::PLAN);
  m.set_round(3);
  m.set_attempt(attempt);
  for (const std::string& id : members) m.add_members(id);
  return m;
}

ControlMessage Decision(K::Kind kind, const std::string& from, int attempt) {
  ControlMessage m;
  m.set_from(from);
  m.set_kind(kind);
  m.set_round(3);
  m.set_attempt(attempt);
  return m;
}

// A member of round 3 that sent READY to `ready_to` at T(0) and did its
// part of `plan`.
RoundMemberState DoneHere(const std::string& ready_to,
                          const ControlMessage& plan) {
  RoundMemberState s(3, "n1");
  s.ReadySent(ready_to, T(0));
  s.Start(plan);
  s.Done(plan);
  return s;
}

TEST(CallOffReasonTest, NamesWhatEndsTheAttempt) {
  const std::vector<std::string> members = {"n0", "n1", "n2"};
  const std::vector<int64_t> planned = {1, 1, 1};
  LiveTable live = ById({Entry("n0"), Entry("n1"), Entry("n2")});
  EXPECT_EQ(CallOffReason(members, planned, "n0", live, false), "");
  EXPECT_EQ(CallOffReason(members, planned, "n0", live, true),
            "this node is stopping");
  live["n1"].set_incarnation(2);
  EXPECT_EQ(CallOffReason(members, planned, "n0", live, false),
            "n1 came back at a new incarnation (it restarted)");
  // A plan that did not say the incarnations checks only liveness.
  EXPECT_EQ(CallOffReason(members, {}, "n0", live, false), "");
  live["n2"].set_state(peer::v1::MEMBER_SUSPECT);
  EXPECT_EQ(CallOffReason(members, {}, "n0", live, false),
            "n2 is no longer alive");
  // The coordinator (not a member of the attempt) counts too.
  live = ById({Entry("n0"), Entry("n1"), Entry("n2")});
  EXPECT_EQ(CallOffReason(members, planned, "c", live, false),
            "c is no longer alive");
}

TEST(RoundMemberStateTest, RunsOnlyPlansOfLaterAttempts) {
  RoundMemberState s(3, "n1");
  EXPECT_EQ(s.last_attempt(), 0);
  ControlMessage plan = Plan("n0", 2, {"n0", "n1"});
  ASSERT_TRUE(s.IsNew(plan));
  EXPECT_EQ(s.Start(plan), 1);
  EXPECT_EQ(s.last_attempt(), 2);
  EXPECT_FALSE(s.IsNew(plan));
  EXPECT_FALSE(s.IsNew(Plan("n0", 1, {"n0", "n1"})));
  // A plan without this node is seen, not run.
  ControlMessage without = Plan("n0", 5, {"n0", "n2"});
  ASSERT_TRUE(s.IsNew(without));
  EXPECT_EQ(s.Start(without), -1);
  EXPECT_EQ(s.last_attempt(), 5);
}

TEST(RoundMemberStateTest, CommitsOnlyTheAttemptDoneHereByItsCoordinator) {
  RoundMemberState s(3, "n1");
  std::vector<LogLine> log;
  ControlMessage plan = Plan("n0", 2, {"n0", "n1"});
  s.Start(plan);
  EXPECT_EQ(s.OnDecision(Decision(K::COMMIT, "n0", 2), &log), Verdict::kWait)
      << "not done yet";
  s.Done(plan);
  EXPECT_EQ(s.OnDecision(Decision(K::COMMIT, "n0", 1), &log), Verdict::kWait);
  EXPECT_EQ(s.OnDecision(Decision(K::COMMIT, "n9", 2), &log), Verdict::kWait);
  EXPECT_EQ(s.OnDecision(Decision(K::COMMIT, "n0", 2), &log),
            Verdict::kCommitted);
  EXPECT_EQ(s.done_attempt(), 2);
  EXPECT_EQ(s.done_members(), (std::vector<std::string>{"n0", "n1"}));
  EXPECT_TRUE(log.empty());

  // Its ABORT undoes the part done: a later COMMIT of it does not count.
  s.OnDecision(Decision(K::ABORT, "n9", 2), &log);
  EXPECT_EQ(s.done_attempt(), 2) << "not its coordinator's";
  s.OnDecision(Decision(K::ABORT, "n0", 2), &log);
  EXPECT_EQ(s.done_attempt(), -1);
  EXPECT_EQ(s.OnDecision(Decision(K::COMMIT, "n0", 2), &log), Verdict::kWait);
}

TEST(RoundMemberStateTest, HeedsStaleOnlyFromWhereItsReadyWent) {
  RoundMemberState s(3, "n1");
  s.ReadySent("n0", T(0));
  std::vector<LogLine> log;
  EXPECT_EQ(s.OnDecision(Decision(K::STALE, "n2", 0), &log), Verdict::kWait);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].level, LogLevel::kInfo);
  EXPECT_EQ(log[0].text, "round 3: ignoring STALE from n2 (READY went to n0)");
  EXPECT_EQ(s.OnDecision(Decision(K::STALE, "n0", 0), &log), Verdict::kStale);
}

TEST(RoundMemberStateTest, ResendsReadyEveryTwoSecondsOrToANewCoordinator) {
  RoundMemberState s(3, "n1");
  std::vector<LogLine> log;
  s.ReadySent("n0", T(0));
  EXPECT_FALSE(s.ShouldSendReady("n0", nullptr, T(2), &log));
  EXPECT_TRUE(s.ShouldSendReady("n0", nullptr, T(2.1), &log));
  s.ReadySent("n0", T(2.1));
  EXPECT_TRUE(s.ShouldSendReady("n2", nullptr, T(2.2), &log));
  // With its part done it waits for the decision without resending, as
  // long as its coordinator stays.
  s.ReadySent("n0", T(3));
  ControlMessage plan = Plan("n0", 1, {"n0", "n1"});
  s.Start(plan);
  s.Done(plan);
  const MemberEntry n0 = Entry("n0");
  EXPECT_FALSE(s.ShouldSendReady("n0", &n0, T(60), &log));
  EXPECT_TRUE(log.empty());
}

TEST(RoundMemberStateTest,
     ACoordinatorChangeWhileDoneStartsOverUnlessItPlanned) {
  const ControlMessage plan = Plan("n0", 1, {"n0", "n1"});
  RoundMemberState s = DoneHere("n0", plan);
  std::vector<LogLine> log;
  EXPECT_TRUE(s.ShouldSendReady("n2", nullptr, T(1), &log));
  EXPECT_EQ(s.done_attempt(), -1) << "the old coordinator is gone";

  // READY went to n2, but n0 planned the attempt done here and is the
  // coordinator again: READY goes to it, and the part done stands.
  RoundMemberState t = DoneHere("n2", plan);
  const MemberEntry n0 = Entry("n0");
  EXPECT_TRUE(t.ShouldSendReady("n0", &n0, T(1), &log));
  EXPECT_EQ(t.done_attempt(), 1);
}

TEST(RoundMemberStateTest, AsksAgainWhenItsCoordinatorWentOnWithoutAWord) {
  RoundMemberState s = DoneHere("n0", Plan("n0", 1, {"n0", "n1"}));
  std::vector<LogLine> log;
  const MemberEntry past = Entry("n0", 4);
  EXPECT_FALSE(s.ShouldSendReady("n0", &past, T(1), &log));
  EXPECT_FALSE(s.ShouldSendReady("n0", &past, T(3), &log));
  // Seen at the round again: the 2 s start over.
  const MemberEntry at = Entry("n0", 3);
  EXPECT_FALSE(s.ShouldSendReady("n0", &at, T(3.5), &log));
  EXPECT_FALSE(s.ShouldSendReady("n0", &past, T(4), &log));
  EXPECT_FALSE(s.ShouldSendReady("n0", &past, T(6), &log));
  EXPECT_TRUE(log.empty());
  EXPECT_TRUE(s.ShouldSendReady("n0", &past, T(6.1), &log));
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].text,
            "round 3: n0 is at round 4 without a word about attempt 1; "
            "asking again");
  EXPECT_EQ(s.done_attempt(), -1);
}

}  // namespace
}  // namespace starling
