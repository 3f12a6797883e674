#include "outer_opt/sync_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace starling {
namespace {

bool IsFinite(double v) { return std::isfinite(v); }

absl::Status BadOption(absl::string_view field, double value,
                       absl::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", value, ": ", want));
}

// An EWMA that starts as a running mean: the first 1/alpha samples count
// equally, so its start does not lean on the first sample.
double EwmaStep(double alpha, int64_t n) {
  return std::max(alpha, 1.0 / static_cast<double>(n));
}

}  // namespace

absl::Status ValidatePageHinkleyOptions(const PageHinkleyOptions& o) {
  if (!(o.delta >= 0) || !IsFinite(o.delta)) {
    return BadOption("page_hinkley.delta", o.delta, "must be finite and >= 0");
  }
  if (!(o.lambda > 0) || !IsFinite(o.lambda)) {
    return BadOption("page_hinkley.lambda", o.lambda, "must be finite and > 0");
  }
  if (!(o.trend_alpha > 0 && o.trend_alpha <= 1)) {
    return BadOption("page_hinkley.trend_alpha", o.trend_alpha,
                     "must be in (0, 1]");
  }
  if (!(o.scale_alpha > 0 && o.scale_alpha <= 1)) {
    return BadOption("page_hinkley.scale_alpha", o.scale_alpha,
                     "must be in (0, 1]");
  }
  if (!(o.clip > o.delta) || !IsFinite(o.clip)) {
    return BadOption(
        "page_hinkley.clip", o.clip,
        absl::StrCat("must be finite and > delta (", o.delta, ")"));
  }
  if (o.warmup < 0) {
    return BadOption("page_hinkley.warmup", o.warmup, "must be >= 0");
  }
  if (o.cooldown < 0) {
    return BadOption("page_hinkley.cooldown", o.cooldown, "must be >= 0");
  }
  return absl::OkStatus();
}

PageHinkley::PageHinkley(const PageHinkleyOptions& o) : options_(o) {}

bool PageHinkley::Add(double loss) {
  if (!std::isfinite(loss)) return false;
  ++seen_;
  if (trend_n_ == 0) {  // first loss, or the first after an alarm
    trend_ = loss;
    trend_n_ = 1;
    has_prev_ = false;
    if (cooldown_left_ > 0) --cooldown_left_;
    return false;
  }
  const double r = loss - trend_;
  ++trend_n_;
  trend_ += EwmaStep(options_.trend_alpha, trend_n_) * r;
  if (cooldown_left_ > 0) {
    // The trend follows the loss through a sync's transient or to an LR
    // change's new level; the noise scale and the test skip it.
    --cooldown_left_;
    has_prev_ = false;
    return false;
  }
  // Noise scale from consecutive residuals: (r_t − r_{t−1})²/2 estimates σ²
  // of the step noise, unaffected by how far the trend lags a falling loss
  // and inflated by a level shift at one step only.
  if (has_prev_) {
    const double d = r - prev_residual_;
    ++scale_n_;
    var_ += EwmaStep(options_.scale_alpha, scale_n_) * (0.5 * d * d - var_);
  }
  prev_residual_ = r;
  has_prev_ = true;
  if (seen_ <= options_.warmup || !(var_ > 0)) return false;
  // A trend that lags a falling loss makes z negative: the test is
  // conservative while the loss still falls fast, as it should be.
  const double z =
      std::clamp(r / std::sqrt(var_), -options_.clip, options_.clip);
  m_ += z - options_.delta;
  m_min_ = std::min(m_min_, m_);
  if (m_ - m_min_ <= options_.lambda) return false;
  ++alarms_;
  m_ = 0;
  m_min_ = 0;
  trend_n_ = 0;  // re-learn the trend at the loss's new level
  has_prev_ = false;
  cooldown_left_ = options_.cooldown;
  return true;
}

void PageHinkley::Suppress() {
  cooldown_left_ = std::max(cooldown_left_, options_.cooldown);
  has_prev_ = false;
}

absl::StatusOr<DivergenceTrigger> DivergenceTrigger::Create(
    const DivergenceTriggerOptions& o) {
  if (!(o.threshold >= 0) || !IsFinite(o.threshold)) {
    return BadOption("divergence threshold", o.threshold,
                     "must be finite and >= 0 (0 = off)");
  }
  return DivergenceTrigger(o);
}

bool DivergenceTrigger::Exceeded(absl::Span<const float> theta,
                                 absl::Span<const float> ref,
                                 double* distance2) const {
  double d2 = 0;
  if (theta.size() != ref.size()) {
    d2 = std::numeric_limits<double>::infinity();
  } else {
    for (size_t i = 0; i < theta.size(); ++i) {
      const double d =
          static_cast<double>(theta[i]) - static_cast<double>(ref[i]);
      d2 += d * d;
    }
  }
  if (distance2 != nullptr) *distance2 = d2;
  return enabled() && !(d2 <= options_.threshold);
}

absl::StatusOr<InnerStepController> InnerStepController::Create(
    const InnerStepOptions& o) {
  if (o.min_steps < 1) {
    return BadOption("min_steps", o.min_steps, "must be >= 1");
  }
  if (o.max_steps < o.min_steps) {
    return BadOption("max_steps", o.max_steps,
                     absl::StrCat("must be >= min_steps (", o.min_steps, ")"));
  }
  if (o.initial < o.min_steps || o.initial > o.max_steps) {
    return BadOption("initial", o.initial,
                     absl::StrCat("must be in [min_steps, max_steps] = [",
                                  o.min_steps, ", ", o.max_steps, "]"));
  }
  if (!(o.grow >= 1) || !IsFinite(o.grow)) {
    return BadOption("grow", o.grow, "must be finite and >= 1");
  }
  if (o.quiet_rounds < 1) {
    return BadOption("quiet_rounds", o.quiet_rounds, "must be >= 1");
  }
  return InnerStepController(o);
}

void InnerStepController::OnDrift() {
  current_ = options_.min_steps;
  quiet_ = 0;
}

void InnerStepController::OnRoundEnd(bool drift_in_round) {
  if (drift_in_round) {
    OnDrift();
    return;
  }
  if (++quiet_ < options_.quiet_rounds) return;
  quiet_ = 0;
  const double grown = std::ceil(static_cast<double>(current_) * options_.grow);
  current_ = static_cast<int>(
      std::min(grown, static_cast<double>(options_.max_steps)));
}

}  // namespace starling
