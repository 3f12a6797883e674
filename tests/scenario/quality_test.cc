// Scenario tests (label `scenario`): the quality bars of `starling train` on
// real data, run end to end through the binary. A few minutes on 2 cores.
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"

namespace starling {
namespace {

using ::starling::testing::Field;
using ::starling::testing::RunToSummary;

// The PyTorch-parity recipe on KJV: the reference script reaches 2.05-2.09
// (bench/pytorch_kjv.py; 2.062 in the DiLoCo issue's table); Starling must
// reach <= 2.12, and stays within 3% of 2.062.
TEST(QualityTest, KjvGptRecipeReachesPyTorchParity) {
  std::string out = testing::TempDir() + "/kjv";
  auto fin =
      Field(RunToSummary("train --model=gpt --layers=2 --width=64 --heads=4 "
                         "--context=64 --data=kjv --batch=16 --steps=800 "
                         "--lr=3e-3 --warmup=50 --threads=1 --seed=0",
                         out),
            "final")
          .struct_value();
  double val = Field(fin, "val_loss").number_value();
  RecordProperty("val_loss", std::to_string(val));
  EXPECT_LE(val, 2.12);
  EXPECT_GE(val, 2.062 * 0.97);
}

// The Fashion-MNIST cnn default reaches >= 88% test accuracy.
TEST(QualityTest, FashionMnistCnnDefaultReaches88Percent) {
  std::string out = testing::TempDir() + "/fmnist";
  auto fin =
      Field(RunToSummary("train --data=fmnist", out), "final").struct_value();
  double acc = Field(fin, "val_accuracy").number_value();
  RecordProperty("val_accuracy", std::to_string(acc));
  EXPECT_GE(acc, 0.88);
}

}  // namespace
}  // namespace starling
