// GPU tests: run only where LibTorch has CUDA and a GPU is visible; they skip
// cleanly elsewhere (CI machines have no GPU).
#include <torch/cuda.h>
#include <torch/torch.h>

#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/trainer.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/core/tiny_gpt.h"

namespace starling {
namespace {

TrainConfig Tiny(const std::string& device) {
  std::string path = testing::TempDir() + "/corpus.txt";
  EXPECT_TRUE(WriteFileAtomic(path, testing::SampleText(100000)).ok());
  TrainConfig c = testing::TinyGptConfig(path);
  c.set_steps(30);
  c.set_device(device);
  EXPECT_TRUE(ResolveTrainConfig(&c).ok());
  return c;
}

TEST(CudaTest, TrainsOnTheGpuAndMatchesTheCpuClosely) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto gpu = Trainer::Create(Tiny("cuda"));
  auto cpu = Trainer::Create(Tiny("cpu"));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE((*gpu)->Parameters()[0].is_cuda());
  // Same seed, same data order: the losses agree to float tolerance.
  for (int i = 0; i < 30; ++i) {
    auto g = (*gpu)->Step();
    auto c = (*cpu)->Step();
    ASSERT_TRUE(g.ok() && c.ok());
    EXPECT_NEAR(g->loss, c->loss, 1e-2 + 1e-2 * c->loss) << i;
  }
  // Flat views and checkpoints work from device memory.
  std::vector<float> flat = Flatten((*gpu)->Parameters());
  EXPECT_EQ(static_cast<int64_t>(flat.size()),
            NumElements((*gpu)->Parameters()));
  std::string ckpt = testing::TempDir() + "/gpu.ckpt";
  ASSERT_TRUE((*gpu)->SaveCheckpoint(ckpt).ok());
  auto again = Trainer::Create(Tiny("cuda"));
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->RestoreCheckpoint(ckpt).ok());
  EXPECT_EQ(ModelHash((*again)->Parameters()), ModelHash((*gpu)->Parameters()));
}

}  // namespace
}  // namespace starling
