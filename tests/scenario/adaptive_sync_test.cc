// Scenario test (label `scenario`) of adaptive sync on real data: a
// stationary swarm run with the drift detector on raises almost no false
// alarms. The drift, heterogeneity and gossip comparisons are longer and
// live in bench/adaptive_sync.py (numbers in docs/results/).
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"

namespace starling {
namespace {

using ::starling::testing::Field;
using ::starling::testing::ReadEvents;
using ::starling::testing::RunToSummary;

// 4 nodes × 10k inner steps of the Fashion-MNIST mlp, no drift, fixed seed,
// adaptive H with the Page-Hinkley detector: at most one false alarm per
// 10k steps per node, and the swarm lengthens H to its maximum.
TEST(AdaptiveSyncScenario, StationaryRunRaisesAtMostOneFalseAlarmPerNode) {
  const std::string out = testing::TempDir() + "/stationary";
  auto summary = RunToSummary(
      "sim --nodes=4 --data=fmnist --model=mlp --steps=10000 "
      "--inner_steps=50 --min_inner_steps=10 --max_inner_steps=200 "
      "--eval_every=5000 --checkpoint_every=0 --seed=1",
      out);
  EXPECT_TRUE(Field(Field(summary, "final").struct_value(), "all_hashes_agree")
                  .bool_value());
  int alarms = 0;
  for (int k = 0; k < 4; ++k) {
    alarms +=
        static_cast<int>(ReadEvents(absl::StrCat(out, "/n", k, "/events.jsonl"),
                                    "drift_detected")
                             .size());
  }
  RecordProperty("false_alarms", alarms);
  EXPECT_LE(alarms, 4) << "false alarms over 4 nodes x 10k steps";
  int longest = 0;
  for (absl::string_view line :
       absl::StrSplit(ReadFile(out + "/n0/events.jsonl").value_or(""), '\n',
                      absl::SkipEmpty())) {
    if (absl::StrContains(line, "\"inner_steps\":200")) longest = 200;
  }
  EXPECT_EQ(longest, 200) << "quiet rounds should lengthen H to the maximum";
}

}  // namespace
}  // namespace starling
