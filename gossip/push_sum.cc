#include "gossip/push_sum.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "core/status.h"
#include "gossip/mailbox.h"

namespace starling {

absl::StatusOr<PushShare> PushSum::Share(absl::Span<float> y,
                                         const Codec* codec,
                                         const PublicCopy* base) {
  if (int64_t bad = FirstNonFinite(y); bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("push-sum share: y[", bad, "] is not finite"));
  }
  PushShare share;
  if (codec == nullptr || codec->lossless()) {
    share.sent.assign(y.begin(), y.end());
    if (codec == nullptr) {
      share.payload.resize(y.size() * sizeof(float));
      if (!y.empty())
        std::memcpy(share.payload.data(), y.data(), share.payload.size());
    } else {
      share.codec = codec->Name();
      STARLING_ASSIGN_OR_RETURN(share.payload, codec->Encode(y));
    }
  } else {
    share.codec = codec->Name();
    const bool relative = base != nullptr && base->sequence > 0 &&
                          base->values.size() == y.size();
    share.sent.resize(y.size());
    if (relative) {
      // `sent` holds y − base until the decode overwrites it.
      for (size_t i = 0; i < y.size(); ++i) {
        share.sent[i] = y[i] - base->values[i];
      }
      if (int64_t bad = FirstNonFinite(share.sent); bad >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "push-sum share: y[", bad, "] minus the public copy overflows"));
      }
      STARLING_ASSIGN_OR_RETURN(share.payload, codec->Encode(share.sent));
      share.base_sequence = base->sequence;
    } else {
      STARLING_ASSIGN_OR_RETURN(share.payload, codec->Encode(y));
    }
    STARLING_RETURN_IF_ERROR(
        codec->Decode(share.payload, absl::MakeSpan(share.sent)));
    // The same sum the receiver forms (PublicCopies::Resolve), bit for bit.
    if (relative) {
      for (size_t i = 0; i < y.size(); ++i) share.sent[i] += base->values[i];
    }
    share.y_before.assign(y.begin(), y.end());
    // Error feedback: what the codec dropped stays here.
    for (size_t i = 0; i < y.size(); ++i) y[i] = 2.0f * y[i] - share.sent[i];
  }
  share.weight = weight_ / 2;
  weight_ -= share.weight;
  return share;
}

void PushSum::Restore(const PushShare& share, absl::Span<float> y) {
  weight_ += share.weight;
  if (!share.y_before.empty() && share.y_before.size() == y.size()) {
    std::copy(share.y_before.begin(), share.y_before.end(), y.begin());
  }
}

absl::StatusOr<double> PushSum::Absorb(absl::Span<float> y,
                                       absl::Span<const float> y_s,
                                       double w_s) {
  if (y_s.size() != y.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("push-sum absorb: ", y_s.size(),
                     " values received, the model has ", y.size()));
  }
  if (!(w_s > 0 && w_s <= kMaxPushWeight)) {
    return absl::InvalidArgumentError(absl::StrCat("push-sum absorb: weight ",
                                                   w_s, " is not in (0, ",
                                                   kMaxPushWeight, "]"));
  }
  if (int64_t bad = FirstNonFinite(y_s); bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("push-sum absorb: value ", bad, " is not finite"));
  }
  const double total = weight_ + w_s;
  if (!std::isfinite(total)) {
    return absl::InvalidArgumentError(
        absl::StrCat("push-sum absorb: weight ", w_s, " added to this node's ",
                     weight_, " is not finite"));
  }
  const double a = weight_ / total, b = w_s / total;
  double dist2 = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double d = static_cast<double>(y[i]) - y_s[i];
    dist2 += d * d;
    y[i] = static_cast<float>(a * y[i] + b * y_s[i]);
  }
  weight_ = total;
  return dist2;
}

std::vector<peer::v1::PushChunk> MakePushChunks(
    const std::string& run_id, const std::string& from, int64_t sequence,
    const PushShare& share, int64_t elements, int64_t chunk_bytes) {
  std::vector<peer::v1::PushChunk> chunks;
  const int64_t total = static_cast<int64_t>(share.payload.size());
  chunk_bytes = std::max<int64_t>(1, chunk_bytes);
  int64_t offset = 0;
  do {
    const int64_t len = std::min(chunk_bytes, total - offset);
    peer::v1::PushChunk c;
    c.set_run_id(run_id);
    c.set_from(from);
    c.set_sequence(sequence);
    c.set_elements(elements);
    c.set_codec(share.codec);
    c.set_total_bytes(total);
    c.set_offset(offset);
    c.set_data(share.payload.data() + offset, static_cast<size_t>(len));
    if (offset == 0) c.set_weight(share.weight);
    c.set_base_sequence(share.base_sequence);
    chunks.push_back(std::move(c));
    offset += len;
  } while (offset < total);
  return chunks;
}

PushAssembler::PushAssembler(std::string run_id, int64_t elements,
                             const Codec* codec, int64_t max_bytes)
    : run_id_(std::move(run_id)),
      elements_(elements),
      codec_(codec),
      max_bytes_(max_bytes) {}

absl::Status PushAssembler::Add(const peer::v1::PushChunk& c) {
  if (c.run_id() != run_id_) {
    return absl::InvalidArgumentError(absl::StrCat("push for run '", c.run_id(),
                                                   "'; this node is in run '",
                                                   run_id_, "'"));
  }
  if (c.elements() != elements_) {
    return absl::InvalidArgumentError(
        absl::StrCat("push of ", c.elements(),
                     " elements; this node's model has ", elements_));
  }
  if (!started_) {
    if (!c.codec().empty() &&
        (codec_ == nullptr || c.codec() != codec_->Name())) {
      return absl::InvalidArgumentError(
          absl::StrCat("push codec '", c.codec(), "'; this node decodes ",
                       codec_ ? "'" + codec_->Name() + "'" : "raw fp32 only"));
    }
    const int64_t limit = c.codec().empty()
                              ? elements_ * static_cast<int64_t>(sizeof(float))
                              : max_bytes_;
    if (c.total_bytes() < 0 || c.total_bytes() > limit ||
        (c.codec().empty() && c.total_bytes() != limit)) {
      return absl::InvalidArgumentError(
          absl::StrCat("push total_bytes ", c.total_bytes(), " does not fit ",
                       elements_, " elements (at most ", limit, " bytes)"));
    }
    if (c.offset() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("push starts at offset ", c.offset(), ", not 0"));
    }
    if (c.base_sequence() < 0 || (c.base_sequence() > 0 && c.codec().empty())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push base_sequence ", c.base_sequence(),
          c.base_sequence() < 0 ? " is negative"
                                : " on a raw fp32 push (only lossy pushes "
                                  "are differences)"));
    }
    header_ = c;
    header_.clear_data();
    started_ = true;
    data_.reserve(static_cast<size_t>(c.total_bytes()));
  } else {
    if (c.from() != header_.from() || c.sequence() != header_.sequence() ||
        c.codec() != header_.codec() ||
        c.total_bytes() != header_.total_bytes() ||
        c.base_sequence() != header_.base_sequence()) {
      return absl::InvalidArgumentError(
          "push header changed in the middle of the stream");
    }
    if (c.weight() != 0) {
      return absl::InvalidArgumentError(
          "push weight on a chunk other than the first");
    }
    if (c.offset() != bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push chunk at offset ", c.offset(), ", expected ", bytes()));
    }
  }
  if (static_cast<int64_t>(c.data().size()) > header_.total_bytes() - bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push chunk at offset ", c.offset(), " of ", c.data().size(),
        " bytes runs past total_bytes ", header_.total_bytes()));
  }
  data_.append(c.data());
  return absl::OkStatus();
}

absl::StatusOr<ReceivedPush> PushAssembler::Finish() {
  if (!started_) return absl::InvalidArgumentError("empty push stream");
  if (bytes() != header_.total_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "truncated push: ", bytes(), " of ", header_.total_bytes(), " bytes"));
  }
  ReceivedPush r;
  r.from = header_.from();
  r.sequence = header_.sequence();
  r.weight = header_.weight();
  r.wire_bytes = bytes();
  r.codec = header_.codec();
  r.base_sequence = header_.base_sequence();
  if (!(r.weight > 0 && r.weight <= kMaxPushWeight)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push weight ", r.weight, " is not in (0, ", kMaxPushWeight, "]"));
  }
  r.values.resize(static_cast<size_t>(elements_));
  if (header_.codec().empty()) {
    if (!data_.empty())
      std::memcpy(r.values.data(), data_.data(), data_.size());
  } else {
    absl::Status s = codec_->Decode(data_, absl::MakeSpan(r.values));
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("push payload does not decode: ", s.message()));
    }
  }
  if (int64_t bad = FirstNonFinite(r.values); bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("push value ", bad, " is not finite"));
  }
  return r;
}

absl::Status PublicCopies::Resolve(ReceivedPush& push) {
  if (push.codec.empty()) return absl::OkStatus();  // y exactly, no copy
  absl::MutexLock lock(&mu_);
  if (push.base_sequence > 0) {
    auto it = copies_.find(push.from);
    if (it == copies_.end() || it->second.sequence != push.base_sequence ||
        it->second.values.size() != push.values.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "push ", push.sequence, " from ", push.from,
          " is relative to its push ", push.base_sequence,
          ", and this node holds ",
          it == copies_.end() ? std::string("no copy of it")
                              : absl::StrCat("its push ", it->second.sequence),
          ": send it in full"));
    }
    // In place: a refused push is dropped whole, and the copy is untouched.
    const std::vector<float>& base = it->second.values;
    for (size_t i = 0; i < base.size(); ++i) push.values[i] += base[i];
    if (int64_t bad = FirstNonFinite(push.values); bad >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("push ", push.sequence, " from ", push.from, ": value ",
                       bad, " plus the public copy is not finite"));
    }
    push.base_sequence = 0;
  }
  PublicCopy& copy = copies_[push.from];
  copy.sequence = push.sequence;
  copy.values = push.values;
  return absl::OkStatus();
}

void PublicCopies::Forget(const std::string& from) {
  absl::MutexLock lock(&mu_);
  copies_.erase(from);
}

int64_t PublicCopies::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(copies_.size());
}

}  // namespace starling
