#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "compression/kernels.h"

namespace starling {
namespace {

constexpr char kStateMagic[4] = {'S', 'E', 'F', '1'};
constexpr size_t kStateOverhead = 4 + 8 + 8;  // magic, count, checksum

// A 64-bit multiply-xor checksum over 8-byte words (corruption detection,
// not security).
uint64_t Checksum(const char* p, size_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) {
    h = (h ^ static_cast<unsigned char>(p[i])) * 0x100000001b3ull;
  }
  return h ^ (h >> 32);
}

}  // namespace

ErrorFeedback::ErrorFeedback(int64_t size)
    : residual_(size > 0 ? static_cast<size_t>(size) : 0, 0.0f) {}

absl::StatusOr<std::string> ErrorFeedback::Compress(
    const Codec& codec, absl::Span<const float> delta, absl::Span<float> sent) {
  const size_t n = residual_.size();
  if (delta.size() != n || sent.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("error feedback holds ", n, " values; got delta of ",
                     delta.size(), " and sent of ", sent.size()));
  }
  x_.resize(n);
  const float* d = delta.data();
  const float* e = residual_.data();
  float* x = x_.data();
  for (size_t i = 0; i < n; ++i) x[i] = d[i] + e[i];
  absl::StatusOr<std::string> bytes = codec.Encode(x_);
  if (!bytes.ok()) return bytes.status();
  const absl::Status decoded = codec.Decode(*bytes, sent);
  if (!decoded.ok()) return decoded;
  const float* s = sent.data();
  float* r = residual_.data();
  for (size_t i = 0; i < n; ++i) r[i] = x[i] - s[i];
  return bytes;
}

absl::Status ErrorFeedback::ScaleResidual(float factor) {
  if (!(factor >= 0.0f && factor <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "error-feedback residual scale ", factor, " is not in [0, 1]"));
  }
  for (float& r : residual_) r *= factor;
  return absl::OkStatus();
}

std::string ErrorFeedback::SaveState() const {
  const uint64_t count = residual_.size();
  std::string out(kStateOverhead + 4 * count, '\0');
  std::memcpy(&out[0], kStateMagic, 4);
  std::memcpy(&out[4], &count, 8);
  if (count > 0) std::memcpy(&out[12], residual_.data(), 4 * count);
  const uint64_t sum = Checksum(out.data(), out.size() - 8);
  std::memcpy(&out[out.size() - 8], &sum, 8);
  return out;
}

absl::Status ErrorFeedback::LoadState(absl::string_view bytes) {
  if (bytes.size() < kStateOverhead ||
      std::memcmp(bytes.data(), kStateMagic, 4) != 0) {
    return absl::DataLossError("error-feedback state: not a residual");
  }
  uint64_t count;
  std::memcpy(&count, bytes.data() + 4, 8);
  if (count != residual_.size()) {
    return absl::DataLossError(absl::StrCat("error-feedback state holds ",
                                            count, " values, this model has ",
                                            residual_.size()));
  }
  if (bytes.size() != kStateOverhead + 4 * count) {
    return absl::DataLossError("error-feedback state: truncated");
  }
  uint64_t sum;
  std::memcpy(&sum, bytes.data() + bytes.size() - 8, 8);
  if (sum != Checksum(bytes.data(), bytes.size() - 8)) {
    return absl::DataLossError("error-feedback state: checksum mismatch");
  }
  if (!compression_internal::Fp32AllFinite(bytes.data() + 12, count)) {
    return absl::DataLossError("error-feedback state: NaN/Inf residual");
  }
  if (count > 0) std::memcpy(residual_.data(), bytes.data() + 12, 4 * count);
  return absl::OkStatus();
}

}  // namespace starling
