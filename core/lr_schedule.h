// The inner learning-rate schedule: linear warmup, then cosine decay to
// `final_lr` at `total_steps`. Pure functions; thread-safe.
#ifndef STARLING_CORE_LR_SCHEDULE_H_
#define STARLING_CORE_LR_SCHEDULE_H_

namespace starling {

struct LrSchedule {
  double peak_lr = 3e-3;
  int warmup_steps = 0;  // steps 0..warmup-1 ramp to peak_lr: peak*(s+1)/warmup
  int total_steps = 1;   // the cosine reaches final_lr here
  double final_lr = 0.0;
};

// Learning rate for 0-based step `step`. Steps past total_steps hold final_lr.
double LearningRateAt(const LrSchedule& schedule, int step);

}  // namespace starling

#endif  // STARLING_CORE_LR_SCHEDULE_H_
