// Whom a gossip tick calls (GossipTargets), and what a waiting node says
// (JoinWaitLine, MembersWaitLine), without sockets.
#include "gossip/membership_gossip.h"

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace starling {
namespace {

using peer::v1::MemberEntry;

MemberEntry Entry(const std::string& id, peer::v1::MemberState state) {
  MemberEntry e;
  e.set_id(id);
  e.set_address(id + ":7000");
  e.set_state(state);
  return e;
}

bool NotSelf(const std::string&) { return false; }

TEST(GossipTargetsTest, TwoLiveMembersAndHalfTheTicksOneGoneOne) {
  const std::vector<MemberEntry> table = {
      Entry("me", peer::v1::MEMBER_ALIVE),  Entry("a", peer::v1::MEMBER_ALIVE),
      Entry("b", peer::v1::MEMBER_ALIVE),   Entry("c", peer::v1::MEMBER_ALIVE),
      Entry("d", peer::v1::MEMBER_SUSPECT), Entry("e", peer::v1::MEMBER_DEAD),
      Entry("f", peer::v1::MEMBER_LEFT)};
  const std::set<std::string> live = {"a:7000", "b:7000", "c:7000"};
  const std::set<std::string> gone = {"d:7000", "e:7000"};
  std::mt19937_64 rng(7);
  int with_gone = 0;
  std::set<std::string> called;
  for (int tick = 0; tick < 1000; ++tick) {
    std::vector<std::string> t = GossipTargets(table, "me", {}, NotSelf, rng);
    ASSERT_GE(t.size(), 2u);
    ASSERT_LE(t.size(), 3u);
    EXPECT_TRUE(live.count(t[0]) && live.count(t[1]) && t[0] != t[1]);
    if (t.size() == 3) {
      EXPECT_TRUE(gone.count(t[2])) << t[2];
      ++with_gone;
    }
    called.insert(t.begin(), t.end());
  }
  EXPECT_GT(with_gone, 400);
  EXPECT_LT(with_gone, 600);
  EXPECT_EQ(called.size(), 5u) << "each live and gone member, never self "
                                  "nor one that left";
}

TEST(GossipTargetsTest, WithNobodyLiveThreeGoneOnesAndOftenASeed) {
  const std::vector<MemberEntry> table = {
      Entry("me", peer::v1::MEMBER_ALIVE), Entry("a", peer::v1::MEMBER_DEAD),
      Entry("b", peer::v1::MEMBER_DEAD), Entry("c", peer::v1::MEMBER_SUSPECT),
      Entry("d", peer::v1::MEMBER_DEAD)};
  const std::vector<std::string> seeds = {"seed:1", "me.example:7000"};
  const auto self_seed = [](const std::string& s) {
    return s == "me.example:7000";
  };
  std::mt19937_64 rng(11);
  int seeded = 0;
  for (int tick = 0; tick < 1000; ++tick) {
    std::vector<std::string> t =
        GossipTargets(table, "me", seeds, self_seed, rng);
    ASSERT_GE(t.size(), 3u);
    EXPECT_EQ(std::set<std::string>(t.begin(), t.begin() + 3).size(), 3u);
    if (t.size() == 4) {
      EXPECT_EQ(t[3], "seed:1") << "never this node's own name";
      ++seeded;
    }
  }
  // Three ticks in ten pick a seed, half of them this node's own name.
  EXPECT_GT(seeded, 100);
  EXPECT_LT(seeded, 200);
}

TEST(GossipTargetsTest, ASeedThatIsALiveMembersAddressIsNotCalledTwice) {
  const std::vector<MemberEntry> table = {Entry("me", peer::v1::MEMBER_ALIVE),
                                          Entry("a", peer::v1::MEMBER_ALIVE)};
  std::mt19937_64 rng(3);
  for (int tick = 0; tick < 200; ++tick) {
    EXPECT_EQ(GossipTargets(table, "me", {"a:7000"}, NotSelf, rng),
              std::vector<std::string>{"a:7000"});
  }
}

// A joining node says whom it tries, how often, the last error and when it
// gives up, instead of a silent wait until --connect_timeout.
TEST(WaitLinesTest, AJoinerNamesItsPeersAndTheLastError) {
  EXPECT_EQ(JoinWaitLine({"10.0.0.1:7070", "b:7070"}, absl::Seconds(10), 7,
                         "b:7070: UNAVAILABLE: Connection refused",
                         absl::Seconds(50)),
            "joining the swarm through --peers=10.0.0.1:7070,b:7070: 7 "
            "attempts in 10s; last error: b:7070: UNAVAILABLE: Connection "
            "refused; giving up in 50s (--connect_timeout)");
}

TEST(WaitLinesTest, AQuorumWaitNamesWhoIsReadyAndWhoIsNot) {
  MemberEntry joining = Entry("c", peer::v1::MEMBER_ALIVE);
  joining.set_joining(true);
  const std::string line = MembersWaitLine(
      {Entry("a", peer::v1::MEMBER_ALIVE), Entry("b", peer::v1::MEMBER_ALIVE),
       joining, Entry("d", peer::v1::MEMBER_DEAD)},
      "a", 4, absl::Seconds(65), absl::Seconds(5));
  EXPECT_EQ(line,
            "waiting for 4 members (--min_members) for 1m05s: 2 ready (a, b); "
            "not ready: c still joining at c:7000, d dead at d:7000; giving "
            "up in 5s (--connect_timeout)");
}

}  // namespace
}  // namespace starling
