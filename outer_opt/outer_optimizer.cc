#include "outer_opt/outer_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace starling {

absl::StatusOr<std::unique_ptr<OuterOptimizer>> OuterOptimizer::Create(
    const OuterOptions& options, int64_t size) {
  OuterOptions o = options;
  if (o.kind == "average") {
    o.lr = 1.0;
    o.momentum = 0.0;
  } else if (o.kind != "nesterov") {
    return absl::InvalidArgumentError(
        absl::StrCat("--outer=", o.kind, ": expected nesterov or average"));
  }
  if (!(o.lr > 0) || !std::isfinite(o.lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--outer_lr=", o.lr, ": must be a positive number"));
  }
  if (!(o.momentum >= 0 && o.momentum < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--outer_momentum=", o.momentum, ": must be in [0, 1)"));
  }
  return std::unique_ptr<OuterOptimizer>(new OuterOptimizer(o, size));
}

OuterOptimizer::OuterOptimizer(const OuterOptions& options, int64_t size)
    : options_(options), momentum_(options.momentum > 0 ? size : 0, 0.0f) {}

absl::Status OuterOptimizer::Step(absl::Span<float> theta,
                                  absl::Span<const float> delta, double span) {
  if (theta.size() != delta.size() ||
      (!momentum_.empty() && momentum_.size() != theta.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer step: θ has ", theta.size(), " elements, Δ has ", delta.size()));
  }
  if (!(span > 0) || !std::isfinite(span)) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer step: span ", span, " must be > 0"));
  }
  // A longer round is a plain round: its Δ already carries the extra
  // progress, and scaling the momentum up as well overshot (measured with
  // time-bounded and adaptive rounds).
  span = std::min(span, 1.0);
  const float lr = static_cast<float>(options_.lr);
  const float mu = static_cast<float>(options_.momentum);
  if (momentum_.empty()) {
    for (size_t i = 0; i < theta.size(); ++i) theta[i] -= lr * delta[i];
  } else {
    // The buffer holds momentum per round of H steps: b ← μ·b + Δ/s and
    // θ ← θ − lr·(Δ + μ·s·b). At a constant span this is the plain step on
    // rounds of that length; when the length changes, the momentum carried
    // over is rescaled to the new round's length. At s = 1 both factors are
    // exactly 1 and μ, so this is PyTorch's Nesterov SGD bit for bit.
    const float inv = static_cast<float>(1.0 / span);
    const float carry = mu * static_cast<float>(span);
    for (size_t i = 0; i < theta.size(); ++i) {
      // The first step initializes b = Δ, as torch.optim.SGD does.
      float b =
          steps_ == 0 ? delta[i] * inv : mu * momentum_[i] + delta[i] * inv;
      momentum_[i] = b;
      theta[i] -= lr * (delta[i] + carry * b);
    }
  }
  ++steps_;
  return absl::OkStatus();
}

std::string OuterOptimizer::SaveState() const {
  std::string out(sizeof(int64_t) * 2, '\0');
  int64_t n = static_cast<int64_t>(momentum_.size());
  std::memcpy(&out[0], &steps_, sizeof(int64_t));
  std::memcpy(&out[8], &n, sizeof(int64_t));
  out.append(reinterpret_cast<const char*>(momentum_.data()),
             momentum_.size() * 4);
  return out;
}

absl::Status OuterOptimizer::LoadState(const std::string& bytes) {
  int64_t steps = 0, n = 0;
  if (bytes.size() < 16) {
    return absl::DataLossError("outer optimizer state is truncated");
  }
  std::memcpy(&steps, bytes.data(), 8);
  std::memcpy(&n, bytes.data() + 8, 8);
  if (n != static_cast<int64_t>(momentum_.size()) ||
      bytes.size() != 16 + static_cast<size_t>(n) * 4 || steps < 0) {
    return absl::DataLossError(absl::StrCat("outer optimizer state holds ", n,
                                            " momentum values; this run needs ",
                                            momentum_.size()));
  }
  std::vector<float> momentum(static_cast<size_t>(n));
  std::memcpy(momentum.data(), bytes.data() + 16, static_cast<size_t>(n) * 4);
  // A damaged checkpoint, or a hostile donor's state, must not poison the
  // model through the momentum.
  for (size_t i = 0; i < momentum.size(); ++i) {
    if (!std::isfinite(momentum[i])) {
      return absl::DataLossError(
          absl::StrCat("outer optimizer state holds a non-finite momentum "
                       "value (",
                       momentum[i], ") at element ", i));
    }
  }
  steps_ = steps;
  momentum_ = std::move(momentum);
  return absl::OkStatus();
}

}  // namespace starling
