#include "gossip/mailbox.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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

std::string Floats(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// A segment the collective expects goes straight into its values through
// the sink one transport claims: added (reduce-scatter) or copied
// (all-gather), and refused in every other way.
TEST(MailboxTest, AnExpectedSegmentIsAppliedStraightIntoTheValues) {
  MailboxOptions o = Options();
  o.tensors["packed"] = 10;
  o.compressed_bytes_per_element["packed"] = 1;
  Mailbox box(o);
  std::vector<float> values(10, 1.0f);
  std::shared_ptr<Sink> sink =
      box.Expect(0, 0, "pseudo_grad", RingPhase::kReduceScatter, 0, 0,
                 absl::MakeSpan(values).subspan(0, 4), /*accumulate=*/true);
  Message header = Good();
  header.payload.clear();
  // Not this message: another step, segment, size or sender, or a
  // compressed tensor.
  Message other = header;
  other.step = 1;
  EXPECT_EQ(box.ClaimSink(other, 16), nullptr);
  other = header;
  other.segment = 1;
  EXPECT_EQ(box.ClaimSink(other, 12), nullptr);
  EXPECT_EQ(box.ClaimSink(header, 12), nullptr);
  other = header;
  other.from = 2;
  EXPECT_EQ(box.ClaimSink(other, 16), nullptr);
  other = header;
  other.tensor = "packed";
  EXPECT_EQ(box.ClaimSink(other, 16), nullptr);
  // Claimed once only.
  ASSERT_EQ(box.ClaimSink(header, 16), sink);
  EXPECT_EQ(box.ClaimSink(header, 16), nullptr);

  ASSERT_TRUE(sink->Apply(0, Floats({2, 3})).ok());
  // (Non-finite values: ASinkRefusesNonFiniteValuesAndSumsThatOverflow.)
  EXPECT_TRUE(absl::IsInvalidArgument(sink->Apply(3, Floats({1, 1}))));
  EXPECT_TRUE(absl::IsInvalidArgument(sink->Apply(0, "abc")));
  // An offset so large that offset + n would overflow.
  EXPECT_TRUE(absl::IsInvalidArgument(
      sink->Apply(std::numeric_limits<int64_t>::max(), Floats({1, 1}))));
  ASSERT_TRUE(sink->Apply(2, Floats({4, 5})).ok());
  // The same message delivered whole as well is a duplicate.
  absl::Status dup = box.Deliver(Good());
  EXPECT_TRUE(absl::IsFailedPrecondition(dup)) << dup;
  EXPECT_NE(dup.message().find("duplicate"), std::string::npos) << dup;

  ASSERT_TRUE(box.DeliverApplied(header).ok());
  auto m = box.Take(0, 0, "pseudo_grad", RingPhase::kReduceScatter, 0,
                    absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->applied);
  EXPECT_TRUE(m->payload.empty());
  EXPECT_EQ(values, std::vector<float>({3, 4, 5, 6, 1, 1, 1, 1, 1, 1}));
  // Closed: nothing more is written.
  sink->Close();
  EXPECT_TRUE(absl::IsFailedPrecondition(sink->Apply(0, Floats({9}))));
  EXPECT_EQ(values[0], 3.0f);

  // All-gather copies; a message nobody expected is never applied.
  std::shared_ptr<Sink> copy =
      box.Expect(0, 0, "pseudo_grad", RingPhase::kAllGather, 1, 1,
                 absl::MakeSpan(values).subspan(4, 3), /*accumulate=*/false);
  header.phase = RingPhase::kAllGather;
  header.step = 1;
  header.segment = 1;
  ASSERT_EQ(box.ClaimSink(header, 12), copy);
  ASSERT_TRUE(copy->Apply(0, Floats({7, 8, 9})).ok());
  EXPECT_EQ(values, std::vector<float>({3, 4, 5, 6, 7, 8, 9, 1, 1, 1}));
  Message unexpected = header;
  unexpected.from = 2;
  EXPECT_TRUE(absl::IsFailedPrecondition(box.DeliverApplied(unexpected)));
}

// A sink checks what it writes in the same pass: NaN/Inf in a chunk, and a
// sum that overflows to Inf, are refused, naming the elements; a NaN sum
// of finite received values is this node's own fault.
TEST(MailboxTest, ASinkRefusesNonFiniteValuesAndSumsThatOverflow) {
  Mailbox box(Options());
  std::vector<float> values(4, 3e38f);
  std::shared_ptr<Sink> add =
      box.Expect(0, 0, "pseudo_grad", RingPhase::kReduceScatter, 0, 0,
                 absl::MakeSpan(values), /*accumulate=*/true);
  ASSERT_TRUE(add->Apply(0, Floats({-3e38f, 1})).ok());
  EXPECT_EQ(values[0], 0.0f);
  absl::Status over = add->Apply(1, Floats({1, 3e38f}));
  EXPECT_TRUE(absl::IsInvalidArgument(over)) << over;
  EXPECT_NE(over.message().find("adding elements 1..2 overflows fp32 to Inf"),
            std::string::npos)
      << over;
  absl::Status inf =
      add->Apply(3, Floats({-std::numeric_limits<float>::infinity()}));
  EXPECT_TRUE(absl::IsInvalidArgument(inf)) << inf;
  EXPECT_NE(inf.message().find("non-finite value (-inf) at element 3"),
            std::string::npos)
      << inf;
  add->Close();
  // This node's own value is NaN: not the sender's fault.
  std::vector<float> own = {1, std::numeric_limits<float>::quiet_NaN(), 1};
  std::shared_ptr<Sink> mine =
      box.Expect(0, 0, "pseudo_grad", RingPhase::kReduceScatter, 1, 0,
                 absl::MakeSpan(own), /*accumulate=*/true);
  absl::Status nan_own = mine->Apply(0, Floats({1, 2, 3}));
  EXPECT_TRUE(absl::IsInternal(nan_own)) << nan_own;
  EXPECT_NE(nan_own.message().find("own value at element 1 is not finite"),
            std::string::npos)
      << nan_own;
  mine->Close();

  std::vector<float> gathered(20, 0.0f);
  std::shared_ptr<Sink> copy =
      box.Expect(0, 0, "pseudo_grad", RingPhase::kAllGather, 1, 1,
                 absl::MakeSpan(gathered), /*accumulate=*/false);
  std::vector<float> in(20, 2.5f);
  ASSERT_TRUE(copy->Apply(0, Floats(in)).ok());
  EXPECT_EQ(gathered, in);
  in[17] = std::numeric_limits<float>::quiet_NaN();
  absl::Status nan = copy->Apply(0, Floats(in));
  EXPECT_TRUE(absl::IsInvalidArgument(nan)) << nan;
  EXPECT_NE(nan.message().find("non-finite value (nan) at element 17"),
            std::string::npos)
      << nan;
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

// A recorded refusal keeps its code, and only the sender's fault
// (InvalidArgument) is worded as a bad message from it: a cancelled stream
// (Aborted) or this node's own NaN (Internal) is not.
TEST(MailboxTest, ARefusalIsWordedAsTheSendersFaultOnlyWhenItIs) {
  Mailbox box(Options());
  auto take = [&](int from) {
    return box
        .Take(from, 0, "pseudo_grad", RingPhase::kReduceScatter, 0,
              absl::Now() + absl::Seconds(30))
        .status();
  };
  box.RecordRejection(0, absl::InvalidArgumentError("a non-finite value"));
  absl::Status bad = take(0);
  EXPECT_TRUE(absl::IsInvalidArgument(bad)) << bad;
  EXPECT_EQ(bad.message(),
            "rejected a bad message from rank 0: a non-finite value");

  box.RecordRejection(2, absl::InternalError("the receiving node's own "
                                             "value at element 3 is not "
                                             "finite"));
  absl::Status own = take(2);
  EXPECT_TRUE(absl::IsInternal(own)) << own;
  EXPECT_EQ(own.message(),
            "could not take the message from rank 2: the receiving node's "
            "own value at element 3 is not finite");

  box.RecordRejection(0, absl::AbortedError("stream ended after 4 of 16"));
  absl::Status cut = take(0);
  EXPECT_TRUE(absl::IsAborted(cut)) << cut;
  EXPECT_EQ(cut.message().find("bad message"), std::string::npos) << cut;
}
// Cancel fails every Take with its reason and runs each live hook once; a
// hook registered after it runs at once, and a dropped one never runs.
TEST(MailboxTest, CancelRunsTheLiveHooksOnce) {
  Mailbox box(Options());
  int live = 0, dropped = 0, late = 0;
  std::unique_ptr<Mailbox::CancelHook> a = box.OnCancel([&] { ++live; });
  box.OnCancel([&] { ++dropped; }).reset();
  box.Cancel(absl::AbortedError("called off"));
  box.Cancel(absl::AbortedError("again"));
  EXPECT_EQ(live, 1);
  EXPECT_EQ(dropped, 0);
  std::unique_ptr<Mailbox::CancelHook> b = box.OnCancel([&] { ++late; });
  EXPECT_EQ(late, 1);
  auto m = box.Take(0, 0, "pseudo_grad", RingPhase::kReduceScatter, 0,
                    absl::InfiniteFuture());
  EXPECT_TRUE(absl::IsAborted(m.status())) << m.status();
  EXPECT_EQ(m.status().message(), "called off");
}

// A hook runs with no lock of the mailbox's held: it may register another
// hook, or drop a registration, without deadlocking the cancel (a hook
// that runs under the hooks' lock hangs here and the test times out).
TEST(MailboxTest, AHookMayCallBackIntoTheMailbox) {
  Mailbox box(Options());
  int nested = 0;
  std::unique_ptr<Mailbox::CancelHook> other = box.OnCancel([] {});
  std::unique_ptr<Mailbox::CancelHook> inner;
  std::unique_ptr<Mailbox::CancelHook> outer = box.OnCancel([&] {
    other.reset();
    inner = box.OnCancel([&] { ++nested; });
  });
  box.Cancel(absl::AbortedError("called off"));
  EXPECT_EQ(nested, 1);
  EXPECT_EQ(other, nullptr);
}

// A sleep that a cancel cuts short: how a shaped send waits on its link.
TEST(MailboxTest, SleepUnlessCancelledWakesOnCancel) {
  Mailbox box(Options());
  EXPECT_TRUE(box.SleepUnlessCancelled(absl::Milliseconds(1)));
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(100));
    box.Cancel(absl::AbortedError("called off"));
  });
  // Without the wake-up this sleeps the full hour and the test times out.
  EXPECT_FALSE(box.SleepUnlessCancelled(absl::Hours(1)));
  canceller.join();
  EXPECT_FALSE(box.SleepUnlessCancelled(absl::Hours(1)));  // already off
}

}  // namespace
}  // namespace starling
