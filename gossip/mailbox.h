// The inbox of one node: complete collective messages delivered by a
// transport (gRPC or in-process), validated on arrival, and taken by the
// collective that waits for them. A message that is malformed, of the wrong
// size, for an unknown tensor, from a stale round or carrying NaN/Inf is
// rejected at delivery with an error naming what was wrong; it never reaches
// the collective, so it cannot corrupt θ.
// A collective may also name, before a raw fp32 message arrives, the
// values it will be added to (or copied into): a streaming transport then
// applies each chunk there as it arrives (see Expect), so the segment is
// reduced while it is received and never buffered whole.
// Thread-safe: transports deliver from their threads while the collective
// thread takes. One absl::Mutex guards the messages, another the cancel
// hooks (OnCancel); no hook runs while either is held (lock order: the
// hooks' mutex, then the messages').
#ifndef STARLING_GOSSIP_MAILBOX_H_
#define STARLING_GOSSIP_MAILBOX_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

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
  uint64_t plan = 0;           // the sender's plan (MailboxOptions.plan)
  std::string payload;         // little-endian fp32 values of the segment
  // Set by the mailbox only (never from the wire): the values went straight
  // into the collective's buffer through a Sink, and `payload` is empty.
  bool applied = false;
};

// out[i] = x[i], or out[i] += x[i] with `accumulate`, for the little-endian
// fp32 values x in `fp32` that a peer sent (4 * out.size() bytes), checked in
// the same pass; element i is element first + i of the message's segment.
// InvalidArgument, the sender's fault: a NaN/Inf x[i] (naming the element)
// or a sum that overflows to Inf. Internal: a sum is NaN although the x[i]
// are finite, so this node's own value was not (blames nobody). After an
// error `out` is partly written.
absl::Status ApplyFromPeer(absl::string_view fp32, absl::Span<float> out,
                           bool accumulate, int64_t first = 0);

// After finite received values were added into `sum` and a check failed:
// Internal naming the first NaN (element first + i), which means this
// node's own value was NaN or Inf (finite + finite is never NaN), so nobody
// else is to blame; OK when there is none (an overflow). The message says
// "the receiving node's own value", since the gRPC server also returns it
// to the sender.
absl::Status OwnValueNotFinite(absl::Span<const float> sum, int64_t first = 0);

// Where the chunks of one expected raw fp32 message go as they arrive: the
// collective's values of that segment. Thread-safe: the transport applies
// while the collective may close it; once Close returns nothing more is
// written.
class Sink {
 public:
  Sink(absl::Span<float> values, bool accumulate)
      : values_(values), accumulate_(accumulate) {}
  // Adds (reduce-scatter) or copies (all-gather) `fp32`, whole
  // little-endian values, at element `offset` of the segment, through
  // ApplyFromPeer (whose errors it returns, the range then partly written).
  // InvalidArgument for a range outside the segment, FailedPrecondition
  // once closed.
  absl::Status Apply(int64_t offset, absl::string_view fp32)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Close() ABSL_LOCKS_EXCLUDED(mu_);
  int64_t elements() const { return static_cast<int64_t>(values_.size()); }

 private:
  absl::Mutex mu_;
  const absl::Span<float> values_;
  const bool accumulate_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
};

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
  // Tensors that travel whole (segment 0 holds every element, step 0 of the
  // all-gather phase): each member's own pack, sent to every other member
  // (AllGatherWhole).
  std::set<std::string> whole_tensors;
  // Tensors whose segments travel compressed: their payload size is only
  // bounded (by max_compressed_bytes_per_element per element plus 4 KiB) and
  // their values are checked after decoding, by the collective.
  std::map<std::string, int64_t> compressed_bytes_per_element;
  // The round this node starts at (a resumed run starts past 0), so that
  // peers that start sending before this node has caught up are not refused.
  int64_t first_round = 0;
  // Elastic rounds: the digest of the attempt's plan (see TensorChunk.plan);
  // the transport refuses chunks of another plan. 0 elsewhere.
  uint64_t plan = 0;
};

// An upper bound on the payload bytes of one message of `tensor` under
// `o`, for a transport to refuse impossible sizes before buffering (Deliver
// checks the exact size): a segment, or the whole tensor when it travels
// whole or when `any_world` (the member count is not known yet). -1 for an
// unknown tensor.
int64_t MaxMessageBytes(const MailboxOptions& o, const std::string& tensor,
                        bool any_world);

class Mailbox {
 public:
  explicit Mailbox(MailboxOptions options);

  // Validates and stores `m`. InvalidArgument for a bad sender, unknown
  // tensor, bad segment/step, wrong element count or payload size, or
  // non-finite values; FailedPrecondition for a stale or far-future round or
  // a duplicate. The error message names the sender and what was wrong.
  absl::Status Deliver(Message m) ABSL_LOCKS_EXCLUDED(mu_);

  // Records that a message from `from` was refused before it could be
  // delivered (e.g. a malformed chunk stream); a Take waiting on that sender
  // fails with this error at once instead of waiting for its deadline.
  void RecordRejection(int from, const absl::Status& why)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until the message for (round, tensor, phase, step) from `from`
  // arrives, or `deadline` passes (DeadlineExceeded naming the peer), or a
  // message from `from` is rejected (that error, with that code: "rejected a
  // bad message from rank N: ..." for InvalidArgument, the sender's fault;
  // "could not take the message from rank N: ..." otherwise).
  absl::StatusOr<Message> Take(int from, int64_t round,
                               const std::string& tensor, RingPhase phase,
                               int step, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The collective expects the raw fp32 message (round, tensor, phase,
  // step) from `from`, for segment `segment`, whose values `values` will
  // take (added to them when `accumulate`, else copied over them). Until the
  // returned sink is closed, a transport that streams chunks may claim it
  // (ClaimSink) and apply the chunks there; Take then returns the message
  // with `applied` set. The caller must Close the sink before `values` go
  // away, whatever happened (on error they hold partial sums).
  std::shared_ptr<Sink> Expect(int from, int64_t round,
                               const std::string& tensor, RingPhase phase,
                               int step, int segment, absl::Span<float> values,
                               bool accumulate) ABSL_LOCKS_EXCLUDED(mu_);
  // For a transport at the first chunk of `header` (payload ignored): the
  // expected sink for it when the header is valid for a raw fp32 segment of
  // `segment_bytes` bytes, the collective expects it and nothing claimed or
  // delivered it yet; else null (the message is then buffered and
  // delivered whole). A claimed message can only arrive through
  // DeliverApplied: Deliver refuses it as a duplicate.
  std::shared_ptr<Sink> ClaimSink(const Message& header, int64_t segment_bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The claimed message `header` was applied whole through its sink.
  absl::Status DeliverApplied(Message header) ABSL_LOCKS_EXCLUDED(mu_);

  // Messages of rounds before `round` are dropped and later refused as stale.
  void AdvanceRound(int64_t round) ABSL_LOCKS_EXCLUDED(mu_);

  // Every Take, waiting now or later, fails with `why` (an elastic round's
  // attempt was called off), and every hook from OnCancel runs once.
  // Idempotent; the first reason stays.
  void Cancel(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_, hooks_mu_);
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);
  // Sleeps up to `d`, waking when the mailbox is cancelled: true when it
  // slept all of `d`, false when cancelled (then, or already before).
  bool SleepUnlessCancelled(absl::Duration d) const ABSL_LOCKS_EXCLUDED(mu_);

  // A registration from OnCancel; destroying it removes the hook (waiting
  // for a run of it in progress).
  class CancelHook {
   public:
    CancelHook(Mailbox* box, int64_t id) : box_(box), id_(id) {}
    ~CancelHook();
    CancelHook(const CancelHook&) = delete;
    CancelHook& operator=(const CancelHook&) = delete;

   private:
    Mailbox* const box_;
    const int64_t id_;
  };
  // Runs `hook` when the mailbox is cancelled, or at once when it already
  // is, for as long as the returned registration lives: how a transport
  // ends a send in flight (to a peer that hangs without closing its
  // connection, say) when the attempt is called off. The hook runs on the
  // cancelling thread (or this one, when already cancelled) with no lock of
  // the mailbox's held, and must not block: destroying its registration
  // waits for a run of it in progress.
  std::unique_ptr<CancelHook> OnCancel(std::function<void()> hook)
      ABSL_LOCKS_EXCLUDED(hooks_mu_);

  // The round (or elastic attempt sequence) this mailbox is at.
  int64_t round() const ABSL_LOCKS_EXCLUDED(mu_);

  const MailboxOptions& options() const { return options_; }

 private:
  // The checks of `m`'s header, with `payload_bytes` for its payload's
  // size, and of the payload's values when `scan`.
  absl::Status Validate(const Message& m, int64_t payload_bytes,
                        bool scan) const;
  // Drops hook `id` (CancelHook's destructor), waiting out a run of it.
  void RemoveHook(int64_t id) ABSL_LOCKS_EXCLUDED(hooks_mu_);

  using Key = std::tuple<int64_t, std::string, int, int, int>;
  const MailboxOptions options_;
  mutable absl::Mutex mu_;
  int64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<Key, Message> inbox_ ABSL_GUARDED_BY(mu_);
  struct Expected {
    int segment = 0;
    std::shared_ptr<Sink> sink;
    bool claimed = false;
  };
  std::map<Key, Expected> expected_ ABSL_GUARDED_BY(mu_);
  std::map<int, absl::Status> rejected_ ABSL_GUARDED_BY(mu_);
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
  // Taken before mu_ when both are (OnCancel asks whether it is
  // cancelled), never while holding it, and released while a hook runs.
  absl::Mutex hooks_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  int64_t next_hook_ ABSL_GUARDED_BY(hooks_mu_) = 0;
  std::map<int64_t, std::function<void()>> hooks_ ABSL_GUARDED_BY(hooks_mu_);
  // The hook Cancel runs now (-1: none), for ~CancelHook to wait out.
  int64_t running_hook_ ABSL_GUARDED_BY(hooks_mu_) = -1;
};

}  // namespace starling

#endif  // STARLING_GOSSIP_MAILBOX_H_
