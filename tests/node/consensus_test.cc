// Consensus distance from gossip snapshots: the formula, and the files
// (steps only some nodes wrote, bad files, deletion).
#include "node/consensus.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace starling {
namespace {

using ::starling::testing::TempDir;

TEST(ConsensusTest, DistanceIsMeanSquaredDeviation) {
  // Means (1, 2); deviations ±1 and ±3: (1 + 9 + 1 + 9) / 2 = 10.
  absl::StatusOr<double> d = ConsensusDistance({{0, -1}, {2, 5}});
  ASSERT_TRUE(d.ok());
  EXPECT_DOUBLE_EQ(*d, 10.0);
  EXPECT_DOUBLE_EQ(*ConsensusDistance({{3, 4}, {3, 4}, {3, 4}}), 0.0);
  EXPECT_DOUBLE_EQ(*ConsensusDistance({{3, 4}}), 0.0);
  EXPECT_TRUE(
      absl::IsInvalidArgument(ConsensusDistance({{1, 2}, {1}}).status()));
}

void WriteSnapshot(const std::string& node_dir, int step,
                   const std::vector<float>& v) {
  ASSERT_TRUE(MakeDirs(node_dir + "/snapshots").ok());
  std::string bytes(v.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), v.data(), bytes.size());
  ASSERT_TRUE(
      WriteFileAtomic(absl::StrCat(node_dir, "/snapshots/step_", step, ".bin"),
                      bytes)
          .ok());
}

TEST(ConsensusTest, FromSnapshotsPerStepOverNodesThatHaveIt) {
  const std::string dir = TempDir() + "/consensus";
  const std::vector<std::string> nodes = {dir + "/n0", dir + "/n1",
                                          dir + "/n2"};
  WriteSnapshot(nodes[0], 10, {0, 0});
  WriteSnapshot(nodes[1], 10, {2, 0});
  WriteSnapshot(nodes[2], 10, {4, 0});  // mean 2: (4 + 0 + 4) / 3
  WriteSnapshot(nodes[0], 20, {1, 1});
  WriteSnapshot(nodes[1], 20, {1, 3});  // n2 died before step 20
  WriteSnapshot(nodes[0], 30, {1, 1});  // alone: no distance
  // A truncated file at step 20 is left out.
  ASSERT_TRUE(MakeDirs(nodes[2] + "/snapshots").ok());
  ASSERT_TRUE(WriteFileAtomic(nodes[2] + "/snapshots/step_20.bin", "abc").ok());
  std::vector<std::string> skipped;
  std::vector<ConsensusPoint> points =
      ConsensusFromSnapshots(nodes, /*remove=*/true, &skipped);
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0].step, 10);
  EXPECT_EQ(points[0].nodes, 3);
  EXPECT_DOUBLE_EQ(points[0].distance, 8.0 / 3);
  EXPECT_EQ(points[1].step, 20);
  EXPECT_EQ(points[1].nodes, 2);
  EXPECT_DOUBLE_EQ(points[1].distance, 1.0);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("step_20"), std::string::npos);
  for (const std::string& n : nodes) {
    EXPECT_FALSE(FileExists(n + "/snapshots")) << n;
  }
}

}  // namespace
}  // namespace starling
