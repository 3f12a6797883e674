// Flat fp32 views of a model's parameters, in a fixed order, and the model
// hash over those bytes. The network modules exchange these buffers, and tests
// and reports compare model hashes to check bit-identity.
// Functions are thread-compatible: callers serialize access to the tensors.
#ifndef STARLING_CORE_FLAT_PARAMS_H_
#define STARLING_CORE_FLAT_PARAMS_H_

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace starling {

// Total number of elements across `tensors`.
int64_t NumElements(const std::vector<torch::Tensor>& tensors);

// Copies every tensor (any device, floating dtype) into one fp32 CPU buffer,
// concatenated in order.
std::vector<float> Flatten(const std::vector<torch::Tensor>& tensors);
// Flatten into `out`, which must hold exactly NumElements(tensors) floats.
void FlattenInto(const std::vector<torch::Tensor>& tensors,
                 absl::Span<float> out);

// Writes `flat` back into `tensors` in place (same order, converting to each
// tensor's dtype and device). InvalidArgument when the sizes differ.
absl::Status Unflatten(absl::Span<const float> flat,
                       const std::vector<torch::Tensor>& tensors);

// 64-bit non-cryptographic hash of a byte range; stable across runs and
// machines of the same endianness.
uint64_t HashBytes(const void* data, size_t size);

// HashBytes of bytes fed in pieces, for data never held in one buffer: the
// pieces' concatenation, whose total `size` is given up front, hashes to
// the same value. Not thread-safe.
class BytesHasher {
 public:
  explicit BytesHasher(size_t size);
  void Update(const void* data, size_t size);
  // The hash, once exactly the announced size has been fed.
  uint64_t Finish();

 private:
  uint64_t h_;
  unsigned char pending_[8];  // bytes of a word not yet complete
  size_t pending_size_ = 0;
};

// Hash of a flat fp32 buffer, as 16 lowercase hex digits.
std::string FlatHash(absl::Span<const float> flat);

// Hash of the flat fp32 bytes of `tensors` (FlatHash of Flatten).
std::string ModelHash(const std::vector<torch::Tensor>& tensors);

}  // namespace starling

#endif  // STARLING_CORE_FLAT_PARAMS_H_
