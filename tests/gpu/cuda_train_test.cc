// GPU tests (label gpu): they run where LibTorch has CUDA and a GPU is
// visible, and skip elsewhere (CI and development machines have no GPU).
// scripts/gpu/run_on_device.sh runs them on a lent GPU machine.
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "core/device.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/trainer.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/core/tiny_gpt.h"
#include "tests/core/trainer_util.h"

namespace starling {
namespace {

using ::starling::testing::MustCreate;
using ::starling::testing::RunSteps;

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

TrainConfig Tiny(const std::string& device,
                 const std::string& precision = "fp32") {
  std::string path = testing::TempDir() + "/corpus.txt";
  EXPECT_TRUE(WriteFileAtomic(path, testing::SampleText(100000)).ok());
  TrainConfig c = testing::TinyGptConfig(path);
  c.set_steps(30);
  c.set_warmup(5);
  c.set_device(device);
  c.set_precision(precision);
  EXPECT_TRUE(ResolveTrainConfig(&c).ok());
  return c;
}

TEST(CudaTest, TrainsOnTheGpuAndMatchesTheCpuClosely) {
  SKIP_WITHOUT_CUDA();
  auto gpu = MustCreate(Tiny("cuda"));
  auto cpu = MustCreate(Tiny("cpu"));
  ASSERT_TRUE(gpu && cpu);
  EXPECT_TRUE(gpu->Parameters()[0].is_cuda());
  EXPECT_EQ(gpu->device().str(), "cuda:0");
  // Same seed, same data order: the losses agree to float tolerance.
  for (int i = 0; i < 30; ++i) {
    auto g = gpu->Step();
    auto c = cpu->Step();
    ASSERT_TRUE(g.ok() && c.ok());
    EXPECT_NEAR(g->loss, c->loss, 1e-2 + 1e-2 * c->loss) << i;
  }
  EXPECT_GT(gpu->PeakMemory().peak_allocated_bytes, 0);
}

// A GPU run checkpointed and resumed (the optimizer's state back on the
// GPU) goes on exactly as the run never interrupted, in fp32 and in bf16.
void ExpectExactResumeOnGpu(const std::string& precision) {
  const TrainConfig c = Tiny("cuda", precision);
  auto straight = MustCreate(c);
  ASSERT_TRUE(straight);
  const std::vector<double> expected = RunSteps(*straight, 20);

  const std::string path = testing::TempDir() + "/gpu-" + precision + ".ckpt";
  auto first = MustCreate(c);
  std::vector<double> got = RunSteps(*first, 9);
  ASSERT_TRUE(first->SaveCheckpoint(path).ok());
  first.reset();
  auto second = MustCreate(c);
  absl::Status s = second->RestoreCheckpoint(path);
  ASSERT_TRUE(s.ok()) << s;
  for (double l : RunSteps(*second, 11)) got.push_back(l);
  EXPECT_EQ(got, expected) << precision;
  EXPECT_EQ(ModelHash(second->Parameters()), ModelHash(straight->Parameters()))
      << precision;
}

TEST(CudaTest, ResumesBitForBitFp32) {
  SKIP_WITHOUT_CUDA();
  ExpectExactResumeOnGpu("fp32");
}

TEST(CudaTest, ResumesBitForBitBf16) {
  SKIP_WITHOUT_CUDA();
  ExpectExactResumeOnGpu("bf16");
}

TEST(CudaTest, Bf16LearnsLikeFp32AndKeepsFp32Weights) {
  SKIP_WITHOUT_CUDA();
  auto fp32 = MustCreate(Tiny("cuda")), bf16 = MustCreate(Tiny("cuda", "bf16"));
  ASSERT_TRUE(fp32 && bf16);
  const std::vector<double> a = RunSteps(*fp32, 30), b = RunSteps(*bf16, 30);
  ASSERT_EQ(b.size(), 30u);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]) / a[i]);
  }
  EXPECT_LT(worst, 0.05);  // as on the CPU (tests/core/trainer_test.cc)
  EXPECT_LT(b.back(), b.front() - 1.0);
  EXPECT_NE(ModelHash(fp32->Parameters()), ModelHash(bf16->Parameters()));
  for (const torch::Tensor& p : bf16->Parameters()) {
    EXPECT_EQ(p.scalar_type(), torch::kFloat32);
  }
}

TEST(CudaTest, HostStagingCopiesThroughPinnedMemoryLikeFlatten) {
  SKIP_WITHOUT_CUDA();
  auto t = MustCreate(Tiny("cuda"));
  ASSERT_TRUE(t);
  RunSteps(*t, 3);
  HostStaging staging;
  const absl::Span<const float> copied = staging.Copy(t->Parameters());
  const std::vector<float> want = Flatten(t->Parameters());
  ASSERT_EQ(copied.size(), want.size());
  EXPECT_TRUE(std::equal(copied.begin(), copied.end(), want.begin()));
  RunSteps(*t, 1);  // the next copy sees the next step's weights
  const absl::Span<const float> again = staging.Copy(t->Parameters());
  EXPECT_EQ(again.data(), copied.data());  // the same pinned buffer
  EXPECT_FALSE(std::equal(again.begin(), again.end(), want.begin()));
}

TEST(CudaTest, TheMemoryCapHolds) {
  SKIP_WITHOUT_CUDA();
  const torch::Device gpu(torch::kCUDA, 0);
  ASSERT_TRUE(SetGpuMemoryFraction(gpu, 0.01).ok());
  // 1% of any GPU of today is far below 64 GiB.
  EXPECT_ANY_THROW(
      torch::empty({int64_t{16} << 30}, torch::TensorOptions().device(gpu)));
  ASSERT_TRUE(SetGpuMemoryFraction(gpu, 1.0).ok());
  torch::Tensor t =
      torch::empty({int64_t{1} << 20}, torch::TensorOptions().device(gpu));
  EXPECT_GE(PeakDeviceMemory(gpu).peak_allocated_bytes, int64_t{4} << 20);
}

TEST(CudaTest, AGpuPastTheLastIsRefusedNamingTheFlag) {
  SKIP_WITHOUT_CUDA();
  const std::string spec =
      "cuda:" + std::to_string(torch::cuda::device_count());
  absl::StatusOr<torch::Device> d = ParseDevice(spec);
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
  EXPECT_NE(d.status().message().find("--device=" + spec), std::string::npos);
}

}  // namespace
}  // namespace starling
