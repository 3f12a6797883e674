#include "gossip/relay_plan.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

using ::testing::ElementsAre;

peer::v1::MemberEntry Member(const std::string& id, peer::v1::Reachability r,
                             peer::v1::MemberState s = peer::v1::MEMBER_ALIVE) {
  peer::v1::MemberEntry e;
  e.set_id(id);
  e.set_state(s);
  e.set_reachability(r);
  return e;
}

constexpr auto kUp = peer::v1::REACHABILITY_REACHABLE;
constexpr auto kNat = peer::v1::REACHABILITY_UNREACHABLE;
constexpr auto kUnknown = peer::v1::REACHABILITY_UNKNOWN;

TEST(RelayPlanTest, PicksTheLeastLoadedReachableLiveMember) {
  const std::vector<peer::v1::MemberEntry> table = {
      Member("a", kUp),      Member("b", kUp),
      Member("c", kUnknown), Member("d", kUp, peer::v1::MEMBER_SUSPECT),
      Member("n1", kNat),    Member("n2", kNat)};
  // Nobody relays yet: a or b (c was never checked, d is suspect), the
  // same each time for one member, and members choosing at once spread.
  std::map<std::string, int> chosen;
  for (int i = 0; i < 100; ++i) {
    const std::string self = "m" + std::to_string(i);
    const std::string relay = PickRelay(table, self, {});
    EXPECT_EQ(relay, PickRelay(table, self, {}));
    ++chosen[relay];
  }
  EXPECT_EQ(chosen.size(), 2u);
  EXPECT_GT(chosen["a"], 20);
  EXPECT_GT(chosen["b"], 20);
  // n2 relays through a: n1 takes b.
  EXPECT_EQ(PickRelay(table, "n1", {{"n2", "a"}}), "b");
  EXPECT_EQ(PickRelay(table, "n1", {{"n2", "b"}}), "a");
  // Its own old choice does not count against a relay.
  EXPECT_EQ(PickRelay(table, "n1", {{"n1", "a"}, {"n2", "b"}}), "a");
  // A relay that just failed is avoided.
  EXPECT_EQ(PickRelay(table, "n1", {}, {"a"}), "b");
  EXPECT_EQ(PickRelay(table, "n1", {}, {"b"}), "a");
  EXPECT_EQ(PickRelay(table, "n1", {}, {"a", "b"}), "");
  // A NATed member is never a relay, itself included.
  EXPECT_EQ(PickRelay({Member("n1", kNat), Member("n2", kNat)}, "n1", {}), "");
}

TEST(RelayPlanTest, RelayedMembersFollowTheirRelayInTheRing) {
  EXPECT_THAT(RelayRingOrder({"c", "a", "b"}, {}), ElementsAre("a", "b", "c"));
  // n2 relays through a, n3 through b: each right after its relay.
  EXPECT_THAT(
      RelayRingOrder({"n3", "b", "n2", "a"}, {{"n2", "a"}, {"n3", "b"}}),
      ElementsAre("a", "n2", "b", "n3"));
  // Two through one relay: after it, in id order.
  EXPECT_THAT(
      RelayRingOrder({"n3", "b", "n2", "a"}, {{"n2", "a"}, {"n3", "a"}}),
      ElementsAre("a", "n2", "n3", "b"));
  // A relay not in this round: the member keeps its sorted place.
  EXPECT_THAT(RelayRingOrder({"n2", "b", "a"}, {{"n2", "z"}}),
              ElementsAre("a", "b", "n2"));
}

}  // namespace
}  // namespace starling
