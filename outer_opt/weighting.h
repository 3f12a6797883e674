// How the members of a DiLoCo round weight their pseudo-gradients Δ_i when
// the round's ring all-reduce can only SUM float vectors: each member packs
// its weighted Δ_i plus kWeightingSlots trailing scalars, and after the sum
// every member unpacks the same average. Pure functions; thread-safe.
#ifndef STARLING_OUTER_OPT_WEIGHTING_H_
#define STARLING_OUTER_OPT_WEIGHTING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace starling {

// kSamples: Δ = Σ w_i Δ_i / Σ w_i with w_i the samples (tokens) a member
// processed this round; what the node has always done.
// kFedNova: Wang et al. 2020 ("Tackling the Objective Inconsistency Problem
// in Heterogeneous Federated Optimization"). Members that ran different
// numbers of inner steps τ_i contribute their per-step update Δ_i / τ_i,
// weighted by their data share p_i; the result is rescaled by
// τ_eff = Σ p_i τ_i / Σ p_i. See weighting.cc for why.
enum class Weighting { kSamples, kFedNova };

// "samples" or "fednova". InvalidArgument naming the value otherwise.
absl::StatusOr<Weighting> ParseWeighting(absl::string_view s);
// The name ParseWeighting accepts for `w`.
const char* WeightingName(Weighting w);

// The trailing scalars a pack adds after the weighted Δ:
// slot 0 the weight, slot 1 the weight times the member's inner steps.
inline constexpr int kWeightingSlots = 2;

struct Contribution {
  absl::Span<const float> delta;  // Δ_i = θ_global − θ_i
  int64_t steps = 0;              // τ_i, inner steps this round (> 0)
  // kSamples: samples processed this round; kFedNova: p_i, this node's share
  // of the data (> 0; shares need not sum to 1, only their ratios matter).
  double weight = 0;
};

// Writes this member's share of the round's sum into `out`:
//   kSamples: out[i] = Δ_i[i]·w, slot 0 = w, slot 1 = w·τ_i (w = float(weight))
//   kFedNova: out[i] = Δ_i[i]·(p_i/τ_i), slot 0 = p_i, slot 1 = p_i·τ_i
// InvalidArgument when out.size() != delta.size() + kWeightingSlots, when
// steps <= 0, or when weight is not a finite positive number (or rounds to
// zero or infinity as a float).
absl::Status PackContribution(Weighting w, const Contribution& c,
                              absl::Span<float> out);

struct Averaged {
  // Σ w_i τ_i / Σ w_i: the inner steps the averaged Δ stands for.
  double effective_steps = 0;
  double total_weight = 0;  // Σ w_i (slot 0 of the sum)
};

// `sum` is the elementwise sum of the members' packs (same Weighting on every
// member). Writes the averaged Δ into delta_out, whose size must be
// sum.size() − kWeightingSlots (InvalidArgument otherwise):
//   kSamples: delta_out[i] = sum[i] / Σ w
//   kFedNova: delta_out[i] = τ_eff · sum[i] / Σ p
// Deterministic: every member that unpacks the same bytes gets the same bytes.
// FailedPrecondition when the weights sum to zero (or are not finite).
absl::StatusOr<Averaged> UnpackAverage(Weighting w, absl::Span<const float> sum,
                                       absl::Span<float> delta_out);

}  // namespace starling

#endif  // STARLING_OUTER_OPT_WEIGHTING_H_
