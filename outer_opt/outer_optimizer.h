// The DiLoCo outer optimizer: SGD with Nesterov momentum (lr 0.7, momentum
// 0.9) on θ_global, with the averaged pseudo-gradient Δ = θ_global − θ_local
// as the gradient; or plain averaging (lr 1, no momentum), as a baseline.
// State (the momentum buffer) lives in CPU memory and is saved in
// checkpoints. Deterministic: the same inputs give the same bytes on every
// member. Not thread-safe: one node thread owns it.
#ifndef STARLING_OUTER_OPT_OUTER_OPTIMIZER_H_
#define STARLING_OUTER_OPT_OUTER_OPTIMIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace starling {

struct OuterOptions {
  std::string kind = "nesterov";  // "nesterov" or "average"
  double lr = 0.7;
  double momentum = 0.9;
};

class OuterOptimizer {
 public:
  // InvalidArgument naming the flag for an unknown kind or bad lr/momentum.
  static absl::StatusOr<std::unique_ptr<OuterOptimizer>> Create(
      const OuterOptions& options, int64_t size);

  // θ ← θ − lr·(Δ + μ·b) with b ← μ·b + Δ (PyTorch's Nesterov SGD; plain
  // averaging is lr 1, μ 0, i.e. θ ← θ − Δ). InvalidArgument when sizes
  // differ.
  //
  // `span` s: the round's length relative to the H the lr and momentum are
  // tuned for (τ_eff / --inner_steps). For s < 1 the buffer is kept per H
  // steps: b ← μ·b + Δ/s and θ ← θ − lr·(Δ + μ·s·b). A run of rounds of one
  // span is then exactly the plain step on rounds of that length (momentum
  // decays per round, as DiLoCo's does at any H), and when the length drops
  // the momentum carried over is rescaled to it: the first 10-step round
  // after 50-step rounds applies a fifth of their momentum instead of all of
  // it (adaptive H after a drift). s >= 1 is exactly the plain step: a
  // longer round's Δ already carries its extra progress. InvalidArgument for
  // s <= 0 or not finite.
  absl::Status Step(absl::Span<float> theta, absl::Span<const float> delta,
                    double span = 1.0);

  // Serialized momentum buffer and step count, for checkpoints.
  std::string SaveState() const;
  // DataLoss when `bytes` does not hold this optimizer's state.
  absl::Status LoadState(const std::string& bytes);

  const OuterOptions& options() const { return options_; }
  int64_t steps() const { return steps_; }

 private:
  OuterOptimizer(const OuterOptions& options, int64_t size);
  OuterOptions options_;
  std::vector<float> momentum_;
  int64_t steps_ = 0;
};

}  // namespace starling

#endif  // STARLING_OUTER_OPT_OUTER_OPTIMIZER_H_
