// Validation and robust aggregation of a DiLoCo round's contributions
// (--aggregate, --norm_bound) when every member holds every member's pack
// (outer_opt/weighting.h) instead of only their sum: each pack is checked
// (finite values, a sane weight, its norm against the round's median norm)
// and the accepted ones are combined by a weighted mean, a coordinate-wise
// trimmed mean or median, or a mean of norm-clipped contributions. The
// result has the layout of the packs' sum, so UnpackAverage reads it as it
// reads the ring's. Every decision depends only on the packs, never on
// which member computes it: members that hold the same packs write the same
// bytes. Pure functions; thread-safe.
#ifndef STARLING_OUTER_OPT_ROBUST_AGGREGATE_H_
#define STARLING_OUTER_OPT_ROBUST_AGGREGATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace starling {

enum class AggregateKind { kMean, kTrimmedMean, kMedian, kNormClip };

struct AggregateSpec {
  AggregateKind kind = AggregateKind::kMean;
  int trim = 0;     // trimmed_mean:K drops the K lowest and K highest
  double clip = 0;  // norm_clip:C clips norms to C × the round's median
};

// "mean", "trimmed_mean:K" (K >= 1), "median" or "norm_clip:C" (C > 0).
// InvalidArgument naming --aggregate and the value otherwise.
absl::StatusOr<AggregateSpec> ParseAggregate(absl::string_view text);
// The text ParseAggregate reads back, e.g. "trimmed_mean:1".
std::string AggregateName(const AggregateSpec& spec);

// What happened to one member's pack.
struct PackVerdict {
  bool present = false;  // it arrived (false: `reason` says why not)
  bool accepted = false;
  std::string reason;  // why it was dropped; empty when accepted
  double norm = 0;     // of its unweighted Δ (pack / weight)
};

struct AggregateStats {
  int accepted = 0;
  double median_norm = 0;
  // trimmed_mean with too few accepted packs to trim: the median was used.
  bool fell_back_to_median = false;
};

// packs[i] is member i's pack: `n` weighted Δ values, kWeightingSlots
// weights, then `extras` trailing values (e.g. stop votes) that are summed
// over accepted packs. An empty span is a pack that never arrived; its
// verdict's `reason` must be set by the caller. Drops packs with a
// non-finite value, a weight that is not positive or lies more than 100×
// from the round's median weight, or (norm_bound > 0) a Δ norm above
// norm_bound × the median norm. Writes into `out` (n + kWeightingSlots +
// extras values) the accepted packs' combination in sum layout.
// FailedPrecondition when no pack is accepted; InvalidArgument for sizes
// that do not fit.
absl::StatusOr<AggregateStats> AggregatePacks(
    const AggregateSpec& spec, double norm_bound, int64_t n, int extras,
    const std::vector<absl::Span<const float>>& packs,
    std::vector<PackVerdict>* verdicts, absl::Span<float> out);

}  // namespace starling

#endif  // STARLING_OUTER_OPT_ROBUST_AGGREGATE_H_
