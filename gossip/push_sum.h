// Push-sum gossip (SGP, Assran et al. 2019) on flat fp32 models, without any
// networking: a node's push-sum weight and the share / restore / absorb steps
// that keep the network-wide mass Σw and the weighted average Σw·y / Σw
// exact, the public copies that let a lossy push carry y minus the model the
// receiver already holds (CHOCO-style), plus the chunking and bounds-checked
// reassembly of a pushed model.
// Not thread-safe: one PushSum per node, used from its training thread.
// PushAssembler is one per incoming stream. PublicCopies is thread-safe.
#ifndef STARLING_GOSSIP_PUSH_SUM_H_
#define STARLING_GOSSIP_PUSH_SUM_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "compression/codec.h"
#include "starling/peer/v1/swarm.pb.h"

namespace starling {

// What one push sends: the (decoded) model y_s, its weight, and the wire
// payload (raw little-endian fp32 when `codec` is empty).
struct PushShare {
  double weight = 0;
  std::string codec;            // "" for raw fp32, else the codec's Name()
  std::string payload;          // the bytes on the wire
  std::vector<float> sent;      // what the receiver decodes
  std::vector<float> y_before;  // the sender's y before the share (lossy only)
  int64_t base_sequence = 0;    // the public copy the payload is relative to
};

// A model as one node last pushed it to another: the receiver rebuilds it
// from the push, the sender keeps the same values, so both hold identical
// bits. CHOCO-style gossip (Koloskova et al. 2019) then compresses y − copy:
// between two pushes a model moves little, so a lossy codec's error, which
// scales with the magnitude of what it encodes, shrinks with it.
struct PublicCopy {
  int64_t sequence = 0;  // the push that set it; 0: none
  std::vector<float> values;
};

// The largest push-sum weight a push may carry. Σw over a swarm stays its
// node count, so no honest push comes near it; a peer's larger weight is
// refused, since sums of such weights would overflow to Inf, and a weight
// of Inf makes the next average Inf / Inf = NaN.
constexpr double kMaxPushWeight = 1 << 20;

class PushSum {
 public:
  explicit PushSum(double weight = 1.0) : weight_(weight) {}
  double weight() const { return weight_; }
  void set_weight(double w) { weight_ = w; }

  // Halves the weight and returns the share (y, w/2). With a lossy `codec`
  // (null: raw fp32) it sends ŷ = D(C(y)) and keeps the codec's error
  // locally, y ← 2y − ŷ, so that (w/2)·y_new + (w/2)·ŷ = w·y: error feedback
  // for gossip, the numerator Σw·y stays exact. With a lossy codec and a
  // `base` copy (sequence > 0, same size) it encodes y − base instead and
  // sends ŷ = base + D(C(y − base)), marking the share with base's sequence.
  // InvalidArgument for non-finite values (nothing changes then).
  absl::StatusOr<PushShare> Share(absl::Span<float> y, const Codec* codec,
                                  const PublicCopy* base = nullptr);
  // Undoes a Share whose push failed: the weight and y come back.
  void Restore(const PushShare& share, absl::Span<float> y);
  // y ← (w·y + w_s·y_s)/(w + w_s), w ← w + w_s. Returns ‖y − y_s‖² before
  // the update. InvalidArgument naming the problem for a size mismatch,
  // w_s not in (0, kMaxPushWeight], a non-finite y_s, or a sum of weights
  // that overflows (y unchanged then).
  absl::StatusOr<double> Absorb(absl::Span<float> y,
                                absl::Span<const float> y_s, double w_s);

 private:
  double weight_;
};

// A push as received and checked.
struct ReceivedPush {
  std::string from;
  int64_t sequence = 0;
  double weight = 0;
  std::vector<float> values;  // decoded payload: y, or y − copy (see base)
  int64_t wire_bytes = 0;
  std::string codec;          // "" for raw fp32
  int64_t base_sequence = 0;  // nonzero: `values` is relative to that push
};

// A receiver's copies of its senders' models, one per sender (lossy pushes
// only: raw fp32 pushes carry y exactly and keep none).
class PublicCopies {
 public:
  // Turns `push` into the sender's model and keeps it as that sender's copy:
  // an absolute push replaces the copy, a difference push adds the copy it
  // names. FailedPrecondition naming the sender when this node does not hold
  // that copy (a push it took that the sender saw fail, or a restart): the
  // sender then pushes in full. InvalidArgument when the sum is not finite.
  // On error the copy is unchanged and `push` is to be dropped.
  absl::Status Resolve(ReceivedPush& push) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the copy of `from` (a sender that left or died): were it to come
  // back, its first relative push is refused and it pushes in full.
  void Forget(const std::string& from) ABSL_LOCKS_EXCLUDED(mu_);
  int64_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, PublicCopy> copies_ ABSL_GUARDED_BY(mu_);
};

// Splits a share into chunks of at most `chunk_bytes` payload bytes; the
// first carries the weight. Every chunk repeats the header.
std::vector<peer::v1::PushChunk> MakePushChunks(
    const std::string& run_id, const std::string& from, int64_t sequence,
    const PushShare& share, int64_t elements, int64_t chunk_bytes);

// Reassembles one push stream. `codec` (null: raw fp32 only) decodes lossy
// payloads; the payload may not exceed `max_bytes`. Never reads out of range.
class PushAssembler {
 public:
  PushAssembler(std::string run_id, int64_t elements, const Codec* codec,
                int64_t max_bytes);
  // InvalidArgument naming what is wrong: run id, element count, codec,
  // offset out of order, total size over the limit, a header that changes
  // mid-stream, a weight on a later chunk.
  absl::Status Add(const peer::v1::PushChunk& chunk);
  // InvalidArgument for a truncated stream, a weight not in
  // (0, kMaxPushWeight], values that do not decode or are not finite.
  absl::StatusOr<ReceivedPush> Finish();
  int64_t bytes() const { return static_cast<int64_t>(data_.size()); }

 private:
  const std::string run_id_;
  const int64_t elements_;
  const Codec* codec_;
  const int64_t max_bytes_;
  bool started_ = false;
  peer::v1::PushChunk header_;  // the first chunk's header fields
  std::string data_;
};

}  // namespace starling

#endif  // STARLING_GOSSIP_PUSH_SUM_H_
