// core/device.h on the CPU: --device parsing, the GPU memory cap's range,
// and HostStaging's copy (the identity of Flatten here). tests/gpu/ covers
// the same on a GPU.
#include "core/device.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>

#include "core/flat_params.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

TEST(DeviceTest, ParseDeviceNamesTheFlag) {
  absl::StatusOr<torch::Device> cpu = ParseDevice("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE(cpu->is_cpu());
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda0"}) {
    absl::StatusOr<torch::Device> d = ParseDevice(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << bad << d.status();
    EXPECT_NE(d.status().message().find("--device="), std::string::npos);
  }
  if (torch::cuda::is_available()) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseDevice("cuda:4096").status()));
  } else {
    absl::StatusOr<torch::Device> d = ParseDevice("cuda:0");
    EXPECT_TRUE(absl::IsFailedPrecondition(d.status())) << d.status();
  }
}

TEST(DeviceTest, MemoryFractionOutOfRangeIsRefusedAndIgnoredOnTheCpu) {
  const torch::Device cpu(torch::kCPU);
  EXPECT_TRUE(SetGpuMemoryFraction(cpu, 0).ok());
  EXPECT_TRUE(SetGpuMemoryFraction(cpu, 0.25).ok());
  EXPECT_TRUE(SetGpuMemoryFraction(cpu, 1).ok());
  for (double bad : {-0.1, 1.5, std::nan("")}) {
    absl::Status s = SetGpuMemoryFraction(cpu, bad);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad;
    EXPECT_NE(s.message().find("--gpu_memory_fraction"), std::string::npos);
  }
  EXPECT_EQ(PeakDeviceMemory(cpu).peak_allocated_bytes, -1);
}

TEST(HostStagingTest, CopiesLikeFlattenAndKeepsItsBuffer) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> params = {torch::randn({3, 5}), torch::randn({7}),
                                       torch::randn({2, 2, 2})};
  HostStaging staging;
  absl::Span<const float> a = staging.Copy(params);
  const std::vector<float> want = Flatten(params);
  ASSERT_EQ(a.size(), want.size());
  EXPECT_TRUE(std::equal(a.begin(), a.end(), want.begin()));
  EXPECT_GE(staging.last_seconds(), 0);
  // The next copy sees the tensors as they are then.
  params[1].add_(1.0);
  absl::Span<const float> b = staging.Copy(params);
  EXPECT_EQ(b[15], want[15] + 1.0f);
  EXPECT_EQ(b[0], want[0]);
}

}  // namespace
}  // namespace starling
