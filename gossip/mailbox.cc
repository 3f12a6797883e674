#include "gossip/mailbox.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "core/status.h"

namespace starling {

int64_t SegmentLength(int64_t total, int parts, int segment) {
  return total / parts + (segment < total % parts ? 1 : 0);
}

int64_t SegmentOffset(int64_t total, int parts, int segment) {
  int64_t base = total / parts, extra = total % parts;
  return segment * base + std::min<int64_t>(segment, extra);
}

absl::Status OwnValueNotFinite(absl::Span<const float> sum, int64_t first) {
  for (size_t i = 0; i < sum.size(); ++i) {
    if (std::isnan(sum[i])) {
      return absl::InternalError(absl::StrCat(
          "the receiving node's own value at element ",
          first + static_cast<int64_t>(i),
          " is not finite (its sum with the received value is NaN)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyFromPeer(absl::string_view fp32, absl::Span<float> out,
                           bool accumulate, int64_t first) {
  if (ApplyFp32(fp32, out, accumulate)) return absl::OkStatus();
  // Refused (rare): say whose values were not finite.
  const int64_t bad = FirstNonFinite(fp32);
  if (bad >= 0) {
    float v;
    std::memcpy(&v, fp32.data() + 4 * bad, 4);
    return absl::InvalidArgumentError(
        absl::StrCat("a non-finite value (", v, ") at element ", first + bad));
  }
  // Finite values received: a NaN sum is this node's own fault; an Inf
  // one, an overflow.
  const size_t n = std::min(fp32.size() / 4, out.size());
  STARLING_RETURN_IF_ERROR(OwnValueNotFinite(out.subspan(0, n), first));
  return absl::InvalidArgumentError(absl::StrCat(
      "adding elements ", first, "..", first + static_cast<int64_t>(n) - 1,
      " overflows fp32 to Inf"));
}

absl::Status Sink::Apply(int64_t offset, absl::string_view fp32) {
  const int64_t n = static_cast<int64_t>(fp32.size() / 4);
  if (fp32.size() % 4 != 0 || offset < 0 || offset > elements() - n) {
    return absl::InvalidArgumentError(absl::StrCat(
        fp32.size(), " bytes at element ", offset,
        " are not whole fp32 values inside the segment's ", elements()));
  }
  absl::MutexLock lock(&mu_);
  if (!open_) {
    return absl::FailedPreconditionError(
        "the collective no longer waits for this message");
  }
  return ApplyFromPeer(fp32, values_.subspan(offset, n), accumulate_, offset);
}

void Sink::Close() {
  absl::MutexLock lock(&mu_);
  open_ = false;
}

Mailbox::Mailbox(MailboxOptions options)
    : options_(std::move(options)), round_(options_.first_round) {}

int64_t MaxMessageBytes(const MailboxOptions& o, const std::string& tensor,
                        bool any_world) {
  auto known = o.tensors.find(tensor);
  if (known == o.tensors.end()) return -1;
  const bool whole = any_world || o.whole_tensors.count(tensor) > 0;
  const int64_t elements = known->second / std::max(1, whole ? 1 : o.world) + 1;
  auto c = o.compressed_bytes_per_element.find(tensor);
  const int64_t per_element =
      c == o.compressed_bytes_per_element.end() ? 4 : c->second;
  return elements * per_element + 4096;
}

absl::Status Mailbox::Deliver(Message m) {
  const int from = m.from;
  m.applied = false;
  absl::Status s =
      Validate(m, static_cast<int64_t>(m.payload.size()), /*scan=*/true);
  if (!s.ok()) {
    // A bad message for the current or next round fails the wait for it;
    // a stale one cannot hurt and is only refused.
    absl::MutexLock lock(&mu_);
    if (m.round >= round_ && from >= 0 && from < options_.world) {
      rejected_[from] = s;
    }
    return s;
  }
  absl::MutexLock lock(&mu_);
  if (m.round < round_) {
    s = absl::FailedPreconditionError(
        absl::StrCat("message from rank ", from, ": stale round ", m.round,
                     "; this node is at round ", round_));
  } else if (m.round > round_ + 1) {
    s = absl::FailedPreconditionError(
        absl::StrCat("message from rank ", from, ": round ", m.round,
                     " is ahead of this node's ", round_, " by more than one"));
  } else {
    Key key{m.round, m.tensor, static_cast<int>(m.phase), m.step, m.from};
    auto e = expected_.find(key);
    if (inbox_.count(key) || (e != expected_.end() && e->second.claimed)) {
      s = absl::FailedPreconditionError(
          absl::StrCat("message from rank ", from, ": duplicate for round ",
                       m.round, " step ", m.step));
    } else {
      inbox_.emplace(std::move(key), std::move(m));
      return absl::OkStatus();
    }
  }
  return s;
}

void Mailbox::RecordRejection(int from, const absl::Status& why) {
  if (from < 0 || from >= options_.world) return;
  absl::MutexLock lock(&mu_);
  rejected_[from] = why;
}

std::shared_ptr<Sink> Mailbox::Expect(int from, int64_t round,
                                      const std::string& tensor,
                                      RingPhase phase, int step, int segment,
                                      absl::Span<float> values,
                                      bool accumulate) {
  auto sink = std::make_shared<Sink>(values, accumulate);
  absl::MutexLock lock(&mu_);
  expected_[Key{round, tensor, static_cast<int>(phase), step, from}] =
      Expected{segment, sink, false};
  return sink;
}

std::shared_ptr<Sink> Mailbox::ClaimSink(const Message& header,
                                         int64_t segment_bytes) {
  if (options_.compressed_bytes_per_element.count(header.tensor) ||
      !Validate(header, segment_bytes, /*scan=*/false).ok()) {
    return nullptr;  // the buffered path says what is wrong
  }
  Key key{header.round, header.tensor, static_cast<int>(header.phase),
          header.step, header.from};
  absl::MutexLock lock(&mu_);
  if (header.round != round_ || inbox_.count(key)) return nullptr;
  auto it = expected_.find(key);
  if (it == expected_.end() || it->second.claimed ||
      it->second.segment != header.segment ||
      it->second.sink->elements() * 4 != segment_bytes) {
    return nullptr;
  }
  it->second.claimed = true;
  return it->second.sink;
}

absl::Status Mailbox::DeliverApplied(Message header) {
  header.payload.clear();
  header.applied = true;
  Key key{header.round, header.tensor, static_cast<int>(header.phase),
          header.step, header.from};
  absl::MutexLock lock(&mu_);
  auto it = expected_.find(key);
  if (header.round < round_ || it == expected_.end() || !it->second.claimed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "message from rank ", header.from, ": round ", header.round, " step ",
        header.step, " is no longer expected; this node is at round ", round_));
  }
  inbox_.emplace(std::move(key), std::move(header));
  return absl::OkStatus();
}

absl::Status Mailbox::Validate(const Message& m, int64_t payload_bytes,
                               bool scan) const {
  const std::string who = absl::StrCat("message from rank ", m.from);
  if (m.from < 0 || m.from >= options_.world || m.from == options_.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": sender rank must be in [0, ", options_.world,
                     ") and not the receiver's own rank ", options_.rank));
  }
  auto known = options_.tensors.find(m.tensor);
  if (known == options_.tensors.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": unknown tensor '", m.tensor, "'"));
  }
  if (m.total_elements != known->second) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": tensor '", m.tensor, "' has ", m.total_elements,
                     " elements; this run's has ", known->second));
  }
  if (m.segment < 0 || m.segment >= options_.world || m.step < 0 ||
      m.step >= options_.world - 1 ||
      (m.phase != RingPhase::kReduceScatter &&
       m.phase != RingPhase::kAllGather)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": bad ring position (phase ",
                     static_cast<int>(m.phase), ", step ", m.step, ", segment ",
                     m.segment, ") for ", options_.world, " members"));
  }
  const bool whole = options_.whole_tensors.count(m.tensor) > 0;
  if (whole &&
      (m.segment != 0 || m.step != 0 || m.phase != RingPhase::kAllGather)) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": tensor '", m.tensor,
        "' travels whole (segment 0, step 0 of the all-gather), not segment ",
        m.segment, " step ", m.step));
  }
  const int64_t elems =
      whole ? known->second
            : SegmentLength(known->second, options_.world, m.segment);
  if (auto c = options_.compressed_bytes_per_element.find(m.tensor);
      c != options_.compressed_bytes_per_element.end()) {
    const int64_t limit = elems * c->second + 4096;
    if (payload_bytes > limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": compressed segment ", m.segment, " of '", m.tensor, "' has ",
          payload_bytes, " bytes; at most ", limit, " fit"));
    }
    return absl::OkStatus();
  }
  const int64_t want = elems * 4;
  if (payload_bytes != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": segment ", m.segment, " of '", m.tensor, "' has ",
                     payload_bytes, " bytes; expected ", want));
  }
  if (!scan) return absl::OkStatus();
  const int64_t bad = FirstNonFinite(m.payload);
  if (bad >= 0) {
    float v;
    std::memcpy(&v, m.payload.data() + 4 * bad, 4);
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": segment ", m.segment, " of '", m.tensor, "' round ", m.round,
        " holds a non-finite value (", v, ") at element ", bad));
  }
  return absl::OkStatus();
}

absl::StatusOr<Message> Mailbox::Take(int from, int64_t round,
                                      const std::string& tensor,
                                      RingPhase phase, int step,
                                      absl::Time deadline) {
  Key key{round, tensor, static_cast<int>(phase), step, from};
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return inbox_.count(key) > 0 || rejected_.count(from) > 0 ||
           !cancelled_.ok();
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "timed out waiting for rank ", from, " (round ", round, ", '", tensor,
        "', ",
        phase == RingPhase::kReduceScatter ? "reduce-scatter" : "all-gather",
        " step ", step, ")"));
  }
  if (!cancelled_.ok()) return cancelled_;
  auto it = inbox_.find(key);
  if (it == inbox_.end()) {
    absl::Status why = rejected_[from];
    rejected_.erase(from);
    // Only InvalidArgument is the sender's fault (see Sink::Apply): a
    // cancelled stream (Aborted) or this node's own NaN (Internal) is not
    // worded as a bad message.
    return absl::Status(
        why.code(), absl::StrCat(absl::IsInvalidArgument(why)
                                     ? "rejected a bad message from rank "
                                     : "could not take the message from rank ",
                                 from, ": ", why.message()));
  }
  Message m = std::move(it->second);
  inbox_.erase(it);
  expected_.erase(key);
  return m;
}

void Mailbox::AdvanceRound(int64_t round) {
  absl::MutexLock lock(&mu_);
  if (round <= round_) return;
  round_ = round;
  rejected_.clear();
  for (auto it = inbox_.begin(); it != inbox_.end();) {
    it = std::get<0>(it->first) < round ? inbox_.erase(it) : std::next(it);
  }
  for (auto it = expected_.begin(); it != expected_.end();) {
    it = std::get<0>(it->first) < round ? expected_.erase(it) : std::next(it);
  }
}

void Mailbox::Cancel(const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_.ok()) return;
    cancelled_ = why.ok() ? absl::CancelledError("cancelled") : why;
  }
  // Once cancelled_ is set no hook is added (OnCancel runs it itself), so
  // this drains them. Each runs with the lock released: a hook may cancel a
  // gRPC call, which must not happen under a lock.
  hooks_mu_.Lock();
  while (!hooks_.empty()) {
    auto it = hooks_.begin();
    std::function<void()> hook = std::move(it->second);
    running_hook_ = it->first;
    hooks_.erase(it);
    hooks_mu_.Unlock();
    hook();
    hooks_mu_.Lock();
    running_hook_ = -1;
  }
  hooks_mu_.Unlock();
}

std::unique_ptr<Mailbox::CancelHook> Mailbox::OnCancel(
    std::function<void()> hook) {
  int64_t id;
  {
    absl::MutexLock lock(&hooks_mu_);
    id = next_hook_++;
    if (!cancelled()) {
      hooks_.emplace(id, std::move(hook));
      hook = nullptr;
    }
  }
  if (hook) hook();  // already cancelled: Cancel will not run it
  return std::make_unique<CancelHook>(this, id);
}

Mailbox::CancelHook::~CancelHook() { box_->RemoveHook(id_); }

void Mailbox::RemoveHook(int64_t id) {
  absl::MutexLock lock(&hooks_mu_);
  hooks_.erase(id);
  auto idle = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(hooks_mu_) {
    return running_hook_ != id;
  };
  hooks_mu_.Await(absl::Condition(&idle));
}

bool Mailbox::cancelled() const {
  absl::MutexLock lock(&mu_);
  return !cancelled_.ok();
}

bool Mailbox::SleepUnlessCancelled(absl::Duration d) const {
  absl::MutexLock lock(&mu_);
  auto called_off = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !cancelled_.ok();
  };
  return !mu_.AwaitWithTimeout(absl::Condition(&called_off), d);
}

int64_t Mailbox::round() const {
  absl::MutexLock lock(&mu_);
  return round_;
}

}  // namespace starling
