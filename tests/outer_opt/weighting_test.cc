#include "outer_opt/weighting.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "outer_opt/outer_optimizer.h"

namespace starling {
namespace {

TEST(WeightingTest, ParsesAndNamesBothWeightings) {
  for (Weighting w : {Weighting::kSamples, Weighting::kFedNova}) {
    absl::StatusOr<Weighting> parsed = ParseWeighting(WeightingName(w));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, w);
  }
  absl::StatusOr<Weighting> bad = ParseWeighting("tokens");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_NE(bad.status().message().find("tokens"), absl::string_view::npos);
}

TEST(WeightingTest, PackRejectsBadInput) {
  std::vector<float> delta = {1, 2, 3};
  std::vector<float> out(delta.size() + kWeightingSlots);
  std::vector<float> short_out(delta.size() + 1);
  for (Weighting w : {Weighting::kSamples, Weighting::kFedNova}) {
    EXPECT_TRUE(PackContribution(w, {delta, 5, 2.0}, absl::MakeSpan(out)).ok());
    absl::Status s =
        PackContribution(w, {delta, 5, 2.0}, absl::MakeSpan(short_out));
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    s = PackContribution(w, {delta, 0, 2.0}, absl::MakeSpan(out));
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("steps"), absl::string_view::npos) << s;
    EXPECT_TRUE(absl::IsInvalidArgument(
        PackContribution(w, {delta, -3, 2.0}, absl::MakeSpan(out))));
    for (double bad :
         {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity(),
          1e300, 1e-300}) {
      s = PackContribution(w, {delta, 5, bad}, absl::MakeSpan(out));
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad << ": " << s;
      EXPECT_NE(s.message().find("weight"), absl::string_view::npos) << s;
    }
  }
}

TEST(WeightingTest, UnpackRejectsBadSizesAndZeroWeight) {
  std::vector<float> sum = {1, 2, 0, 0};  // weights sum to zero
  std::vector<float> out(2), wrong(3);
  for (Weighting w : {Weighting::kSamples, Weighting::kFedNova}) {
    EXPECT_TRUE(absl::IsFailedPrecondition(
        UnpackAverage(w, sum, absl::MakeSpan(out)).status()));
    EXPECT_TRUE(absl::IsInvalidArgument(
        UnpackAverage(w, sum, absl::MakeSpan(wrong)).status()));
    EXPECT_TRUE(absl::IsInvalidArgument(
        UnpackAverage(w, std::vector<float>{1}, absl::Span<float>()).status()));
    std::vector<float> negative = {1, 2, -1, 3};
    EXPECT_TRUE(absl::IsFailedPrecondition(
        UnpackAverage(w, negative, absl::MakeSpan(out)).status()));
  }
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// kSamples is what the node sent and computed before weightings existed:
// Δ·w, w, and Δ = sum / Σw, to the bit.
TEST(WeightingTest, SamplesIsBitExactWithTheNodesFormula) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  const int n = 257;
  const std::vector<int64_t> samples = {4096, 1000, 12345};
  const std::vector<int64_t> steps = {50, 13, 71};
  std::vector<float> sum(n + kWeightingSlots, 0.0f);
  std::vector<float> expected_sum(n + 1, 0.0f);
  for (size_t m = 0; m < samples.size(); ++m) {
    std::vector<float> delta(n);
    for (float& v : delta) v = normal(rng);
    std::vector<float> pack(n + kWeightingSlots);
    ASSERT_TRUE(
        PackContribution(Weighting::kSamples,
                         {delta, steps[m], static_cast<double>(samples[m])},
                         absl::MakeSpan(pack))
            .ok());
    const float w = static_cast<float>(samples[m]);
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(SameBits(pack[i], delta[i] * w)) << i;
    }
    EXPECT_TRUE(SameBits(pack[n], w));
    EXPECT_TRUE(SameBits(pack[n + 1], w * static_cast<float>(steps[m])));
    for (int i = 0; i < n + kWeightingSlots; ++i) sum[i] += pack[i];
    for (int i = 0; i < n; ++i) expected_sum[i] += delta[i] * w;
    expected_sum[n] += w;
  }
  std::vector<float> avg(n);
  absl::StatusOr<Averaged> a =
      UnpackAverage(Weighting::kSamples, sum, absl::MakeSpan(avg));
  ASSERT_TRUE(a.ok()) << a.status();
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(SameBits(avg[i], expected_sum[i] / expected_sum[n])) << i;
  }
  EXPECT_EQ(a->total_weight, 4096.0 + 1000 + 12345);
  const double want_steps =
      (4096.0 * 50 + 1000.0 * 13 + 12345.0 * 71) / (4096.0 + 1000 + 12345);
  EXPECT_NEAR(a->effective_steps, want_steps, 1e-4 * want_steps);
}

// FedNova's average on values exact in float: p = {1, 3}, τ = {2, 4},
// Δ_1 = 4, Δ_2 = 8. d = (1·4/2 + 3·8/4)/4 = 2, τ_eff = (2 + 12)/4 = 3.5,
// Δ = 7. Samples weighting of the same Δs with w = p·τ would give
// (2·4 + 12·8)/14 = 7.43: the fast member counts more.
TEST(WeightingTest, FedNovaNormalizesByStepsAndRescalesByEffectiveSteps) {
  std::vector<float> d1 = {4, -4}, d2 = {8, 0};
  std::vector<float> p1(4), p2(4), sum(4);
  ASSERT_TRUE(
      PackContribution(Weighting::kFedNova, {d1, 2, 1.0}, absl::MakeSpan(p1))
          .ok());
  ASSERT_TRUE(
      PackContribution(Weighting::kFedNova, {d2, 4, 3.0}, absl::MakeSpan(p2))
          .ok());
  EXPECT_EQ(p1, (std::vector<float>{2, -2, 1, 2}));
  EXPECT_EQ(p2, (std::vector<float>{6, 0, 3, 12}));
  for (int i = 0; i < 4; ++i) sum[i] = p1[i] + p2[i];
  std::vector<float> avg(2);
  absl::StatusOr<Averaged> a =
      UnpackAverage(Weighting::kFedNova, sum, absl::MakeSpan(avg));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_DOUBLE_EQ(a->effective_steps, 3.5);
  EXPECT_DOUBLE_EQ(a->total_weight, 4.0);
  EXPECT_FLOAT_EQ(avg[0], 7.0f);
  EXPECT_FLOAT_EQ(avg[1], -1.75f);  // 3.5 · (−2 + 0)/4
}

// 4 nodes, node i minimizes f_i(x) = ½‖x − c_i‖² with equal data shares, so
// the real objective's minimum is x* = mean(c_i). Node i runs τ_i ∈ {10, 20,
// 30, 40} steps of GD per round (a slow and a fast node), and the round's
// average goes through pack → elementwise sum → unpack → Nesterov outer step.
struct Problem {
  static constexpr int kNodes = 4;
  static constexpr int kDim = 8;
  std::vector<std::vector<double>> c;
  std::vector<double> optimum;
  std::vector<int64_t> steps = {10, 20, 30, 40};
  Problem() : c(kNodes, std::vector<double>(kDim)), optimum(kDim, 0.0) {
    std::mt19937 rng(42);
    std::uniform_real_distribution<double> u(-1, 1);
    for (auto& ci : c) {
      for (int k = 0; k < kDim; ++k) {
        ci[k] = u(rng);
        optimum[k] += ci[k] / kNodes;
      }
    }
  }
};

// Runs `rounds` rounds; returns the max-abs distance of θ_global to x*.
double RunRounds(const Problem& p, Weighting w, int rounds) {
  constexpr double kInnerLr = 1e-4;
  constexpr int kBatch = 32;
  auto outer = OuterOptimizer::Create({"nesterov", 0.7, 0.9}, Problem::kDim);
  EXPECT_TRUE(outer.ok());
  std::vector<float> theta(Problem::kDim, 0.0f);
  std::vector<float> sum(Problem::kDim + kWeightingSlots);
  std::vector<float> pack(sum.size()), delta(Problem::kDim), avg(Problem::kDim);
  for (int r = 0; r < rounds; ++r) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (int i = 0; i < Problem::kNodes; ++i) {
      std::vector<double> x(theta.begin(), theta.end());
      for (int64_t s = 0; s < p.steps[i]; ++s) {
        for (int k = 0; k < Problem::kDim; ++k) {
          x[k] -= kInnerLr * (x[k] - p.c[i][k]);
        }
      }
      for (int k = 0; k < Problem::kDim; ++k) {
        delta[k] = static_cast<float>(theta[k] - x[k]);
      }
      // Samples: what the node processed (τ_i batches); FedNova: equal
      // data shares.
      const double weight = w == Weighting::kSamples
                                ? static_cast<double>(p.steps[i] * kBatch)
                                : 0.25;
      EXPECT_TRUE(
          PackContribution(w, {delta, p.steps[i], weight}, absl::MakeSpan(pack))
              .ok());
      for (size_t k = 0; k < sum.size(); ++k) sum[k] += pack[k];
    }
    absl::StatusOr<Averaged> a = UnpackAverage(w, sum, absl::MakeSpan(avg));
    EXPECT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE((*outer)->Step(absl::MakeSpan(theta), avg).ok());
  }
  double err = 0;
  for (int k = 0; k < Problem::kDim; ++k) {
    err = std::max(err, std::abs(theta[k] - p.optimum[k]));
  }
  return err;
}

TEST(WeightingTest, FedNovaConvergesToTheOptimumAndSamplesIsBiased) {
  const Problem p;
  const int rounds = 1500;
  const double fednova_err = RunRounds(p, Weighting::kFedNova, rounds);
  const double samples_err = RunRounds(p, Weighting::kSamples, rounds);
  // Max-abs distance to x*. FedNova's residual is the inner drift's
  // (1 − (1 − η)^τ)/τ ≠ η, ~3e-4 here; samples weighting converges to the
  // minimum of Σ τ_i² f_i instead.
  EXPECT_LT(fednova_err, 1e-3);
  EXPECT_GT(samples_err, 1e-2);
  EXPECT_GT(samples_err, 10 * fednova_err);
  RecordProperty("fednova_max_abs_error", std::to_string(fednova_err));
  RecordProperty("samples_max_abs_error", std::to_string(samples_err));
  std::printf("max-abs distance to x*: fednova %.3g, samples %.3g\n",
              fednova_err, samples_err);
}

}  // namespace
}  // namespace starling
