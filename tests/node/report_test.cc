// Unit tests of a sim run's report.html and its data files (node/report.h),
// written into a temporary directory. The charts are drawn when gnuplot is
// installed; either way the page names each chart.
#include "node/report.h"

#include <cstdlib>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace starling {
namespace {

using ::starling::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

ReportData Data() {
  ReportData d;
  d.title = "Starling sim: 2 nodes, diloco";
  d.val_vs_time = {{10.5, 2.5}};
  d.rounds = {{0, 1e6, 3.25, 5, true, 2}, {1, 2.5e6, 2.75, 9.5, false, 1}};
  d.nodes = {{"n0", 2e6, 1e6, 0.75}, {"n1", 5e5, 0, 0}};
  d.facts = {{"rounds", "2"}, {"a <b> & c", "x<y"}};
  return d;
}

std::string Read(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  EXPECT_TRUE(text.ok()) << path;
  return text.value_or("");
}

TEST(ReportTest, ThePageHoldsTheFactsEveryChartAndTheData) {
  const std::string dir = TempDir();
  const absl::Status s = WriteReport(dir, Data());
  EXPECT_TRUE(s.ok() || absl::IsFailedPrecondition(s)) << s;
  const std::string html = Read(dir + "/report.html");
  EXPECT_THAT(html, HasSubstr("<title>Starling sim: 2 nodes, diloco</title>"));
  EXPECT_THAT(html, HasSubstr("<tr><th>rounds</th><td>2</td></tr>"));
  EXPECT_THAT(
      html, HasSubstr("<tr><th>a &lt;b&gt; &amp; c</th><td>x&lt;y</td></tr>"));
  for (const char* title :
       {"Validation loss vs wall time", "Loss vs bytes sent (all nodes)",
        "Bytes per node", "Model hash agreement per round", "Members per round",
        "Membership over time"}) {
    EXPECT_THAT(html, HasSubstr(std::string("<h2>") + title + "</h2>"));
  }
  EXPECT_THAT(html, Not(HasSubstr("Fault events")));
  EXPECT_THAT(html, Not(HasSubstr("faults.csv")));
  EXPECT_THAT(html, HasSubstr("<a href=\"summary.json\">summary.json</a>"));
  EXPECT_EQ(Read(dir + "/report/rounds.csv"),
            "round,cumulative_mb,train_loss,wall_seconds,hashes_agree,members\n"
            "0,1.000000,3.250000,5.000,1,2\n"
            "1,2.500000,2.750000,9.500,0,1\n");
  EXPECT_EQ(Read(dir + "/report/nodes.csv"),
            "node,sent_mb,received_mb,utilization\n"
            "n0,2.000000,1.000000,0.7500\n"
            "n1,0.500000,0.000000,0.0000\n");
  EXPECT_EQ(Read(dir + "/report/val_loss.csv"),
            "wall_seconds,val_loss\n10.500,2.500000\n");
  EXPECT_FALSE(FileExists(dir + "/report/faults.csv"));
}

// The page stands alone: every chart is inlined as a data: URI (the PNG
// gnuplot drew, in base64), none is linked from report/.
TEST(ReportTest, ChartsAreInlinedAsDataUris) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "gnuplot is not installed";
  }
  const std::string dir = TempDir();
  ASSERT_TRUE(WriteReport(dir, Data()).ok());
  const std::string html = Read(dir + "/report.html");
  EXPECT_THAT(html, Not(HasSubstr("<img src=\"report/")));
  const std::string png = Read(dir + "/report/membership.png");
  ASSERT_FALSE(png.empty());
  EXPECT_THAT(html, HasSubstr(absl::StrCat("<img src=\"data:image/png;base64,",
                                           absl::Base64Escape(png), "\"")));
  size_t charts = 0;
  for (size_t at = html.find("data:image/png;base64,"); at != std::string::npos;
       at = html.find("data:image/png;base64,", at + 1)) {
    ++charts;
  }
  EXPECT_EQ(charts, 6u);
}

// A classifier's accuracy gets its data file and its chart; the members
// charts end one above the most members, so that a constant membership is
// not drawn on the top border.
TEST(ReportTest, AccuracyChartAndMembersInsideTheFrame) {
  const std::string dir = TempDir();
  ReportData d = Data();
  (void)WriteReport(dir, d);
  EXPECT_THAT(Read(dir + "/report/charts.gp"), Not(HasSubstr("val_accuracy")));
  d.accuracy_vs_time = {{10.5, 0.8125}, {20, 0.875}};
  const std::string dir2 = TempDir();
  (void)WriteReport(dir2, d);
  EXPECT_EQ(Read(dir2 + "/report/val_accuracy.csv"),
            "wall_seconds,val_accuracy\n10.500,0.812500\n20.000,0.875000\n");
  EXPECT_THAT(Read(dir2 + "/report.html"),
              HasSubstr("<h2>Validation accuracy vs wall time</h2>"));
  const std::string gp = Read(dir2 + "/report/charts.gp");
  EXPECT_THAT(gp, HasSubstr("'val_accuracy.csv' using 1:($2*100)"));
  // Two members at most: the y axis runs to 3, on both members charts.
  EXPECT_THAT(gp, Not(HasSubstr("set yrange [0:*]; set offsets")));
  size_t axes = 0;
  for (size_t at = gp.find("set yrange [0:3];"); at != std::string::npos;
       at = gp.find("set yrange [0:3];", at + 1)) {
    ++axes;
  }
  EXPECT_EQ(axes, 2u) << gp;
}

TEST(ReportTest, FaultsGetATableAndMarksOnTheMembershipChart) {
  const std::string dir = TempDir();
  ReportData d = Data();
  d.faults = {{12, "kill", "n1", ""},
              {20, "partition_start", "n0|n1", ""},
              {30, "partition_end", "n0|n1", ""},
              {40, "restart", "n1", "still running"}};
  (void)WriteReport(dir, d);
  const std::string html = Read(dir + "/report.html");
  EXPECT_THAT(html, HasSubstr("<h2>Membership over time, with the injected "
                              "faults</h2>"));
  EXPECT_THAT(html, HasSubstr("<tr><td>12.0</td><td>kill</td><td>n1</td>"
                              "<td>carried out</td></tr>"));
  EXPECT_THAT(html, HasSubstr("<td>skipped: still running</td>"));
  EXPECT_THAT(html, HasSubstr("<a href=\"report/faults.csv\">faults.csv</a>"));
  EXPECT_THAT(Read(dir + "/report/faults.csv"),
              HasSubstr("40.000,restart,\"n1\",\"still running\"\n"));
  const std::string script = Read(dir + "/report/charts.gp");
  EXPECT_THAT(script, HasSubstr("set label 'kill n1' at first 12.000"));
  EXPECT_THAT(script, HasSubstr("set object rect from first 20.000, graph 0 "
                                "to first 30.000"));
  EXPECT_THAT(script, Not(HasSubstr("restart n1")));  // skipped: no mark
}

TEST(ReportTest, GossipWithoutRoundsDrawsOnlyWhatHasPoints) {
  const std::string dir = TempDir();
  ReportData d = Data();
  d.rounds.clear();
  d.consensus = {{10, 0.5, 3}, {20, 0.125, 3}};
  d.loss_marks = {{7, "drift n0", true}};
  (void)WriteReport(dir, d);
  const std::string html = Read(dir + "/report.html");
  EXPECT_THAT(html, HasSubstr("<h2>Validation loss vs wall time, with data "
                              "drift</h2>"));
  EXPECT_THAT(html, HasSubstr("<h2>Bytes per node</h2>"));
  EXPECT_THAT(html, HasSubstr("<h2>Consensus distance (gossip)</h2>"));
  EXPECT_THAT(html, Not(HasSubstr("Members per round")));
  EXPECT_EQ(Read(dir + "/report/consensus.csv"),
            "step,distance,nodes\n10,0.5,3\n20,0.125,3\n");
  EXPECT_EQ(Read(dir + "/report/drift.csv"),
            "wall_seconds,kind,label\n7.000,drift,\"drift n0\"\n");
}

}  // namespace
}  // namespace starling
