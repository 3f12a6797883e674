// Unit tests of the merge of a `starling sim`'s node outputs
// (node/sim_merge.h): records parsed from summary and event text, merged
// into the run's summary and report data without processes or files.
#include "node/sim_merge.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "node/sim_events.h"

namespace starling {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;
using ::testing::ElementsAre;
using ::testing::Pair;

const absl::Time kStart = absl::FromUnixSeconds(1700000000);

// RFC 3339 of kStart + `seconds`.
std::string At(double seconds) {
  return absl::FormatTime(absl::RFC3339_full, kStart + absl::Seconds(seconds),
                          absl::UTCTimeZone());
}

Struct Json(const std::string& text) {
  absl::StatusOr<Struct> s = ParseJsonObject(text, "test json");
  EXPECT_TRUE(s.ok()) << text;
  return s.value_or(Struct());
}

std::string RoundEvent(int round, const std::string& hash, double loss,
                       double bytes, double t,
                       const std::string& members = R"(["n0","n1"])") {
  return absl::StrFormat(
      R"({"event":"round","round":%d,"step":%d,"members":%s,)"
      R"("model_hash":"%s","train_loss":%g,"val_loss":null,"bytes":%g,)"
      R"("seconds":1.5,"time":"%s","wall_seconds":%g})"
      "\n",
      round, 50 * (round + 1), members, hash, loss, bytes, At(t), t);
}

// A finished node's summary.json.
std::string Summary(const std::string& id, const std::string& hash,
                    double val_loss, double bytes_sent,
                    bool interrupted = false) {
  return absl::StrFormat(
      R"({"model":{"architecture":"gpt-tiny"},"nodes":[{"id":"%s",)"
      R"("bytes_sent":%g,"bytes_received":900,"compression":"int8",)"
      R"("bytes_before_compression":800,"bytes_after_compression":200,)"
      R"("compute_seconds":8,"wall_seconds":10,"inner_steps":100}],)"
      R"("final":{"inner_steps":100,"val_loss":%g,"model_hash":"%s",)"
      R"("allreduce_equivalent_bytes":50000,"interrupted":%s}})",
      id, bytes_sent, val_loss, hash, interrupted ? "true" : "false");
}

NodeRecord Record(const std::string& id, const std::string& summary,
                  const std::string& events) {
  if (summary.empty()) return NodeRecordFrom(id, nullptr, events);
  const Struct s = Json(summary);
  return NodeRecordFrom(id, &s, events);
}

MergeInput Input(std::vector<std::string> ids) {
  MergeInput in;
  in.dir = "/runs/sim";
  in.ids = std::move(ids);
  in.initial_nodes = 2;
  in.algo = "diloco";
  in.start = kStart;
  in.wall = 12;
  return in;
}

TrainConfig Config() {
  TrainConfig c;
  c.set_model("gpt");
  return c;
}

// The merged summary.json, parsed back.
Struct Merge(const MergeInput& in, const std::vector<NodeRecord>& recs,
             ReportData* report = nullptr) {
  MergedRun run = MergeRun(in, recs, Config(), JsonObject().Add("nodes", 2),
                           /*consensus=*/{});
  if (report != nullptr) *report = run.report;
  return Json(run.summary.Dump());
}

const Struct& Final(const Struct& summary) {
  return FieldOf(summary, "final").struct_value();
}
const Struct& Row(const Struct& summary, const std::string& list, int i) {
  return FieldOf(summary, list).list_value().values(i).struct_value();
}
double Num(const Struct& s, const std::string& key) {
  return FieldOf(s, key).number_value();
}
std::string Str(const Struct& s, const std::string& key) {
  return FieldOf(s, key).string_value();
}
std::string Fact(const ReportData& r, const std::string& label) {
  for (const auto& [k, v] : r.facts) {
    if (k == label) return v;
  }
  return "(missing)";
}

TEST(SimMergeTest, AgreeingNodesMergeRoundByRound) {
  std::vector<NodeRecord> recs = {
      Record("n0", Summary("n0", "f", 2.5, 1000),
             RoundEvent(0, "a", 3.0, 400, 5) + RoundEvent(1, "b", 2.0, 600, 9)),
      Record("n1", Summary("n1", "f", 2.5, 1000),
             RoundEvent(0, "a", 3.4, 400, 6) + RoundEvent(1, "b", 2.2, 600, 8)),
  };
  ReportData report;
  const Struct s = Merge(Input({"n0", "n1"}), recs, &report);
  EXPECT_EQ(Str(s, "command"), "sim");
  EXPECT_EQ(Str(FieldOf(s, "model").struct_value(), "architecture"),
            "gpt-tiny");
  EXPECT_EQ(FieldOf(s, "rounds").list_value().values_size(), 2);
  const Struct& r0 = Row(s, "rounds", 0);
  EXPECT_EQ(Str(r0, "model_hash"), "a");
  EXPECT_TRUE(FieldOf(r0, "hashes_agree").bool_value());
  EXPECT_DOUBLE_EQ(Num(r0, "train_loss"), 3.2);
  EXPECT_DOUBLE_EQ(Num(r0, "bytes"), 800);
  EXPECT_DOUBLE_EQ(Num(r0, "wall_seconds"), 6);  // the last to log it
  EXPECT_EQ(FieldOf(r0, "reported_by").list_value().values_size(), 2);
  EXPECT_EQ(Str(Row(s, "nodes", 1), "status"), "finished");

  const Struct& fin = Final(s);
  EXPECT_DOUBLE_EQ(Num(fin, "val_loss"), 2.5);
  EXPECT_DOUBLE_EQ(Num(fin, "total_bytes"), 2000);
  EXPECT_DOUBLE_EQ(Num(fin, "allreduce_equivalent_bytes"), 100000);
  EXPECT_DOUBLE_EQ(Num(fin, "comm_reduction"), 50);
  EXPECT_EQ(Str(fin, "compression"), "int8");
  EXPECT_DOUBLE_EQ(Num(fin, "utilization"), 0.8);
  EXPECT_EQ(Str(fin, "model_hash"), "f");
  EXPECT_TRUE(FieldOf(fin, "all_hashes_agree").bool_value());
  EXPECT_TRUE(FieldOf(fin, "final_models_agree").bool_value());
  EXPECT_EQ(FieldOf(fin, "split_rounds").list_value().values_size(), 0);
  EXPECT_DOUBLE_EQ(Num(fin, "rounds"), 2);
  EXPECT_DOUBLE_EQ(Num(fin, "wall_seconds"), 12);

  EXPECT_EQ(report.title, "Starling sim: 2 nodes, diloco");
  EXPECT_EQ(Fact(report, "model"), "gpt-tiny");
  EXPECT_EQ(Fact(report, "final validation loss"), "2.5000");
  EXPECT_EQ(Fact(report, "model hashes agree every round"), "yes");
  EXPECT_EQ(Fact(report, "pseudo-gradient compression"),
            "int8: 1.6 KB before, 400 B after (4.0x)");
  ASSERT_EQ(report.rounds.size(), 2u);
  EXPECT_DOUBLE_EQ(report.rounds[1].cumulative_bytes, 2000);
  EXPECT_EQ(report.rounds[1].members, 2);
}

TEST(SimMergeTest, ASplitRoundTakesTheMajorityHashAndItsMembers) {
  std::vector<NodeRecord> recs = {
      Record("n0", Summary("n0", "f", 2.5, 10),
             RoundEvent(0, "a", 1, 1, 1, R"(["n0"])")),
      Record("n1", Summary("n1", "f", 2.5, 10),
             RoundEvent(0, "b", 1, 1, 1, R"(["n1","n2"])")),
      Record("n2", Summary("n2", "f", 2.5, 10),
             RoundEvent(0, "b", 1, 1, 1, R"(["n1","n2"])")),
  };
  ReportData report;
  const Struct s = Merge(Input({"n0", "n1", "n2"}), recs, &report);
  const Struct& r0 = Row(s, "rounds", 0);
  EXPECT_EQ(Str(r0, "model_hash"), "b");
  EXPECT_FALSE(FieldOf(r0, "hashes_agree").bool_value());
  EXPECT_EQ(FieldOf(r0, "members").list_value().values_size(), 2);
  const Struct& fin = Final(s);
  EXPECT_FALSE(FieldOf(fin, "all_hashes_agree").bool_value());
  EXPECT_TRUE(FieldOf(fin, "final_models_agree").bool_value());
  EXPECT_DOUBLE_EQ(
      FieldOf(fin, "split_rounds").list_value().values(0).number_value(), 0);
  EXPECT_EQ(ToJson(FieldOf(fin, "members_at_end")), R"(["n1","n2"])");
  EXPECT_EQ(Fact(report, "model hashes agree every round"),
            "NO in round 0; the final models agree");
  EXPECT_EQ(report.title, "Starling sim: 2 nodes (+1 joining), diloco");
}

TEST(SimMergeTest, NodesEndAsKilledLeftOrInterrupted) {
  MergeInput in = Input({"n0", "n1", "n2", "n3"});
  in.faults.killed = {"n2"};
  in.faults.left = {"n1"};
  std::vector<NodeRecord> recs = {
      Record("n0", Summary("n0", "f", 2.5, 100), RoundEvent(0, "a", 1, 70, 1)),
      Record("n1", Summary("n1", "f", 2.5, 100, /*interrupted=*/true), ""),
      Record("n2", Summary("n2", "e", 2.9, 100, true), ""),
      // No summary: killed before it wrote one; its rounds' bytes count.
      Record("n3", "", RoundEvent(0, "a", 1, 70, 1)),
  };
  const Struct s = Merge(in, recs);
  EXPECT_EQ(Str(Row(s, "nodes", 0), "status"), "finished");
  EXPECT_EQ(Str(Row(s, "nodes", 1), "status"), "left");
  EXPECT_EQ(Str(Row(s, "nodes", 2), "status"), "killed");
  EXPECT_EQ(Str(Row(s, "nodes", 3), "status"), "killed");
  EXPECT_EQ(Str(Row(s, "nodes", 3), "id"), "n3");
  EXPECT_DOUBLE_EQ(Num(Final(s), "total_bytes"), 370);
  // Every summary is at 100 steps: the final models differ.
  EXPECT_EQ(ToJson(FieldOf(Final(s), "final_models_agree")), "false");
}

// A node whose summary says its model is not the swarm's (it stopped apart
// with exit code 3, or trained on alone) is flagged; one that left on a
// signal is not, whatever its summary says.
TEST(SimMergeTest, ANodeThatEndedApartIsFlagged) {
  auto with = [](std::string summary, const std::string& fields) {
    summary.insert(summary.rfind("}}"), absl::StrCat(",", fields));
    return summary;
  };
  MergeInput in = Input({"n0", "n1", "n2"});
  in.faults.left = {"n2"};
  std::vector<NodeRecord> recs = {
      Record("n0",
             with(Summary("n0", "f", 2.5, 10), R"("model_is_swarms":true)"),
             ""),
      Record("n1",
             with(Summary("n1", "g", 2.9, 10), R"("model_is_swarms":false)"),
             ""),
      Record("n2",
             with(Summary("n2", "e", 2.9, 10, /*interrupted=*/true),
                  R"("model_is_swarms":false)"),
             ""),
  };
  const Struct s = Merge(in, recs);
  EXPECT_EQ(Str(Row(s, "nodes", 0), "status"), "finished");
  EXPECT_EQ(Str(Row(s, "nodes", 1), "status"), "apart");
  EXPECT_EQ(Str(Row(s, "nodes", 2), "status"), "left");
  EXPECT_EQ(ToJson(FieldOf(Final(s), "nodes_apart")), R"(["n1"])");
  EXPECT_THAT(DoneLine(s, "diloco", 40, "/runs/a"),
              ::testing::HasSubstr(
                  " | ENDED APART from the swarm: n1 (not the swarm's model) "
                  "| 40s"));
}

TEST(SimMergeTest, TheSummaryFillsRoundsTheEventsLost) {
  const std::string summary =
      absl::StrCat(Summary("n0", "f", 2.5, 10)
                       .substr(0, Summary("n0", "f", 2.5, 10).size() - 1),
                   R"(,"rounds":[{"round":0,"model_hash":"a","bytes":5},)"
                   R"({"round":1,"model_hash":"zzz","bytes":5}]})");
  NodeRecord n =
      Record("n0", summary,
             RoundEvent(1, "b", 1, 7, 3) + RoundEvent(1, "c", 1, 9, 4) +
                 "{\"event\":\"round\",\"trunc");
  ASSERT_EQ(n.rounds.size(), 2u);
  EXPECT_EQ(n.rounds.at(0).hash, "a");  // from the summary
  EXPECT_EQ(n.rounds.at(1).hash, "c");  // the last event wins
  EXPECT_DOUBLE_EQ(n.rounds.at(1).wall_seconds, 4);
  EXPECT_DOUBLE_EQ(n.steps(), 100);
}

TEST(SimMergeTest, GossipsFinalLossIsTheMeanOfTheNodes) {
  MergeInput in = Input({"n0", "n1"});
  in.algo = "gossip";
  std::vector<NodeRecord> recs = {
      Record("n0", Summary("n0", "f", 2.0, 10), ""),
      Record("n1", Summary("n1", "g", 3.0, 10), ""),
  };
  ReportData report;
  MergedRun run =
      MergeRun(in, recs, Config(), JsonObject(), {{10, 0.5, 2}, {20, 0.25, 2}});
  const Struct s = Json(run.summary.Dump());
  EXPECT_DOUBLE_EQ(Num(Final(s), "val_loss"), 2.5);
  EXPECT_EQ(Str(Final(s), "val_loss_of"), "mean of nodes");
  EXPECT_EQ(FieldOf(s, "consensus").list_value().values_size(), 2);
  EXPECT_EQ(Fact(run.report, "model hashes agree every round"), "n/a (gossip)");
  EXPECT_EQ(Fact(run.report, "consensus distance at the end (gossip)"),
            "0.25 at step 20 over 2 nodes");
}

TEST(SimMergeTest, TimesCountFromTheEarliestEventOfAResumedRun) {
  MergeInput in = Input({"n0"});
  in.faults.marks.push_back({3, "kill", "n0", ""});
  std::vector<NodeRecord> recs = {
      Record("n0", Summary("n0", "f", 2.5, 10),
             RoundEvent(0, "a", 1, 1, -20) + RoundEvent(1, "b", 1, 1, 4) +
                 absl::StrFormat(R"({"event":"eval","step":100,"val_loss":2.7,)"
                                 R"("time":"%s","wall_seconds":1})"
                                 "\n",
                                 At(5)) +
                 absl::StrFormat(R"({"event":"drift","step":60,"time":"%s"})"
                                 "\n",
                                 At(2))),
  };
  ReportData report;
  const Struct s = Merge(in, recs, &report);
  EXPECT_DOUBLE_EQ(Num(Row(s, "rounds", 0), "wall_seconds"), 0);
  EXPECT_DOUBLE_EQ(Num(Row(s, "rounds", 1), "wall_seconds"), 24);
  EXPECT_THAT(report.val_vs_time, ElementsAre(Pair(25, 2.7)));
  ASSERT_EQ(report.faults.size(), 1u);
  EXPECT_DOUBLE_EQ(report.faults[0].wall_seconds, 23);
  EXPECT_DOUBLE_EQ(Num(Row(s, "drift", 0), "seconds"), 22);
  EXPECT_EQ(Fact(report, "data drift"), "drift n0 at 22.0s");
  EXPECT_EQ(Fact(report, "fault events"), "1 (table below)");
}

TEST(SimMergeTest, AgreementSaysWhereTheHashesSplit) {
  EXPECT_EQ(AgreementText({}, std::nullopt), "yes");
  EXPECT_EQ(AgreementText({}, true), "yes");
  EXPECT_EQ(AgreementText({}, false), "NO: the final models differ");
  EXPECT_EQ(AgreementText({4}, std::nullopt), "NO in round 4");
  EXPECT_EQ(AgreementText({3, 4, 5, 8}, true),
            "NO in rounds 3-5, 8; the final models agree");
  EXPECT_EQ(AgreementText({1, 3, 5, 7, 9, 10}, false),
            "NO in rounds 1, 3, 5, 7 and 2 more; the final models differ");
}

TEST(SimMergeTest, TheDoneLineReadsTheMergedSummary) {
  const Struct s =
      Json(R"({"final":{"val_loss":2.0721982268399972,"total_bytes":53100000,)"
           R"("allreduce_equivalent_bytes":2.6e9,"comm_reduction":49.63,)"
           R"("split_rounds":[],"final_models_agree":true}})");
  EXPECT_EQ(DoneLine(s, "diloco", 40, "/runs/a"),
            "done: val_loss 2.0721982268399972 | sent 53.1 MB (per-step "
            "all-reduce: 2.6 GB, 49.6x less) | hashes agree: yes | 40s\n"
            "  report: /runs/a/report.html");
  EXPECT_THAT(DoneLine(s, "gossip", 40, "/runs/a"),
              ::testing::HasSubstr(
                  "hashes agree: n/a (gossip: each node keeps its own model)"));
  const Struct classifier =
      Json(R"({"final":{"val_loss":0.35,"val_accuracy":0.8765,)"
           R"("total_bytes":1,"allreduce_equivalent_bytes":2,)"
           R"("comm_reduction":2,"split_rounds":[],)"
           R"("final_models_agree":true}})");
  EXPECT_THAT(DoneLine(classifier, "diloco", 40, "/runs/a"),
              ::testing::HasSubstr("done: val_loss 0.35 | val_acc 87.65% |"));
}

}  // namespace
}  // namespace starling
