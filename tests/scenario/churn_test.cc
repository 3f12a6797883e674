// Scenario test (label `scenario`): elastic DiLoCo under churn. Six nodes
// train the default model on KJV for a few minutes while a random node is
// killed (kill -9) or restarted every 8-12 s; the final validation loss
// must be within 5% of a run without churn at equal total samples. Six to
// ten minutes on 2 cores.
#include <algorithm>
#include <iostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"

namespace starling {
namespace {

using ::starling::testing::Field;
using ::starling::testing::ReadEvents;
using ::starling::testing::RunToSummary;

struct SimRun {
  double val_loss = 0;
  double samples = 0;
  int64_t rounds = 0;
  bool agree = false;
  int restarts = 0, kills = 0;
  // Restarted nodes that committed no round in their last life: they came
  // back to a swarm that had finished.
  std::vector<std::string> back_too_late;
};

// Whether node `id` of the sim in `out` committed a round after it last
// started (a "start" or "resume" event).
bool TrainedInItsLastLife(const std::string& out, const std::string& id) {
  bool trained = false;
  for (const auto& ev :
       ReadEvents(absl::StrCat(out, "/", id, "/events.jsonl"))) {
    const std::string kind = Field(ev, "event").string_value();
    if (kind == "start" || kind == "resume") trained = false;
    if (kind == "round") trained = true;
  }
  return trained;
}

SimRun Sim(const std::string& flags, const std::string& out) {
  auto summary = RunToSummary("sim " + flags, out);
  auto fin = Field(summary, "final").struct_value();
  SimRun run;
  run.val_loss = Field(fin, "val_loss").number_value();
  run.agree = Field(fin, "all_hashes_agree").bool_value();
  run.rounds = static_cast<int64_t>(Field(fin, "rounds").number_value());
  // Samples that reached θ_global: each round's members times H steps of
  // --batch examples (work lost to a crash or a missed round is not
  // counted, which favours neither run).
  for (const auto& r : Field(summary, "rounds").list_value().values()) {
    run.samples +=
        Field(r.struct_value(), "members").list_value().values_size() * 50.0 *
        16.0;
  }
  auto faults = summary.fields().find("faults");
  if (faults != summary.fields().end()) {
    std::set<std::string> restarted;
    for (const auto& f : faults->second.list_value().values()) {
      const auto& fs = f.struct_value();
      if (fs.fields().count("skipped")) continue;
      const std::string kind = Field(fs, "kind").string_value();
      run.kills += kind == "kill";
      run.restarts += kind == "restart";
      if (kind == "restart") restarted.insert(Field(fs, "node").string_value());
    }
    for (const std::string& id : restarted) {
      if (!TrainedInItsLastLife(out, id)) run.back_too_late.push_back(id);
    }
  }
  return run;
}

TEST(ChurnScenario, TrainingKeepsProgressingUnderChurn) {
  const std::string dir = testing::TempDir();
  const int nodes = 6, steps = 4000, batch = 16;
  // A random kill or restart every 8-12 s (fixed seed): kill a running
  // node, or restart a dead one; every dead node is back well before the
  // end. (With 15-30 s the last restart came at 197 s, and a faster run
  // once ended at 194 s: two nodes came back to a swarm that had finished
  // and left, resumed from their checkpoints and trained on as a pair.
  // With 10-20 s and 3000 steps the last came at 137 s, and on a quiet VM
  // on 2026-12-06 the run ended at 127 s: the restarted node found nobody
  // to join and the sim failed.)
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> gap(8, 12);
  std::vector<std::string> kills, restarts;
  std::vector<int> dead;
  double t = 10;
  // Events stop at about 100 s; the run takes three to five minutes (2m50s
  // on the quiet VM above).
  for (int k = 0; k < 8; ++k) {
    t += gap(rng);
    bool restart = !dead.empty() && (dead.size() >= 2 || rng() % 2 == 0);
    if (restart) {
      int victim = dead.front();
      dead.erase(dead.begin());
      restarts.push_back(
          absl::StrCat("n", victim, "@", static_cast<int>(t), "s"));
    } else {
      int victim = 1 + static_cast<int>(rng() % (nodes - 1));
      while (std::find(dead.begin(), dead.end(), victim) != dead.end()) {
        victim = 1 + victim % (nodes - 1);
      }
      dead.push_back(victim);
      kills.push_back(absl::StrCat("n", victim, "@", static_cast<int>(t), "s"));
    }
  }
  for (int victim : dead) {
    t += 3;
    restarts.push_back(
        absl::StrCat("n", victim, "@", static_cast<int>(t), "s"));
  }
  const std::string common =
      absl::StrCat("--nodes=", nodes, " --seed=0 --suspect_timeout=2");
  SimRun churn = Sim(absl::StrCat(common, " --steps=", steps,
                                  " --kill=", absl::StrJoin(kills, ","),
                                  " --restart=", absl::StrJoin(restarts, ",")),
                     dir + "/churn");
  // The premise: the churn is over while the swarm still trains, so every
  // restarted node trained with it again.
  EXPECT_TRUE(churn.back_too_late.empty())
      << "the churn outlasted the run: restarted, "
      << absl::StrJoin(churn.back_too_late, ", ")
      << " committed no round before the end";
  EXPECT_TRUE(churn.agree);
  EXPECT_GE(churn.kills, 3);
  EXPECT_GE(churn.restarts, 3);
  ASSERT_GT(churn.samples, 0);
  // The same swarm without churn, for the same total samples.
  const int equal_steps =
      static_cast<int>(churn.samples / (nodes * batch) / 50) * 50;
  SimRun clean =
      Sim(absl::StrCat(common, " --steps=", equal_steps), dir + "/clean");
  EXPECT_TRUE(clean.agree);
  RecordProperty("churn_val_loss", absl::StrCat(churn.val_loss));
  RecordProperty("churn_samples", absl::StrCat(churn.samples));
  RecordProperty("clean_val_loss", absl::StrCat(clean.val_loss));
  RecordProperty("clean_steps", absl::StrCat(equal_steps));
  std::cout << "churn: val_loss " << churn.val_loss << ", samples "
            << churn.samples << ", " << churn.kills << " kills, "
            << churn.restarts << " restarts, " << churn.rounds
            << " rounds\nclean: val_loss " << clean.val_loss << ", "
            << equal_steps << " steps per node\n";
  EXPECT_LE(churn.val_loss, clean.val_loss * 1.05);
}

}  // namespace
}  // namespace starling
