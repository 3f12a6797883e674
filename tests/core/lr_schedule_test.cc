#include "core/lr_schedule.h"

#include "gtest/gtest.h"

namespace starling {
namespace {

TEST(LrScheduleTest, WarmupIsLinearFromPeakOverWarmup) {
  LrSchedule s{.peak_lr = 1.0, .warmup_steps = 4, .total_steps = 100};
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 0), 0.25);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 1), 0.5);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 3), 1.0);
}

TEST(LrScheduleTest, CosineStartsAtPeakHalvesMidwayEndsAtFinal) {
  LrSchedule s{
      .peak_lr = 2.0, .warmup_steps = 10, .total_steps = 110, .final_lr = 0.0};
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 10), 2.0);
  EXPECT_NEAR(LearningRateAt(s, 60), 1.0, 1e-12);
  EXPECT_NEAR(LearningRateAt(s, 110), 0.0, 1e-12);
  EXPECT_NEAR(LearningRateAt(s, 500), 0.0, 1e-12);  // held past the end
}

TEST(LrScheduleTest, DecayIsMonotoneAfterWarmup) {
  LrSchedule s{.peak_lr = 3e-3, .warmup_steps = 50, .total_steps = 800};
  double prev = LearningRateAt(s, 50);
  for (int step = 51; step <= 800; ++step) {
    double lr = LearningRateAt(s, step);
    EXPECT_LE(lr, prev) << step;
    prev = lr;
  }
}

TEST(LrScheduleTest, NoWarmupStartsAtPeak) {
  LrSchedule s{.peak_lr = 0.5, .warmup_steps = 0, .total_steps = 10};
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 0), 0.5);
  EXPECT_NEAR(LearningRateAt(s, 5), 0.25, 1e-12);
}

TEST(LrScheduleTest, FinalLrIsTheFloor) {
  LrSchedule s{
      .peak_lr = 1.0, .warmup_steps = 0, .total_steps = 10, .final_lr = 0.1};
  EXPECT_NEAR(LearningRateAt(s, 10), 0.1, 1e-12);
  EXPECT_NEAR(LearningRateAt(s, 5), 0.55, 1e-12);
}

}  // namespace
}  // namespace starling
