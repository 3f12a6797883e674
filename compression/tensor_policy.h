// Per-tensor compression policy over a flat parameter vector: each tensor's
// range of the flat view gets its own codec (small tensors such as norms and
// biases go in bf16 or fp32, large ones use the main codec), and any slice
// [offset, offset+len) of the vector can be encoded on its own, as the ring
// all-reduce does per segment. Implements Codec for whole vectors, so error
// feedback can wrap it. Immutable after Create: thread-safe.
#ifndef STARLING_COMPRESSION_TENSOR_POLICY_H_
#define STARLING_COMPRESSION_TENSOR_POLICY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "compression/codec.h"

namespace starling {

struct PolicyOptions {
  std::string main = "fp32";      // --compression
  std::string small = "bf16";     // codec for tensors below the threshold
  int64_t small_elements = 4096;  // "small": fewer elements than this (>= 0)
  int64_t trailing_fp32 = 0;      // extra elements at the end kept in fp32
};

class PolicyCodec : public Codec {
 public:
  // `tensor_sizes` are the element counts of the tensors in flat order.
  // With a lossless main codec every tensor uses it (the small codec only
  // applies when compression is lossy, but its spec is always checked).
  // InvalidArgument naming the flag for a bad spec.
  static absl::StatusOr<std::unique_ptr<PolicyCodec>> Create(
      const std::vector<int64_t>& tensor_sizes, const PolicyOptions& options);

  int64_t size() const { return size_; }

  // Encodes values = flat[offset, offset + values.size()).
  absl::StatusOr<std::string> EncodeSlice(int64_t offset,
                                          absl::Span<const float> values) const;
  // InvalidArgument / DataLoss for a payload that does not fit the slice;
  // never reads out of bounds.
  absl::Status DecodeSlice(int64_t offset, absl::string_view bytes,
                           absl::Span<float> out) const;
  absl::Status DecodeSliceAccumulate(int64_t offset, absl::string_view bytes,
                                     absl::Span<float> acc) const;

  // Codec over the whole vector (values.size() == size()).
  std::string Name() const override { return name_; }
  bool lossless() const override { return lossless_; }
  absl::StatusOr<std::string> Encode(
      absl::Span<const float> values) const override;
  absl::Status Decode(absl::string_view bytes,
                      absl::Span<float> out) const override;
  absl::Status DecodeAccumulate(absl::string_view bytes,
                                absl::Span<float> acc) const override;

  // Most bytes an encoded slice of `elements` elements can take.
  int64_t MaxEncodedBytes(int64_t elements) const;

 private:
  struct Range {
    int64_t offset;
    int64_t length;
    const Codec* codec;
  };
  PolicyCodec() = default;
  template <typename Fn>
  absl::Status ForEachPart(int64_t offset, int64_t length, Fn fn) const;
  // One part of an encoded slice: its codec, its elements [rel, rel + len)
  // of the slice, and its bytes (after their u32 length).
  struct EncodedPart {
    const Codec* codec;
    int64_t rel;
    int64_t len;
    absl::string_view bytes;
  };
  // `bytes` (a slice [offset, offset + length)) split into its parts;
  // DataLoss for truncated parts or trailing bytes.
  absl::StatusOr<std::vector<EncodedPart>> SplitSlice(
      int64_t offset, int64_t length, absl::string_view bytes) const;

  std::vector<std::unique_ptr<Codec>> codecs_;
  std::vector<Range> ranges_;
  int64_t size_ = 0;
  std::string name_;
  bool lossless_ = true;
};

}  // namespace starling

#endif  // STARLING_COMPRESSION_TENSOR_POLICY_H_
