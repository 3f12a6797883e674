// Integration tests of `starling bench allreduce`: it runs real worker
// processes (Gloo and Starling's ring over gRPC on loopback) and writes its
// JSON and markdown reports. Behaviour only; timings are never asserted.
#include <string>

#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"

namespace starling {
namespace {

using ::starling::testing::ExpectRefused;
using ::starling::testing::Field;
using ::starling::testing::ReadJson;
using ::starling::testing::RunStarling;
using ::starling::testing::TempDir;

TEST(BenchTest, AllreduceWritesJsonAndMarkdown) {
  const std::string dir = TempDir() + "/ar";
  auto r = RunStarling("bench allreduce --out=" + dir +
                       " --nodes=2 --sizes_mib=1,4K --iterations=1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("bench allreduce: 1 MiB 1/1"), std::string::npos)
      << r.err;

  auto json = ReadJson(dir + "/allreduce.json");
  EXPECT_EQ(Field(json, "benchmark").string_value(), "allreduce");
  EXPECT_EQ(Field(json, "nodes").number_value(), 2);
  EXPECT_EQ(Field(json, "iterations").number_value(), 1);
  // How loaded the VM was (Linux always has /proc/stat): a fraction.
  const double steal = Field(json, "host_steal_fraction").number_value();
  EXPECT_GE(steal, 0);
  EXPECT_LE(steal, 1);
  const auto& sizes = Field(json, "sizes").list_value();
  ASSERT_EQ(sizes.values_size(), 2);
  const auto& size = sizes.values(0).struct_value();
  EXPECT_EQ(Field(size, "size_mib").number_value(), 1);
  EXPECT_EQ(Field(size, "payload_bytes").number_value(), 1 << 20);
  EXPECT_GT(Field(size, "gloo_seconds").number_value(), 0);
  // The ring's 2(N-1)/N of the payload: one segment of two, twice.
  EXPECT_EQ(Field(size, "gloo_bytes_sent_per_rank").number_value(), 1 << 20);
  EXPECT_GT(Field(size, "gloo_algbw_GBps").number_value(), 0);
  // Every all-reduce costs its processes some CPU.
  EXPECT_GT(Field(size, "gloo_cpu_seconds_per_rank").number_value(), 0);
  const auto& starling = Field(size, "starling").list_value();
  ASSERT_EQ(starling.values_size(), 2);  // the default: fp32,int8
  for (int i = 0; i < 2; ++i) {
    const auto& s = starling.values(i).struct_value();
    EXPECT_EQ(Field(s, "compression").string_value(), i == 0 ? "fp32" : "int8");
    EXPECT_GT(Field(s, "seconds").number_value(), 0);
    EXPECT_GT(Field(s, "ratio_to_gloo").number_value(), 0);
    EXPECT_GT(Field(s, "algbw_GBps").number_value(), 0);
    EXPECT_GT(Field(s, "cpu_seconds_per_rank").number_value(), 0);
    // fp32 sends the payload plus framing; int8 about a quarter of it.
    const double sent = Field(s, "bytes_sent_per_rank").number_value();
    const double payload =
        Field(s, "payload_bytes_sent_per_rank").number_value();
    EXPECT_GE(sent, payload);
    if (i == 0) {
      EXPECT_EQ(payload, 1 << 20);
    } else {
      EXPECT_LT(payload, (1 << 20) / 3);
    }
  }

  // A K suffix gives KiB: 4 KiB is 1024 values, 512 of them sent twice.
  const auto& small = sizes.values(1).struct_value();
  EXPECT_EQ(Field(small, "size_mib").number_value(), 4.0 / 1024);
  EXPECT_EQ(Field(small, "payload_bytes").number_value(), 4096);
  EXPECT_EQ(Field(small, "gloo_bytes_sent_per_rank").number_value(), 4096);
  const auto& small_fp32 =
      Field(small, "starling").list_value().values(0).struct_value();
  EXPECT_EQ(Field(small_fp32, "payload_bytes_sent_per_rank").number_value(),
            4096);

  absl::StatusOr<std::string> md = ReadFile(dir + "/allreduce.md");
  ASSERT_TRUE(md.ok()) << md.status();
  for (const char* row :
       {"| 1 MiB | Gloo |", "| 1 MiB | Starling fp32 |",
        "| 1 MiB | Starling int8 |", "| 4 KiB | Gloo |",
        "| 4 KiB | Starling fp32 |", "ratio to Gloo", "CPU s per rank",
        "% of this VM's CPU time to others"}) {
    EXPECT_NE(md->find(row), std::string::npos) << row << "\n" << *md;
  }
  EXPECT_EQ(r.out, *md);  // the table is printed too
}

TEST(BenchTest, BadFlagsExitTwoNamingTheFlag) {
  struct Case {
    std::string args;
    std::string mention;
  };
  const std::vector<Case> cases = {
      {"bench", "starling bench allreduce"},
      {"bench reduce", "got 'reduce'"},
      {"bench allreduce --nodes=1", "--nodes=1"},
      {"bench allreduce --sizes_mib=4,x", "--sizes_mib=4,x"},
      {"bench allreduce --sizes_mib=0K", "--sizes_mib=0K"},
      {"bench allreduce --sizes_mib=4097", "--sizes_mib=4097"},
      {"bench allreduce --iterations=0", "--iterations=0"},
      {"bench allreduce --compression=fp32,int9", "int9"},
      {"bench allreduce --compression=int8,int8", "'int8' twice"},
      {"bench allreduce --chunk_bytes=10", "--chunk_bytes=10"},
      {"bench allreduce --steps=3", "--steps"},
  };
  for (const Case& c : cases) ExpectRefused(c.args, c.mention);
}

}  // namespace
}  // namespace starling
