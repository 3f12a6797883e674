// Sync policies for adaptive DiLoCo rounds: a Page-Hinkley drift detector on
// the de-trended training loss, a model-space divergence trigger (Kamp et al.
// 2018) and the controller that shortens the inner steps H on drift and
// lengthens them again when the stream is quiet. Pure, network-free state
// machines; not thread-safe: the node's training thread owns each of them.
#ifndef STARLING_OUTER_OPT_SYNC_POLICY_H_
#define STARLING_OUTER_OPT_SYNC_POLICY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace starling {

// Page-Hinkley test for an upward shift in a de-trended training loss. The
// loss is fed as the residual r_t = loss_t − trend_{t−1} (trend: an EWMA of
// the loss), divided by a running noise scale, so delta and lambda are in
// units of the loss's own step-to-step noise and work for any loss scale.
struct PageHinkleyOptions {
  // Tolerated drift of the normalized residual per step (in noise σ): the
  // test accumulates z_t − delta, so shifts well below delta·σ are ignored.
  double delta = 0.5;
  // Alarm threshold on m_t − min m: about lambda / (shift/σ − delta) steps
  // after a shift, e.g. ~6 steps for a 3σ shift (more while the trend
  // lags a fast-falling loss). 15 gave no false alarm in 50 nodes × 10k
  // steps of Gaussian or Student-t(3) noise; 10 gave a few.
  double lambda = 15.0;
  // EWMA factor of the trend (time constant ~1/alpha steps). The trend
  // absorbs a level shift within a few 1/alpha steps, so a shift must be
  // caught before that: a slower trend detects smaller shifts.
  double trend_alpha = 0.01;
  // EWMA factor of the noise-scale estimate.
  double scale_alpha = 0.01;
  // Normalized residuals are clipped to ±clip, so one outlier step (a bad
  // batch) adds at most clip − delta and cannot raise an alarm alone.
  double clip = 5.0;
  // Steps before the first alarm is possible (trend and scale settle).
  int warmup = 100;
  // Steps ignored after Suppress() (a sync or an LR change) and after an
  // alarm. The trend keeps tracking the loss meanwhile; the test does not.
  int cooldown = 20;
};

// InvalidArgument naming the field: delta < 0, lambda <= 0, an alpha outside
// (0, 1], clip <= delta, warmup < 0 or cooldown < 0 (or any non-finite).
absl::Status ValidatePageHinkleyOptions(const PageHinkleyOptions& o);

class PageHinkley {
 public:
  // `o` should pass ValidatePageHinkleyOptions.
  explicit PageHinkley(const PageHinkleyOptions& o = {});

  // Feeds one step's training loss; true when drift is detected at this step
  // (then the test resets, re-learns the trend at the new level and cools
  // down). Non-finite losses are ignored.
  bool Add(double loss);
  // Starts a cool-down: call after a sync (the outer step moves θ) and after
  // an LR schedule change.
  void Suppress();

  int64_t alarms() const { return alarms_; }
  // Current m_t − M_t (≥ 0; an alarm fires above lambda), for logging.
  double statistic() const { return m_ - m_min_; }
  const PageHinkleyOptions& options() const { return options_; }

 private:
  PageHinkleyOptions options_;
  int64_t seen_ = 0;     // finite losses fed
  int64_t trend_n_ = 0;  // losses in the trend since it was (re)started
  double trend_ = 0;
  int64_t scale_n_ = 0;    // residual differences in the scale estimate
  double var_ = 0;         // EWMA of (r_t − r_{t−1})² / 2: the noise σ²
  bool has_prev_ = false;  // prev_residual_ holds the previous step's r
  double prev_residual_ = 0;
  int cooldown_left_ = 0;
  double m_ = 0;
  double m_min_ = 0;
  int64_t alarms_ = 0;
};

// Model-space trigger (Kamp et al. 2018, dynamic averaging): sync early when
// the local model strays from the reference (θ at the last sync).
struct DivergenceTriggerOptions {
  double threshold = 0;  // ‖θ_i − θ_ref‖² above this fires; 0 = off
};

class DivergenceTrigger {
 public:
  // InvalidArgument naming the threshold when it is negative or not finite.
  static absl::StatusOr<DivergenceTrigger> Create(
      const DivergenceTriggerOptions& o);
  // `o.threshold` should be finite and ≥ 0 (Create checks it).
  explicit DivergenceTrigger(const DivergenceTriggerOptions& o = {})
      : options_(o) {}

  bool enabled() const { return options_.threshold > 0; }
  // Squared L2 distance ‖theta − ref‖², computed in double; true when the
  // trigger is enabled and the distance is above the threshold. A NaN
  // distance, or theta and ref of different sizes (distance +inf), counts as
  // above: the model cannot be shown to be close. Disabled: always false
  // (distance2 is still written when given).
  bool Exceeded(absl::Span<const float> theta, absl::Span<const float> ref,
                double* distance2 = nullptr) const;

  const DivergenceTriggerOptions& options() const { return options_; }

 private:
  DivergenceTriggerOptions options_;
};

// H between rounds: drift shortens it, quiet lengthens it again.
struct InnerStepOptions {
  // Defaults: a fixed H of 50, the node's --inner_steps default.
  int min_steps = 50;
  int max_steps = 50;
  int initial = 50;
  double grow = 2.0;  // H := min(max, ceil(H·grow)) after quiet rounds
  // Rounds without drift before H grows. 3, not 2: H must stay short long
  // enough after a drift to speed recovery (bench/adaptive_sync.py drift).
  int quiet_rounds = 3;
};

class InnerStepController {
 public:
  // InvalidArgument naming min/max/initial when inconsistent (min < 1,
  // max < min, initial outside [min, max]), grow when not finite or < 1,
  // quiet_rounds when < 1.
  static absl::StatusOr<InnerStepController> Create(const InnerStepOptions& o);

  // The inner steps H for the next round.
  int current() const { return current_; }
  // Drift seen (loss or model space): H := min_steps; the quiet count
  // restarts.
  void OnDrift();
  // At the end of each round. drift_in_round: as OnDrift. Otherwise counts a
  // quiet round; after quiet_rounds of them in a row, H := min(max,
  // ceil(H·grow)) and the count restarts.
  void OnRoundEnd(bool drift_in_round);
  // False when min == max: H never changes.
  bool adaptive() const { return options_.min_steps < options_.max_steps; }
  const InnerStepOptions& options() const { return options_; }

 private:
  explicit InnerStepController(const InnerStepOptions& o)
      : options_(o), current_(o.initial) {}
  InnerStepOptions options_;
  int current_;
  int quiet_ = 0;
};

}  // namespace starling

#endif  // STARLING_OUTER_OPT_SYNC_POLICY_H_
