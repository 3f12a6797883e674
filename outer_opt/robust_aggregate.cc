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

absl::StatusOr<AggregateStats> AggregatePacks(
    const AggregateSpec& spec, double norm_bound, int64_t n, int extras,
    const std::vector<absl::Span<const float>>& packs,
    std::vector<PackVerdict>* verdicts, absl::Span<float> out) {
  const size_t len = static_cast<size_t>(n) + kWeightingSlots + extras;
  const int world = static_cast<int>(packs.size());
  if (out.size() != len || verdicts->size() != packs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "aggregate: output has ", out.size(), " values, expected ", len,
        "; verdicts for ", verdicts->size(), " of ", world, " packs"));
  }
  std::vector<PackVerdict>& v = *verdicts;
  // 1. Each pack on its own: size, finite values, a positive weight.
  std::vector<double> weights;
  for (int i = 0; i < world; ++i) {
    v[i].accepted = false;
    if (packs[i].empty()) {
      v[i].present = false;
      if (v[i].reason.empty()) v[i].reason = "no contribution arrived";
      continue;
    }
    v[i].present = true;
    v[i].reason.clear();
    if (packs[i].size() != len) {
      v[i].reason =
          absl::StrCat("has ", packs[i].size(), " values; expected ", len);
      continue;
    }
    const float* p = packs[i].data();
    for (size_t k = 0; k < len; ++k) {
      if (!std::isfinite(p[k])) {
        v[i].reason =
            absl::StrCat("non-finite value (", p[k], ") at element ", k);
        break;
      }
    }
    if (!v[i].reason.empty()) continue;
    const double w = p[n];
    if (!(w > 0) || !(p[n + 1] >= 0)) {
      v[i].reason = absl::StrCat("weight ", w, " and weighted steps ", p[n + 1],
                                 " must be positive");
      continue;
    }
    double norm2 = 0;
    for (int64_t k = 0; k < n; ++k) {
      const double x = static_cast<double>(p[k]) / w;
      norm2 += x * x;
    }
    v[i].norm = std::sqrt(norm2);
    if (!std::isfinite(v[i].norm)) {
      v[i].reason = "its norm overflows";
      continue;
    }
    v[i].accepted = true;
    weights.push_back(w);
  }
  // 2. Against the round: weights near the median weight, norms within
  // norm_bound × the median norm.
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
  AggregateStats stats;
  stats.median_norm = Median(norms);
  std::vector<int> accepted;
  for (int i = 0; i < world; ++i) {
    if (!v[i].accepted) continue;
    if (norm_bound > 0 && v[i].norm > norm_bound * stats.median_norm) {
      v[i].accepted = false;
      v[i].reason = absl::StrFormat(
          "norm %.4g is %.3gx the round's median %.4g (--norm_bound=%g)",
          v[i].norm, v[i].norm / std::max(stats.median_norm, 1e-300),
          stats.median_norm, norm_bound);
      continue;
    }
    accepted.push_back(i);
  }
  stats.accepted = static_cast<int>(accepted.size());
  if (accepted.empty()) {
    return absl::FailedPreconditionError(
        "aggregate: no member's contribution passed validation");
  }
  // 3. Combine. Slots: the accepted weights and weighted steps; extras
  // summed.
  double total_w = 0;
  for (size_t j = n; j < len; ++j) {
    double s = 0;
    for (int i : accepted) s += packs[i][j];
    out[j] = static_cast<float>(s);
  }
  total_w = out[n];
  AggregateSpec how = spec;
  const int m = stats.accepted;
  if (how.kind == AggregateKind::kTrimmedMean && m <= 2 * how.trim) {
    how.kind = AggregateKind::kMedian;
    stats.fell_back_to_median = true;
  }
  switch (how.kind) {
    case AggregateKind::kMean:
    case AggregateKind::kNormClip: {
      std::vector<double> scale(world, 1.0);
      if (how.kind == AggregateKind::kNormClip) {
        const double cap = how.clip * stats.median_norm;
        for (int i : accepted) {
          if (v[i].norm > cap && v[i].norm > 0) scale[i] = cap / v[i].norm;
        }
      }
      for (int64_t k = 0; k < n; ++k) {
        double s = 0;
        for (int i : accepted) s += static_cast<double>(packs[i][k]) * scale[i];
        out[k] = static_cast<float>(s);
      }
      break;
    }
    case AggregateKind::kTrimmedMean:
    case AggregateKind::kMedian: {
      std::vector<float> x(m);
      std::vector<float> inv_w(world);
      for (int i : accepted) inv_w[i] = 1.0f / packs[i][n];
      const int drop = how.kind == AggregateKind::kTrimmedMean ? how.trim : 0;
      const float fw = static_cast<float>(total_w);
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
        out[k] = r * fw;
      }
      break;
    }
  }
  return stats;
}

}  // namespace starling
