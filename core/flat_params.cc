#include "core/flat_params.h"

#include <torch/torch.h>

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
  torch::NoGradGuard no_grad;
  size_t offset = 0;
  for (const auto& t : tensors) {
    torch::Tensor cpu =
        t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    std::memcpy(flat.data() + offset, cpu.data_ptr<float>(),
                sizeof(float) * static_cast<size_t>(cpu.numel()));
    offset += static_cast<size_t>(cpu.numel());
  }
  return flat;
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
    // copy_ converts dtype/device and never aliases `flat`.
    torch::Tensor dst = t;
    dst.copy_(src);
    offset += static_cast<size_t>(t.numel());
  }
  return absl::OkStatus();
}

uint64_t HashBytes(const void* data, size_t size) {
  // Word-at-a-time multiply/rotate mixing with an avalanche finish
  // (constants from xxHash64).
  constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
  constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
  constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
  auto rotl = [](uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = kP3 ^ (static_cast<uint64_t>(size) * kP1);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h ^= rotl(w * kP2, 31) * kP1;
    h = rotl(h, 27) * kP1 + kP3;
  }
  for (; i < size; ++i) {
    h ^= static_cast<uint64_t>(p[i]) * kP3;
    h = rotl(h, 11) * kP1;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

std::string FlatHash(absl::Span<const float> flat) {
  return absl::StrFormat("%016x", HashBytes(flat.data(), flat.size() * 4));
}

std::string ModelHash(const std::vector<torch::Tensor>& tensors) {
  return FlatHash(Flatten(tensors));
}

}  // namespace starling
