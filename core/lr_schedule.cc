#include "core/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace starling {

double LearningRateAt(const LrSchedule& s, int step) {
  if (step < 0) step = 0;
  if (step < s.warmup_steps) {
    return s.peak_lr * static_cast<double>(step + 1) / s.warmup_steps;
  }
  int decay_steps = std::max(1, s.total_steps - s.warmup_steps);
  double progress =
      std::min(1.0, static_cast<double>(step - s.warmup_steps) / decay_steps);
  return s.final_lr +
         (s.peak_lr - s.final_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace starling
