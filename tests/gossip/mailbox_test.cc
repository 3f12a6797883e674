#include "gossip/mailbox.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "gtest/gtest.h"

namespace starling {
namespace {

MailboxOptions Options() {
  MailboxOptions o;
  o.rank = 1;
  o.world = 3;
  o.run_id = "r";
  o.tensors = {{"pseudo_grad", 10}};
  return o;
}

Message Good(int64_t round = 0) {
  Message m;
  m.from = 0;
  m.round = round;
  m.tensor = "pseudo_grad";
  m.phase = RingPhase::kReduceScatter;
  m.step = 0;
  m.segment = 0;  // 10 elements over 3: 4, 3, 3
  m.total_elements = 10;
  m.payload.assign(4 * 4, '\0');
  return m;
}

TEST(SegmentTest, SplitsCoverTheWholeTensor) {
  for (int parts : {1, 2, 3, 7}) {
    for (int64_t total : {0, 1, 5, 10, 1001}) {
      int64_t sum = 0;
      for (int s = 0; s < parts; ++s) {
        EXPECT_EQ(SegmentOffset(total, parts, s), sum);
        sum += SegmentLength(total, parts, s);
      }
      EXPECT_EQ(sum, total);
    }
  }
}

TEST(MailboxTest, DeliversAndTakes) {
  Mailbox box(Options());
  ASSERT_TRUE(box.Deliver(Good()).ok());
  auto m = box.Take(0, 0, "pseudo_grad", RingPhase::kReduceScatter, 0,
                    absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->payload.size(), 16u);
}

TEST(MailboxTest, RejectsBadMessagesNamingTheProblem) {
  struct Case {
    std::function<void(Message*)> mutate;
    absl::StatusCode code;
    const char* mention;
  };
  std::vector<Case> cases = {
      {[](Message* m) { m->payload.resize(12); },
       absl::StatusCode::kInvalidArgument, "expected 16"},
      {[](Message* m) { m->tensor = "weights"; },
       absl::StatusCode::kInvalidArgument, "unknown tensor 'weights'"},
      {[](Message* m) { m->total_elements = 11; },
       absl::StatusCode::kInvalidArgument, "11 elements"},
      {[](Message* m) {
         float nan = std::numeric_limits<float>::quiet_NaN();
         std::memcpy(&m->payload[8], &nan, 4);
       },
       absl::StatusCode::kInvalidArgument, "non-finite"},
      {[](Message* m) {
         float inf = std::numeric_limits<float>::infinity();
         std::memcpy(&m->payload[0], &inf, 4);
       },
       absl::StatusCode::kInvalidArgument, "non-finite"},
      {[](Message* m) { m->from = 1; }, absl::StatusCode::kInvalidArgument,
       "sender rank"},
      {[](Message* m) { m->from = 7; }, absl::StatusCode::kInvalidArgument,
       "sender rank"},
      {[](Message* m) { m->segment = 3; }, absl::StatusCode::kInvalidArgument,
       "ring position"},
      {[](Message* m) { m->round = 5; }, absl::StatusCode::kFailedPrecondition,
       "ahead"},
  };
  for (const Case& c : cases) {
    Mailbox box(Options());
    Message m = Good();
    c.mutate(&m);
    absl::Status s = box.Deliver(m);
    EXPECT_EQ(s.code(), c.code) << c.mention << ": " << s;
    EXPECT_NE(s.message().find(c.mention), std::string::npos) << s;
  }
}

TEST(MailboxTest, StaleRoundsAndDuplicatesAreRefused) {
  Mailbox box(Options());
  box.AdvanceRound(3);
  absl::Status s = box.Deliver(Good(2));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("stale round 2"), std::string::npos);
  ASSERT_TRUE(box.Deliver(Good(4)).ok());  // one round ahead is buffered
  EXPECT_TRUE(absl::IsFailedPrecondition(box.Deliver(Good(4))));
}

TEST(MailboxTest, TakeFailsFastOnARejectedSenderAndTimesOut) {
  Mailbox box(Options());
  Message bad = Good();
  bad.payload.resize(3);
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(50));
    (void)box.Deliver(bad);
  });
  auto start = absl::Now();
  auto m = box.Take(0, 0, "pseudo_grad", RingPhase::kReduceScatter, 0,
                    absl::Now() + absl::Seconds(30));
  t.join();
  EXPECT_TRUE(absl::IsInvalidArgument(m.status())) << m.status();
  EXPECT_NE(m.status().message().find("rank 0"), std::string::npos);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));

  auto late = box.Take(2, 0, "pseudo_grad", RingPhase::kAllGather, 1,
                       absl::Now() + absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(late.status())) << late.status();
}

}  // namespace
}  // namespace starling
