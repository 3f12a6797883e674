// Helpers for the tests that drive a Trainer directly (tests/core/ on the
// CPU, tests/gpu/ on a GPU): create one or fail the test, run N steps.
#ifndef STARLING_TESTS_CORE_TRAINER_UTIL_H_
#define STARLING_TESTS_CORE_TRAINER_UTIL_H_

#include <memory>
#include <utility>
#include <vector>

#include "core/trainer.h"
#include "gtest/gtest.h"

namespace starling::testing {

// The trainer `c` describes; nullptr (and a test failure) when it cannot be
// created.
inline std::unique_ptr<Trainer> MustCreate(const TrainConfig& c) {
  auto t = Trainer::Create(c);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(t).value() : nullptr;
}

// The losses of `n` inner steps; stops (failing the test) at the first
// error.
inline std::vector<double> RunSteps(Trainer& t, int n) {
  std::vector<double> losses;
  for (int i = 0; i < n; ++i) {
    auto r = t.Step();
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) break;
    losses.push_back(r->loss);
  }
  return losses;
}

}  // namespace starling::testing

#endif  // STARLING_TESTS_CORE_TRAINER_UTIL_H_
