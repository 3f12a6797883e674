// Fuzz target for the mailbox (gossip/mailbox.h), where every collective
// message a peer sends is validated: Deliver of messages built from the
// input, mixed with the other calls a transport and a collective make
// (AdvanceRound, Take without waiting, Expect, ClaimSink and Sink::Apply of
// streamed pieces the way the gRPC transport applies them, DeliverApplied,
// RecordRejection, Cancel).
// Input: u8 world size, u8 rank, u16 elements of "pseudo_grad", u16 of
// "grad", u8 flags (bit0: "pseudo_grad" travels compressed, bit1: "grad"
// travels whole, bit2: "pseudo_grad" travels whole), u8 first round, then
// operations (u8 opcode and its fields; see the code).
// Invariants: an accepted raw message comes from a valid other rank, has
// exactly its segment's bytes and only finite values, and a Take right after
// returns it unchanged (and a second Deliver is a duplicate); a claimed sink
// accepts exactly its segment and DeliverApplied then succeeds.
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "compression/codec.h"
#include "gossip/mailbox.h"
#include "tests/fuzz/fuzz_util.h"

namespace starling {
namespace {

std::string Tensor(fuzz::Reader& in) {
  switch (in.Get<uint8_t>() % 3) {
    case 0:
      return "pseudo_grad";
    case 1:
      return "grad";
    default:
      return std::string(in.LenBytes(32));
  }
}

int64_t Round(fuzz::Reader& in, const Mailbox& mb) {
  if (in.Get<uint8_t>() & 1) return in.Get<int64_t>();
  return mb.round() + in.Get<int8_t>();
}

// A message header (and payload when `payload`), as a transport builds it
// from the wire.
Message ReadMessage(fuzz::Reader& in, const Mailbox& mb, bool payload) {
  Message m;
  m.from = in.Get<int32_t>();
  m.round = Round(in, mb);
  m.tensor = Tensor(in);
  m.phase = static_cast<RingPhase>(in.Get<int32_t>());
  m.step = in.Get<int32_t>();
  m.segment = in.Get<int32_t>();
  m.total_elements = in.Get<int64_t>();
  if (payload) m.payload = std::string(in.LenBytes(1 << 18));
  m.applied = in.Get<uint8_t>() & 1;  // never trusted by the mailbox
  return m;
}

}  // namespace
}  // namespace starling

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace starling;
  fuzz::Reader in(data, size);
  MailboxOptions o;
  o.world = 1 + in.Get<uint8_t>() % 8;
  o.rank = in.Get<uint8_t>() % o.world;
  o.run_id = fuzz::kRunId;
  o.tensors["pseudo_grad"] = in.Get<uint16_t>() % 4096;
  o.tensors["grad"] = in.Get<uint16_t>() % 4096;
  const uint8_t flags = in.Get<uint8_t>();
  if (flags & 1) o.compressed_bytes_per_element["pseudo_grad"] = 1 + flags % 8;
  if (flags & 2) o.whole_tensors.insert("grad");
  if (flags & 4) o.whole_tensors.insert("pseudo_grad");
  o.first_round = in.Get<uint8_t>();

  // Declared before the mailbox: sinks point into these values.
  std::deque<std::vector<float>> values;
  std::vector<std::shared_ptr<Sink>> sinks;
  Mailbox mb(o);
  bool cancelled = false;

  for (int ops = 0; !in.empty() && ops < 256; ++ops) {
    switch (in.Get<uint8_t>() % 7) {
      case 0: {  // Deliver
        Message m = ReadMessage(in, mb, /*payload=*/true);
        const uint8_t check = in.Get<uint8_t>();
        const Message copy = m;
        const absl::Status s = mb.Deliver(m);
        if (!s.ok()) {
          FUZZ_CHECK(
              absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s),
              "Deliver: %s", s.ToString().c_str());
          break;
        }
        FUZZ_CHECK(copy.from >= 0 && copy.from < o.world && copy.from != o.rank,
                   "accepted sender %d", copy.from);
        FUZZ_CHECK(o.tensors.count(copy.tensor) &&
                       o.tensors[copy.tensor] == copy.total_elements,
                   "accepted tensor '%s'", copy.tensor.c_str());
        if (!o.compressed_bytes_per_element.count(copy.tensor)) {
          const int64_t want = 4 * (o.whole_tensors.count(copy.tensor)
                                        ? copy.total_elements
                                        : SegmentLength(copy.total_elements,
                                                        o.world, copy.segment));
          FUZZ_CHECK(static_cast<int64_t>(copy.payload.size()) == want,
                     "accepted %zu bytes, segment has %lld",
                     copy.payload.size(), static_cast<long long>(want));
          FUZZ_CHECK(FirstNonFinite(copy.payload) < 0, "accepted NaN/Inf");
        }
        if (check & 1) {
          FUZZ_CHECK(absl::IsFailedPrecondition(mb.Deliver(copy)),
                     "a duplicate was not refused");
        }
        if ((check & 2) && !cancelled) {
          absl::StatusOr<Message> t =
              mb.Take(copy.from, copy.round, copy.tensor, copy.phase, copy.step,
                      absl::InfinitePast());
          FUZZ_CHECK(t.ok(), "Take after Deliver: %s",
                     t.status().ToString().c_str());
          FUZZ_CHECK(t->payload == copy.payload && !t->applied &&
                         t->segment == copy.segment,
                     "Take returned another message");
        }
        break;
      }
      case 1:  // AdvanceRound
        mb.AdvanceRound(mb.round() + in.Get<uint8_t>() % 4);
        break;
      case 2: {  // Take, never waiting
        const Message h = ReadMessage(in, mb, /*payload=*/false);
        (void)mb.Take(h.from, h.round, h.tensor, h.phase, h.step,
                      absl::InfinitePast());
        break;
      }
      case 3: {  // Expect
        const Message h = ReadMessage(in, mb, /*payload=*/false);
        const bool accumulate = in.Get<uint8_t>() & 1;
        values.emplace_back(in.Get<uint16_t>() % 4096, 1.0f);
        sinks.push_back(mb.Expect(h.from, h.round, h.tensor, h.phase, h.step,
                                  h.segment, absl::MakeSpan(values.back()),
                                  accumulate));
        break;
      }
      case 4: {  // A streamed message: ClaimSink, pieces, DeliverApplied
        const Message h = ReadMessage(in, mb, /*payload=*/false);
        const int64_t segment_bytes = in.Get<int64_t>();
        const int pieces = in.Get<uint8_t>() % 8;
        std::shared_ptr<Sink> sink = mb.ClaimSink(h, segment_bytes);
        if (sink == nullptr) {
          for (int i = 0; i < pieces; ++i) (void)in.LenBytes(1 << 16);
          break;
        }
        FUZZ_CHECK(sink->elements() * 4 == segment_bytes,
                   "claimed a sink of %lld elements for %lld bytes",
                   static_cast<long long>(sink->elements()),
                   static_cast<long long>(segment_bytes));
        // As the transport does: whole values at the running element
        // offset, a value split between pieces carried over.
        int64_t applied = 0;
        std::string carry;
        bool ok = true;
        for (int i = 0; i < pieces && ok; ++i) {
          std::string piece = carry + std::string(in.LenBytes(1 << 16));
          const size_t whole = piece.size() / 4 * 4;
          if (whole > 0) {
            const absl::Status s =
                sink->Apply(applied, absl::string_view(piece).substr(0, whole));
            ok = s.ok();
            if (ok) applied += static_cast<int64_t>(whole / 4);
          }
          carry = piece.substr(whole);
        }
        // And one piece at an offset of the input's choosing (32-bit: the
        // transport's offsets are counts of applied values, never near the
        // int64 limit).
        const int64_t offset = in.Get<int32_t>();
        (void)sink->Apply(offset, in.LenBytes(64));
        if (ok && carry.empty() && applied * 4 == segment_bytes) {
          const absl::Status s = mb.DeliverApplied(h);
          FUZZ_CHECK(s.ok(), "DeliverApplied: %s", s.ToString().c_str());
          Message again = h;
          again.payload.assign(static_cast<size_t>(segment_bytes), '\0');
          FUZZ_CHECK(absl::IsFailedPrecondition(mb.Deliver(again)),
                     "a claimed message was delivered twice");
        }
        break;
      }
      case 5: {  // RecordRejection
        mb.RecordRejection(in.Get<int32_t>(),
                           absl::InvalidArgumentError("fuzz"));
        break;
      }
      case 6:
        if (in.Get<uint8_t>() == 0xCA) {
          mb.Cancel(absl::CancelledError("fuzz"));
          cancelled = true;
        }
        break;
    }
  }
  for (auto& s : sinks) s->Close();
  return 0;
}
