#include "outer_opt/weighting.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace starling {

// Why FedNova. With time-bounded rounds a fast member runs more inner steps
// τ_i than a slow one, and its Δ_i = θ_global − θ_i is roughly τ_i times its
// per-step update (Δ_i ≈ η Σ_k ∇f_i ≈ η τ_i ∇f_i for small drift). Averaging
// the Δ_i by samples (w_i ∝ τ_i) therefore weights member i's gradient by
// τ_i² instead of by its data share p_i: the outer loop then converges to the
// minimum of Σ τ_i² f_i, not of the real objective Σ p_i f_i, and the bias
// stays however many rounds run (Wang et al. 2020, "objective
// inconsistency"). FedNova normalizes first: d = Σ p_i (Δ_i / τ_i) / Σ p_i is
// a per-step update in which every member counts by its data share, so the
// fixed point is the minimum of Σ p_i f_i. It then rescales by the round's
// effective steps τ_eff = Σ p_i τ_i / Σ p_i, so the outer step still moves as
// far as the members' τ_eff local steps did (no loss of progress per round).
//
// Every arithmetic step below is a single float operation on each element
// (no FMA contraction, see CMakeLists.txt), so members that unpack the same
// summed bytes write the same averaged bytes.

absl::StatusOr<Weighting> ParseWeighting(absl::string_view s) {
  if (s == "samples") return Weighting::kSamples;
  if (s == "fednova") return Weighting::kFedNova;
  return absl::InvalidArgumentError(
      absl::StrCat("--weighting=", s, ": expected samples or fednova"));
}

const char* WeightingName(Weighting w) {
  switch (w) {
    case Weighting::kSamples:
      return "samples";
    case Weighting::kFedNova:
      return "fednova";
  }
  return "unknown";
}

absl::Status PackContribution(Weighting w, const Contribution& c,
                              absl::Span<float> out) {
  const size_t n = c.delta.size();
  if (out.size() != n + kWeightingSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("pack: output has ", out.size(), " elements; Δ has ", n,
                     " and the weighting adds ", kWeightingSlots));
  }
  if (c.steps <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pack: steps = ", c.steps, ": a member needs at least one inner step"));
  }
  const float fw = static_cast<float>(c.weight);
  if (!(c.weight > 0) || !std::isfinite(c.weight) || !(fw > 0) ||
      !std::isfinite(fw)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pack: weight = ", c.weight, " (", WeightingName(w),
                     "): must be a positive finite float"));
  }
  const float steps = static_cast<float>(c.steps);
  switch (w) {
    case Weighting::kSamples:
      // Bit for bit what the node sent before weightings existed.
      for (size_t i = 0; i < n; ++i) out[i] = c.delta[i] * fw;
      out[n] = fw;
      out[n + 1] = fw * steps;
      return absl::OkStatus();
    case Weighting::kFedNova: {
      const float coef =
          static_cast<float>(c.weight / static_cast<double>(c.steps));
      const float weighted_steps =
          static_cast<float>(c.weight * static_cast<double>(c.steps));
      if (!(coef > 0) || !std::isfinite(weighted_steps)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "pack: weight = ", c.weight, " with steps = ", c.steps,
            " (fednova): weight/steps and weight·steps must be positive "
            "finite floats"));
      }
      for (size_t i = 0; i < n; ++i) out[i] = c.delta[i] * coef;
      out[n] = fw;
      out[n + 1] = weighted_steps;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError("pack: unknown weighting");
}

absl::StatusOr<Averaged> UnpackAverage(Weighting w, absl::Span<const float> sum,
                                       absl::Span<float> delta_out) {
  if (sum.size() < static_cast<size_t>(kWeightingSlots) ||
      delta_out.size() != sum.size() - kWeightingSlots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unpack: the sum has ", sum.size(), " elements and Δ has ",
        delta_out.size(), "; expected Δ to have ", kWeightingSlots, " fewer"));
  }
  const size_t n = delta_out.size();
  const float total = sum[n];
  if (!(total > 0) || !std::isfinite(total)) {
    return absl::FailedPreconditionError(
        absl::StrCat("unpack: the round's weights sum to ", total, " (",
                     WeightingName(w), "); nothing to average"));
  }
  Averaged avg;
  avg.total_weight = total;
  avg.effective_steps =
      static_cast<double>(sum[n + 1]) / static_cast<double>(total);
  switch (w) {
    case Weighting::kSamples:
      for (size_t i = 0; i < n; ++i) delta_out[i] = sum[i] / total;
      return avg;
    case Weighting::kFedNova: {
      // Δ = τ_eff · (Σ p_i Δ_i/τ_i) / Σ p_i, as one multiply per element.
      const float scale =
          static_cast<float>(avg.effective_steps / static_cast<double>(total));
      for (size_t i = 0; i < n; ++i) delta_out[i] = sum[i] * scale;
      return avg;
    }
  }
  return absl::InvalidArgumentError("unpack: unknown weighting");
}

}  // namespace starling
