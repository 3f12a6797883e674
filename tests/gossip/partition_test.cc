// The emulated network partition: the file's groups, and a heal.
#include "gossip/partition.h"

#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace starling {
namespace {

TEST(PartitionTest, ParsesGroupsOfIds) {
  EXPECT_EQ(
      ParsePartition("n0, n1 |n2,n3,"),
      (std::map<std::string, int>{{"n0", 0}, {"n1", 0}, {"n2", 1}, {"n3", 1}}));
  EXPECT_TRUE(ParsePartition("").empty());
}

TEST(PartitionTest, SeparatesGroupsUntilTheFileHeals) {
  const std::string file =
      testing::TempDir() + "/partition_test_" +
      testing::UnitTest::GetInstance()->current_test_info()->name();
  std::ofstream(file) << "n0,n1|n2\nignored|lines\n";
  Partition p(file);
  EXPECT_FALSE(p.active());
  p.Reload();
  EXPECT_TRUE(p.active());
  EXPECT_TRUE(p.Separates("n0", "n2"));
  EXPECT_FALSE(p.Separates("n0", "n1"));
  EXPECT_FALSE(p.Separates("n0", "lines")) << "only the first line counts";
  EXPECT_FALSE(p.Separates("n0", "n9")) << "an id in no group";
  std::ofstream(file) << "\n";
  p.Reload();
  EXPECT_FALSE(p.active());
  EXPECT_FALSE(p.Separates("n0", "n2"));
  std::remove(file.c_str());
}

}  // namespace
}  // namespace starling
