#include "gossip/membership.h"

#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gossip/test_members.h"

namespace starling {
namespace {

using peer::v1::MEMBER_ALIVE;
using peer::v1::MEMBER_DEAD;
using peer::v1::MEMBER_LEFT;
using peer::v1::MEMBER_STATE_UNSPECIFIED;
using peer::v1::MEMBER_SUSPECT;
using peer::v1::MemberEntry;
using peer::v1::MemberState;

std::unique_ptr<Membership> Make(const std::string& id,
                                 int64_t incarnation = 100) {
  MembershipOptions o;
  o.self_id = id;
  o.self_address = id + ":7000";
  o.incarnation = incarnation;
  o.suspect_after = absl::Seconds(3);
  auto m = Membership::Create(o, T(0));
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(m).value();
}

MemberEntry Entry(const std::string& id, int64_t incarnation, MemberState state,
                  int64_t heartbeat = 0) {
  MemberEntry e = TestMember(id, state, incarnation);
  e.set_heartbeat(heartbeat);
  return e;
}

MemberEntry Row(const Membership& m, const std::string& id) {
  auto e = m.Get(id);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *e : MemberEntry();
}

MemberState StateOf(const Membership& m, const std::string& id) {
  return Row(m, id).state();
}

std::vector<std::string> Ids(const std::vector<MemberEntry>& entries) {
  std::vector<std::string> ids;
  for (const auto& e : entries) ids.push_back(e.id());
  return ids;
}

// One push-pull gossip exchange between `a` and `b` at time `now`.
void Exchange(Membership& a, Membership& b, absl::Time now) {
  ASSERT_TRUE(b.Merge(a.Snapshot(), now).ok());
  ASSERT_TRUE(a.Merge(b.Snapshot(), now).ok());
}

TEST(MembershipTest, CreateRejectsEmptyIdOrAddress) {
  MembershipOptions o;
  o.self_address = "h:1";
  auto m = Membership::Create(o, T(0));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("self_id"), std::string::npos);
  o.self_id = "a";
  o.self_address = "";
  m = Membership::Create(o, T(0));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("self_address"), std::string::npos);
  o.self_address = "h:1";
  o.incarnation = -1;
  EXPECT_EQ(Membership::Create(o, T(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.incarnation = 0;
  o.max_members = 0;
  m = Membership::Create(o, T(0));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("max_members"), std::string::npos);
}

TEST(MembershipTest, SelfRowIsAlwaysPresentAndIncarnationDefaultsToNow) {
  MembershipOptions o;
  o.self_id = "a";
  o.self_address = "h:1";
  auto m = Membership::Create(o, T(5));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->self_id(), "a");
  MemberEntry self = Row(**m, "a");
  EXPECT_EQ(self.incarnation(), absl::ToUnixMillis(T(5)));
  EXPECT_EQ(self.state(), MEMBER_ALIVE);
  EXPECT_EQ(self.address(), "h:1");
  EXPECT_EQ(Ids((*m)->Snapshot()), std::vector<std::string>{"a"});
  EXPECT_EQ(Ids((*m)->Live()), std::vector<std::string>{"a"});
  EXPECT_EQ((*m)->Get("zz").status().code(), absl::StatusCode::kNotFound);

  (*m)->Beat();
  (*m)->Beat();
  (*m)->SetProgress(7, "abcd", 0, true);
  self = Row(**m, "a");
  EXPECT_EQ(self.heartbeat(), 3);  // two beats, and the news
  EXPECT_EQ(self.round(), 7);
  EXPECT_EQ(self.lineage(), "abcd");
  EXPECT_TRUE(self.joining());
  // The detector never suspects this node itself.
  (*m)->Tick(T(100));
  EXPECT_EQ(StateOf(**m, "a"), MEMBER_ALIVE);
}

TEST(MembershipTest, ThreeTablesConvergeByPairwiseGossip) {
  auto a = Make("a"), b = Make("b"), c = Make("c");
  a->SetProgress(5, "lin5", 0, false);
  a->Beat();
  std::vector<MembershipChange> changes;
  // b joined through a, c through b.
  ASSERT_TRUE(b->Merge(a->Snapshot(), T(0), &changes).ok());
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].id, "a");
  EXPECT_EQ(changes[0].from, MEMBER_STATE_UNSPECIFIED);
  EXPECT_EQ(changes[0].to, MEMBER_ALIVE);
  EXPECT_EQ(changes[0].incarnation, 100);
  Exchange(*b, *c, T(0.5));
  Exchange(*c, *a, T(1));

  const std::vector<std::string> all = {"a", "b", "c"};
  for (Membership* m : {a.get(), b.get(), c.get()}) {
    EXPECT_EQ(Ids(m->Snapshot()), all) << m->self_id();
    EXPECT_EQ(Ids(m->Live()), all) << m->self_id();
    for (const MemberEntry& e : m->Snapshot()) {
      EXPECT_EQ(e.state(), MEMBER_ALIVE);
      EXPECT_EQ(e.address(), e.id() + ":7000");
    }
    MemberEntry ea = Row(*m, "a");
    EXPECT_EQ(ea.round(), 5);
    EXPECT_EQ(ea.lineage(), "lin5");
    EXPECT_EQ(ea.heartbeat(), 2);
  }
  // More gossip changes nothing and records nothing.
  changes.clear();
  ASSERT_TRUE(a->Merge(c->Snapshot(), T(1.5), &changes).ok());
  EXPECT_TRUE(changes.empty());
}

// A node that turns ready (or moves on) says so before its next beat: the
// others take the new row over the copy they already hold.
TEST(MembershipTest, ProgressIsNewsBeforeTheNextBeat) {
  auto a = Make("a"), b = Make("b");
  a->SetProgress(0, "", 0, true);
  ASSERT_TRUE(b->Merge(a->Snapshot(), T(0)).ok());
  ASSERT_TRUE(Row(*b, "a").joining());
  a->SetProgress(0, "", 0, false);
  ASSERT_TRUE(b->Merge(a->Snapshot(), T(0.1)).ok());
  EXPECT_FALSE(Row(*b, "a").joining());
  // The same progress again is no news.
  const int64_t beat = Row(*a, "a").heartbeat();
  a->SetProgress(0, "", 0, false);
  EXPECT_EQ(Row(*a, "a").heartbeat(), beat);
}

// The dial-back verdict is the member's own news, like its progress; a
// value outside the enum from a peer is refused.
// The dialing path's question: who at this address is behind NAT, and
// through which relay? Only a member marked unreachable with a relay, never
// this node itself.
TEST(MembershipTest, RelayedAtNamesTheUnreachableMemberAndItsRelay) {
  auto a = Make("a"), b = Make("b");
  a->SetReachability(peer::v1::REACHABILITY_UNREACHABLE);
  a->SetRelay("r:7000");
  EXPECT_FALSE(a->RelayedAt(Row(*a, "a").address()).ok());  // itself
  ASSERT_TRUE(b->Merge(a->Snapshot(), T(0)).ok());
  absl::StatusOr<std::pair<std::string, std::string>> at =
      b->RelayedAt(Row(*a, "a").address());
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(at->first, "a");
  EXPECT_EQ(at->second, "r:7000");
  a->SetRelay("");  // no relay: dialed directly
  ASSERT_TRUE(b->Merge(a->Snapshot(), T(0.1)).ok());
  EXPECT_TRUE(absl::IsNotFound(b->RelayedAt(Row(*a, "a").address()).status()));
  EXPECT_FALSE(b->RelayedAt("nobody:1").ok());
}

TEST(MembershipTest, ReachabilitySpreadsAsNewsAndBadValuesAreRefused) {
  auto a = Make("a"), b = Make("b");
  ASSERT_TRUE(b->Merge(a->Snapshot(), T(0)).ok());
  EXPECT_EQ(Row(*b, "a").reachability(), peer::v1::REACHABILITY_UNKNOWN);
  a->SetReachability(peer::v1::REACHABILITY_UNREACHABLE);
  ASSERT_TRUE(b->Merge(a->Snapshot(), T(0.1)).ok());
  EXPECT_EQ(Row(*b, "a").reachability(), peer::v1::REACHABILITY_UNREACHABLE);
  const int64_t beat = Row(*a, "a").heartbeat();
  a->SetReachability(peer::v1::REACHABILITY_UNREACHABLE);
  EXPECT_EQ(Row(*a, "a").heartbeat(), beat);  // no news
  MemberEntry bad = Entry("c", 100, peer::v1::MEMBER_ALIVE);
  bad.set_reachability(static_cast<peer::v1::Reachability>(7));
  EXPECT_FALSE(b->Merge({bad}, T(0.2)).ok());
  EXPECT_FALSE(b->Get("c").ok());
}

TEST(MembershipTest, SuspectsThenDeclaresDeadAfterSilence) {
  auto a = Make("a"), b = Make("b");
  ASSERT_TRUE(a->Merge(b->Snapshot(), T(0)).ok());
  std::vector<MembershipChange> changes;
  a->Tick(T(2.9), &changes);
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_ALIVE);
  EXPECT_TRUE(changes.empty());
  a->Tick(T(3), &changes);
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_SUSPECT);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].id, "b");
  EXPECT_EQ(changes[0].from, MEMBER_ALIVE);
  EXPECT_EQ(changes[0].to, MEMBER_SUSPECT);
  // Suspected members still count as live.
  EXPECT_EQ(Ids(a->Live()), (std::vector<std::string>{"a", "b"}));
  a->Tick(T(5.9), &changes);
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_SUSPECT);
  a->Tick(T(6), &changes);
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_DEAD);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[1].from, MEMBER_SUSPECT);
  EXPECT_EQ(changes[1].to, MEMBER_DEAD);
  EXPECT_EQ(changes[1].incarnation, 100);
  EXPECT_EQ(Ids(a->Live()), std::vector<std::string>{"a"});
  // Dead stays dead and is still in the table as a tombstone.
  a->Tick(T(100), &changes);
  EXPECT_EQ(changes.size(), 2u);
  EXPECT_EQ(Ids(a->Snapshot()), (std::vector<std::string>{"a", "b"}));
}

// A node that was itself stopped for a while (SIGSTOP, a starved CPU) holds
// only the silence from before its pause against the others.
TEST(MembershipTest, APauseOfThisNodeIsNotTheOthersSilence) {
  auto a = Make("a"), b = Make("b"), c = Make("c");
  ASSERT_TRUE(a->Merge(b->Snapshot(), T(0)).ok());
  ASSERT_TRUE(a->Merge(c->Snapshot(), T(2)).ok());
  // a is stopped from 2.5 s to 7.5 s: b was silent 2.5 s before it, c 0.5 s.
  a->ForgivePause(absl::Seconds(5), T(7.5));
  a->Tick(T(7.5));
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_ALIVE);
  EXPECT_EQ(StateOf(*a, "c"), MEMBER_ALIVE);
  a->Tick(T(8));  // b: 2.5 s before the pause and 0.5 s after it
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_SUSPECT);
  EXPECT_EQ(StateOf(*a, "c"), MEMBER_ALIVE);
  a->Tick(T(9.9));
  EXPECT_EQ(StateOf(*a, "c"), MEMBER_ALIVE);
  a->Tick(T(10));
  EXPECT_EQ(StateOf(*a, "c"), MEMBER_SUSPECT);
  // A member heard during the pause (its gossip was handled as the node
  // woke) is not pushed into the future.
  auto d = Make("d");
  ASSERT_TRUE(a->Merge(d->Snapshot(), T(20)).ok());
  a->ForgivePause(absl::Seconds(30), T(20));
  a->Tick(T(22.9));
  EXPECT_EQ(StateOf(*a, "d"), MEMBER_ALIVE);
  a->Tick(T(23));
  EXPECT_EQ(StateOf(*a, "d"), MEMBER_SUSPECT);
}

TEST(MembershipTest, RisingHeartbeatPreventsSuspicion) {
  auto a = Make("a"), b = Make("b");
  for (int t = 0; t <= 30; ++t) {
    b->Beat();
    ASSERT_TRUE(a->Merge(b->Snapshot(), T(t)).ok());
    a->Tick(T(t + 0.5));
    ASSERT_EQ(StateOf(*a, "b"), MEMBER_ALIVE) << "t=" << t;
  }
  // The same (stale) snapshot again is no sign of life.
  ASSERT_TRUE(a->Merge(b->Snapshot(), T(32)).ok());
  a->Tick(T(33));
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_SUSPECT);
  // A round rise alone also counts as progress.
  auto c = Make("c");
  ASSERT_TRUE(a->Merge(c->Snapshot(), T(40)).ok());
  c->SetProgress(1, "x", 0, false);
  ASSERT_TRUE(a->Merge(c->Snapshot(), T(42)).ok());
  a->Tick(T(44));
  EXPECT_EQ(StateOf(*a, "c"), MEMBER_ALIVE);
  EXPECT_EQ(Row(*a, "c").round(), 1);
}

TEST(MembershipTest, LocalSuspicionClearsWhenTheHeartbeatRises) {
  auto a = Make("a"), b = Make("b");
  ASSERT_TRUE(a->Merge(b->Snapshot(), T(0)).ok());
  a->Tick(T(3));
  ASSERT_EQ(StateOf(*a, "b"), MEMBER_SUSPECT);
  b->Beat();
  std::vector<MembershipChange> changes;
  ASSERT_TRUE(a->Merge(b->Snapshot(), T(4), &changes).ok());
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_ALIVE);
  EXPECT_EQ(Row(*a, "b").incarnation(), 100);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].from, MEMBER_SUSPECT);
  EXPECT_EQ(changes[0].to, MEMBER_ALIVE);
}

TEST(MembershipTest, GossipedSuspicionIsRefutedOnlyByANewIncarnation) {
  auto a = Make("a"), b = Make("b"), c = Make("c");
  ASSERT_TRUE(a->Merge(b->Snapshot(), T(0)).ok());
  ASSERT_TRUE(c->Merge(b->Snapshot(), T(0)).ok());
  a->Tick(T(3));  // a suspects b; c hears it from a
  ASSERT_TRUE(c->Merge(a->Snapshot(), T(3)).ok());
  ASSERT_EQ(StateOf(*c, "b"), MEMBER_SUSPECT);
  // b's heartbeat rising keeps it from dying at c but does not clear the
  // rumour at the same incarnation.
  for (int t = 4; t <= 12; ++t) {
    b->Beat();
    ASSERT_TRUE(c->Merge(b->Snapshot(), T(t)).ok());
    c->Tick(T(t + 0.5));
    ASSERT_EQ(StateOf(*c, "b"), MEMBER_SUSPECT) << "t=" << t;
  }
  EXPECT_EQ(Row(*c, "b").heartbeat(), 9);
  // b hears the rumour and refutes it.
  std::vector<MembershipChange> changes;
  ASSERT_TRUE(b->Merge(c->Snapshot(), T(13), &changes).ok());
  EXPECT_EQ(Row(*b, "b").incarnation(), 101);
  EXPECT_EQ(StateOf(*b, "b"), MEMBER_ALIVE);
  int refutations = 0;
  for (const auto& ch : changes) {
    if (ch.id != "b") continue;
    ++refutations;
    EXPECT_EQ(ch.from, MEMBER_SUSPECT);
    EXPECT_EQ(ch.to, MEMBER_ALIVE);
    EXPECT_EQ(ch.incarnation, 101);
  }
  EXPECT_EQ(refutations, 1);
  changes.clear();
  ASSERT_TRUE(c->Merge(b->Snapshot(), T(13), &changes).ok());
  EXPECT_EQ(StateOf(*c, "b"), MEMBER_ALIVE);
  EXPECT_EQ(Row(*c, "b").incarnation(), 101);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].from, MEMBER_SUSPECT);
  EXPECT_EQ(changes[0].to, MEMBER_ALIVE);
  // The old rumour no longer sticks anywhere.
  ASSERT_TRUE(c->Merge(a->Snapshot(), T(14)).ok());
  EXPECT_EQ(StateOf(*c, "b"), MEMBER_ALIVE);
  ASSERT_TRUE(a->Merge(c->Snapshot(), T(14)).ok());
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_ALIVE);
}

TEST(MembershipTest, AForgedFarFutureIncarnationIsRefusedAndANearOneRefuted) {
  // A member's incarnation is its start time in ms. A death notice at
  // INT64_MAX - 1 used to be taken, and the victim's refutation at INT64_MAX
  // refused: evicted for good. An incarnation more than a day ahead of the
  // receiver's clock is refused now; one within a day is refuted as usual.
  auto a = Make("a"), b = Make("b");
  ASSERT_TRUE(a->Merge(b->Snapshot(), T(0)).ok());
  ASSERT_TRUE(b->Merge(a->Snapshot(), T(0)).ok());
  const int64_t now_ms = absl::ToUnixMillis(T(0));
  const int64_t day_ms = int64_t{24} * 3600 * 1000;
  for (int64_t forged :
       {std::numeric_limits<int64_t>::max() - 1,
        std::numeric_limits<int64_t>::max(), now_ms + day_ms + 1}) {
    absl::Status s = a->Merge({Entry("b", forged, MEMBER_DEAD)}, T(0));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << forged;
    EXPECT_NE(s.message().find(absl::StrCat(
                  "incarnation ", forged,
                  " is more than a day ahead of this node's clock (", now_ms,
                  " ms since 1970")),
              std::string::npos)
        << s;
    EXPECT_EQ(StateOf(*a, "b"), MEMBER_ALIVE);
    EXPECT_EQ(Row(*a, "b").incarnation(), 100);
  }
  // At the edge: taken, then refuted by b, whose refutation a takes.
  const int64_t edge = now_ms + day_ms;
  ASSERT_TRUE(a->Merge({Entry("b", edge, MEMBER_DEAD)}, T(0)).ok());
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_DEAD);
  ASSERT_TRUE(b->Merge(a->Snapshot(), T(0.1)).ok());
  EXPECT_EQ(Row(*b, "b").incarnation(), edge + 1);
  ASSERT_TRUE(a->Merge(b->Snapshot(), T(0.2)).ok());
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_ALIVE);
  EXPECT_EQ(Row(*a, "b").incarnation(), edge + 1);
}

TEST(MembershipTest, RefutesADeathRumourAboutItself) {
  auto a = Make("a"), b = Make("b");
  ASSERT_TRUE(a->Merge(b->Snapshot(), T(0)).ok());
  a->Tick(T(3));
  a->Tick(T(6));
  ASSERT_EQ(StateOf(*a, "b"), MEMBER_DEAD);

  std::vector<MembershipChange> changes;
  ASSERT_TRUE(b->Merge(a->Snapshot(), T(7), &changes).ok());
  MemberEntry self = Row(*b, "b");
  EXPECT_EQ(self.state(), MEMBER_ALIVE);
  EXPECT_EQ(self.incarnation(), 101);
  EXPECT_EQ(self.address(), "b:7000");
  EXPECT_EQ(Ids(b->Live()), (std::vector<std::string>{"a", "b"}));
  bool refuted = false;
  for (const auto& c : changes) {
    if (c.id == "b") {
      refuted = true;
      EXPECT_EQ(c.from, MEMBER_DEAD);
      EXPECT_EQ(c.to, MEMBER_ALIVE);
      EXPECT_EQ(c.incarnation, 101);
    }
  }
  EXPECT_TRUE(refuted);

  // The rumour holder accepts the refutation on the next merge.
  changes.clear();
  ASSERT_TRUE(a->Merge(b->Snapshot(), T(8), &changes).ok());
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_ALIVE);
  EXPECT_EQ(Row(*a, "b").incarnation(), 101);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].from, MEMBER_DEAD);
  EXPECT_EQ(changes[0].to, MEMBER_ALIVE);
  EXPECT_EQ(changes[0].incarnation, 101);

  // A rumour at a higher incarnation than its own is refuted above it.
  ASSERT_TRUE(b->Merge({Entry("b", 500, MEMBER_SUSPECT)}, T(9)).ok());
  EXPECT_EQ(Row(*b, "b").incarnation(), 501);
  EXPECT_EQ(StateOf(*b, "b"), MEMBER_ALIVE);
}

TEST(MembershipTest, GossipNeverEditsThisNodesRow) {
  auto a = Make("a");
  a->Beat();
  a->SetProgress(3, "mine", 0, false);
  MemberEntry forged = Entry("a", 100, MEMBER_ALIVE, 999);
  forged.set_address("evil:1");
  forged.set_round(42);
  forged.set_lineage("theirs");
  std::vector<MembershipChange> changes;
  ASSERT_TRUE(a->Merge({forged}, T(1), &changes).ok());
  MemberEntry self = Row(*a, "a");
  EXPECT_EQ(self.address(), "a:7000");
  EXPECT_EQ(self.heartbeat(), 2);
  EXPECT_EQ(self.round(), 3);
  EXPECT_EQ(self.lineage(), "mine");
  EXPECT_EQ(self.incarnation(), 100);
  EXPECT_TRUE(changes.empty());
}

TEST(MembershipTest, StaleDeathNoticeDoesNotEvictALiveNode) {
  auto a = Make("a"), b = Make("b");
  ASSERT_TRUE(a->Merge(b->Snapshot(), T(0)).ok());
  std::vector<MembershipChange> changes;
  ASSERT_TRUE(
      a->Merge({Entry("b", 99, MEMBER_DEAD, 1000), Entry("b", 99, MEMBER_LEFT)},
               T(1), &changes)
          .ok());
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_ALIVE);
  EXPECT_EQ(Row(*a, "b").heartbeat(), 0);
  EXPECT_TRUE(changes.empty());
  // Nor does it make the node itself bump its incarnation.
  ASSERT_TRUE(b->Merge({Entry("b", 99, MEMBER_DEAD)}, T(1), &changes).ok());
  EXPECT_EQ(Row(*b, "b").incarnation(), 100);
  EXPECT_EQ(StateOf(*b, "b"), MEMBER_ALIVE);
  EXPECT_TRUE(changes.empty());
}

TEST(MembershipTest, RestartedNodeReplacesItsTombstone) {
  auto a = Make("a"), b = Make("b", 100);
  b->Beat();
  b->Beat();
  ASSERT_TRUE(a->Merge(b->Snapshot(), T(0)).ok());
  a->Tick(T(3));
  a->Tick(T(6));
  ASSERT_EQ(StateOf(*a, "b"), MEMBER_DEAD);
  // b restarts on another port with a later incarnation and heartbeat 0.
  MembershipOptions o;
  o.self_id = "b";
  o.self_address = "b:7001";
  o.incarnation = 200;
  auto b2 = Membership::Create(o, T(10));
  ASSERT_TRUE(b2.ok());
  std::vector<MembershipChange> changes;
  ASSERT_TRUE(a->Merge((*b2)->Snapshot(), T(10), &changes).ok());
  MemberEntry e = Row(*a, "b");
  EXPECT_EQ(e.state(), MEMBER_ALIVE);
  EXPECT_EQ(e.incarnation(), 200);
  EXPECT_EQ(e.address(), "b:7001");
  EXPECT_EQ(e.heartbeat(), 0);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].from, MEMBER_DEAD);
  EXPECT_EQ(changes[0].to, MEMBER_ALIVE);
  EXPECT_EQ(changes[0].incarnation, 200);
  // And it is detected afresh from the replacement time.
  a->Tick(T(12));
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_ALIVE);
}

TEST(MembershipTest, TombstonesAreNotResurrectedByOldAliveEntries) {
  auto a = Make("a");
  ASSERT_TRUE(a->Merge({Entry("b", 100, MEMBER_DEAD, 5),
                        Entry("c", 100, MEMBER_LEFT, 5)},
                       T(0))
                  .ok());
  std::vector<MembershipChange> changes;
  ASSERT_TRUE(a->Merge({Entry("b", 100, MEMBER_ALIVE, 50),
                        Entry("b", 99, MEMBER_ALIVE, 60),
                        Entry("c", 100, MEMBER_SUSPECT, 50),
                        Entry("c", 100, MEMBER_DEAD, 50)},
                       T(1), &changes)
                  .ok());
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_DEAD);
  EXPECT_EQ(StateOf(*a, "c"), MEMBER_LEFT);  // the first terminal state stays
  EXPECT_TRUE(changes.empty());
  EXPECT_EQ(Ids(a->Live()), std::vector<std::string>{"a"});
}

TEST(MembershipTest, AFullTableMakesRoomOnlyByEvictingTheOldestTombstone) {
  MembershipOptions o;
  o.self_id = "a";
  o.self_address = "a:7000";
  o.incarnation = 100;
  o.suspect_after = absl::Seconds(3);
  o.max_members = 3;
  auto made = Membership::Create(o, T(0));
  ASSERT_TRUE(made.ok()) << made.status();
  Membership& a = **made;
  ASSERT_TRUE(
      a.Merge({Entry("b", 1, MEMBER_ALIVE), Entry("c", 1, MEMBER_ALIVE)}, T(0))
          .ok());

  // Full of live members: a newcomer is refused, naming it, and the rest of
  // the same batch is still merged.
  absl::Status s = a.Merge(
      {Entry("d", 1, MEMBER_ALIVE), Entry("c", 1, MEMBER_ALIVE, 5)}, T(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("full"), std::string::npos) << s;
  EXPECT_NE(s.message().find("\"d\""), std::string::npos) << s;
  EXPECT_EQ(Ids(a.Snapshot()), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(Row(a, "c").heartbeat(), 5);

  // b falls silent first and dies at 7 s; c leaves at 8 s.
  a.Tick(T(3.5));
  a.Tick(T(7));
  ASSERT_EQ(StateOf(a, "b"), MEMBER_DEAD);
  ASSERT_TRUE(a.Merge({Entry("c", 1, MEMBER_LEFT, 6)}, T(8)).ok());

  // A tombstone of a stranger guards nothing here: dropped, not swapped in.
  std::vector<MembershipChange> changes;
  ASSERT_TRUE(a.Merge({Entry("x", 1, MEMBER_DEAD)}, T(9), &changes).ok());
  EXPECT_TRUE(changes.empty());
  EXPECT_EQ(Ids(a.Snapshot()), (std::vector<std::string>{"a", "b", "c"}));

  // Newcomers take the places of the oldest tombstones, b's then c's.
  ASSERT_TRUE(a.Merge({Entry("d", 1, MEMBER_ALIVE)}, T(9), &changes).ok());
  EXPECT_EQ(Ids(a.Snapshot()), (std::vector<std::string>{"a", "c", "d"}));
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].id, "d");
  EXPECT_EQ(changes[0].to, MEMBER_ALIVE);
  ASSERT_TRUE(a.Merge({Entry("e", 1, MEMBER_SUSPECT)}, T(10)).ok());
  EXPECT_EQ(Ids(a.Snapshot()), (std::vector<std::string>{"a", "d", "e"}));
  EXPECT_EQ(a.Merge({Entry("f", 1, MEMBER_ALIVE)}, T(11)).code(),
            absl::StatusCode::kResourceExhausted);
  // The evicted tombstones stay out, and the table never grew past 3.
  ASSERT_TRUE(a.Merge({Entry("b", 1, MEMBER_DEAD)}, T(12)).ok());
  EXPECT_EQ(Ids(a.Snapshot()), (std::vector<std::string>{"a", "d", "e"}));

  // e dies, so there is room for a newcomer again. Stale gossip that still
  // has b or c alive at the incarnation they died at does not bring them
  // back; b at a new incarnation (it restarted) takes e's place.
  a.Tick(T(13.5));
  a.Tick(T(17));
  ASSERT_EQ(StateOf(a, "e"), MEMBER_DEAD);
  ASSERT_EQ(StateOf(a, "d"), MEMBER_DEAD);
  changes.clear();
  ASSERT_TRUE(a.Merge({Entry("b", 1, MEMBER_ALIVE, 50),
                       Entry("c", 1, MEMBER_SUSPECT, 50)},
                      T(18), &changes)
                  .ok());
  EXPECT_TRUE(changes.empty());
  EXPECT_EQ(Ids(a.Snapshot()), (std::vector<std::string>{"a", "d", "e"}));
  ASSERT_TRUE(a.Merge({Entry("b", 2, MEMBER_ALIVE)}, T(19), &changes).ok());
  EXPECT_EQ(Ids(a.Snapshot()), (std::vector<std::string>{"a", "b", "d"}));
  EXPECT_EQ(StateOf(a, "b"), MEMBER_ALIVE);
  EXPECT_EQ(changes.size(), 1u);
}

TEST(MembershipTest, WorseStateWinsAtTheSameIncarnation) {
  auto a = Make("a");
  ASSERT_TRUE(a->Merge({Entry("b", 100, MEMBER_ALIVE, 10)}, T(0)).ok());
  std::vector<MembershipChange> changes;
  // A SUSPECT entry with an older heartbeat still wins over ALIVE.
  ASSERT_TRUE(
      a->Merge({Entry("b", 100, MEMBER_SUSPECT, 3)}, T(1), &changes).ok());
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_SUSPECT);
  EXPECT_EQ(Row(*a, "b").heartbeat(), 10);
  ASSERT_TRUE(
      a->Merge({Entry("b", 100, MEMBER_ALIVE, 9)}, T(2), &changes).ok());
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_SUSPECT);
  ASSERT_TRUE(a->Merge({Entry("b", 100, MEMBER_DEAD, 0)}, T(3), &changes).ok());
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_DEAD);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].to, MEMBER_SUSPECT);
  EXPECT_EQ(changes[1].from, MEMBER_SUSPECT);
  EXPECT_EQ(changes[1].to, MEMBER_DEAD);
}

TEST(MembershipTest, LeavePropagatesAsLeft) {
  auto a = Make("a"), b = Make("b"), c = Make("c");
  Exchange(*a, *b, T(0));
  Exchange(*a, *c, T(0));
  b->Leave();
  EXPECT_EQ(StateOf(*b, "b"), MEMBER_LEFT);
  EXPECT_EQ(Ids(b->Live()), std::vector<std::string>{"a"});
  std::vector<MembershipChange> changes;
  ASSERT_TRUE(a->Merge(b->Snapshot(), T(1), &changes).ok());
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_LEFT);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].from, MEMBER_ALIVE);
  EXPECT_EQ(changes[0].to, MEMBER_LEFT);
  Exchange(*c, *a, T(2));
  EXPECT_EQ(StateOf(*c, "b"), MEMBER_LEFT);
  EXPECT_EQ(Ids(c->Live()), (std::vector<std::string>{"a", "c"}));
  // A node that left does not refute rumours about itself.
  ASSERT_TRUE(b->Merge({Entry("b", 100, MEMBER_DEAD)}, T(3)).ok());
  EXPECT_EQ(StateOf(*b, "b"), MEMBER_LEFT);
  EXPECT_EQ(Row(*b, "b").incarnation(), 100);
  // The detector leaves LEFT rows alone.
  changes.clear();
  a->Tick(T(100), &changes);
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_LEFT);
  for (const auto& ch : changes) EXPECT_NE(ch.id, "b");
}

TEST(MembershipTest, RejectsInvalidEntriesAndMergesTheRest) {
  auto a = Make("a");
  MemberEntry no_id = Entry("", 1, MEMBER_ALIVE);
  MemberEntry no_address = Entry("y", 1, MEMBER_ALIVE);
  no_address.clear_address();
  MemberEntry no_state = Entry("z", 1, MEMBER_STATE_UNSPECIFIED);
  MemberEntry negative = Entry("w", -4, MEMBER_ALIVE);
  std::vector<MembershipChange> changes;
  absl::Status s = a->Merge({Entry("x", 1, MEMBER_ALIVE), no_address, no_id,
                             no_state, negative, Entry("v", 1, MEMBER_SUSPECT)},
                            T(0), &changes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("empty address"), std::string::npos) << s;
  EXPECT_NE(s.message().find("\"y\""), std::string::npos) << s;
  EXPECT_EQ(Ids(a->Snapshot()), (std::vector<std::string>{"a", "v", "x"}));
  EXPECT_EQ(StateOf(*a, "v"), MEMBER_SUSPECT);
  EXPECT_EQ(changes.size(), 2u);

  s = a->Merge({no_state}, T(0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("state"), std::string::npos) << s;
  s = a->Merge({no_id}, T(0));
  EXPECT_NE(s.message().find("empty id"), std::string::npos) << s;
  s = a->Merge({negative}, T(0));
  EXPECT_NE(s.message().find("incarnation"), std::string::npos) << s;

  // Rounds a peer names must leave room for arithmetic on them.
  MemberEntry far = Entry("u", 1, MEMBER_ALIVE);
  far.set_round(kMaxRound + 1);
  s = a->Merge({far}, T(0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("round 1099511627777 is out of range [0, "
                             "1099511627776]"),
            std::string::npos)
      << s;
  far.set_round(-1);
  EXPECT_EQ(a->Merge({far}, T(0)).code(), absl::StatusCode::kInvalidArgument);
  far.set_round(kMaxRound);
  far.set_early_sync(kMaxRound + 2);
  s = a->Merge({far}, T(0));
  EXPECT_NE(s.message().find("early_sync 1099511627778 is out of range"),
            std::string::npos)
      << s;
  far.set_early_sync(kMaxRound + 1);
  EXPECT_TRUE(a->Merge({far}, T(0)).ok());
  EXPECT_EQ(a->Get("u")->round(), kMaxRound);
}

TEST(MembershipTest, RefusesIdsAndAddressesAPeerCouldAbuse) {
  // A peer's entries are stored, gossiped to everyone and logged: an id
  // that forges a log line, floods it, or breaks the specs' separators,
  // and an address or lineage that is not one printable token, are
  // refused; the good entry among them is merged.
  auto a = Make("a");
  const std::string huge(100000, 'x');
  std::vector<MemberEntry> bad = {
      Entry("n1\nE 12:00:00 forged line", 1, MEMBER_ALIVE),
      Entry(huge, 1, MEMBER_ALIVE), Entry("n1,n2", 1, MEMBER_ALIVE),
      Entry("n\xff", 1, MEMBER_ALIVE), Entry("sp ace", 1, MEMBER_ALIVE)};
  MemberEntry address = Entry("m", 1, MEMBER_ALIVE);
  address.set_address("127.0.0.1:7001\n");
  bad.push_back(address);
  MemberEntry long_address = Entry("l", 1, MEMBER_ALIVE);
  long_address.set_address(huge);
  bad.push_back(long_address);
  MemberEntry lineage = Entry("k", 1, MEMBER_ALIVE);
  lineage.set_lineage(huge);
  bad.push_back(lineage);
  for (const MemberEntry& e : bad) {
    absl::Status s = a->Merge({e, Entry("ok", 1, MEMBER_ALIVE)}, T(0));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << e.id();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s;
    EXPECT_LT(s.message().size(), 400u) << s;
  }
  EXPECT_EQ(Ids(a->Snapshot()), (std::vector<std::string>{"a", "ok"}));
  EXPECT_TRUE(CheckNodeId("starling-0").ok());
  EXPECT_TRUE(CheckNodeId("[::1]:7001").ok());
  EXPECT_TRUE(CheckNodeId(std::string(128, 'n')).ok());
  EXPECT_FALSE(CheckNodeId(std::string(129, 'n')).ok());
  EXPECT_FALSE(CheckNodeId("").ok());
}

TEST(MembershipTest, ConcurrentUseIsSafe) {
  auto a = Make("a"), b = Make("b");
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    for (int i = 0; i < 500; ++i) {
      b->Beat();
      ASSERT_TRUE(a->Merge(b->Snapshot(), T(i * 0.01)).ok());
    }
  });
  threads.emplace_back([&] {
    for (int i = 0; i < 500; ++i) {
      a->Beat();
      a->Tick(T(i * 0.01));
      ASSERT_TRUE(b->Merge(a->Snapshot(), T(i * 0.01)).ok());
      (void)a->Live();
    }
  });
  for (auto& t : threads) t.join();
  EXPECT_EQ(Row(*a, "b").heartbeat(), 500);
  EXPECT_EQ(StateOf(*a, "b"), MEMBER_ALIVE);
  EXPECT_EQ(Row(*b, "a").heartbeat(), 500);
}

}  // namespace
}  // namespace starling
