// Robust aggregation of packed contributions: parsing --aggregate, each
// rule's result on hand-checked packs, every reason a pack is dropped, and
// that the result is the same bytes whatever order the checks see.
#include "outer_opt/robust_aggregate.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "outer_opt/weighting.h"

namespace starling {
namespace {

constexpr int64_t kN = 4;  // Δ length
constexpr int kExtras = 1;

// A pack of Δ = x with weight w (samples weighting), stop vote `stop`.
std::vector<float> Pack(std::vector<float> x, float w, float stop = 0) {
  std::vector<float> p(kN + kWeightingSlots + kExtras);
  Contribution c;
  c.delta = x;
  c.steps = 10;
  c.weight = w;
  EXPECT_TRUE(PackContribution(Weighting::kSamples, c,
                               absl::MakeSpan(p).subspan(0, p.size() - 1))
                  .ok());
  p.back() = stop;
  return p;
}

struct Result {
  absl::StatusOr<AggregateStats> stats;
  std::vector<PackVerdict> verdicts;
  std::vector<float> delta;  // unpacked Δ
  std::vector<float> out;
};

Result Aggregate(const std::string& spec_text, double bound,
                 const std::vector<std::vector<float>>& packs) {
  Result r;
  auto spec = ParseAggregate(spec_text);
  EXPECT_TRUE(spec.ok()) << spec.status();
  std::vector<absl::Span<const float>> spans;
  for (const auto& p : packs) spans.emplace_back(p);
  r.verdicts.resize(packs.size());
  r.out.resize(kN + kWeightingSlots + kExtras);
  r.stats = AggregatePacks(*spec, bound, kN, kExtras, spans, &r.verdicts,
                           absl::MakeSpan(r.out));
  if (r.stats.ok()) {
    r.delta.resize(kN);
    auto avg = UnpackAverage(Weighting::kSamples,
                             absl::MakeConstSpan(r.out).subspan(0, kN + 2),
                             absl::MakeSpan(r.delta));
    EXPECT_TRUE(avg.ok()) << avg.status();
  }
  return r;
}

TEST(RobustAggregateTest, ParsesEveryRuleAndNamesBadOnes) {
  for (const char* ok :
       {"mean", "median", "trimmed_mean:1", "trimmed_mean:3", "norm_clip:2"}) {
    auto s = ParseAggregate(ok);
    ASSERT_TRUE(s.ok()) << ok << ": " << s.status();
    EXPECT_EQ(AggregateName(*s), ok);
  }
  for (const char* bad :
       {"", "avg", "mean:1", "trimmed_mean", "trimmed_mean:0", "trimmed_mean:x",
        "norm_clip:-1", "norm_clip:nan", "median:2"}) {
    auto s = ParseAggregate(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << bad;
    EXPECT_NE(s.status().message().find("--aggregate="), std::string::npos);
  }
}

TEST(RobustAggregateTest, MeanIsTheWeightedMeanOfTheRing) {
  Result r =
      Aggregate("mean", 0, {Pack({1, 2, 3, 4}, 1), Pack({3, 2, 1, 0}, 3, 1)});
  ASSERT_TRUE(r.stats.ok()) << r.stats.status();
  EXPECT_EQ(r.stats->accepted, 2);
  EXPECT_FLOAT_EQ(r.delta[0], (1 * 1 + 3 * 3) / 4.0f);
  EXPECT_FLOAT_EQ(r.delta[3], (4 * 1 + 0 * 3) / 4.0f);
  EXPECT_EQ(r.out.back(), 1.0f);  // stop votes summed
}

// One hostile member among five: the trimmed mean and the median ignore
// its values, the norm clip shrinks them, the plain mean is dragged along.
TEST(RobustAggregateTest, EachRuleAgainstOneHugeContribution) {
  std::vector<std::vector<float>> packs = {
      Pack({1, 1, 1, 1}, 1), Pack({1.1f, 0.9f, 1, 1}, 1),
      Pack({0.9f, 1.1f, 1, 1}, 1), Pack({1, 1, 1.2f, 0.8f}, 1),
      Pack({1000, -1000, 1000, 1000}, 1)};
  Result mean = Aggregate("mean", 0, packs);
  EXPECT_GT(mean.delta[0], 100);
  Result trimmed = Aggregate("trimmed_mean:1", 0, packs);
  ASSERT_TRUE(trimmed.stats.ok());
  EXPECT_NEAR(trimmed.delta[0], (1 + 1 + 1.1) / 3, 1e-5);  // 0.9 and 1000 go
  EXPECT_NEAR(trimmed.delta[1], (0.9 + 1 + 1) / 3, 1e-5);
  Result median = Aggregate("median", 0, packs);
  EXPECT_NEAR(median.delta[2], 1.0, 1e-6);
  Result clipped = Aggregate("norm_clip:1", 0, packs);
  ASSERT_TRUE(clipped.stats.ok());
  EXPECT_LT(clipped.delta[0], 1.5);  // the outlier clipped to the median norm
  // The norm bound drops it from the mean, with the reason.
  Result bounded = Aggregate("mean", 10, packs);
  ASSERT_TRUE(bounded.stats.ok());
  EXPECT_EQ(bounded.stats->accepted, 4);
  EXPECT_FALSE(bounded.verdicts[4].accepted);
  EXPECT_NE(bounded.verdicts[4].reason.find("--norm_bound=10"),
            std::string::npos)
      << bounded.verdicts[4].reason;
  EXPECT_NEAR(bounded.delta[0], 1.0, 1e-5);
}

TEST(RobustAggregateTest, DropsNonFiniteMissingAndOddlyWeightedPacks) {
  std::vector<float> nan_pack = Pack({1, 1, 1, 1}, 1);
  nan_pack[2] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> inf_weight = Pack({1, 1, 1, 1}, 1);
  inf_weight[kN] = std::numeric_limits<float>::infinity();
  std::vector<std::vector<float>> packs = {
      Pack({2, 2, 2, 2}, 1),    nan_pack,  {}, Pack({4, 4, 4, 4}, 1),
      Pack({9, 9, 9, 9}, 1e6f), inf_weight};
  std::vector<absl::Span<const float>> spans;
  for (const auto& p : packs) spans.emplace_back(p);
  std::vector<PackVerdict> v(packs.size());
  v[2].reason = "rank 2: timed out";
  std::vector<float> out(kN + kWeightingSlots + kExtras);
  auto stats = AggregatePacks(AggregateSpec{}, 0, kN, kExtras, spans, &v,
                              absl::MakeSpan(out));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->accepted, 2);
  EXPECT_TRUE(v[0].accepted && v[3].accepted);
  EXPECT_NE(v[1].reason.find("non-finite value (nan) at element 2"),
            std::string::npos)
      << v[1].reason;
  EXPECT_FALSE(v[2].present);
  EXPECT_EQ(v[2].reason, "rank 2: timed out");
  EXPECT_NE(v[4].reason.find("median"), std::string::npos) << v[4].reason;
  EXPECT_NE(v[5].reason.find("non-finite"), std::string::npos) << v[5].reason;
  EXPECT_FLOAT_EQ(out[0] / out[kN], 3.0f);
}

TEST(RobustAggregateTest, NothingValidIsAnErrorAndTooFewToTrimUsesTheMedian) {
  std::vector<float> nan_pack = Pack({1, 1, 1, 1}, 1);
  nan_pack[0] = std::numeric_limits<float>::infinity();
  Result none = Aggregate("mean", 0, {nan_pack});
  EXPECT_TRUE(absl::IsFailedPrecondition(none.stats.status()));
  Result two = Aggregate("trimmed_mean:1", 0,
                         {Pack({1, 1, 1, 1}, 1), Pack({3, 3, 3, 3}, 1)});
  ASSERT_TRUE(two.stats.ok());
  EXPECT_TRUE(two.stats->fell_back_to_median);
  EXPECT_FLOAT_EQ(two.delta[0], 2.0f);
}

// Members compute from the same packs in their own processes: the bytes
// must not depend on anything else (here: repeated runs, and a FedNova
// pack layout read through the same rule).
TEST(RobustAggregateTest, SamePacksGiveTheSameBytes) {
  std::vector<std::vector<float>> packs;
  for (int i = 0; i < 7; ++i) {
    packs.push_back(Pack({0.1f * i, -0.3f * i, 1.0f / (i + 1), 0.7f}, 1 + i));
  }
  for (const char* rule :
       {"mean", "trimmed_mean:2", "median", "norm_clip:1.5"}) {
    Result a = Aggregate(rule, 3, packs);
    Result b = Aggregate(rule, 3, packs);
    ASSERT_TRUE(a.stats.ok() && b.stats.ok()) << rule;
    EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4))
        << rule;
  }
}

}  // namespace
}  // namespace starling
