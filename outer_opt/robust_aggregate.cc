#include "outer_opt/robust_aggregate.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "outer_opt/weighting.h"

namespace starling {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Median of the first `k` values of `v` (reordered).
float MedianOf(float* v, int k) {
  std::sort(v, v + k);
  return k % 2 == 1 ? v[k / 2] : 0.5f * (v[k / 2 - 1] + v[k / 2]);
}

constexpr double kWeightSpread = 100;

}  // namespace

absl::StatusOr<AggregateSpec> ParseAggregate(absl::string_view text) {
  AggregateSpec spec;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--aggregate=", text, ": ", why,
                     " (use mean, trimmed_mean:K, median or norm_clip:C)"));
  };
  const size_t colon = text.find(':');
  const absl::string_view name = text.substr(0, colon);
  const absl::string_view arg =
      colon == absl::string_view::npos ? "" : text.substr(colon + 1);
  if (name == "mean" || name == "median") {
    if (colon != absl::string_view::npos) return bad("takes no argument");
    spec.kind = name == "mean" ? AggregateKind::kMean : AggregateKind::kMedian;
    return spec;
  }
  if (name == "trimmed_mean") {
    spec.kind = AggregateKind::kTrimmedMean;
    if (!absl::SimpleAtoi(arg, &spec.trim) || spec.trim < 1) {
      return bad("K must be an integer >= 1 (values dropped at each end)");
    }
    return spec;
  }
  if (name == "norm_clip") {
    spec.kind = AggregateKind::kNormClip;
    if (!absl::SimpleAtod(arg, &spec.clip) || !(spec.clip > 0) ||
        !std::isfinite(spec.clip)) {
      return bad("C must be a positive number (a multiple of the median norm)");
    }
    return spec;
  }
  return bad("unknown aggregate");
}

std::string AggregateName(const AggregateSpec& spec) {
  switch (spec.kind) {
    case AggregateKind::kMean:
      return "mean";
    case AggregateKind::kTrimmedMean:
      return absl::StrCat("trimmed_mean:", spec.trim);
    case AggregateKind::kMedian:
      return "median";
    case AggregateKind::kNormClip:
      return absl::StrCat("norm_clip:", spec.clip);
  }
  return "unknown";
}

namespace {

// Stage 1, each pack on its own: present, of the right size, finite, with
// a positive weight and a finite norm of its unweighted Δ.
void CheckPack(absl::Span<const float> pack, size_t len, int64_t n,
               PackVerdict& v) {
  v.accepted = false;
  if (pack.empty()) {
    v.present = false;
    if (v.reason.empty()) v.reason = "no contribution arrived";
    return;
  }
  v.present = true;
  v.reason.clear();
  if (pack.size() != len) {
    v.reason = absl::StrCat("has ", pack.size(), " values; expected ", len);
    return;
  }
  const float* p = pack.data();
  for (size_t k = 0; k < len; ++k) {
    if (!std::isfinite(p[k])) {
      v.reason = absl::StrCat("non-finite value (", p[k], ") at element ", k);
      return;
    }
  }
  const double w = p[n];
  if (!(w > 0) || !(p[n + 1] >= 0)) {
    v.reason = absl::StrCat("weight ", w, " and weighted steps ", p[n + 1],
                            " must be positive");
    return;
  }
  double norm2 = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double x = static_cast<double>(p[k]) / w;
    norm2 += x * x;
  }
  v.norm = std::sqrt(norm2);
  if (!std::isfinite(v.norm)) {
    v.reason = "its norm overflows";
    return;
  }
  v.accepted = true;
}

// Stage 2, against the round: weights near the median weight, norms within
// norm_bound × the median norm. Returns the accepted packs' indices and
// fills stats->median_norm.
std::vector<int> CheckAgainstRound(
    double norm_bound, int64_t n,
    const std::vector<absl::Span<const float>>& packs,
    std::vector<PackVerdict>& v, AggregateStats* stats) {
  const int world = static_cast<int>(packs.size());
  std::vector<double> weights;
  for (int i = 0; i < world; ++i) {
    if (v[i].accepted) weights.push_back(packs[i][n]);
  }
  const double median_w = Median(weights);
  std::vector<double> norms;
  for (int i = 0; i < world; ++i) {
    if (!v[i].accepted) continue;
    const double w = packs[i][n];
    if (w > kWeightSpread * median_w || w < median_w / kWeightSpread) {
      v[i].accepted = false;
      v[i].reason = absl::StrFormat(
          "weight %g is more than %gx away from the round's median %g", w,
          kWeightSpread, median_w);
      continue;
    }
    norms.push_back(v[i].norm);
  }
  stats->median_norm = Median(norms);
  std::vector<int> accepted;
  for (int i = 0; i < world; ++i) {
    if (!v[i].accepted) continue;
    if (norm_bound > 0 && v[i].norm > norm_bound * stats->median_norm) {
      v[i].accepted = false;
      v[i].reason = absl::StrFormat(
          "norm %.4g is %.3gx the round's median %.4g (--norm_bound=%g)",
          v[i].norm, v[i].norm / std::max(stats->median_norm, 1e-300),
          stats->median_norm, norm_bound);
      continue;
    }
    accepted.push_back(i);
  }
  return accepted;
}

// kMean and kNormClip: the accepted packs' sum, each scaled down to the
// clip (C × the median norm) when it is longer.
void CombineMean(const AggregateSpec& how, double median_norm, int64_t n,
                 const std::vector<absl::Span<const float>>& packs,
                 const std::vector<PackVerdict>& v,
                 const std::vector<int>& accepted, absl::Span<float> out) {
  std::vector<double> scale(packs.size(), 1.0);
  if (how.kind == AggregateKind::kNormClip) {
    const double cap = how.clip * median_norm;
    for (int i : accepted) {
      if (v[i].norm > cap && v[i].norm > 0) scale[i] = cap / v[i].norm;
    }
  }
  for (int64_t k = 0; k < n; ++k) {
    double s = 0;
    for (int i : accepted) s += static_cast<double>(packs[i][k]) * scale[i];
    out[k] = static_cast<float>(s);
  }
}

// kTrimmedMean and kMedian, per coordinate over the unweighted Δ, weighted
// back by the accepted packs' total weight.
void CombineCoordinatewise(const AggregateSpec& how, int64_t n,
                           const std::vector<absl::Span<const float>>& packs,
                           const std::vector<int>& accepted, float total_w,
                           absl::Span<float> out) {
  const int m = static_cast<int>(accepted.size());
  std::vector<float> x(m);
  std::vector<float> inv_w(packs.size());
  for (int i : accepted) inv_w[i] = 1.0f / packs[i][n];
  const int drop = how.kind == AggregateKind::kTrimmedMean ? how.trim : 0;
  for (int64_t k = 0; k < n; ++k) {
    for (int j = 0; j < m; ++j) {
      x[j] = packs[accepted[j]][k] * inv_w[accepted[j]];
    }
    float r;
    if (how.kind == AggregateKind::kMedian) {
      r = MedianOf(x.data(), m);
    } else {
      std::sort(x.begin(), x.end());
      double s = 0;
      for (int j = drop; j < m - drop; ++j) s += x[j];
      r = static_cast<float>(s / (m - 2 * drop));
    }
    out[k] = r * total_w;
  }
}

}  // namespace

absl::StatusOr<AggregateStats> AggregatePacks(
    const AggregateSpec& spec, double norm_bound, int64_t n, int extras,
    const std::vector<absl::Span<const float>>& packs,
    std::vector<PackVerdict>* verdicts, absl::Span<float> out) {
  const size_t len = static_cast<size_t>(n) + kWeightingSlots + extras;
  if (out.size() != len || verdicts->size() != packs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "aggregate: output has ", out.size(), " values, expected ", len,
        "; verdicts for ", verdicts->size(), " of ", packs.size(), " packs"));
  }
  std::vector<PackVerdict>& v = *verdicts;
  for (size_t i = 0; i < packs.size(); ++i) CheckPack(packs[i], len, n, v[i]);
  AggregateStats stats;
  const std::vector<int> accepted =
      CheckAgainstRound(norm_bound, n, packs, v, &stats);
  stats.accepted = static_cast<int>(accepted.size());
  if (accepted.empty()) {
    return absl::FailedPreconditionError(
        "aggregate: no member's contribution passed validation");
  }
  // The slots: the accepted weights and weighted steps; extras summed.
  for (size_t j = n; j < len; ++j) {
    double s = 0;
    for (int i : accepted) s += packs[i][j];
    out[j] = static_cast<float>(s);
  }
  AggregateSpec how = spec;
  if (how.kind == AggregateKind::kTrimmedMean &&
      stats.accepted <= 2 * how.trim) {
    how.kind = AggregateKind::kMedian;
    stats.fell_back_to_median = true;
  }
  if (how.kind == AggregateKind::kMean ||
      how.kind == AggregateKind::kNormClip) {
    CombineMean(how, stats.median_norm, n, packs, v, accepted, out);
  } else {
    CombineCoordinatewise(how, n, packs, accepted, out[n], out);
  }
  return stats;
}

}  // namespace starling
