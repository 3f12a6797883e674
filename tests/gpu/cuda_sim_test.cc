// `starling sim --device=cuda` (label gpu): four node processes share one
// GPU, each with its own CUDA context and memory cap, and agree on every
// round. Skips without CUDA.
#include <torch/cuda.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"

namespace starling {
namespace {

using ::starling::testing::Field;
using ::starling::testing::ReadJson;
using ::starling::testing::RunStarling;

TEST(CudaSimTest, FourNodesShareTheGpuAndAgreeEveryRound) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::string out = testing::TempDir() + "/cuda-sim";
  auto r = RunStarling(
      absl::StrCat("sim --nodes=4 --steps=30 --inner_steps=10 --device=cuda "
                   "--precision=bf16 --eval_every=0 ",
                   testing::TinyTextFlags(300000), " --out=", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("hashes agree: yes"), std::string::npos) << r.err;
  auto summary = ReadJson(out + "/summary.json");
  EXPECT_EQ(Field(summary, "rounds").list_value().values_size(), 3);
  const auto& nodes = Field(summary, "nodes").list_value();
  ASSERT_EQ(nodes.values_size(), 4);
  for (const auto& v : nodes.values()) {
    const auto& node = v.struct_value();
    EXPECT_EQ(Field(node, "device").string_value(), "cuda:0");
    EXPECT_EQ(Field(node, "precision").string_value(), "bf16");
    EXPECT_GT(Field(node, "gpu_peak_allocated_bytes").number_value(), 0);
    const auto& split = Field(node, "round_time_split").struct_value();
    EXPECT_EQ(Field(split, "rounds").number_value(), 3);
    EXPECT_GT(Field(split, "inner_seconds").number_value(), 0);
    EXPECT_GT(Field(split, "copy_seconds").number_value(), 0);
  }
}

}  // namespace
}  // namespace starling
