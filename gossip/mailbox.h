// The inbox of one node: complete collective messages delivered by a
// transport (gRPC or in-process), validated on arrival, and taken by the
// collective that waits for them. A message that is malformed, of the wrong
// size, for an unknown tensor, from a stale round or carrying NaN/Inf is
// rejected at delivery with an error naming what was wrong; it never reaches
// the collective, so it cannot corrupt θ.
// Thread-safe: transports deliver from their threads while the collective
// thread takes. One absl::Mutex guards all state; no callbacks under it.
#ifndef STARLING_GOSSIP_MAILBOX_H_
#define STARLING_GOSSIP_MAILBOX_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace starling {

enum class RingPhase { kReduceScatter = 1, kAllGather = 2 };

// One collective message: a segment of a flat fp32 tensor.
struct Message {
  int from = 0;
  int64_t round = 0;
  std::string tensor;  // "pseudo_grad" or "grad"
  RingPhase phase = RingPhase::kReduceScatter;
  int step = 0;
  int segment = 0;
  int64_t total_elements = 0;  // of the whole flat tensor
  std::string payload;         // little-endian fp32 values of the segment
};

// The index of the first NaN or ±Inf among little-endian fp32 values, or -1.
int64_t FirstNonFinite(absl::string_view fp32);

// Elements of segment `segment` when `total` elements are split into `parts`
// nearly equal contiguous segments (the first total % parts get one more).
int64_t SegmentLength(int64_t total, int parts, int segment);
int64_t SegmentOffset(int64_t total, int parts, int segment);

struct MailboxOptions {
  int rank = 0;
  int world = 1;
  std::string run_id;
  // Elements of each known tensor's flat view, e.g. {"pseudo_grad", P + 1}.
  std::map<std::string, int64_t> tensors;
  // Tensors whose segments travel compressed: their payload size is only
  // bounded (by max_compressed_bytes_per_element per element plus 4 KiB) and
  // their values are checked after decoding, by the collective.
  std::map<std::string, int64_t> compressed_bytes_per_element;
  // The round this node starts at (a resumed run starts past 0), so that
  // peers that start sending before this node has caught up are not refused.
  int64_t first_round = 0;
};

class Mailbox {
 public:
  explicit Mailbox(MailboxOptions options);

  // Validates and stores `m`. InvalidArgument for a bad sender, unknown
  // tensor, bad segment/step, wrong element count or payload size, or
  // non-finite values; FailedPrecondition for a stale or far-future round or
  // a duplicate. The error message names the sender and what was wrong.
  absl::Status Deliver(Message m);

  // Records that a message from `from` was refused before it could be
  // delivered (e.g. a malformed chunk stream); a Take waiting on that sender
  // fails with this error at once instead of waiting for its deadline.
  void RecordRejection(int from, const absl::Status& why);

  // Waits until the message for (round, tensor, phase, step) from `from`
  // arrives, or `deadline` passes (DeadlineExceeded naming the peer), or a
  // message from `from` is rejected (that error).
  absl::StatusOr<Message> Take(int from, int64_t round,
                               const std::string& tensor, RingPhase phase,
                               int step, absl::Time deadline);

  // Messages of rounds before `round` are dropped and later refused as stale.
  void AdvanceRound(int64_t round);

  // Every Take, waiting now or later, fails with `why` (an elastic round's
  // attempt was called off). Idempotent; the first reason stays.
  void Cancel(const absl::Status& why);
  bool cancelled() const;

  // The round (or elastic attempt sequence) this mailbox is at.
  int64_t round() const;

  const MailboxOptions& options() const { return options_; }

 private:
  absl::Status Validate(const Message& m) const;

  using Key = std::tuple<int64_t, std::string, int, int, int>;
  const MailboxOptions options_;
  mutable absl::Mutex mu_;
  int64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<Key, Message> inbox_ ABSL_GUARDED_BY(mu_);
  std::map<int, absl::Status> rejected_ ABSL_GUARDED_BY(mu_);
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
};

}  // namespace starling

#endif  // STARLING_GOSSIP_MAILBOX_H_
