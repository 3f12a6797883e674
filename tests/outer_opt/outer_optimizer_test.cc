#include "outer_opt/outer_optimizer.h"

#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace starling {
namespace {

TEST(OuterOptimizerTest, NesterovMatchesTorchSgd) {
  const int n = 50;
  torch::manual_seed(0);
  torch::Tensor theta_t = torch::randn({n});
  std::vector<float> theta(theta_t.data_ptr<float>(),
                           theta_t.data_ptr<float>() + n);
  torch::Tensor param = theta_t.clone().set_requires_grad(true);
  torch::optim::SGD sgd(
      {param}, torch::optim::SGDOptions(0.7).momentum(0.9).nesterov(true));
  auto outer = OuterOptimizer::Create({"nesterov", 0.7, 0.9}, n);
  ASSERT_TRUE(outer.ok());
  for (int step = 0; step < 5; ++step) {
    torch::Tensor delta = torch::randn({n});
    param.mutable_grad() = delta.clone();
    sgd.step();
    ASSERT_TRUE((*outer)
                    ->Step(absl::MakeSpan(theta),
                           absl::MakeConstSpan(delta.data_ptr<float>(), n))
                    .ok());
    for (int i = 0; i < n; ++i) {
      EXPECT_NEAR(theta[i], param[i].item<float>(), 1e-5) << step << "," << i;
    }
  }
}

TEST(OuterOptimizerTest, AveragingReplacesThetaWithTheAverage) {
  auto outer = OuterOptimizer::Create({"average", 0.3, 0.5}, 3);
  ASSERT_TRUE(outer.ok());
  EXPECT_EQ((*outer)->options().lr, 1.0);
  EXPECT_EQ((*outer)->options().momentum, 0.0);
  std::vector<float> theta = {1, 2, 3};
  // Δ = θ_global − mean(θ_i): mean is {0.5, 2, 4}.
  std::vector<float> delta = {0.5f, 0.0f, -1.0f};
  ASSERT_TRUE((*outer)->Step(absl::MakeSpan(theta), delta).ok());
  EXPECT_EQ(theta, (std::vector<float>{0.5f, 2.0f, 4.0f}));
}

TEST(OuterOptimizerTest, StateRoundTripsAndRejectsForeignState) {
  auto a = OuterOptimizer::Create({}, 4);
  auto b = OuterOptimizer::Create({}, 4);
  std::vector<float> t1 = {1, 1, 1, 1}, t2 = t1;
  std::vector<float> d = {0.1f, -0.2f, 0.3f, 0.0f};
  ASSERT_TRUE((*a)->Step(absl::MakeSpan(t1), d).ok());
  ASSERT_TRUE((*b)->LoadState((*a)->SaveState()).ok());
  t2 = t1;
  ASSERT_TRUE((*a)->Step(absl::MakeSpan(t1), d).ok());
  ASSERT_TRUE((*b)->Step(absl::MakeSpan(t2), d).ok());
  EXPECT_EQ(t1, t2);
  auto c = OuterOptimizer::Create({}, 5);
  EXPECT_TRUE(absl::IsDataLoss((*c)->LoadState((*a)->SaveState())));
  EXPECT_TRUE(absl::IsDataLoss((*c)->LoadState("xy")));
  // A non-finite momentum value (a damaged file, a hostile donor) is
  // refused, and the state loaded before stays.
  std::string poisoned = (*a)->SaveState();
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(&poisoned[16 + 4 * 2], &inf, 4);
  absl::Status s = (*b)->LoadState(poisoned);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("non-finite momentum value (inf) at element 2"),
            std::string::npos)
      << s;
  ASSERT_TRUE((*b)->Step(absl::MakeSpan(t2), d).ok());
  ASSERT_TRUE((*a)->Step(absl::MakeSpan(t1), d).ok());
  EXPECT_EQ(t1, t2);
}

TEST(OuterOptimizerTest, BadOptionsNameTheFlag) {
  auto s = OuterOptimizer::Create({"adam", 0.7, 0.9}, 1).status();
  EXPECT_NE(s.message().find("--outer=adam"), std::string::npos);
  s = OuterOptimizer::Create({"nesterov", -1, 0.9}, 1).status();
  EXPECT_NE(s.message().find("--outer_lr"), std::string::npos);
  s = OuterOptimizer::Create({"nesterov", 0.7, 1.0}, 1).status();
  EXPECT_NE(s.message().find("--outer_momentum"), std::string::npos);
}

TEST(OuterOptimizerTest, SizeMismatchIsAnError) {
  auto o = OuterOptimizer::Create({}, 3);
  std::vector<float> t(3), d(2);
  EXPECT_TRUE(absl::IsInvalidArgument((*o)->Step(absl::MakeSpan(t), d)));
}

// span: k short rounds of span 1/k move θ about as far as one full round
// (instead of applying the momentum k times); span >= 1 is the plain step.
TEST(OuterOptimizerTest, SpanRescalesMomentumToTheRoundLength) {
  auto make = [] {
    auto o = OuterOptimizer::Create(OuterOptions(), 1);
    EXPECT_TRUE(o.ok());
    return std::move(o).value();
  };
  const double lr = OuterOptions().lr;
  auto full = make(), split = make(), unscaled = make(), plain = make();
  std::vector<float> a(1, 0.f), b(1, 0.f), c(1, 0.f), d(1, 0.f);
  const std::vector<float> delta = {1.0f};
  for (int r = 0; r < 5; ++r) {  // warm the momentum up with full rounds
    ASSERT_TRUE(full->Step(absl::MakeSpan(a), delta).ok());
    ASSERT_TRUE(split->Step(absl::MakeSpan(b), delta).ok());
    ASSERT_TRUE(unscaled->Step(absl::MakeSpan(c), delta).ok());
    ASSERT_TRUE(plain->Step(absl::MakeSpan(d), delta, 1.0).ok());
  }
  EXPECT_EQ(a[0], d[0]);  // span 1 is bit-identical
  ASSERT_TRUE(plain->Step(absl::MakeSpan(d), delta, 2.5).ok());
  ASSERT_TRUE(full->Step(absl::MakeSpan(a), delta).ok());
  EXPECT_EQ(a[0], d[0]);  // and so is a longer round
  ASSERT_TRUE(split->Step(absl::MakeSpan(b), delta).ok());
  ASSERT_TRUE(unscaled->Step(absl::MakeSpan(c), delta).ok());
  // The first round a tenth as long carries a tenth of the momentum; without
  // the span it would carry nearly all of it.
  const float a0 = a[0], b0 = b[0], c0 = c[0];
  ASSERT_TRUE(full->Step(absl::MakeSpan(a), delta).ok());
  const std::vector<float> tenth = {0.1f};
  ASSERT_TRUE(split->Step(absl::MakeSpan(b), tenth, 0.1).ok());
  ASSERT_TRUE(unscaled->Step(absl::MakeSpan(c), tenth).ok());
  const double full_carry = a0 - a[0] - lr * 1.0;
  const double split_carry = b0 - b[0] - lr * 0.1;
  const double naive_carry = c0 - c[0] - lr * 0.1;
  EXPECT_NEAR(split_carry / full_carry, 0.1, 1e-4);
  EXPECT_GT(naive_carry / full_carry, 0.8);
  // A run of rounds of one span is the plain step on rounds of that length.
  auto fifth = make(), reference = make();
  std::vector<float> e = {0.f}, f = {0.f};
  for (int r = 0; r < 20; ++r) {
    const std::vector<float> dr = {0.3f + 0.01f * r};
    ASSERT_TRUE(fifth->Step(absl::MakeSpan(e), dr, 0.2).ok());
    ASSERT_TRUE(reference->Step(absl::MakeSpan(f), dr).ok());
  }
  EXPECT_NEAR(e[0], f[0], 1e-5 * std::abs(f[0]));
  EXPECT_FALSE(full->Step(absl::MakeSpan(a), delta, 0.0).ok());
  EXPECT_FALSE(full->Step(absl::MakeSpan(a), delta, NAN).ok());
}

}  // namespace
}  // namespace starling
