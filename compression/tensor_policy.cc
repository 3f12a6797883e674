#include "compression/tensor_policy.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "compression/kernels.h"
#include "core/status.h"

namespace starling {
namespace {

// A slice payload is a sequence of parts, one per range the slice touches:
//   u32 part bytes, then that many bytes of the range's codec payload.
void PutU32(std::string* out, uint32_t v) {
  out->append(reinterpret_cast<const char*>(&v), 4);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PolicyCodec>> PolicyCodec::Create(
    const std::vector<int64_t>& tensor_sizes, const PolicyOptions& o) {
  auto p = std::unique_ptr<PolicyCodec>(new PolicyCodec());
  if (o.small_elements < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--small_tensor_elems=", o.small_elements, ": must be >= 0"));
  }
  absl::StatusOr<std::unique_ptr<Codec>> main = MakeCodec(o.main);
  if (!main.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--compression=", o.main, ": ", main.status().message()));
  }
  const Codec* main_ptr = main->get();
  const Codec* small_ptr = main_ptr;
  const Codec* fp32_ptr = nullptr;
  p->codecs_.push_back(std::move(main).value());
  // Checked even where it goes unused (a lossless main codec), so that a
  // typo fails now, not when the main codec changes.
  absl::StatusOr<std::unique_ptr<Codec>> small = MakeCodec(o.small);
  if (!small.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--small_tensor_codec=", o.small, ": ", small.status().message()));
  }
  if (!main_ptr->lossless()) {
    small_ptr = small->get();
    p->codecs_.push_back(std::move(small).value());
  }
  if (o.trailing_fp32 > 0) {
    STARLING_ASSIGN_OR_RETURN(std::unique_ptr<Codec> fp32, MakeCodec("fp32"));
    fp32_ptr = fp32.get();
    p->codecs_.push_back(std::move(fp32));
  }
  auto add = [&](int64_t length, const Codec* codec) {
    if (length <= 0) return;
    if (!p->ranges_.empty() && p->ranges_.back().codec == codec) {
      p->ranges_.back().length += length;  // merge neighbours
    } else {
      p->ranges_.push_back({p->size_, length, codec});
    }
    p->size_ += length;
    p->lossless_ = p->lossless_ && codec->lossless();
  };
  for (int64_t n : tensor_sizes) {
    add(n, n < o.small_elements ? small_ptr : main_ptr);
  }
  add(o.trailing_fp32, fp32_ptr);
  p->name_ = main_ptr->Name();
  if (small_ptr != main_ptr) {
    absl::StrAppend(&p->name_, " (tensors < ", o.small_elements,
                    " elements: ", small_ptr->Name(), ")");
  }
  return p;
}

template <typename Fn>
absl::Status PolicyCodec::ForEachPart(int64_t offset, int64_t length,
                                      Fn fn) const {
  if (offset < 0 || length < 0 || offset + length > size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice [", offset, ", ", offset + length,
                     ") is outside the ", size_, "-element vector"));
  }
  const int64_t end = offset + length;
  auto it = std::upper_bound(
      ranges_.begin(), ranges_.end(), offset,
      [](int64_t off, const Range& r) { return off < r.offset; });
  if (it != ranges_.begin()) --it;
  for (; it != ranges_.end() && it->offset < end; ++it) {
    int64_t b = std::max(offset, it->offset);
    int64_t e = std::min(end, it->offset + it->length);
    if (b >= e) continue;
    STARLING_RETURN_IF_ERROR(fn(*it->codec, b - offset, e - b));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PolicyCodec::EncodeSlice(
    int64_t offset, absl::Span<const float> values) const {
  std::string out;
  STARLING_RETURN_IF_ERROR(ForEachPart(
      offset, static_cast<int64_t>(values.size()),
      [&](const Codec& c, int64_t rel, int64_t len) -> absl::Status {
        STARLING_ASSIGN_OR_RETURN(std::string part,
                                  c.Encode(values.subspan(rel, len)));
        PutU32(&out, static_cast<uint32_t>(part.size()));
        out += part;
        return absl::OkStatus();
      }));
  return out;
}

absl::StatusOr<std::vector<PolicyCodec::EncodedPart>> PolicyCodec::SplitSlice(
    int64_t offset, int64_t length, absl::string_view bytes) const {
  std::vector<EncodedPart> parts;
  size_t pos = 0;
  STARLING_RETURN_IF_ERROR(ForEachPart(
      offset, length,
      [&](const Codec& c, int64_t rel, int64_t len) -> absl::Status {
        uint32_t n = 0;
        if (bytes.size() - pos < 4) {
          return absl::DataLossError("compressed slice is truncated");
        }
        std::memcpy(&n, bytes.data() + pos, 4);
        pos += 4;
        if (bytes.size() - pos < n) {
          return absl::DataLossError("compressed slice part is truncated");
        }
        parts.push_back({&c, rel, len, bytes.substr(pos, n)});
        pos += n;
        return absl::OkStatus();
      }));
  if (pos != bytes.size()) {
    return absl::DataLossError(absl::StrCat(
        "compressed slice has ", bytes.size() - pos, " trailing bytes"));
  }
  return parts;
}

absl::Status PolicyCodec::DecodeSlice(int64_t offset, absl::string_view bytes,
                                      absl::Span<float> out) const {
  STARLING_ASSIGN_OR_RETURN(
      std::vector<EncodedPart> parts,
      SplitSlice(offset, static_cast<int64_t>(out.size()), bytes));
  for (const EncodedPart& p : parts) {
    STARLING_RETURN_IF_ERROR(
        p.codec->Decode(p.bytes, out.subspan(p.rel, p.len)));
  }
  return absl::OkStatus();
}

absl::Status PolicyCodec::DecodeSliceAccumulate(int64_t offset,
                                                absl::string_view bytes,
                                                absl::Span<float> acc) const {
  STARLING_ASSIGN_OR_RETURN(
      std::vector<EncodedPart> parts,
      SplitSlice(offset, static_cast<int64_t>(acc.size()), bytes));
  // One part (one codec covers the slice, the usual case): that codec adds
  // straight into `acc`, and leaves it unchanged on a decoding error,
  // without a decoded copy of the whole slice (a zeroed buffer as large as
  // a ring segment). Several: decode all first, so that an error in a later
  // part leaves `acc` unchanged too. Either way an overflowing sum is found
  // in the pass that adds.
  if (parts.size() == 1) {
    return parts[0].codec->DecodeAccumulate(parts[0].bytes, acc);
  }
  std::vector<float> decoded(acc.size());
  for (const EncodedPart& p : parts) {
    STARLING_RETURN_IF_ERROR(p.codec->Decode(
        p.bytes, absl::MakeSpan(decoded).subspan(p.rel, p.len)));
  }
  // The fp32 codec's kernel: the vector adds, and the overflow check in
  // the same pass.
  const bool finite = compression_internal::Fp32ToFloat(
      reinterpret_cast<const char*>(decoded.data()), decoded.size(), acc.data(),
      /*accumulate=*/true);
  return finite ? absl::OkStatus() : AccumulateOverflowError();
}

absl::StatusOr<std::string> PolicyCodec::Encode(
    absl::Span<const float> values) const {
  return EncodeSlice(0, values);
}

absl::Status PolicyCodec::Decode(absl::string_view bytes,
                                 absl::Span<float> out) const {
  return DecodeSlice(0, bytes, out);
}

absl::Status PolicyCodec::DecodeAccumulate(absl::string_view bytes,
                                           absl::Span<float> acc) const {
  return DecodeSliceAccumulate(0, bytes, acc);
}

int64_t PolicyCodec::MaxEncodedBytes(int64_t elements) const {
  // Top-k at 100% stores a 4-byte index and up to 4 bytes of value per
  // element; every part adds its length prefix and a codec header.
  return elements * 8 + static_cast<int64_t>(ranges_.size()) * 64 + 64;
}

}  // namespace starling
