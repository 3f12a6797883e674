// The receiving side's decisions without sockets: which attempt a chunk
// belongs to, the checks of a stream's chunks, whom a refusal blames, the
// assembly of a payload that arrives in odd pieces, and the router that
// holds early messages for their attempt.
#include "gossip/chunk_reader.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gossip/protocol.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

using peer::v1::TensorChunk;

constexpr int64_t kElems = 1000;  // "pseudo_grad"; 3 members: 334, 333, 333

MailboxOptions Options(uint64_t plan = 0, int64_t first_round = 0) {
  MailboxOptions o;
  o.rank = 1;
  o.world = 3;
  o.run_id = "run";
  o.tensors = {{"pseudo_grad", kElems}, {"packed", kElems}};
  o.compressed_bytes_per_element = {{"packed", 2}};
  o.plan = plan;
  o.first_round = first_round;
  return o;
}

// The first chunk of segment 0 from rank 0, carrying `bytes` in all.
TensorChunk First(int64_t round = 0, int64_t bytes = 334 * 4) {
  TensorChunk c;
  c.set_run_id("run");
  c.set_from_rank(0);
  c.set_round(round);
  c.set_tensor("pseudo_grad");
  c.set_phase(peer::v1::PHASE_REDUCE_SCATTER);
  c.set_total_elements(kElems);
  c.set_segment_bytes(bytes);
  return c;
}

absl::Status Accept(const Message&) { return absl::OkStatus(); }

TEST(FitAttemptTest, StaleCurrentEarlyAndTooFarAhead) {
  EXPECT_EQ(FitAttempt(9, 10, 4), AttemptFit::kStale);
  EXPECT_EQ(FitAttempt(10, 10, 4), AttemptFit::kCurrent);
  EXPECT_EQ(FitAttempt(11, 10, 4), AttemptFit::kEarly);
  EXPECT_EQ(FitAttempt(14, 10, 4), AttemptFit::kEarly);
  EXPECT_EQ(FitAttempt(15, 10, 4), AttemptFit::kTooFarAhead);
  // The protocol's window holds a sender kEarlyRounds whole rounds ahead.
  EXPECT_EQ(FitAttempt(kEarlyRounds * kAttemptsPerRound, 0, kEarlyWindow),
            AttemptFit::kEarly);
}

TEST(CheckFirstChunkTest, AnotherRunIsRefusedBeforeTheSenderIsNamed) {
  const MailboxOptions o = Options();
  TensorChunk c = First();
  c.set_from_rank(2);
  c.set_run_id("other");
  StreamHead head;
  absl::Status s = CheckFirstChunk(c, {&o, 0, false}, Accept, &head);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("chunk for run 'other'"), std::string::npos);
  EXPECT_EQ(head.message.from, 0);
}

TEST(CheckFirstChunkTest, ElasticAttemptsAreStaleHeldOrTooFarAhead) {
  const MailboxOptions o = Options();
  const int64_t now = 3 * int64_t{kAttemptsPerRound};
  StreamHead head;
  absl::Status s =
      CheckFirstChunk(First(now - 1), {&o, now, true}, Accept, &head);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find(" is over; this node is at "), std::string::npos);
  EXPECT_EQ(head.message.from, 0);

  head = StreamHead();
  s = CheckFirstChunk(First(now + kEarlyWindow + 1), {&o, now, true}, Accept,
                      &head);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;  // its sender retries

  // Without exact rounds every round is this mailbox's (Deliver judges).
  head = StreamHead();
  EXPECT_TRUE(CheckFirstChunk(First(now + kEarlyWindow + 1), {&o, now, false},
                              Accept, &head)
                  .ok());
  EXPECT_FALSE(head.early);
}

// Attempt 5 as planned here: 3 members, this node rank 1, plan 9, ids.
PlannedAttempt Planned5() {
  return PlannedAttempt{Options(/*plan=*/9, /*first_round=*/5),
                        {"n0", "n1", "n2"}};
}

TEST(CheckFirstChunkTest, AnEarlyMessageIsCheckedAgainstItsPlannedAttempt) {
  const MailboxOptions o = Options(/*plan=*/7);
  // The attempt after the installed one (4), its PLAN not here: nothing to
  // check it against, so nothing is held; the sender retries. Whatever it
  // claims (an unknown tensor, say) is not looked at.
  TensorChunk c = First(5);
  c.set_tensor("bogus");
  int asked = 0;
  auto sender = [&](const Message& m) {
    ++asked;
    EXPECT_EQ(m.from, 0);
    return absl::OkStatus();
  };
  StreamHead head;
  absl::Status s = CheckFirstChunk(c, {&o, 4, true}, sender, &head);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find("attempt 5 is not planned here yet"),
            std::string::npos)
      << s;
  EXPECT_TRUE(head.early);
  EXPECT_EQ(asked, 0);

  // Planned: its plan, its sender and its size, as for the installed one.
  const PlannedAttempt planned = Planned5();
  c.set_plan(7);  // the installed attempt's plan, not attempt 5's
  head = StreamHead();
  s = CheckFirstChunk(c, {&o, 4, true, &planned}, sender, &head);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("belongs to another plan"), std::string::npos);
  c.set_plan(9);
  s = CheckFirstChunk(c, {&o, 4, true, &planned}, sender, &head);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("unknown tensor 'bogus'"), std::string::npos);
  EXPECT_EQ(asked, 1);
  // More than one segment of 3 members (a whole tensor fits the 4 KiB of
  // slack a segment has here).
  c = First(5, (kElems / 3 + 1) * 4 + 4096 + 1);
  c.set_plan(9);
  s = CheckFirstChunk(c, {&o, 4, true, &planned}, sender, &head);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  c = First(5);
  c.set_plan(9);
  head = StreamHead();
  ASSERT_TRUE(CheckFirstChunk(c, {&o, 4, true, &planned}, sender, &head).ok());
  EXPECT_TRUE(head.early);
  EXPECT_FALSE(head.may_claim);
  EXPECT_EQ(head.message.plan, 9u);
  EXPECT_EQ(head.segment_bytes, 334 * 4);
}

TEST(CheckFirstChunkTest, TheInstalledAttemptChecksPlanThenSender) {
  const MailboxOptions o = Options(/*plan=*/7);
  TensorChunk c = First(4);
  c.set_plan(8);
  int asked = 0;
  auto sender = [&](const Message& m) {
    ++asked;
    EXPECT_EQ(m.from, 0);
    return absl::PermissionDeniedError("not that member");
  };
  StreamHead head;
  absl::Status s = CheckFirstChunk(c, {&o, 4, true}, sender, &head);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("belongs to another plan"), std::string::npos);
  EXPECT_EQ(asked, 0);

  c.set_plan(7);
  s = CheckFirstChunk(c, {&o, 4, true}, sender, &head);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_EQ(asked, 1);
}

TEST(CheckFirstChunkTest, TensorsAndSizesAreChecked) {
  const MailboxOptions o = Options();
  StreamHead head;
  TensorChunk c = First();
  c.set_tensor("optimizer_state");
  absl::Status s = CheckFirstChunk(c, {&o, 0, false}, Accept, &head);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("unknown tensor 'optimizer_state'"),
            std::string::npos);

  // One segment of 1000 elements over 3 members: at most 334 + 1 values
  // and 4 KiB.
  const int64_t most = (kElems / 3 + 1) * 4 + 4096;
  s = CheckFirstChunk(First(0, most + 1), {&o, 0, false}, Accept, &head);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find(absl::StrCat("at most ", most, " fit")),
            std::string::npos)
      << s;
  s = CheckFirstChunk(First(0, -1), {&o, 0, false}, Accept, &head);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;

  ASSERT_TRUE(
      CheckFirstChunk(First(0, most), {&o, 0, false}, Accept, &head).ok());
  EXPECT_TRUE(head.may_claim);  // raw fp32 of the installed attempt
  c = First();
  c.set_tensor("packed");
  ASSERT_TRUE(CheckFirstChunk(c, {&o, 0, false}, Accept, &head).ok());
  EXPECT_FALSE(head.may_claim);  // compressed: buffered whole
}

TEST(CheckLaterChunksTest, TheHeaderStaysAndTheBytesContinue) {
  const MailboxOptions o = Options();
  StreamHead head;
  ASSERT_TRUE(
      CheckFirstChunk(First(0, 5000), {&o, 0, false}, Accept, &head).ok());
  TensorChunk c = First(0, 5000);
  EXPECT_TRUE(CheckSameMessage(c, head.message).ok());
  c.set_segment(1);
  absl::Status s = CheckSameMessage(c, head.message);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("header changed"), std::string::npos);

  c = First(0, 5000);
  c.set_offset(400);
  EXPECT_TRUE(CheckChunkBounds(c, 400, 2, 400, head).ok());
  s = CheckChunkBounds(c, 400, 2, 0, head);  // a gap
  EXPECT_NE(s.message().find("chunk at offset 400 with 400 bytes does not "
                             "continue the 0 of 5000 bytes received"),
            std::string::npos)
      << s;
  s = CheckChunkBounds(c, 4601, 2, 400, head);  // past the end
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  // 5000 bytes take at most 5000 / 256 + 2 = 21 chunks.
  EXPECT_TRUE(CheckChunkBounds(c, 0, 21, 400, head).ok());
  s = CheckChunkBounds(c, 0, 22, 400, head);
  EXPECT_NE(s.message().find("22 chunks for 5000 bytes; at most 21"),
            std::string::npos)
      << s;
}

TEST(RejectionToRecordTest, OnlyTheSendersOwnFaultsBlameIt) {
  const absl::Status bad = absl::InvalidArgumentError("non-finite");
  EXPECT_FALSE(
      RejectionToRecord(bad, /*header_seen=*/false, false, true).has_value());
  ASSERT_TRUE(RejectionToRecord(bad, true, false, true).has_value());
  EXPECT_EQ(*RejectionToRecord(bad, true, false, true), bad);
  // A stream cut short: aborted, not blamed.
  std::optional<absl::Status> cut = RejectionToRecord(bad, true, false, false);
  ASSERT_TRUE(cut.has_value());
  EXPECT_TRUE(absl::IsAborted(*cut)) << *cut;
  EXPECT_EQ(cut->message(), "non-finite");
  for (const absl::Status& s : {absl::UnavailableError("ahead"),
                                absl::FailedPreconditionError("other plan"),
                                absl::PermissionDeniedError("impostor")}) {
    EXPECT_FALSE(RejectionToRecord(s, true, false, true).has_value()) << s;
  }
}

// A message of an attempt not installed claims a rank of that attempt's
// plan: whatever is wrong with it, the member at that rank of the
// installed attempt is not blamed (the attack that made honest members sit
// rounds out: bogus chunks for an attempt 3 rounds ahead).
TEST(RejectionToRecordTest, AMessageOfAnotherAttemptBlamesNobody) {
  for (const absl::Status& s : {absl::InvalidArgumentError("unknown tensor"),
                                absl::InvalidArgumentError("non-finite"),
                                absl::AbortedError("cut short")}) {
    EXPECT_FALSE(RejectionToRecord(s, true, /*early=*/true, true).has_value())
        << s;
    EXPECT_FALSE(RejectionToRecord(s, true, /*early=*/true, false).has_value())
        << s;
  }
}

TEST(CheckSenderTest, BoundIdsTakeOnlyTheMemberAtThatRank) {
  PeerCredentials creds;
  Message m;
  m.from = 1;
  EXPECT_TRUE(CheckSender(creds, {}, {}, m).ok());  // ids not bound
  creds.bind_node_ids = true;
  const std::vector<std::string> ids = {"a", "b"};
  EXPECT_TRUE(CheckSender(creds, ids, {"x", "b"}, m).ok());
  absl::Status s = CheckSender(creds, ids, {"a"}, m);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  m.from = 2;
  s = CheckSender(creds, ids, {"a", "b"}, m);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_NE(s.message().find("knows no member id at that rank"),
            std::string::npos);
}

std::string Fp32(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

TEST(SinkFeederTest, ValuesSplitBetweenPiecesArriveWhole) {
  std::vector<float> sent(50), values(50, 1.0f);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = 0.5f * i;
  const std::string bytes = Fp32(sent);
  auto sink = std::make_shared<Sink>(absl::MakeSpan(values), true);
  SinkFeeder feed(sink);
  size_t at = 0;
  for (size_t n = 1; at < bytes.size(); n = n % 7 + 1) {
    const size_t take = std::min(n, bytes.size() - at);
    ASSERT_TRUE(feed.Feed(bytes.data() + at, take).ok());
    at += take;
  }
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(values[i], 1.0f + sent[i]) << "element " << i;
  }
}

// A message of `round` from rank 0 of `o`'s members, segment 0.
Message Whole(int64_t round, uint64_t plan) {
  Message m;
  m.from = 0;
  m.round = round;
  m.tensor = "pseudo_grad";
  m.phase = RingPhase::kReduceScatter;
  m.total_elements = kElems;
  m.plan = plan;
  m.payload = Fp32(std::vector<float>(334, 2.0f));
  return m;
}

TEST(AttemptRouterTest, HoldsEarlyMessagesOfPlannedAttemptsAndRefusesStale) {
  AttemptRouter router(InsecurePeerCredentials());
  EXPECT_EQ(router.Current().mailbox, nullptr);
  router.Install(std::make_shared<Mailbox>(Options(7, 10)), true, {});
  AttemptRouter::Attempt a = router.Current();
  ASSERT_NE(a.mailbox, nullptr);
  EXPECT_TRUE(a.exact_round);

  absl::Status s = router.Place(Whole(9, 7), {});
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("attempt 9 is over"), std::string::npos);
  // Not planned here: not held.
  s = router.Place(Whole(11, 7), {});
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_EQ(router.early_bytes(), 0);
  for (int64_t seq : {11, 12}) {
    router.Expect(PlannedAttempt{Options(7, seq), {"n0", "n1", "n2"}});
  }
  router.Expect(PlannedAttempt{Options(7, 10), {}});  // installed: ignored
  EXPECT_EQ(router.Planned(10), nullptr);
  ASSERT_NE(router.Planned(11), nullptr);
  ASSERT_TRUE(router.Place(Whole(11, 7), {}).ok());  // held
  ASSERT_TRUE(router.Place(Whole(12, 9), {}).ok());  // held; another plan
  EXPECT_EQ(router.early_bytes(), 2 * 334 * 4);

  // Attempt 11 installed: its message is delivered, its plan forgotten.
  auto next = std::make_shared<Mailbox>(Options(7, 11));
  router.Install(next, true, {});
  EXPECT_EQ(router.Planned(11), nullptr);
  EXPECT_EQ(router.early_bytes(), 334 * 4);
  auto got = next->Take(0, 11, "pseudo_grad", RingPhase::kReduceScatter, 0,
                        absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->payload, Fp32(std::vector<float>(334, 2.0f)));

  // Attempt 12's message was of another plan: refused when it is installed.
  auto last = std::make_shared<Mailbox>(Options(7, 12));
  router.Install(last, true, {});
  EXPECT_EQ(router.early_bytes(), 0);
  got = last->Take(0, 12, "pseudo_grad", RingPhase::kReduceScatter, 0,
                   absl::Now() + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(got.status())) << got.status();
  // The installed attempt's own message goes straight in.
  ASSERT_TRUE(router.Place(Whole(12, 7), {}).ok());
  got = last->Take(0, 12, "pseudo_grad", RingPhase::kReduceScatter, 0,
                   absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(got.ok()) << got.status();
}

// Held early messages are bounded per sender (one rank of one planned
// attempt) by twice the whole tensor, before anything is buffered
// (EarlyRoom, at the first chunk) and when the message is complete (Place);
// the others' room is their own. Only the attempts planned last are kept.
TEST(AttemptRouterTest, EarlyMessagesAreBoundedPerSender) {
  AttemptRouter router(InsecurePeerCredentials());
  router.Install(std::make_shared<Mailbox>(Options(7, 10)), true, {});
  router.Expect(PlannedAttempt{Options(7, 11), {"n0", "n1", "n2"}});
  const int64_t bound = EarlyBytesPerSender(Options());
  EXPECT_EQ(bound, 2 * ((kElems + 1) * 4 + 4096));
  EXPECT_TRUE(router.EarlyRoom(11, 0, bound).ok());
  absl::Status s = router.EarlyRoom(11, 0, bound + 1);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find("held per sender"), std::string::npos) << s;
  EXPECT_EQ(router.early_refused(), 1);
  int held = 0;
  while (router.Place(Whole(11, 7), {}).ok()) ++held;
  EXPECT_EQ(held, bound / (334 * 4));
  EXPECT_EQ(router.early_refused(), 2);
  EXPECT_TRUE(router.EarlyRoom(11, 2, 334 * 4).ok());            // another rank
  EXPECT_TRUE(absl::IsUnavailable(router.EarlyRoom(12, 0, 1)));  // unplanned

  for (int64_t seq = 12; seq < 12 + AttemptRouter::kPlannedAttempts; ++seq) {
    router.Expect(PlannedAttempt{Options(7, seq), {"n0", "n1", "n2"}});
  }
  EXPECT_EQ(router.Planned(11), nullptr);
  EXPECT_NE(router.Planned(12), nullptr);
}

}  // namespace
}  // namespace starling
