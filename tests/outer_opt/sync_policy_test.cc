#include "outer_opt/sync_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace starling {
namespace {

// A synthetic training-loss stream: a slowly decaying loss
// 2.5·exp(−t/3000) + 1.5, Gaussian step noise, a transient bump after every
// sync (the outer step moves θ), and optionally an upward level shift.
struct LossStream {
  double sigma = 0.1;
  int sync_every = 50;         // 0 = no syncs
  double transient = 0.3;      // bump right after a sync ...
  double transient_steps = 3;  // ... decaying with this time constant
  int64_t shift_at = -1;       // step of the level shift; −1 = none
  double shift = 0.3;
  uint32_t seed = 1;

  std::mt19937 rng{seed};
  std::normal_distribution<double> noise{0.0, 1.0};

  void Reset() { rng.seed(seed); }
  bool SyncAt(int64_t t) const {
    return sync_every > 0 && t > 0 && t % sync_every == 0;
  }
  double Loss(int64_t t) {
    double loss = 2.5 * std::exp(-static_cast<double>(t) / 3000) + 1.5 +
                  sigma * noise(rng);
    if (sync_every > 0 && t >= sync_every) {
      const double since = static_cast<double>(t % sync_every);
      loss += transient * std::exp(-since / transient_steps);
    }
    if (shift_at >= 0 && t >= shift_at) loss += shift;
    return loss;
  }
};

// Feeds `steps` losses, calling Suppress() at each sync when `suppress`;
// returns the steps at which the detector alarmed.
std::vector<int64_t> FeedStream(PageHinkley& ph, LossStream& s, int64_t steps,
                                bool suppress = true, double scale = 1.0) {
  std::vector<int64_t> alarms;
  for (int64_t t = 0; t < steps; ++t) {
    if (suppress && s.SyncAt(t)) ph.Suppress();
    if (ph.Add(scale * s.Loss(t))) alarms.push_back(t);
  }
  return alarms;
}

TEST(PageHinkleyTest, DefaultOptionsAreValid) {
  EXPECT_TRUE(ValidatePageHinkleyOptions({}).ok());
}

TEST(PageHinkleyTest, RejectsBadOptionsNamingTheField) {
  struct Case {
    const char* field;
    void (*mutate)(PageHinkleyOptions&);
  };
  const Case cases[] = {
      {"delta", [](PageHinkleyOptions& o) { o.delta = -0.1; }},
      {"lambda", [](PageHinkleyOptions& o) { o.lambda = 0; }},
      {"lambda", [](PageHinkleyOptions& o) { o.lambda = std::nan(""); }},
      {"trend_alpha", [](PageHinkleyOptions& o) { o.trend_alpha = 0; }},
      {"trend_alpha", [](PageHinkleyOptions& o) { o.trend_alpha = 1.5; }},
      {"scale_alpha", [](PageHinkleyOptions& o) { o.scale_alpha = -1; }},
      {"clip", [](PageHinkleyOptions& o) { o.clip = o.delta; }},
      {"warmup", [](PageHinkleyOptions& o) { o.warmup = -1; }},
      {"cooldown", [](PageHinkleyOptions& o) { o.cooldown = -5; }},
  };
  for (const Case& c : cases) {
    PageHinkleyOptions o;
    c.mutate(o);
    absl::Status s = ValidatePageHinkleyOptions(o);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.field << ": " << s;
    EXPECT_NE(s.message().find(c.field), absl::string_view::npos) << s;
  }
}

// 8 nodes × 10k steps of a stationary (decaying, noisy, synced) loss: at
// most one false alarm per node per 10k steps on average.
TEST(PageHinkleyTest, FewFalseAlarmsOnStationaryStreams) {
  int64_t total = 0;
  for (uint32_t node = 0; node < 8; ++node) {
    LossStream s;
    s.seed = 100 + node;
    s.Reset();
    s.sigma = 0.05 + 0.1 * node / 7.0;  // 0.05 .. 0.15
    PageHinkley ph;
    const std::vector<int64_t> alarms = FeedStream(ph, s, 10000);
    EXPECT_EQ(ph.alarms(), static_cast<int64_t>(alarms.size()));
    total += ph.alarms();
  }
  std::printf("false alarms over 8 x 10k stationary steps: %lld\n",
              static_cast<long long>(total));
  RecordProperty("false_alarms", std::to_string(total));
  EXPECT_LE(total, 8);
}

// A +3σ level shift (+0.3 with σ 0.1) is found within 100 steps, at any
// phase relative to the syncs (0: the shift lands on a sync and its
// cool-down), and found once: the detector re-learns the new level.
TEST(PageHinkleyTest, DetectsAnUpwardLevelShiftQuickly) {
  int64_t worst = 0;
  for (uint32_t node = 0; node < 8; ++node) {
    LossStream s;
    s.seed = 200 + node;
    s.Reset();
    s.sigma = 0.1;
    s.shift = 0.3;
    const int64_t phase = (node * 17) % 50;
    s.shift_at = 6000 + phase;
    PageHinkley ph;
    std::vector<int64_t> alarms = FeedStream(ph, s, 9000);
    ASSERT_FALSE(alarms.empty()) << "node " << node;
    // The first alarm is the shift, not a false one before it.
    ASSERT_GE(alarms[0], s.shift_at) << "node " << node;
    const int64_t delay = alarms[0] - s.shift_at;
    EXPECT_LE(delay, 100) << "node " << node << " phase " << phase;
    worst = std::max(worst, delay);
    EXPECT_EQ(alarms.size(), 1u)
        << "node " << node << ": re-alarmed at " << alarms.back();
  }
  std::printf("worst detection delay of a +3 sigma shift: %lld steps\n",
              static_cast<long long>(worst));
  RecordProperty("worst_delay_steps", std::to_string(worst));
}

// Large sync transients (+1 with σ 0.05) alarm when nobody calls Suppress();
// the cool-down after Suppress() hides them.
TEST(PageHinkleyTest, SuppressHidesSyncTransients) {
  LossStream s;
  s.sigma = 0.05;
  s.transient = 1.0;
  s.transient_steps = 5;
  s.seed = 300;
  s.Reset();
  PageHinkley unsuppressed;
  EXPECT_GT(FeedStream(unsuppressed, s, 5000, /*suppress=*/false).size(), 10u);
  s.Reset();
  PageHinkley suppressed;
  EXPECT_EQ(FeedStream(suppressed, s, 5000, /*suppress=*/true).size(), 0u);
}

TEST(PageHinkleyTest, NoAlarmDuringWarmupAndNonFiniteLossesAreIgnored) {
  PageHinkleyOptions o;
  o.warmup = 200;
  PageHinkley ph(o);
  // A huge shift inside the warm-up: the statistics absorb it, no alarm.
  for (int t = 0; t < 200; ++t) {
    EXPECT_FALSE(ph.Add(1.0 + (t >= 100 ? 5.0 : 0.0) + 0.01 * (t % 3)));
  }
  EXPECT_EQ(ph.alarms(), 0);
  const double stat = ph.statistic();
  EXPECT_FALSE(ph.Add(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_FALSE(ph.Add(std::numeric_limits<double>::infinity()));
  EXPECT_EQ(ph.statistic(), stat);
  // Past the warm-up a shift of the same size alarms.
  bool alarmed = false;
  for (int t = 0; t < 100 && !alarmed; ++t) {
    alarmed = ph.Add(6.0 + 5.0 + 0.01 * (t % 3));
  }
  EXPECT_TRUE(alarmed);
  EXPECT_EQ(ph.alarms(), 1);
  EXPECT_EQ(ph.statistic(), 0.0);  // the test resets at an alarm
}

// The thresholds are unit-free: the same stream in other units (×1024 is
// exact in floating point) alarms at exactly the same steps.
TEST(PageHinkleyTest, AlarmsDoNotDependOnTheLossScale) {
  LossStream s;
  s.sigma = 0.1;
  s.shift_at = 3000;
  s.seed = 400;
  s.Reset();
  PageHinkley a;
  std::vector<int64_t> base = FeedStream(a, s, 5000);
  s.Reset();
  PageHinkley b;
  std::vector<int64_t> scaled = FeedStream(b, s, 5000, true, 1024.0);
  ASSERT_FALSE(base.empty());
  EXPECT_EQ(base, scaled);
}

TEST(DivergenceTriggerTest, FiresAboveTheThreshold) {
  std::vector<float> ref = {0, 0, 0, 0};
  std::vector<float> theta = {1, -1, 0.5f, 0};  // ‖θ − ref‖² = 2.25
  double d2 = -1;
  DivergenceTrigger off;
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.Exceeded(theta, ref, &d2));
  EXPECT_DOUBLE_EQ(d2, 2.25);
  absl::StatusOr<DivergenceTrigger> low = DivergenceTrigger::Create({2.0});
  ASSERT_TRUE(low.ok());
  EXPECT_TRUE(low->enabled());
  EXPECT_TRUE(low->Exceeded(theta, ref));
  absl::StatusOr<DivergenceTrigger> at = DivergenceTrigger::Create({2.25});
  ASSERT_TRUE(at.ok());
  EXPECT_FALSE(at->Exceeded(theta, ref));  // "above", not "at"
  EXPECT_FALSE(at->Exceeded(ref, ref, &d2));
  EXPECT_EQ(d2, 0.0);
}

TEST(DivergenceTriggerTest, SumsInDouble) {
  // One difference of 10^4 (10^8 squared) then 10^6 differences of 0.1
  // (0.01 squared, 10^4 in all). A float sum stays at 10^8 (its ulp there is
  // 8, so each 0.01 is lost); the double sum is 10^8 + 10^4.
  const int n = 1000001;
  std::vector<float> ref(n, 0.0f), theta(n, 0.1f);
  theta[0] = 1e4f;
  const double small = static_cast<double>(0.1f) * 0.1f;
  double d2 = 0;
  DivergenceTrigger t({1e8 + 5e3});
  EXPECT_TRUE(t.Exceeded(theta, ref, &d2));
  EXPECT_NEAR(d2, 1e8 + (n - 1) * small, 0.1);  // a float sum is 1e4 off
}

TEST(DivergenceTriggerTest, MismatchedSizesAndNaNCountAsAbove) {
  DivergenceTrigger t({1.0});
  std::vector<float> a = {0, 0}, b = {0, 0, 0};
  double d2 = 0;
  EXPECT_TRUE(t.Exceeded(a, b, &d2));
  EXPECT_TRUE(std::isinf(d2));
  std::vector<float> nan = {std::nanf(""), 0};
  EXPECT_TRUE(t.Exceeded(nan, a));
  EXPECT_FALSE(DivergenceTrigger().Exceeded(nan, a));  // off stays off
}

TEST(DivergenceTriggerTest, RejectsBadThreshold) {
  for (double bad :
       {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    absl::StatusOr<DivergenceTrigger> t = DivergenceTrigger::Create({bad});
    EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << bad;
    EXPECT_NE(t.status().message().find("threshold"), absl::string_view::npos);
  }
  EXPECT_TRUE(DivergenceTrigger::Create({0}).ok());
}

TEST(InnerStepControllerTest, RejectsInconsistentOptionsNamingTheField) {
  struct Case {
    InnerStepOptions o;
    const char* field;
  };
  const Case cases[] = {
      {{0, 10, 5, 2.0, 2}, "min_steps"},
      {{10, 5, 5, 2.0, 2}, "max_steps"},
      {{10, 100, 5, 2.0, 2}, "initial"},
      {{10, 100, 101, 2.0, 2}, "initial"},
      {{10, 100, 50, 0.5, 2}, "grow"},
      {{10, 100, 50, std::nan(""), 2}, "grow"},
      {{10, 100, 50, 2.0, 0}, "quiet_rounds"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<InnerStepController> h = InnerStepController::Create(c.o);
    EXPECT_TRUE(absl::IsInvalidArgument(h.status())) << c.field;
    EXPECT_NE(h.status().message().find(c.field), absl::string_view::npos)
        << h.status();
  }
  EXPECT_TRUE(InnerStepController::Create({}).ok());
}

TEST(InnerStepControllerTest, DriftShortensAndQuietRoundsLengthen) {
  absl::StatusOr<InnerStepController> h =
      InnerStepController::Create({10, 100, 100, 2.0, 2});
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->adaptive());
  EXPECT_EQ(h->current(), 100);
  h->OnDrift();
  EXPECT_EQ(h->current(), 10);
  std::vector<int> seen;
  for (int r = 0; r < 12; ++r) {
    h->OnRoundEnd(false);
    seen.push_back(h->current());
  }
  EXPECT_EQ(seen, (std::vector<int>{10, 20, 20, 40, 40, 80, 80, 100, 100, 100,
                                    100, 100}));
  // Drift in a round: back to min, and the quiet count restarts.
  h->OnRoundEnd(false);  // one quiet round counted ...
  h->OnRoundEnd(true);   // ... then drift
  EXPECT_EQ(h->current(), 10);
  h->OnRoundEnd(false);
  EXPECT_EQ(h->current(), 10);
  h->OnRoundEnd(false);
  EXPECT_EQ(h->current(), 20);
}

TEST(InnerStepControllerTest, GrowRoundsUp) {
  absl::StatusOr<InnerStepController> h =
      InnerStepController::Create({3, 9, 3, 1.5, 1});
  ASSERT_TRUE(h.ok());
  h->OnRoundEnd(false);
  EXPECT_EQ(h->current(), 5);  // ceil(4.5)
  h->OnRoundEnd(false);
  EXPECT_EQ(h->current(), 8);  // ceil(7.5)
  h->OnRoundEnd(false);
  EXPECT_EQ(h->current(), 9);  // capped at max
}

TEST(InnerStepControllerTest, FixedHNeverChanges) {
  absl::StatusOr<InnerStepController> h =
      InnerStepController::Create({50, 50, 50, 2.0, 1});
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE(h->adaptive());
  h->OnDrift();
  EXPECT_EQ(h->current(), 50);
  h->OnRoundEnd(false);
  h->OnRoundEnd(true);
  EXPECT_EQ(h->current(), 50);
}

}  // namespace
}  // namespace starling
