// The start barrier of in-process swarms on loopback: JoinSwarm, then
// SetProgress(joining = false), then WaitForMembers. A member counts for the
// others only once it is ready, and still counts after it leaves, so that a
// slow joiner and a fast finisher cannot strand each other.
#include "gossip/swarm.h"

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

std::unique_ptr<Swarm> StartSwarm(const std::string& id,
                                  const std::vector<std::string>& seeds) {
  SwarmOptions o;
  o.node_id = id;
  o.seeds = seeds;
  o.identity.run_id = "barrier";
  o.identity.algo = "gossip";
  o.identity.model = MakeFingerprint("mlp(x)", 10, "abc");
  o.gossip_interval = absl::Milliseconds(50);
  o.suspect_after = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<Swarm>> s = Swarm::Start(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(s).value() : nullptr;
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

bool Ready(std::future<absl::Status>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

TEST(SwarmTest, OnlyReadyMembersCountAndOneThatLeftReadyStillCounts) {
  std::unique_ptr<Swarm> a = StartSwarm("n0", {});
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->JoinSwarm(absl::Now() + absl::Seconds(10)).ok());
  a->SetProgress(0, "", /*joining=*/false);
  std::unique_ptr<Swarm> b = StartSwarm("n2", {a->address()});
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(b->JoinSwarm(absl::Now() + absl::Seconds(10)).ok());
  b->SetProgress(0, "", /*joining=*/false);
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
  c->SetProgress(0, "", /*joining=*/false);
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

}  // namespace
}  // namespace starling
