#include "core/flat_params.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace starling {

int64_t NumElements(const std::vector<torch::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.numel();
  return n;
}

std::vector<float> Flatten(const std::vector<torch::Tensor>& tensors) {
  std::vector<float> flat(static_cast<size_t>(NumElements(tensors)));
  FlattenInto(tensors, absl::MakeSpan(flat));
  return flat;
}

void FlattenInto(const std::vector<torch::Tensor>& tensors,
                 absl::Span<float> out) {
  torch::NoGradGuard no_grad;
  size_t offset = 0;
  for (const auto& t : tensors) {
    torch::Tensor cpu =
        t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    std::memcpy(out.data() + offset, cpu.data_ptr<float>(),
                sizeof(float) * static_cast<size_t>(cpu.numel()));
    offset += static_cast<size_t>(cpu.numel());
  }
}

absl::Status Unflatten(absl::Span<const float> flat,
                       const std::vector<torch::Tensor>& tensors) {
  int64_t expected = NumElements(tensors);
  if (static_cast<int64_t>(flat.size()) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("flat buffer has ", flat.size(),
                     " elements; the model has ", expected));
  }
  torch::NoGradGuard no_grad;
  size_t offset = 0;
  for (const auto& t : tensors) {
    torch::Tensor src = torch::from_blob(
        const_cast<float*>(flat.data() + offset), t.sizes(), torch::kFloat32);
    // An integer buffer (a step count) takes the nearest integer, not the
    // truncation that a conversion would give an average.
    if (!t.is_floating_point()) src = src.round();
    // copy_ converts dtype/device and never aliases `flat`.
    torch::Tensor dst = t;
    dst.copy_(src);
    offset += static_cast<size_t>(t.numel());
  }
  return absl::OkStatus();
}

std::vector<float> BufferDelta(absl::Span<const float> shared,
                               absl::Span<const float> own) {
  std::vector<float> delta(own.size());
  for (size_t i = 0; i < delta.size(); ++i) {
    delta[i] = shared[i] == own[i] ? 0.0f : shared[i] - own[i];
  }
  return delta;
}

void ApplyBufferMean(absl::Span<const float> sum, double weight,
                     absl::Span<float> shared) {
  for (size_t i = 0; i < shared.size(); ++i) {
    if (sum[i] != 0) shared[i] -= static_cast<float>(sum[i] / weight);
  }
}

// Word-at-a-time multiply/rotate mixing with an avalanche finish
// (constants from xxHash64).
namespace {
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t Mix(uint64_t h, uint64_t w) {
  h ^= Rotl(w * kP2, 31) * kP1;
  return Rotl(h, 27) * kP1 + kP3;
}
}  // namespace

BytesHasher::BytesHasher(size_t size)
    : h_(kP3 ^ (static_cast<uint64_t>(size) * kP1)) {}

void BytesHasher::Update(const void* data, size_t size) {
  // An empty span may carry a null pointer, and memcpy's arguments must
  // never be null, even for zero bytes.
  if (size == 0) return;
  const auto* p = static_cast<const unsigned char*>(data);
  if (pending_size_ > 0) {
    const size_t take = std::min(size, 8 - pending_size_);
    std::memcpy(pending_ + pending_size_, p, take);
    pending_size_ += take;
    p += take;
    size -= take;
    if (pending_size_ < 8) return;
    uint64_t w;
    std::memcpy(&w, pending_, 8);
    h_ = Mix(h_, w);
    pending_size_ = 0;
  }
  uint64_t h = h_;  // in a register: p may alias any byte, h_ included
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = Mix(h, w);
  }
  h_ = h;
  std::memcpy(pending_, p + i, size - i);
  pending_size_ = size - i;
}

uint64_t BytesHasher::Finish() {
  uint64_t h = h_;
  for (size_t i = 0; i < pending_size_; ++i) {
    h ^= static_cast<uint64_t>(pending_[i]) * kP3;
    h = Rotl(h, 11) * kP1;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t HashBytes(const void* data, size_t size) {
  BytesHasher hasher(size);
  hasher.Update(data, size);
  return hasher.Finish();
}

std::string FlatHash(absl::Span<const float> flat,
                     absl::Span<const float> buffers) {
  BytesHasher hasher((flat.size() + buffers.size()) * 4);
  hasher.Update(flat.data(), flat.size() * 4);
  hasher.Update(buffers.data(), buffers.size() * 4);
  return absl::StrFormat("%016x", hasher.Finish());
}

std::string ModelHash(const std::vector<torch::Tensor>& tensors,
                      const std::vector<torch::Tensor>& buffers) {
  return FlatHash(Flatten(tensors), Flatten(buffers));
}

}  // namespace starling
