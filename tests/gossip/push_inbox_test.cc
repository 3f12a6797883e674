// The push-sum inbox: places reserved by streams, filled or given back.
#include "gossip/push_inbox.h"

#include <vector>

#include "gtest/gtest.h"

namespace starling {
namespace {

ReceivedPush From(const std::string& id) {
  ReceivedPush p;
  p.from = id;
  return p;
}

TEST(PushInboxTest, StreamsHoldTheirPlaceUntilTheyEnd) {
  PushInbox inbox(2);
  const int64_t a = inbox.Reserve();
  const int64_t b = inbox.Reserve();
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  EXPECT_EQ(inbox.Reserve(), -1) << "full while two stream in";
  inbox.End(a, nullptr);  // a stream that failed gives its place back
  const int64_t c = inbox.Reserve();
  ASSERT_GE(c, 0);
  ReceivedPush pc = From("c"), pb = From("b");
  inbox.End(c, &pc);
  inbox.End(b, &pb);
  EXPECT_EQ(inbox.Reserve(), -1) << "full while two wait";
  ReceivedPush again = From("again");
  inbox.End(c, &again);  // ended already: ignored
  std::vector<ReceivedPush> taken = inbox.Take();
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].from, "c");
  EXPECT_EQ(taken[1].from, "b");
  EXPECT_TRUE(inbox.Take().empty());
  EXPECT_GE(inbox.Reserve(), 0);
}

TEST(PushInboxTest, HoldsAtLeastOne) {
  PushInbox inbox(0);
  EXPECT_GE(inbox.Reserve(), 0);
  EXPECT_EQ(inbox.Reserve(), -1);
}

}  // namespace
}  // namespace starling
