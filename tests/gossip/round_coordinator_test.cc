// The round coordinator as a state machine on a fake clock: no sockets, no
// threads. Each test feeds it READY, DONE and FAILED messages, refusals
// and ticks with a member table, and checks the messages it decides to
// send (PLAN, COMMIT, ABORT, STALE), its log lines and its numbers.
#include "gossip/round_coordinator.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/gossip/test_members.h"

namespace starling {
namespace {

using peer::v1::ControlMessage;
using peer::v1::MemberEntry;
using K = peer::v1::ControlMessage;

MemberEntry Entry(const std::string& id, int64_t round = 0,
                  int64_t incarnation = 1,
                  peer::v1::MemberState state = peer::v1::MEMBER_ALIVE) {
  return TestMember(id, state, incarnation, round);
}

// n0 (this node), n1 and n2, alive at round 0.
std::vector<MemberEntry> Three() {
  return {Entry("n0"), Entry("n1"), Entry("n2")};
}

ControlMessage Ready(const std::string& from, int64_t round = 0,
                     const std::string& lineage = "", int last_attempt = 0) {
  ControlMessage m;
  m.set_run_id("run");
  m.set_from(from);
  m.set_kind(K::READY);
  m.set_round(round);
  m.set_lineage(lineage);
  m.set_last_attempt(last_attempt);
  return m;
}

ControlMessage Report(K::Kind kind, const std::string& from, int64_t round,
                      int attempt) {
  ControlMessage m;
  m.set_from(from);
  m.set_kind(kind);
  m.set_round(round);
  m.set_attempt(attempt);
  return m;
}

RoundCoordinatorOptions Options() {
  RoundCoordinatorOptions o;
  o.self_id = "n0";
  o.run_id = "run";
  o.round_deadline = absl::Seconds(60);
  o.attempt_timeout = absl::Seconds(120);
  return o;
}

// "KIND(round,attempt)->to" for each message, in order.
std::string Sent(const std::vector<Outgoing>& out) {
  std::vector<std::string> parts;
  for (const auto& [to, m] : out) {
    parts.push_back(absl::StrCat(K::Kind_Name(m.kind()), "(", m.round(), ",",
                                 m.attempt(), ")->", to));
  }
  return absl::StrJoin(parts, " ");
}

std::string Members(const ControlMessage& plan) {
  return absl::StrJoin(plan.members(), ",");
}

// Readies every id of `ids` for round 0 at `now`.
void ReadyAll(RoundCoordinator& c, const std::vector<std::string>& ids,
              const std::vector<MemberEntry>& live, absl::Time now) {
  for (const std::string& id : ids) {
    EXPECT_EQ(c.OnReady(Ready(id), live, now), "") << id;
  }
}

TEST(RoundCoordinatorTest, WaitsForEveryLiveMemberOrTheDeadline) {
  RoundCoordinator c(Options());
  ReadyAll(c, {"n0", "n1"}, Three(), T(0));
  EXPECT_TRUE(c.Tick(Three(), T(0)).plans.empty()) << "n2 is not ready";
  EXPECT_TRUE(c.Tick(Three(), T(59.9)).plans.empty());
  RoundCoordinator::Decisions d = c.Tick(Three(), T(60));
  ASSERT_EQ(Sent(d.plans), "PLAN(0,1)->n0 PLAN(0,1)->n1");
  const ControlMessage& plan = d.plans[0].second;
  EXPECT_EQ(Members(plan), "n0,n1");
  EXPECT_EQ(absl::StrJoin(plan.addresses(), ","), "n0:7000,n1:7000");
  EXPECT_EQ(absl::StrJoin(plan.incarnations(), ","), "1,1");
  EXPECT_EQ(plan.from(), "n0");
  EXPECT_EQ(plan.run_id(), "run");
  EXPECT_TRUE(c.running());

  // With every live member ready, at once.
  RoundCoordinator all(Options());
  ReadyAll(all, {"n0", "n1", "n2"}, Three(), T(0));
  EXPECT_EQ(Sent(all.Tick(Three(), T(0)).plans),
            "PLAN(0,1)->n0 PLAN(0,1)->n1 PLAN(0,1)->n2");
}

// A member behind a relay goes right after its relay in the ring (relay
// and order of the others as RelayRingOrder decides), so that the relay
// sends it its own segments instead of forwarding another member's.
TEST(RoundCoordinatorTest, PlansEachRelayedMemberRightAfterItsRelay) {
  std::vector<MemberEntry> live = {Entry("n0"), Entry("n1"), Entry("n2"),
                                   Entry("n3")};
  live[1].set_reachability(peer::v1::REACHABILITY_UNREACHABLE);
  live[1].set_relay("n3:7000");
  RoundCoordinator c(Options());
  ReadyAll(c, {"n0", "n1", "n2", "n3"}, live, T(0));
  RoundCoordinator::Decisions d = c.Tick(live, T(0));
  ASSERT_EQ(d.plans.size(), 4u);
  EXPECT_EQ(Members(d.plans[0].second), "n0,n2,n3,n1");
  EXPECT_EQ(absl::StrJoin(d.plans[0].second.addresses(), ","),
            "n0:7000,n2:7000,n3:7000,n1:7000");
}

TEST(RoundCoordinatorTest, ASuspectIsNotWaitedForAndOnePastTheRoundStalesIt) {
  RoundCoordinator c(Options());
  std::vector<MemberEntry> live = {
      Entry("n0"), Entry("n1"),
      Entry("n2", 0, 1, peer::v1::MEMBER_SUSPECT),  // not ALIVE
      Entry("n3", 1)};                              // past round 0
  ReadyAll(c, {"n1", "n0"}, live, T(0));
  // n3 is ahead: without the catch-up rule it would not be waited for
  // either; here it makes the ready members catch up instead.
  RoundCoordinator::Decisions d = c.Tick(live, T(0));
  EXPECT_EQ(Sent(d.messages), "STALE(0,0)->n0 STALE(0,0)->n1");
  ASSERT_EQ(d.log.size(), 1u);
  EXPECT_EQ(d.log[0].text,
            "round 0 was committed without its ready members (2): n3 is at "
            "round 1; they catch up");
  EXPECT_EQ(c.committed(), 0);

  RoundCoordinator suspect(Options());
  live.pop_back();
  ReadyAll(suspect, {"n0", "n1"}, live, T(0));
  EXPECT_EQ(Sent(suspect.Tick(live, T(0)).plans),
            "PLAN(0,1)->n0 PLAN(0,1)->n1");
}

TEST(RoundCoordinatorTest, CommitsWhenEveryMemberIsDoneAndStalesTheRest) {
  RoundCoordinator c(Options());
  ReadyAll(c, {"n0", "n1"}, Three(), T(0));
  ASSERT_EQ(c.Tick(Three(), T(60)).plans.size(), 2u);
  EXPECT_EQ(c.OnReady(Ready("n2"), Three(), T(61)), "");  // too late
  c.OnDone(Report(K::DONE, "n0", 0, 1));
  c.OnDone(Report(K::DONE, "n2", 0, 1));  // not in the plan
  c.OnDone(Report(K::DONE, "n1", 0, 2));  // another attempt
  RoundCoordinator::Decisions d = c.Tick(Three(), T(62));
  EXPECT_FALSE(d.commit);
  EXPECT_TRUE(d.messages.empty());
  c.OnDone(Report(K::DONE, "n1", 0, 1));
  d = c.Tick(Three(), T(63));
  EXPECT_TRUE(d.commit);
  EXPECT_EQ(Sent(d.messages), "COMMIT(0,1)->n0 COMMIT(0,1)->n1 STALE(0,1)->n2");
  EXPECT_EQ(c.committed(), 0);
  EXPECT_FALSE(c.running());
}

TEST(RoundCoordinatorTest, AnswersStaleForACommittedRoundOrAWorseLineage) {
  RoundCoordinator c(Options());
  ReadyAll(c, {"n0", "n1", "n2"}, Three(), T(0));
  ASSERT_EQ(c.Tick(Three(), T(0)).plans.size(), 3u);
  for (const char* id : {"n0", "n1", "n2"}) {
    c.OnDone(Report(K::DONE, id, 0, 1));
  }
  ASSERT_TRUE(c.Tick(Three(), T(1)).commit);
  EXPECT_EQ(c.OnReady(Ready("n1", 0), Three(), T(2)), "");
  EXPECT_EQ(Sent(c.Tick(Three(), T(2)).messages), "STALE(0,0)->n1");

  // At round 1 on lineage "b" (weight 6), a READY on "a" of weight 3 is
  // behind; one on "c" of weight 9 is ahead and moves the coordinator,
  // whose ready members hear STALE.
  ControlMessage b = Ready("n0", 1, "b");
  b.set_member_rounds(6);
  ASSERT_EQ(c.OnReady(b, Three(), T(3)), "");
  ControlMessage a = Ready("n1", 1, "a");
  a.set_member_rounds(3);
  ASSERT_EQ(c.OnReady(a, Three(), T(3)), "");
  EXPECT_EQ(Sent(c.Tick(Three(), T(3)).messages), "STALE(1,0)->n1");
  ControlMessage heavier = Ready("n2", 1, "c");
  heavier.set_member_rounds(9);
  ASSERT_EQ(c.OnReady(heavier, Three(), T(4)), "");
  EXPECT_EQ(Sent(c.Tick(Three(), T(4)).messages), "STALE(1,0)->n0");
  EXPECT_EQ(c.round(), 1);
}

TEST(RoundCoordinatorTest, AbortsAndReplansWhenAMemberDies) {
  RoundCoordinator c(Options());
  ReadyAll(c, {"n0", "n1", "n2"}, Three(), T(0));
  ASSERT_EQ(c.Tick(Three(), T(0)).plans.size(), 3u);
  std::vector<MemberEntry> live = Three();
  live[2].set_state(peer::v1::MEMBER_SUSPECT);
  RoundCoordinator::Decisions d = c.Tick(live, T(1));
  EXPECT_EQ(Sent(d.messages), "ABORT(0,1)->n0 ABORT(0,1)->n1 ABORT(0,1)->n2");
  ASSERT_EQ(d.log.size(), 1u);
  EXPECT_EQ(d.log[0].level, LogLevel::kWarning);
  EXPECT_EQ(d.log[0].text, "round 0 attempt 1 aborted: n2 is no longer alive");
  // The survivors at once: the first retry does not wait.
  EXPECT_EQ(Sent(d.plans), "PLAN(0,2)->n0 PLAN(0,2)->n1");
  EXPECT_TRUE(c.running());
}

TEST(RoundCoordinatorTest, AbortsWhenAMemberRestartedAtAHigherIncarnation) {
  RoundCoordinator c(Options());
  ReadyAll(c, {"n0", "n1", "n2"}, Three(), T(0));
  ASSERT_EQ(c.Tick(Three(), T(0)).plans.size(), 3u);
  std::vector<MemberEntry> live = Three();
  live[1].set_incarnation(2);  // n1 came back before anyone suspected it
  RoundCoordinator::Decisions d = c.Tick(live, T(1));
  ASSERT_EQ(d.log.size(), 1u);
  EXPECT_EQ(d.log[0].text,
            "round 0 attempt 1 aborted: n1 came back at a new incarnation "
            "(it restarted)");
  ASSERT_EQ(d.plans.size(), 2u);
  EXPECT_EQ(Members(d.plans[0].second), "n0,n2") << "n1 sends READY again";
  // Its new life's READY brings it into the next attempt (the second
  // retry of the round waits 100 ms).
  c.OnFailed(Report(K::FAILED, "n2", 0, 2));
  EXPECT_EQ(c.OnReady(Ready("n1", 0, "", 2), live, T(2)), "");
  d = c.Tick(live, T(2));
  ASSERT_EQ(d.log.size(), 1u);
  EXPECT_EQ(d.log[0].text, "round 0 attempt 2 aborted: n2 failed: ");
  EXPECT_TRUE(d.plans.empty());
  d = c.Tick(live, T(2.2));
  ASSERT_EQ(d.plans.size(), 3u);
  EXPECT_EQ(Members(d.plans[0].second), "n0,n1,n2");
  EXPECT_EQ(absl::StrJoin(d.plans[0].second.incarnations(), ","), "1,2,1");
}

TEST(RoundCoordinatorTest, AbortsAnAttemptThatRunsPastItsTimeout) {
  RoundCoordinator c(Options());
  ReadyAll(c, {"n0", "n1", "n2"}, Three(), T(0));
  ASSERT_EQ(c.Tick(Three(), T(0)).plans.size(), 3u);
  EXPECT_TRUE(c.Tick(Three(), T(120)).messages.empty());
  RoundCoordinator::Decisions d = c.Tick(Three(), T(120.5));
  ASSERT_EQ(d.log.size(), 1u);
  EXPECT_EQ(d.log[0].text,
            "round 0 attempt 1 aborted: it ran past --round_timeout");
}

TEST(RoundCoordinatorTest, BacksOffAfterRepeatedFailures) {
  RoundCoordinator c(Options());
  ReadyAll(c, {"n0", "n1", "n2"}, Three(), T(0));
  absl::Time now = T(0);
  ASSERT_EQ(c.Tick(Three(), now).plans.size(), 3u);
  // After abort k of the round the next plan waits 0 ms (k = 1), then
  // 100 ms doubling up to 5 s.
  const std::vector<int> waits_ms = {0,    100,  200,  400, 800,
                                     1600, 3200, 5000, 5000};
  for (size_t k = 0; k < waits_ms.size(); ++k) {
    SCOPED_TRACE(absl::StrCat("abort ", k + 1));
    const int next = c.attempt() + 1;
    c.OnFailed(Report(K::FAILED, "n1", 0, c.attempt()));
    RoundCoordinator::Decisions d = c.Tick(Three(), now);
    ASSERT_EQ(d.messages.size(), 3u);
    if (waits_ms[k] > 0) {
      EXPECT_TRUE(d.plans.empty());
      const absl::Duration wait = absl::Milliseconds(waits_ms[k]);
      EXPECT_TRUE(
          c.Tick(Three(), now + wait - absl::Milliseconds(1)).plans.empty());
      now += wait;
      d = c.Tick(Three(), now);
    }
    ASSERT_EQ(d.plans.size(), 3u);
    EXPECT_EQ(d.plans[0].second.attempt(), next);
  }
}

TEST(RoundCoordinatorTest, NumbersAttemptsAboveAnyAReadyClaims) {
  RoundCoordinator c(Options());
  ASSERT_EQ(c.OnReady(Ready("n1", 0, "", 7), Three(), T(0)), "");
  ReadyAll(c, {"n0", "n2"}, Three(), T(0));
  RoundCoordinator::Decisions d = c.Tick(Three(), T(0));
  ASSERT_EQ(d.plans.size(), 3u);
  EXPECT_EQ(d.plans[0].second.attempt(), 8);

  RoundCoordinator highest(Options());
  ASSERT_EQ(
      highest.OnReady(Ready("n1", 0, "", kMaxClaimedAttempt), Three(), T(0)),
      "");
  ReadyAll(highest, {"n0", "n2"}, Three(), T(0));
  d = highest.Tick(Three(), T(0));
  ASSERT_EQ(d.plans.size(), 3u);
  EXPECT_EQ(d.plans[0].second.attempt(), kMaxClaimedAttempt + 1);
  // The attempt numbers stay below the next round's mailbox sequences.
  EXPECT_LT(kMaxClaimedAttempt + 1, kAttemptsPerRound);
}

TEST(RoundCoordinatorTest, ARefusalByAFollowerOfAnotherCoordinatorWaits) {
  RoundCoordinator c(Options());
  ReadyAll(c, {"n0", "n1", "n2"}, Three(), T(0));
  RoundCoordinator::Decisions d = c.Tick(Three(), T(0));
  ASSERT_EQ(d.plans.size(), 3u);
  c.OnPlanRefused(d.plans[2].second, "n2", "n1");
  d = c.Tick(Three(), T(1));
  ASSERT_EQ(d.log.size(), 1u);
  EXPECT_EQ(d.log[0].text, "round 0 attempt 1 aborted: n2 refused the plan");
  // n2 is alive and not ready: the next plan waits for it, or the deadline
  // after the first READY.
  EXPECT_TRUE(c.Tick(Three(), T(30)).plans.empty());
  d = c.Tick(Three(), T(60));
  ASSERT_EQ(d.plans.size(), 2u);
  EXPECT_EQ(Members(d.plans[0].second), "n0,n1");

  // Refused by one that cannot be reached: left out, and the plan goes on
  // at once without it.
  RoundCoordinator gone(Options());
  ReadyAll(gone, {"n0", "n1", "n2"}, Three(), T(0));
  d = gone.Tick(Three(), T(0));
  const ControlMessage first = d.plans[2].second;
  gone.OnPlanRefused(first, "n2", "");
  d = gone.Tick(Three(), T(1));
  EXPECT_EQ(d.messages.size(), 3u);
  ASSERT_EQ(d.plans.size(), 2u);
  EXPECT_EQ(Members(d.plans[0].second), "n0,n1");
  // A refusal of an attempt no longer running changes nothing.
  gone.OnPlanRefused(first, "n1", "");
  d = gone.Tick(Three(), T(2));
  EXPECT_TRUE(d.messages.empty());
  EXPECT_TRUE(gone.running());
  EXPECT_EQ(gone.attempt(), 2);
}

TEST(RoundCoordinatorTest, ANewerRoundAbortsTheRunningAttempt) {
  RoundCoordinator c(Options());
  ReadyAll(c, {"n0", "n1"}, Three(), T(0));
  ASSERT_EQ(c.Tick(Three(), T(60)).plans.size(), 2u);
  // n2 went on under another coordinator; n0 and n1 are behind.
  std::vector<MemberEntry> live = Three();
  live[2].set_round(1);
  ASSERT_EQ(c.OnReady(Ready("n2", 1), live, T(61)), "");
  EXPECT_FALSE(c.running());
  EXPECT_EQ(c.round(), 1);
  EXPECT_EQ(Sent(c.Tick(live, T(61)).messages),
            "STALE(0,0)->n0 STALE(0,0)->n1 ABORT(0,1)->n0 ABORT(0,1)->n1");
}

TEST(RoundCoordinatorTest, RefusesAReadyAloneFarAhead) {
  RoundCoordinator c(Options());
  EXPECT_EQ(c.OnReady(Ready("n1", 1000), Three(), T(0)),
            "n0 is at round 0 and no member but \"n1\" is at round 1000 yet");
  // The next round is the usual progression; this node vouches for itself;
  // another member there vouches for it.
  EXPECT_EQ(c.OnReady(Ready("n1", 0), Three(), T(0)), "");
  EXPECT_EQ(c.OnReady(Ready("n0", 5), Three(), T(0)), "");
  std::vector<MemberEntry> live = Three();
  live[2].set_round(9);
  EXPECT_EQ(c.OnReady(Ready("n1", 9), live, T(0)), "");
  EXPECT_EQ(c.round(), 9);
}

TEST(RoundCoordinatorTest, GoesBackFromARoundNobodyVouchesFor) {
  RoundCoordinator c(Options());
  std::vector<MemberEntry> live = Three();
  live.push_back(Entry("x", 1000));  // a false entry vouches for n1
  ASSERT_EQ(c.OnReady(Ready("n1", 1000), live, T(0)), "");
  live.pop_back();
  EXPECT_TRUE(c.Tick(live, T(0)).log.empty());
  EXPECT_TRUE(c.Tick(live, T(5)).log.empty());
  RoundCoordinator::Decisions d = c.Tick(live, T(5.1));
  ASSERT_EQ(d.log.size(), 1u);
  EXPECT_EQ(d.log[0].text,
            "round 1000: neither this node nor two other members are at it "
            "any more (1 ready for it); back to round 0");
  EXPECT_EQ(c.round(), -1);
  ReadyAll(c, {"n0", "n1", "n2"}, live, T(6));
  EXPECT_EQ(c.Tick(live, T(6)).plans.size(), 3u);
}

TEST(RoundCoordinatorTest, OnlyTheCoordinatorDecidesACatchUp) {
  // n0 holds a READY (sent when it was taken for the coordinator) while m,
  // of a smaller id, is the coordinator in its view: n0 decides no
  // catch-up although a member is past the round.
  RoundCoordinator c(Options());
  std::vector<MemberEntry> live = {Entry("m"), Entry("n0"), Entry("n1", 1)};
  ASSERT_EQ(c.OnReady(Ready("n0", 0), live, T(0)), "");
  RoundCoordinator::Decisions d = c.Tick(live, T(0));
  EXPECT_TRUE(d.messages.empty());
  EXPECT_TRUE(d.log.empty());
  EXPECT_EQ(c.committed(), -1);
}

TEST(RoundCoordinatorTest, AFailureNamingACulpritBansBothFromTheRound) {
  RoundCoordinator c(Options());
  ReadyAll(c, {"n0", "n1", "n2"}, Three(), T(0));
  ASSERT_EQ(c.Tick(Three(), T(0)).plans.size(), 3u);
  ControlMessage failed = Report(K::FAILED, "n1", 0, 1);
  failed.set_culprit("n2");
  std::vector<LogLine> log = c.OnFailed(failed);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].level, LogLevel::kWarning);
  EXPECT_EQ(log[0].text,
            "round 0: n1 refused invalid data from n2; both sit out the rest "
            "of round 0");
  RoundCoordinator::Decisions d = c.Tick(Three(), T(1));
  ASSERT_EQ(d.log.size(), 1u);
  EXPECT_EQ(d.log[0].text, "round 0 attempt 1 aborted: n1 sits out round 0");
  // n0 runs the round alone; the two are banned once, and their READYs
  // are taken but dropped.
  ASSERT_EQ(d.plans.size(), 1u);
  EXPECT_EQ(Members(d.plans[0].second), "n0");
  EXPECT_TRUE(c.OnFailed(failed).empty());
  ReadyAll(c, {"n1", "n2"}, Three(), T(1));
  c.OnDone(Report(K::DONE, "n0", 0, 2));
  d = c.Tick(Three(), T(2));
  EXPECT_EQ(Sent(d.messages), "COMMIT(0,2)->n0");
}

}  // namespace
}  // namespace starling
