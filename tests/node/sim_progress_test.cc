// Unit tests of `starling sim`'s live progress line (node/sim_progress.h):
// the figures from the nodes' events and the line's text, with time
// injected and no processes.
#include "node/sim_progress.h"

#include <cmath>
#include <string>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "node/sim_events.h"

namespace starling {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

google::protobuf::Struct Event(const std::string& json) {
  absl::StatusOr<google::protobuf::Struct> s = ParseJsonObject(json, "event");
  EXPECT_TRUE(s.ok()) << json;
  return s.value_or(google::protobuf::Struct());
}

// A "round" event as a node logs it.
google::protobuf::Struct Round(int round, int step, double loss, double bytes,
                               const std::string& members) {
  return Event(absl::StrFormat(
      R"({"event":"round","round":%d,"step":%d,"train_loss":%.17g,)"
      R"("bytes":%.17g,"members":%s})",
      round, step, loss, bytes, members));
}

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

// A progress view of `nodes` nodes; no files are read (Observe only).
SimProgress Progress(int nodes, bool show_members = false,
                     bool gossip = false) {
  std::vector<std::string> ids;
  for (int i = 0; i < nodes; ++i) ids.push_back("n" + std::to_string(i));
  SimProgress p("/nonexistent", ids, 800, show_members, gossip);
  for (int i = 0; i < nodes; ++i) p.SetCounted(i, true);
  return p;
}

TEST(SimProgressTest, EtaIsUnknownBeforeTheFirstStepThenAtTheSamePace) {
  EXPECT_TRUE(std::isnan(EtaSeconds(3, 0, 800)));
  EXPECT_DOUBLE_EQ(EtaSeconds(15, 300, 800), 25);
  EXPECT_DOUBLE_EQ(EtaSeconds(40, 800, 800), 0);
}

TEST(SimProgressTest, TheLineBeforeAnyStepShowsDashes) {
  ProgressFigures f;
  f.total_steps = 800;
  f.eta = EtaSeconds(0, 0, 800);
  EXPECT_EQ(FormatProgressLine(f),
            "sim | round 0 | step 0/800 | loss - | val - | sent 0 B | 0s | "
            "eta ?");
}

TEST(SimProgressTest, RoundsFromEveryNodeMakeTheLine) {
  SimProgress p = Progress(2);
  p.Observe(0, Round(5, 300, 2.2, 9950000, R"(["n0","n1"])"), kT0);
  p.Observe(1, Round(5, 300, 2.2314, 9950000, R"(["n0","n1"])"), kT0);
  p.Observe(0, Event(R"({"event":"eval","step":300,"val_loss":2.3783})"), kT0);
  EXPECT_EQ(p.Line(15, kT0),
            "sim | round 6 | step 300/800 | loss 2.2157 | val 2.3783 | sent "
            "19.9 MB | 15s | eta 25s");
}

// A classifier's evaluations carry val_accuracy: the line shows it after
// the validation loss (DiLoCo: the latest; gossip: the nodes' mean).
TEST(SimProgressTest, AClassifiersAccuracyFollowsItsLoss) {
  SimProgress p = Progress(2);
  p.Observe(0, Round(2, 100, 0.5, 1000, R"(["n0","n1"])"), kT0);
  p.Observe(1, Round(2, 100, 0.5, 1000, R"(["n0","n1"])"), kT0);
  EXPECT_THAT(p.Line(5, kT0), Not(HasSubstr("acc")));
  p.Observe(0,
            Event(R"({"event":"eval","step":100,"val_loss":0.41,)"
                  R"("val_accuracy":0.8512})"),
            kT0);
  EXPECT_THAT(p.Line(5, kT0), HasSubstr("| val 0.4100 | acc 85.12% | sent"));
  SimProgress g = Progress(2, false, /*gossip=*/true);
  g.Observe(0,
            Event(R"({"event":"eval","step":10,"val_loss":1,)"
                  R"("val_accuracy":0.5})"),
            kT0);
  g.Observe(1,
            Event(R"({"event":"eval","step":10,"val_loss":1,)"
                  R"("val_accuracy":0.7})"),
            kT0);
  EXPECT_THAT(g.Line(5, kT0), HasSubstr("| acc 60.00% |"));
}

TEST(SimProgressTest, TheSlowestCountedNodeSetsTheStep) {
  SimProgress p = Progress(3, /*show_members=*/true);
  p.Observe(0, Round(3, 200, 1, 0, R"(["n0","n1","n2"])"), kT0);
  p.Observe(1, Round(2, 150, 3, 0, R"(["n0","n1"])"), kT0);
  ProgressFigures f = p.Figures(10, kT0);
  EXPECT_EQ(f.count, 4);
  EXPECT_EQ(f.members, 3);  // of the latest round
  EXPECT_EQ(f.step, 0);     // n2 has logged nothing yet
  p.SetCounted(2, false);   // stopped by the sim
  f = p.Figures(10, kT0);
  EXPECT_EQ(f.step, 150);
  EXPECT_DOUBLE_EQ(f.loss, 2);
  EXPECT_THAT(FormatProgressLine(f), HasSubstr("| members 3 |"));
}

TEST(SimProgressTest, AnExchangeOpenForFiveSecondsIsNamed) {
  SimProgress p = Progress(2);
  p.Observe(1, Event(R"({"event":"sync","sync_round":3})"), kT0);
  EXPECT_THAT(p.Line(20, kT0 + absl::Seconds(4)), Not(HasSubstr("exchanging")));
  EXPECT_THAT(p.Line(20, kT0 + absl::Seconds(6)),
              HasSubstr("| eta ? | exchanging round 4 for 6s"));
  // A retry of the same round keeps its start; the round's end closes it.
  p.Observe(1, Event(R"({"event":"sync","sync_round":3})"),
            kT0 + absl::Seconds(5));
  EXPECT_THAT(p.Line(20, kT0 + absl::Seconds(9)),
              HasSubstr("exchanging round 4 for 9s"));
  p.Observe(1, Event(R"({"event":"round","round":3,"step":200})"),
            kT0 + absl::Seconds(9));
  EXPECT_THAT(p.Line(20, kT0 + absl::Seconds(10)),
              Not(HasSubstr("exchanging")));
}

TEST(SimProgressTest, GossipCountsPushesAndAveragesTheNodesValidation) {
  SimProgress p = Progress(2, false, /*gossip=*/true);
  EXPECT_FALSE(p.formed());
  p.Observe(0, Event(R"({"event":"start"})"), kT0);
  EXPECT_TRUE(p.formed());
  p.Observe(0,
            Event(R"({"event":"exchange","kind":"push","step":40,)"
                  R"("bytes":1000,"train_loss":2})"),
            kT0);
  p.Observe(1, Event(R"({"event":"exchange","kind":"absorb","step":30})"), kT0);
  EXPECT_TRUE(p.HasRound(1));
  p.Observe(0, Event(R"({"event":"eval","val_loss":2.0})"), kT0);
  p.Observe(1, Event(R"({"event":"eval","val_loss":3.0})"), kT0);
  EXPECT_EQ(p.Line(10, kT0),
            "sim | pushes 1 | step 30/800 | loss 1.0000 | val 2.5000 | sent "
            "1.0 KB | 10s | eta 4m17s");
}

}  // namespace
}  // namespace starling
