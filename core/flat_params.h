// Flat fp32 views of a model's parameters (and of its buffers: integer ones
// as exact floats up to 2^24), in a fixed order, and the model hash over
// those bytes. The network modules exchange these buffers, and tests
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

// Copies every tensor (any device, any real dtype) into one fp32 CPU buffer,
// concatenated in order.
std::vector<float> Flatten(const std::vector<torch::Tensor>& tensors);
// Flatten into `out`, which must hold exactly NumElements(tensors) floats.
void FlattenInto(const std::vector<torch::Tensor>& tensors,
                 absl::Span<float> out);

// Writes `flat` back into `tensors` in place (same order, converting to each
// tensor's dtype and device; an integer tensor takes the nearest integer).
// InvalidArgument when the sizes differ.
absl::Status Unflatten(absl::Span<const float> flat,
                       const std::vector<torch::Tensor>& tensors);

// Buffers (BatchNorm's running statistics and the like) are kept equal
// across members by averaging what each member's moved from the shared
// value: δb = BufferDelta(shared, own) goes into the exchange weighted, and
// ApplyBufferMean(Σ w δb, Σ w, shared) applies the mean.
// δb = shared − own, elementwise, and exactly 0 where the two are equal (so
// that equal infinities, a mask's, give 0, not NaN). Same sizes.
std::vector<float> BufferDelta(absl::Span<const float> shared,
                               absl::Span<const float> own);
// shared −= sum / weight, elementwise, leaving an element whose sum is 0 as
// it was (exactly, infinities included). Same sizes; weight > 0.
void ApplyBufferMean(absl::Span<const float> sum, double weight,
                     absl::Span<float> shared);

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

// Hash of a flat fp32 buffer followed by the model's flat buffers (the
// hash of their concatenation), as 16 lowercase hex digits. A model
// without buffers hashes its parameters alone.
std::string FlatHash(absl::Span<const float> flat,
                     absl::Span<const float> buffers = {});

// The model hash: FlatHash of Flatten(params) and Flatten(buffers).
std::string ModelHash(const std::vector<torch::Tensor>& params,
                      const std::vector<torch::Tensor>& buffers = {});

}  // namespace starling

#endif  // STARLING_CORE_FLAT_PARAMS_H_
