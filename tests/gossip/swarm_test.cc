// In-process swarms on loopback. The start barrier: JoinSwarm, then
// SetProgress(joining = false), then WaitForMembers. A member counts for the
// others only once it is ready, and still counts after it leaves, so that a
// slow joiner and a fast finisher cannot strand each other. And the state a
// member serves to joiners (ServeState, FetchState). Also: the member
// table's cap, control messages from strangers, the copies of lossy
// senders' pushes, dropped when a sender leaves, and the advertised address
// (a member behind a port forward).
#include "gossip/swarm.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compression/tensor_policy.h"
#include "core/flat_params.h"
#include "gossip/push_sum.h"
#include "gossip/reachability.h"
#include "gtest/gtest.h"
#include "starling/peer/v1/swarm.grpc.pb.h"
#include "tests/harness/tcp_forward.h"
#include "tests/harness/wait.h"

namespace starling {
namespace {

SwarmOptions TestOptions(const std::string& id,
                         const std::vector<std::string>& seeds,
                         const std::string& listen = "127.0.0.1:0") {
  SwarmOptions o;
  o.node_id = id;
  o.listen = listen;
  o.seeds = seeds;
  o.identity.run_id = "barrier";
  o.identity.algo = "gossip";
  o.identity.model = MakeFingerprint("mlp(x)", 10, "abc");
  o.gossip_interval = absl::Milliseconds(50);
  o.suspect_after = absl::Seconds(30);
  return o;
}

std::unique_ptr<Swarm> Start(const SwarmOptions& o) {
  absl::StatusOr<std::unique_ptr<Swarm>> s = Swarm::Start(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(s).value() : nullptr;
}

std::unique_ptr<Swarm> StartSwarm(const std::string& id,
                                  const std::vector<std::string>& seeds,
                                  const std::string& listen = "127.0.0.1:0") {
  return Start(TestOptions(id, seeds, listen));
}

// StartSwarm, then JoinSwarm through `seeds` (null when either fails).
std::unique_ptr<Swarm> StartJoined(const std::string& id,
                                   const std::vector<std::string>& seeds,
                                   const std::string& listen = "127.0.0.1:0") {
  std::unique_ptr<Swarm> s = StartSwarm(id, seeds, listen);
  if (s == nullptr) return nullptr;
  absl::Status joined = s->JoinSwarm(absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(joined.ok()) << id << ": " << joined;
  return joined.ok() ? std::move(s) : nullptr;
}

// StartJoined, then SetProgress(round, no lineage, not joining).
std::unique_ptr<Swarm> StartReady(const std::string& id,
                                  const std::vector<std::string>& seeds,
                                  int64_t round,
                                  const std::string& listen = "127.0.0.1:0") {
  std::unique_ptr<Swarm> s = StartJoined(id, seeds, listen);
  if (s != nullptr) s->SetProgress({round, ""}, /*joining=*/false);
  return s;
}

// The state of `id` in `s`'s view ("" when unknown), with " joining" when
// it is still joining.
std::string Seen(const Swarm& s, const std::string& id) {
  for (const peer::v1::MemberEntry& e : s.Members()) {
    if (e.id() != id) continue;
    return absl::StrCat(MemberStateName(e.state()),
                        e.joining() ? " joining" : "");
  }
  return "";
}

// Whether `s` sees `id` as `want` within 20 s.
bool SeenWithin(const Swarm& s, const std::string& id,
                const std::string& want) {
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (Seen(s, id) != want && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  return Seen(s, id) == want;
}

// n0 and n1 at round 0 (n1 joined through n0), each seeing the other alive.
void StartPair(std::unique_ptr<Swarm>* a, std::unique_ptr<Swarm>* b) {
  *a = StartReady("n0", {}, 0);
  ASSERT_NE(*a, nullptr);
  *b = StartReady("n1", {(*a)->address()}, 0);
  ASSERT_NE(*b, nullptr);
  ASSERT_TRUE(SeenWithin(**a, "n1", "alive"));
  ASSERT_TRUE(SeenWithin(**b, "n0", "alive"));
}

// What RoundOnBoth returns: each node's SyncRound result, and when `a`'s
// returned.
struct BothRounds {
  absl::StatusOr<Swarm::RoundResult> a, b;
  absl::Time a_returned;
};

// Runs SyncRound(0) on `a` (on this thread) and `b` (on another) at once.
BothRounds RoundOnBoth(Swarm& a, const Swarm::Reduce& a_reduce, Swarm& b,
                       const Swarm::Reduce& b_reduce,
                       const std::function<bool()>& stop) {
  std::future<absl::StatusOr<Swarm::RoundResult>> b_round = std::async(
      std::launch::async, [&] { return b.SyncRound({}, b_reduce, stop); });
  BothRounds r{a.SyncRound({}, a_reduce, stop), absl::UnknownError(""),
               absl::Now()};
  r.b = b_round.get();
  return r;
}

// A reduce that does nothing, and a `stop` that never says stop.
absl::Status NoOp(Transport&, int64_t, const std::vector<std::string>&) {
  return absl::OkStatus();
}
bool Never() { return false; }

// Sends round message `m` to the Swarm service at `address` as run
// "barrier" (a member, or someone forging one), and returns the ack.
peer::v1::ControlAck SendControlTo(const std::string& address,
                                   peer::v1::ControlMessage m) {
  auto stub = peer::v1::Swarm::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  m.set_run_id("barrier");
  peer::v1::ControlAck ack;
  grpc::Status s = stub->Control(&ctx, m, &ack);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return ack;
}

// A READY from `from` for `round`.
peer::v1::ControlMessage Ready(const std::string& from, int64_t round) {
  peer::v1::ControlMessage m;
  m.set_from(from);
  m.set_kind(peer::v1::ControlMessage::READY);
  m.set_round(round);
  return m;
}

bool Ready(std::future<absl::Status>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

TEST(SwarmTest, OnlyReadyMembersCountAndOneThatLeftReadyStillCounts) {
  std::unique_ptr<Swarm> a = StartReady("n0", {}, 0);
  ASSERT_NE(a, nullptr);
  std::unique_ptr<Swarm> b = StartReady("n2", {a->address()}, 0);
  ASSERT_NE(b, nullptr);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::future<absl::Status> wait_a = std::async(
      std::launch::async, [&] { return a->WaitForMembers(3, deadline); });
  std::future<absl::Status> wait_b = std::async(
      std::launch::async, [&] { return b->WaitForMembers(3, deadline); });

  // n1 has started, so its gossip reaches the others, but it has not joined.
  std::unique_ptr<Swarm> c = StartSwarm("n1", {a->address()});
  ASSERT_NE(c, nullptr);
  const absl::Time seen_by = absl::Now() + absl::Seconds(20);
  while ((Seen(*a, "n1") != "alive joining" ||
          Seen(*b, "n1") != "alive joining") &&
         absl::Now() < seen_by) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(Seen(*a, "n1"), "alive joining");
  ASSERT_EQ(Seen(*b, "n1"), "alive joining");
  absl::SleepFor(absl::Milliseconds(500));  // many gossip rounds
  EXPECT_FALSE(Ready(wait_a)) << "n0 counted n1 before it joined";
  EXPECT_FALSE(Ready(wait_b)) << "n2 counted n1 before it joined";

  // n1 joins, passes the barrier at once (it sees n0 and n2 ready), and
  // leaves at once, before its gossip can tell them it was ready: its LEFT
  // entry says so.
  ASSERT_TRUE(c->JoinSwarm(absl::Now() + absl::Seconds(10)).ok());
  c->SetProgress({0, ""}, /*joining=*/false);
  ASSERT_TRUE(c->WaitForMembers(3, absl::Now() + absl::Seconds(10)).ok());
  c->Leave();
  EXPECT_TRUE(wait_a.get().ok());
  EXPECT_TRUE(wait_b.get().ok());
  EXPECT_EQ(Seen(*a, "n1"), "left");

  // A member that left before it was ready does not count.
  std::unique_ptr<Swarm> d = StartSwarm("n3", {a->address()});
  ASSERT_NE(d, nullptr);
  ASSERT_TRUE(d->JoinSwarm(absl::Now() + absl::Seconds(10)).ok());
  d->Leave();
  absl::Status four = a->WaitForMembers(4, absl::Now() + absl::Seconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(four)) << four;
  EXPECT_NE(four.message().find("only 3 are ready"), std::string::npos) << four;
  EXPECT_NE(four.message().find("n3 left"), std::string::npos) << four;
}

// A state whose θ holds `value` everywhere (with its hash, which the joiner
// checks).
SwarmState StateAt(int64_t round, float value) {
  SwarmState s;
  s.round = round;
  s.step = round * 10;
  s.theta.assign(5000, value);
  s.lineage = FlatHash(s.theta);
  s.member_rounds = 3 * round;  // three members in every round
  s.outer_state = absl::StrCat("momentum of round ", round);
  return s;
}

TEST(SwarmTest, ServesItsNewestStateAndRefusesARoundItHasNotReachedOrLost) {
  std::unique_ptr<Swarm> donor = StartReady("n0", {}, 4);
  ASSERT_NE(donor, nullptr);
  std::unique_ptr<Swarm> joiner = StartJoined("n1", {donor->address()});
  ASSERT_NE(joiner, nullptr);

  // Nothing served yet.
  EXPECT_EQ(donor->ServedRound(), -1);
  absl::StatusOr<SwarmState> none = joiner->FetchState(
      {"n0"}, nullptr, absl::Now() + absl::Seconds(10), nullptr);
  ASSERT_TRUE(absl::IsUnavailable(none.status())) << none.status();
  EXPECT_NE(none.status().message().find("no committed state"),
            std::string::npos)
      << none.status();

  // The newer state wins, and the served round never goes back.
  donor->ServeState(StateAt(3, 1.5f));
  donor->ServeState(StateAt(4, 2.5f));
  int64_t seen = -1;
  const absl::Time by = absl::Now() + absl::Seconds(30);
  while (seen != 4 && absl::Now() < by) {
    const int64_t now = donor->ServedRound();
    ASSERT_GE(now, seen);
    ASSERT_TRUE(now == -1 || now == 3 || now == 4) << now;
    seen = now;
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(seen, 4);
  const SwarmState want = StateAt(4, 2.5f);
  Swarm::Lineage best{4, want.lineage, want.member_rounds, {"n0"}};
  Swarm::FetchStats stats;
  absl::StatusOr<SwarmState> got = joiner->FetchState(
      {"n0"}, &best, absl::Now() + absl::Seconds(10), &stats);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->round, 4);
  EXPECT_EQ(got->step, 40);
  EXPECT_EQ(got->lineage, want.lineage);
  EXPECT_EQ(got->member_rounds, want.member_rounds);
  EXPECT_EQ(got->theta, want.theta);
  EXPECT_EQ(got->outer_state, want.outer_state);
  EXPECT_GT(stats.bytes, 0);

  // A joiner that wants round 6 is refused before any byte moves, and that
  // is no failed transfer.
  Swarm::Lineage ahead{6, "", 0, {"n0"}};
  stats = Swarm::FetchStats();
  absl::StatusOr<SwarmState> early = joiner->FetchState(
      {"n0"}, &ahead, absl::Now() + absl::Seconds(10), &stats);
  ASSERT_TRUE(absl::IsUnavailable(early.status())) << early.status();
  EXPECT_NE(early.status().message().find("serves round 4, not yet round 6"),
            std::string::npos)
      << early.status();
  EXPECT_EQ(stats.bytes, 0);
  EXPECT_EQ(stats.retries, 0);

  // Round 4 of a lineage that wins over the served one (after a partition):
  // refused at once as well. As heavy, "0" sorts before any longer hash;
  // heavier, "zzzz" wins too.
  ASSERT_NE(want.lineage, "0");
  for (const Swarm::Lineage& other :
       {Swarm::Lineage{4, "0", want.member_rounds, {"n0"}},
        Swarm::Lineage{4, "zzzz", want.member_rounds + 1, {"n0"}}}) {
    stats = Swarm::FetchStats();
    absl::StatusOr<SwarmState> lost = joiner->FetchState(
        {"n0"}, &other, absl::Now() + absl::Seconds(10), &stats);
    ASSERT_TRUE(absl::IsUnavailable(lost.status())) << lost.status();
    EXPECT_NE(lost.status().message().find(
                  absl::StrCat("serves round 4 of lineage ", want.lineage,
                               ", not ", other.lineage)),
              std::string::npos)
        << lost.status();
    EXPECT_EQ(stats.bytes, 0);
    EXPECT_EQ(stats.retries, 0);
  }
  // A lighter lineage loses to the served one, whatever its hash: served.
  Swarm::Lineage lighter{4, "0", want.member_rounds - 1, {"n0"}};
  got = joiner->FetchState({"n0"}, &lighter, absl::Now() + absl::Seconds(10),
                           nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->lineage, want.lineage);
}

// Each state is encoded only when a joiner asks for it: joiners that ask at
// once all wait for the one encoding and get the same state, and a state
// handed over later replaces it for the next joiner.
TEST(SwarmTest, JoinersAskingAtOnceShareOneEncodingOfTheNewestState) {
  std::unique_ptr<Swarm> donor = StartReady("n0", {}, 4);
  ASSERT_NE(donor, nullptr);
  std::vector<std::unique_ptr<Swarm>> joiners;
  for (const char* id : {"n1", "n2", "n3"}) {
    joiners.push_back(StartJoined(id, {donor->address()}));
    ASSERT_NE(joiners.back(), nullptr);
  }
  donor->ServeState(StateAt(4, 2.5f));
  EXPECT_EQ(donor->ServedRound(), 4);
  std::vector<std::future<absl::StatusOr<SwarmState>>> got;
  for (auto& j : joiners) {
    Swarm* joiner = j.get();
    got.push_back(std::async(std::launch::async, [joiner] {
      return joiner->FetchState({"n0"}, nullptr,
                                absl::Now() + absl::Seconds(30), nullptr);
    }));
  }
  const SwarmState want = StateAt(4, 2.5f);
  for (auto& f : got) {
    absl::StatusOr<SwarmState> s = f.get();
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->round, 4);
    EXPECT_EQ(s->theta, want.theta);
    EXPECT_EQ(s->outer_state, want.outer_state);
  }

  donor->ServeState(StateAt(5, 3.5f));
  absl::StatusOr<SwarmState> next = joiners[0]->FetchState(
      {"n0"}, nullptr, absl::Now() + absl::Seconds(30), nullptr);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->round, 5);
  EXPECT_EQ(next->theta, StateAt(5, 3.5f).theta);
}

// A donor that died (still listed as alive) is a failed donor; a caller
// that tries again after every donor failed gets one account of the whole
// transfer, the failed call included.
TEST(SwarmTest, FetchStatsAddUpAcrossAFailedCallAndTheNextOne) {
  std::unique_ptr<Swarm> donor = StartReady("n0", {}, 4);
  ASSERT_NE(donor, nullptr);
  std::unique_ptr<Swarm> dead = StartReady("n1", {donor->address()}, 4);
  ASSERT_NE(dead, nullptr);
  std::unique_ptr<Swarm> joiner = StartJoined("n2", {donor->address()});
  ASSERT_NE(joiner, nullptr);
  const absl::Time seen_by = absl::Now() + absl::Seconds(20);
  while (Seen(*joiner, "n1") != "alive" && absl::Now() < seen_by) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(Seen(*joiner, "n1"), "alive");
  dead->Shutdown();  // no goodbye: it stays alive in the others' view
  donor->ServeState(StateAt(4, 2.5f));
  while (donor->ServedRound() != 4 && absl::Now() < seen_by) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(donor->ServedRound(), 4);

  // n1 fails (a retry), n0 has not reached round 5 (a refusal): no state.
  Swarm::FetchStats stats;
  Swarm::Lineage ahead{5, "", 0, {"n1", "n0"}};
  absl::StatusOr<SwarmState> failed = joiner->FetchState(
      ahead.donors, &ahead, absl::Now() + absl::Seconds(10), &stats);
  ASSERT_TRUE(absl::IsUnavailable(failed.status())) << failed.status();
  EXPECT_EQ(stats.retries, 1);
  EXPECT_EQ(stats.bytes, 0);
  EXPECT_EQ(stats.donor, "");

  Swarm::Lineage best{4, "", 0, {"n0"}};
  absl::StatusOr<SwarmState> got = joiner->FetchState(
      best.donors, &best, absl::Now() + absl::Seconds(10), &stats);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->round, 4);
  EXPECT_EQ(stats.donor, "n0");
  EXPECT_EQ(stats.retries, 1);
  EXPECT_GT(stats.bytes, 0);
  EXPECT_GT(stats.seconds, 0);
}

// Whether `s` sees member `id` at `at` within 20 s.
bool ProgressSeenWithin(const Swarm& s, const std::string& id,
                        const Swarm::Lineage& at) {
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (absl::Now() < until) {
    for (const peer::v1::MemberEntry& e : s.Members()) {
      if (e.id() == id && e.round() == at.round && e.lineage() == at.lineage &&
          e.member_rounds() == at.member_rounds) {
        return true;
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// A pair of members (StartPair), n0 at `at_a` and n1 at `at_b`, each
// having seen the other's progress.
void StartPairAt(const Swarm::Lineage& at_a, const Swarm::Lineage& at_b,
                 std::unique_ptr<Swarm>* a, std::unique_ptr<Swarm>* b) {
  ASSERT_NO_FATAL_FAILURE(StartPair(a, b));
  (*a)->SetProgress(at_a, /*joining=*/false);
  (*b)->SetProgress(at_b, /*joining=*/false);
  ASSERT_TRUE(ProgressSeenWithin(**a, "n1", at_b));
  ASSERT_TRUE(ProgressSeenWithin(**b, "n0", at_a));
}

// The ids of `entries`, joined by commas.
std::string Ids(const std::vector<peer::v1::MemberEntry>& entries) {
  std::vector<std::string> ids;
  for (const peer::v1::MemberEntry& e : entries) ids.push_back(e.id());
  return absl::StrJoin(ids, ",");
}

// A member done with its run stays for those it sees behind it: at an
// earlier round, or at its own round on a worse lineage (a larger hash: the
// other side of a partition that healed as both finished). One on a better
// lineage is not behind: it is this member that fetches its state (Best).
TEST(SwarmTest, BehindMeansAnEarlierRoundOrAWorseLineageAtTheSameRound) {
  const Swarm::Lineage at_a{5, "aaaa", 10}, at_b{5, "bbbb", 10};
  std::unique_ptr<Swarm> a, b;
  ASSERT_NO_FATAL_FAILURE(StartPairAt(at_a, at_b, &a, &b));
  EXPECT_EQ(Ids(a->Behind(at_a)), "n1");
  EXPECT_EQ(Ids(b->Behind(at_b)), "");
  EXPECT_FALSE(Swarm::Ahead(a->Best(), at_a));
  EXPECT_TRUE(Swarm::Ahead(b->Best(), at_b));
  EXPECT_EQ(b->Best().lineage, "aaaa");
  EXPECT_EQ(b->Best().member_rounds, 10);
  // A later round outranks any hash and weight, and the same lineage is not
  // behind.
  EXPECT_EQ(Ids(b->Behind({6, "zzzz", 0})), "n0");
  EXPECT_EQ(Ids(a->Behind({4, "0000", 99})), "");
  EXPECT_EQ(Ids(a->Behind(at_b)), "");
}

// At the same round the heavier lineage wins whatever its hash: after a
// member ran a round apart (falsely suspected) while the rest ran it
// together, the rest's θ_global is kept, not the one of the smaller hash.
TEST(SwarmTest, AtTheSameRoundTheHeavierLineageIsAhead) {
  // n0 ran round 4 alone (9 + 1), n1 with two others (9 + 3).
  const Swarm::Lineage alone{5, "aaaa", 10}, together{5, "bbbb", 12};
  std::unique_ptr<Swarm> a, b;
  ASSERT_NO_FATAL_FAILURE(StartPairAt(alone, together, &a, &b));
  EXPECT_TRUE(Swarm::Ahead(a->Best(), alone));
  EXPECT_EQ(a->Best().lineage, "bbbb");
  EXPECT_EQ(a->Best().member_rounds, 12);
  EXPECT_FALSE(Swarm::Ahead(b->Best(), together));
  EXPECT_EQ(Ids(b->Behind(together)), "n0");
  EXPECT_EQ(Ids(a->Behind(alone)), "");

  // The order itself: round, then weight, then the smaller hash; one hash
  // is one lineage whatever weight is claimed for it, and a member with no
  // lineage yet is on no other.
  EXPECT_TRUE(Swarm::Ahead({6, "zzzz", 0}, {5, "aaaa", 99}));
  EXPECT_TRUE(Swarm::Ahead({5, "zzzz", 11}, {5, "aaaa", 10}));
  EXPECT_FALSE(Swarm::Ahead({5, "aaaa", 10}, {5, "zzzz", 11}));
  EXPECT_TRUE(Swarm::Ahead({5, "aaaa", 10}, {5, "zzzz", 10}));
  EXPECT_FALSE(Swarm::Ahead({5, "zzzz", 10}, {5, "aaaa", 10}));
  EXPECT_FALSE(Swarm::Ahead({5, "aaaa", 99}, {5, "aaaa", 10}));
  EXPECT_FALSE(Swarm::Ahead({5, "aaaa", 10}, {5, "", 0}));
  EXPECT_FALSE(Swarm::Ahead({5, "", 99}, {5, "aaaa", 10}));
}

// A member that restarts at the same address while the coordinator's
// channel to it is in reconnect backoff (its last attempts were refused
// while it was down) still takes part in the next round: the plan waits
// for the channel to connect instead of failing at once, which left the
// member out and aborted the attempt (NetemTest hit that when a node
// started listening a moment after its peers first dialled it).
TEST(SwarmTest, AMemberBackAtItsAddressIsInTheNextRoundsFirstAttempt) {
  std::unique_ptr<Swarm> a = StartReady("n0", {}, 0);
  ASSERT_NE(a, nullptr);
  std::unique_ptr<Swarm> b = StartReady("n1", {a->address()}, 0);
  ASSERT_NE(b, nullptr);
  const std::string b_address = b->address();
  ASSERT_TRUE(SeenWithin(*a, "n1", "alive"));
  b->Shutdown();  // no goodbye: n0 keeps gossiping to it, refused
  b.reset();
  // Long enough for n0's backoff to reach its cap of about a second, so
  // that its channel stays refused for up to that long after n1 is back.
  absl::SleepFor(kMaxReconnectBackoff * 4);
  ASSERT_EQ(Seen(*a, "n1"), "alive");  // suspect_after is 30 s

  b = StartReady("n1", {a->address()}, 0, b_address);
  ASSERT_NE(b, nullptr);
  BothRounds r = RoundOnBoth(*a, NoOp, *b, NoOp, Never);
  ASSERT_TRUE(r.a.ok()) << r.a.status();
  ASSERT_TRUE(r.b.ok()) << r.b.status();
  for (const Swarm::RoundResult* res : {&*r.a, &*r.b}) {
    EXPECT_EQ(res->outcome, Swarm::Outcome::kCommitted);
    EXPECT_EQ(res->attempt, 1) << "the first plan did not reach n1";
    EXPECT_EQ(res->members, (std::vector<std::string>{"n0", "n1"}));
  }
}

// Attempts of one round that fail at once, every time (a link too slow for
// the round's deadline, say), are retried: the first retry at once, then
// after 100 ms, doubling. Before, the coordinator replanned at once every
// time: thousands of attempts (and log lines) a minute. And a member told
// to stop leaves the round although plans keep coming.
TEST(SwarmTest, AttemptsThatKeepFailingAreRetriedWithBackoff) {
  std::unique_ptr<Swarm> a, b;
  ASSERT_NO_FATAL_FAILURE(StartPair(&a, &b));
  constexpr int kAttempts = 6;
  std::atomic<bool> stop{false};
  // Each node's reduce runs on its own SyncRound thread only.
  auto failing = [&stop](std::vector<absl::Time>* at) {
    return [&stop, at](Transport&, int64_t, const std::vector<std::string>&) {
      at->push_back(absl::Now());
      if (at->size() >= kAttempts) stop = true;
      return absl::UnavailableError("test: this attempt fails");
    };
  };
  const auto stopping = [&stop] { return stop.load(); };
  std::vector<absl::Time> a_at, b_at;
  BothRounds r = RoundOnBoth(*a, failing(&a_at), *b, failing(&b_at), stopping);
  ASSERT_TRUE(r.a.ok()) << r.a.status();
  ASSERT_TRUE(r.b.ok()) << r.b.status();
  EXPECT_EQ(r.a->outcome, Swarm::Outcome::kStopped);
  EXPECT_EQ(r.b->outcome, Swarm::Outcome::kStopped);
  // The first node to reach kAttempts stopped both; the other was told to
  // stop before it ran that last attempt, or just after. A gap is from one
  // attempt's start to the next's, so it includes the wait.
  const std::vector<absl::Time>& at = a_at.size() >= b_at.size() ? a_at : b_at;
  const std::vector<absl::Time>& other =
      a_at.size() >= b_at.size() ? b_at : a_at;
  ASSERT_EQ(at.size(), kAttempts);
  EXPECT_GE(other.size(), kAttempts - 1);
  for (int k = 2; k < kAttempts; ++k) {
    const absl::Duration wait = absl::Milliseconds(100) * (1 << (k - 2));
    EXPECT_GE(at[k] - at[k - 1], wait) << "before attempt " << k + 1;
  }
}

// Round control messages from ids that are not members, or that name one
// that is not, change nothing. Before, a DONE from a made-up id counted
// towards the commit (n0 committed while n1 was still reducing), a FAILED
// from one barred a real member from the round at no cost, a READY from
// one moved the coordinator to any round, and an ABORT from anyone called
// off a member's running attempt.
TEST(SwarmTest, ControlMessagesFromNonMembersChangeNothing) {
  std::unique_ptr<Swarm> a, b;
  ASSERT_NO_FATAL_FAILURE(StartPair(&a, &b));
  const auto forge = SendControlTo;
  auto message = [](peer::v1::ControlMessage::Kind kind,
                    const std::string& from, int64_t round) {
    peer::v1::ControlMessage m;
    m.set_kind(kind);
    m.set_from(from);
    m.set_round(round);
    m.set_attempt(1);
    return m;
  };
  absl::Time b_reduced = absl::InfiniteFuture();
  std::atomic<bool> b_cancelled{false};
  std::vector<peer::v1::ControlAck> acks;
  // n1 forges while its part of attempt 1 runs, then takes its time.
  const auto b_reduce = [&](Transport& t, int64_t,
                            const std::vector<std::string>&) {
    using K = peer::v1::ControlMessage;
    acks.push_back(forge(a->address(), message(K::DONE, "ghost", 0)));
    peer::v1::ControlMessage failed = message(K::FAILED, "ghost", 0);
    failed.set_culprit("n1");
    acks.push_back(forge(a->address(), failed));
    failed.set_from("n1");
    failed.set_culprit("ghost");
    acks.push_back(forge(a->address(), failed));
    acks.push_back(forge(a->address(), message(K::READY, "ghost", 1000)));
    (void)forge(b->address(), message(K::ABORT, "ghost", 0));
    absl::SleepFor(absl::Milliseconds(500));
    b_cancelled = t.mailbox().cancelled();
    b_reduced = absl::Now();
    return absl::OkStatus();
  };
  BothRounds r = RoundOnBoth(*a, NoOp, *b, b_reduce, Never);
  ASSERT_TRUE(r.a.ok()) << r.a.status();
  ASSERT_TRUE(r.b.ok()) << r.b.status();
  EXPECT_LE(b_reduced, r.a_returned) << "n0 committed before n1 was done";
  EXPECT_FALSE(b_cancelled.load()) << "a stranger's ABORT called n1 off";
  for (const Swarm::RoundResult* res : {&*r.a, &*r.b}) {
    EXPECT_EQ(res->outcome, Swarm::Outcome::kCommitted);
    EXPECT_EQ(res->attempt, 1);
    EXPECT_EQ(res->members, (std::vector<std::string>{"n0", "n1"}));
  }
  ASSERT_EQ(acks.size(), 4u);
  for (const peer::v1::ControlAck& ack : acks) {
    EXPECT_FALSE(ack.accepted());
    EXPECT_EQ(ack.reason(), "n0 knows no member \"ghost\"");
  }
}

TEST(SwarmTest, RoundMessagesWithNumbersOutOfRangeAreRefused) {
  // A member's round or attempt number out of the protocol's range is
  // refused, naming it: the coordinator adopts a READY's round and
  // last_attempt, and a member turns a PLAN's numbers into its mailbox
  // sequence, where INT32_MAX + 1 or 2^62 * 2^20 would overflow.
  std::unique_ptr<Swarm> a, b;
  ASSERT_NO_FATAL_FAILURE(StartPair(&a, &b));
  using K = peer::v1::ControlMessage;
  auto send = [](const std::string& address, const std::string& from,
                 K::Kind kind, int64_t round, int attempt, int last_attempt) {
    K m = Ready(from, round);
    m.set_kind(kind);
    m.set_attempt(attempt);
    m.set_last_attempt(last_attempt);
    return SendControlTo(address, m);
  };
  const int kMaxInt = std::numeric_limits<int>::max();
  const std::string to_n0 = "n0 refused a round message from \"n1\": ";
  const std::string to_n1 = "n1 refused a round message from \"n0\": ";
  struct Case {
    bool to_b;
    K::Kind kind;
    int64_t round;
    int attempt;
    int last_attempt;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {false, K::READY, kMaxRound + 1, 0, 0,
       to_n0 + "round 1099511627777 is out of range [0, 1099511627776]"},
      {false, K::READY, std::numeric_limits<int64_t>::max(), 0, 0,
       to_n0 + "round 9223372036854775807 is out of range [0, " +
           "1099511627776]"},
      {false, K::READY, -1, 0, 0,
       to_n0 + "round -1 is out of range [0, 1099511627776]"},
      {false, K::READY, 0, -1, 0,
       to_n0 + "attempt -1 is out of range [0, 1048575]"},
      {false, K::READY, 0, 0, kMaxClaimedAttempt + 1,
       to_n0 + "last_attempt 524289 is out of range [0, 524288]"},
      {false, K::READY, 0, 0, kMaxInt,
       to_n0 + "last_attempt 2147483647 is out of range [0, 524288]"},
      {false, K::DONE, 0, kAttemptsPerRound, 0,
       to_n0 + "attempt 1048576 is out of range [0, 1048575]"},
      {false, static_cast<K::Kind>(99), 0, 1, 0,
       "n0 refused a round message of unknown kind 99 from \"n1\""},
      {true, K::PLAN, 0, std::numeric_limits<int>::min(), 0,
       to_n1 + "attempt -2147483648 is out of range [0, 1048575]"},
      {true, K::COMMIT, kMaxRound + 5, 1, 0,
       to_n1 + "round 1099511627781 is out of range [0, 1099511627776]"},
  };
  const std::string long_lineage(129, 'f');
  for (const Case& c : cases) {
    peer::v1::ControlAck ack = c.to_b
                                   ? send(b->address(), "n0", c.kind, c.round,
                                          c.attempt, c.last_attempt)
                                   : send(a->address(), "n1", c.kind, c.round,
                                          c.attempt, c.last_attempt);
    EXPECT_FALSE(ack.accepted()) << c.reason;
    EXPECT_EQ(ack.reason(), c.reason);
  }
  // A READY's lineage goes into every plan: it must be a short token.
  for (const std::string& lineage : {long_lineage, std::string("ab\ncd")}) {
    K m = Ready("n1", 0);
    m.set_lineage(lineage);
    peer::v1::ControlAck ack = SendControlTo(a->address(), m);
    EXPECT_FALSE(ack.accepted());
    EXPECT_EQ(ack.reason().rfind(to_n0 + "lineage ", 0), 0u) << ack.reason();
  }
  // Only members' COMMIT, ABORT and STALE are held for the training thread.
  peer::v1::ControlAck ghost = send(b->address(), "ghost", K::COMMIT, 0, 1, 0);
  EXPECT_FALSE(ghost.accepted());
  EXPECT_EQ(ghost.reason(), "n1 knows no member \"ghost\"");

  // A burst of forged round messages under the coordinator's id is held
  // nowhere (each would have cost a round): none carries n1's round token.
  for (int i = 0; i < 100; ++i) {
    peer::v1::ControlAck stale = send(b->address(), "n0", K::STALE, 0, 1, 0);
    ASSERT_FALSE(stale.accepted());
    EXPECT_EQ(stale.reason(),
              "a STALE from \"n0\" without this node's round token");
  }

  // The highest claim allowed, from n1 itself, is taken: the round runs at
  // an attempt after it, and both members commit it.
  peer::v1::ControlAck claim =
      send(a->address(), "n1", K::READY, 0, 0, kMaxClaimedAttempt);
  EXPECT_FALSE(claim.accepted()) << "a forged claim";
  BothRounds r = RoundOnBoth(*a, NoOp, *b, NoOp, Never);
  ASSERT_TRUE(r.a.ok()) << r.a.status();
  ASSERT_TRUE(r.b.ok()) << r.b.status();
  for (const Swarm::RoundResult* res : {&*r.a, &*r.b}) {
    EXPECT_EQ(res->outcome, Swarm::Outcome::kCommitted);
    EXPECT_EQ(res->attempt, 1);
    EXPECT_EQ(res->members, (std::vector<std::string>{"n0", "n1"}));
  }
}

TEST(SwarmTest, AReadyFarAheadOfEveryOtherMemberDoesNotMoveTheCoordinator) {
  // Someone says n1 is ready for round 1000 while n0 and n1 are at round
  // 0. Taken on its word, the coordinator moved to round 1000: the
  // members' READY for round 0 then heard STALE, again and again, with
  // nobody ahead to catch up from. Now a READY under n1's id counts only
  // with n1's round token, which n1 proves when asked (and a READY that n1
  // itself sent that far ahead would be refused until another member is
  // there: RoundCoordinatorTest.RefusesAReadyAloneFarAhead); round 0
  // commits.
  std::unique_ptr<Swarm> a, b;
  ASSERT_NO_FATAL_FAILURE(StartPair(&a, &b));
  peer::v1::ControlAck ack = SendControlTo(a->address(), Ready("n1", 1000));
  EXPECT_FALSE(ack.accepted());
  EXPECT_EQ(ack.reason(), "a READY from \"n1\" carries no round token");
  peer::v1::ControlMessage guessed = Ready("n1", 1000);
  guessed.set_token(12345);
  ack = SendControlTo(a->address(), guessed);
  EXPECT_TRUE(ack.accepted()) << "held while n1 is asked";
  // Not even under the coordinator's own id.
  ack = SendControlTo(a->address(), Ready("n0", 1000));
  EXPECT_FALSE(ack.accepted());
  EXPECT_EQ(ack.reason(),
            "n0 refused a round message under its own id from another caller");

  BothRounds r = RoundOnBoth(*a, NoOp, *b, NoOp, Never);
  ASSERT_TRUE(r.a.ok()) << r.a.status();
  ASSERT_TRUE(r.b.ok()) << r.b.status();
  for (const Swarm::RoundResult* res : {&*r.a, &*r.b}) {
    EXPECT_EQ(res->outcome, Swarm::Outcome::kCommitted);
    EXPECT_EQ(res->attempt, 1);
    EXPECT_EQ(res->members, (std::vector<std::string>{"n0", "n1"}));
  }
  EXPECT_GE(a->refusals().at("control_refused"), 2);

  // A node alone, resumed at round 5, vouches for itself.
  std::unique_ptr<Swarm> alone = StartReady("solo", {}, 5);
  ASSERT_NE(alone, nullptr);
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  absl::StatusOr<Swarm::RoundResult> solo = alone->SyncRound(
      {5, ""}, NoOp, [give_up] { return absl::Now() > give_up; });
  ASSERT_TRUE(solo.ok()) << solo.status();
  EXPECT_EQ(solo->outcome, Swarm::Outcome::kCommitted);
  EXPECT_EQ(solo->members, (std::vector<std::string>{"solo"}));
}

// Round messages under members' ids from another caller change nothing:
// the coordinator's to a member must carry the member's round token, the
// member's to the coordinator too. Before, 20 forged STALEs from the
// coordinator's id cost a member 20 rounds, a forged PLAN with a high
// attempt number put it in an attempt nobody ran, a forged FAILED barred
// two members from the round, and a forged DONE counted towards a commit.
TEST(SwarmTest, ControlMessagesUnderMembersIdsChangeNothing) {
  std::unique_ptr<Swarm> a, b;
  ASSERT_NO_FATAL_FAILURE(StartPair(&a, &b));
  using K = peer::v1::ControlMessage;
  auto message = [](K::Kind kind, const std::string& from, int attempt) {
    K m = Ready(from, 0);
    m.set_kind(kind);
    m.set_attempt(attempt);
    m.set_token(0x1234);  // a guess
    return m;
  };
  // Before the round: a backlog of forged STALEs for it.
  for (int i = 0; i < 20; ++i) {
    EXPECT_FALSE(
        SendControlTo(b->address(), message(K::STALE, "n0", 0)).accepted());
  }
  absl::Time b_reduced = absl::InfiniteFuture();
  std::atomic<bool> b_cancelled{false};
  std::vector<peer::v1::ControlAck> acks;
  // While n1's part of attempt 1 runs, someone forges under n0's and n1's
  // ids; then n1 takes its time.
  const auto b_reduce = [&](Transport& t, int64_t,
                            const std::vector<std::string>&) {
    acks.push_back(SendControlTo(a->address(), message(K::DONE, "n1", 1)));
    K failed = message(K::FAILED, "n1", 1);
    failed.set_culprit("n0");
    acks.push_back(SendControlTo(a->address(), failed));
    for (K::Kind kind : {K::ABORT, K::STALE, K::COMMIT}) {
      acks.push_back(SendControlTo(b->address(), message(kind, "n0", 1)));
    }
    K plan = message(K::PLAN, "n0", 500000);
    plan.add_members("n1");
    plan.add_addresses(b->address());
    acks.push_back(SendControlTo(b->address(), plan));
    absl::SleepFor(absl::Milliseconds(500));
    b_cancelled = t.mailbox().cancelled();
    b_reduced = absl::Now();
    return absl::OkStatus();
  };
  BothRounds r = RoundOnBoth(*a, NoOp, *b, b_reduce, Never);
  ASSERT_TRUE(r.a.ok()) << r.a.status();
  ASSERT_TRUE(r.b.ok()) << r.b.status();
  EXPECT_LE(b_reduced, r.a_returned) << "n0 committed before n1 was done";
  EXPECT_FALSE(b_cancelled.load()) << "a forged message called n1 off";
  for (const Swarm::RoundResult* res : {&*r.a, &*r.b}) {
    EXPECT_EQ(res->outcome, Swarm::Outcome::kCommitted);
    EXPECT_EQ(res->attempt, 1);
    EXPECT_EQ(res->members, (std::vector<std::string>{"n0", "n1"}));
  }
  ASSERT_EQ(acks.size(), 6u);
  for (const peer::v1::ControlAck& ack : acks) {
    EXPECT_FALSE(ack.accepted());
    EXPECT_NE(ack.reason().find("round token"), std::string::npos)
        << ack.reason();
  }
  EXPECT_EQ(b->refusals().at("control_refused"), 24);
}

TEST(SwarmTest, AFullMemberTableRefusesJoinersButStillAnswersGossip) {
  SwarmOptions o = TestOptions("n0", {});
  o.max_members = 2;
  std::unique_ptr<Swarm> a = Start(o);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->JoinSwarm(absl::Now() + absl::Seconds(10)).ok());
  std::unique_ptr<Swarm> b = StartJoined("n1", {a->address()});
  ASSERT_NE(b, nullptr);

  // The joiner hears why.
  std::unique_ptr<Swarm> c = StartSwarm("n2", {a->address()});
  ASSERT_NE(c, nullptr);
  absl::Status joined = c->JoinSwarm(absl::Now() + absl::Seconds(2));
  EXPECT_FALSE(joined.ok());
  EXPECT_NE(joined.message().find("the table is full"), std::string::npos)
      << joined;
  EXPECT_NE(joined.message().find("\"n2\""), std::string::npos) << joined;

  // A member gossiping an entry n0 has no room for still gets n0's view.
  peer::v1::GossipRequest req;
  req.set_run_id("barrier");
  req.set_from("n1");
  peer::v1::MemberEntry* e = req.add_members();
  e->set_id("n3");
  e->set_address("127.0.0.1:1");
  e->set_incarnation(1);
  e->set_state(peer::v1::MEMBER_ALIVE);
  auto stub = peer::v1::Swarm::NewStub(
      grpc::CreateChannel(a->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  peer::v1::GossipResponse resp;
  grpc::Status s = stub->Gossip(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  std::vector<std::string> ids;
  for (const peer::v1::MemberEntry& m : resp.members()) ids.push_back(m.id());
  EXPECT_EQ(ids, (std::vector<std::string>{"n0", "n1"}));
  EXPECT_EQ(Seen(*a, "n3"), "");
}

// A receiver keeps a copy of each lossy sender's last push, which the
// sender's next push is relative to, and drops it once the sender has left
// or died: copies would otherwise grow with churn. A sender back under the
// same id then has its relative push refused (FailedPrecondition: it
// pushes in full next), where before it left the same kind of push was
// taken.
TEST(SwarmTest, ALeftSendersCopyIsDroppedSoItsRelativePushIsRefused) {
  PolicyOptions po;
  po.main = "int8";
  absl::StatusOr<std::unique_ptr<PolicyCodec>> codec =
      PolicyCodec::Create({10}, po);
  ASSERT_TRUE(codec.ok()) << codec.status();
  auto options = [&](const std::string& id,
                     const std::vector<std::string>& seeds) {
    SwarmOptions o = TestOptions(id, seeds);
    o.identity.compression = "int8";
    o.push_codec = codec->get();
    o.push_elements = 10;
    return o;
  };
  auto joined = [&](const std::string& id,
                    const std::vector<std::string>& seeds) {
    std::unique_ptr<Swarm> s = Start(options(id, seeds));
    if (s == nullptr) return s;
    absl::Status j = s->JoinSwarm(absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(j.ok()) << id << ": " << j;
    s->SetProgress({0, ""}, /*joining=*/false);
    return s;
  };
  std::unique_ptr<Swarm> a = joined("a", {});
  ASSERT_NE(a, nullptr);
  std::unique_ptr<Swarm> b = joined("b", {a->address()});
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(SeenWithin(*a, "b", "alive"));
  ASSERT_TRUE(SeenWithin(*b, "a", "alive"));

  PushSum sum;
  std::vector<float> y(10);
  for (int i = 0; i < 10; ++i) y[i] = 0.1f * static_cast<float>(i + 1);
  PublicCopy copy;  // b's last push to a, as both hold it
  // Pushes y (relative to `copy` once there is one) from `from` to a.
  auto push = [&](Swarm& from) {
    absl::StatusOr<PushShare> share =
        sum.Share(absl::MakeSpan(y), codec->get(), &copy);
    EXPECT_TRUE(share.ok()) << share.status();
    if (!share.ok()) return share.status();
    int64_t sequence = 0;
    absl::Status s = from.Push("a", *share, absl::Seconds(10), &sequence);
    if (s.ok()) {
      copy = PublicCopy{sequence, share->sent};
    } else {
      sum.Restore(*share, absl::MakeSpan(y));
    }
    return s;
  };
  absl::Status absolute = push(*b);  // a keeps a copy
  ASSERT_TRUE(absolute.ok()) << absolute;
  ASSERT_GT(copy.sequence, 0);
  absl::Status relative = push(*b);
  ASSERT_TRUE(relative.ok()) << relative;
  EXPECT_EQ(a->TakePushes().size(), 2u);

  b->Leave();
  ASSERT_TRUE(SeenWithin(*a, "b", "left"));
  b->Shutdown();
  std::unique_ptr<Swarm> back = joined("b", {a->address()});
  ASSERT_NE(back, nullptr);
  ASSERT_TRUE(SeenWithin(*back, "a", "alive"));
  absl::Status refused = push(*back);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_NE(refused.message().find("holds no copy of it"), std::string::npos)
      << refused;
  EXPECT_TRUE(a->TakePushes().empty());
}

// The address in `s`'s table for member `id` ("" when unknown).
std::string AddressSeen(const Swarm& s, const std::string& id) {
  for (const peer::v1::MemberEntry& e : s.Members()) {
    if (e.id() == id) return e.address();
  }
  return "";
}

// The reachability n1's row says its join's dial-back found ("" while
// `s` does not know n1).
std::string ReachabilitySeen(const Swarm& s, const std::string& id) {
  for (const peer::v1::MemberEntry& e : s.Members()) {
    if (e.id() == id) return ReachabilityName(e.reachability());
  }
  return "";
}

// The member that admits a join dials the joiner back at the address it
// advertises: one that listens there is reachable, one whose address
// refuses connections (as behind NAT) is not, and both it and the others
// learn so by gossip. The founder is never dialed back, but a joiner that
// reached it at its advertised address tells it so.
TEST(SwarmTest, TheDialBackAtJoinRecordsReachability) {
  std::unique_ptr<Swarm> a = StartReady("n0", {}, 0);
  ASSERT_NE(a, nullptr);
  std::unique_ptr<Swarm> b = StartJoined("n1", {a->address()});
  ASSERT_NE(b, nullptr);
  // n2 advertises a port nobody listens on (the forward's, before it has a
  // target: it accepts nothing once closed).
  std::string closed;
  {
    testing::TcpForward gone;
    closed = gone.address();
  }
  SwarmOptions o = TestOptions("n2", {a->address()});
  o.advertise = closed;
  std::unique_ptr<Swarm> c = Start(o);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->JoinSwarm(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(ReachabilitySeen(*b, "n1"), "reachable");
  EXPECT_EQ(ReachabilitySeen(*c, "n2"), "unreachable");
  EXPECT_EQ(ReachabilitySeen(*a, "n0"), "reachable");
  for (const Swarm* s : {a.get(), b.get()}) {
    EXPECT_TRUE(testing::WaitFor(
        [&] { return ReachabilitySeen(*s, "n2") == "unreachable"; },
        absl::Seconds(20)))
        << s->id() << ": " << ReachabilitySeen(*s, "n2");
  }
  EXPECT_TRUE(testing::WaitFor(
      [&] { return ReachabilitySeen(*a, "n1") == "reachable"; },
      absl::Seconds(20)));
}

// n1 listens on a port of its own but advertises a forwarded one: the
// others learn the forwarded address, and their dials (gossip) reach n1
// through the forward.
TEST(SwarmTest, PeersDialTheAdvertisedAddress) {
  testing::TcpForward forward;
  ASSERT_GT(forward.port(), 0);
  std::unique_ptr<Swarm> a = StartReady("n0", {}, 0);
  ASSERT_NE(a, nullptr);
  SwarmOptions o = TestOptions("n1", {a->address()});
  o.advertise = forward.address();
  std::unique_ptr<Swarm> b = Start(o);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->address(), forward.address());
  EXPECT_NE(b->listen_address(), forward.address());
  forward.SetTarget(b->listen_address());
  ASSERT_TRUE(b->JoinSwarm(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_TRUE(testing::WaitFor(
      [&] { return AddressSeen(*a, "n1") == forward.address(); },
      absl::Seconds(20)))
      << AddressSeen(*a, "n1");
  EXPECT_TRUE(testing::WaitFor([&] { return forward.connections() > 0; },
                               absl::Seconds(20)));
  EXPECT_TRUE(SeenWithin(*a, "n1", "alive joining"));
}

}  // namespace
}  // namespace starling
