// Scenario tests (label `scenario`): DiLoCo learning quality through
// `starling sim` on KJV against the plain-PyTorch reference figures. Each run
// takes one to five minutes on 2 cores.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/scenario/sim_result.h"

namespace starling {
namespace {

using ::starling::testing::SimResult;

SimResult Sim(const std::string& flags) {
  return testing::RunSim(flags, testing::TempDir() + "/sim");
}

struct Reference {
  const char* name;
  const char* flags;
  double val_loss;  // the PyTorch reference (4 nodes, batch 16, 800 steps)
};

class ShortRecipeTest : public ::testing::TestWithParam<Reference> {};

// Mean of seeds 0 and 1 within 3% of the reference.
TEST_P(ShortRecipeTest, MatchesThePyTorchReference) {
  const Reference& ref = GetParam();
  double sum = 0;
  for (int seed : {0, 1}) {
    SimResult r = Sim(absl::StrCat("--nodes=4 --batch=16 --steps=800 ",
                                   ref.flags, " --seed=", seed));
    EXPECT_TRUE(r.agree);
    sum += r.val_loss;
  }
  const double mean = sum / 2;
  RecordProperty("mean_val_loss", std::to_string(mean));
  EXPECT_LE(std::abs(mean - ref.val_loss) / ref.val_loss, 0.03)
      << ref.name << ": mean val loss " << mean << " vs reference "
      << ref.val_loss;
}

INSTANTIATE_TEST_SUITE_P(
    Kjv, ShortRecipeTest,
    ::testing::Values(Reference{"ddp", "--algo=ddp", 1.884},
                      Reference{"diloco_h10", "--inner_steps=10", 1.966},
                      Reference{"diloco_h50", "--inner_steps=50", 2.087}),
    [](const auto& info) { return std::string(info.param.name); });

// The promise: with enough rounds (3000 steps, H=50: 60 rounds) DiLoCo comes
// within 3% of its own ddp while sending about 50x fewer bytes.
TEST(LongRecipeTest, DilocoWithin3PercentOfDdpWithFiftyTimesFewerBytes) {
  const std::string common =
      "--nodes=4 --batch=16 --steps=3000 --seed=0 "
      "--eval_every=1000";
  SimResult ddp = Sim(common + " --algo=ddp");
  SimResult diloco = Sim(common + " --inner_steps=50");
  RecordProperty("ddp_val_loss", std::to_string(ddp.val_loss));
  RecordProperty("diloco_val_loss", std::to_string(diloco.val_loss));
  EXPECT_TRUE(ddp.agree && diloco.agree);
  EXPECT_LE(diloco.val_loss, ddp.val_loss * 1.03)
      << "diloco " << diloco.val_loss << " vs ddp " << ddp.val_loss;
  const double fewer = ddp.total_bytes / diloco.total_bytes;
  EXPECT_GT(fewer, 45.0);
  EXPECT_LT(fewer, 55.0);
}

}  // namespace
}  // namespace starling
