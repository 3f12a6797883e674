#include "node/sim_merge.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/file_util.h"
#include "core/logging.h"
#include "core/status.h"
#include "node/run_output.h"
#include "node/sim_events.h"

namespace starling {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

bool IsNumber(const Value& v) { return v.kind_case() == Value::kNumberValue; }

RoundSeen RoundFrom(const Struct& r) {
  RoundSeen s;
  s.members = FieldOf(r, "members");
  s.hash = FieldOf(r, "model_hash").string_value();
  s.train_loss = FieldOf(r, "train_loss").number_value();
  s.val_loss = FieldOf(r, "val_loss");
  s.bytes = FieldOf(r, "bytes").number_value();
  s.seconds = FieldOf(r, "seconds").number_value();
  s.residual_flush = FieldOf(r, "residual_flush").bool_value();
  return s;
}

// Seconds on the run's clock: from the sim's start, or from the first
// event a resumed run logged before it.
struct RunClock {
  double origin = 0;        // Unix seconds of the run's time 0
  double start_offset = 0;  // the sim's start on the run's clock

  // An event's time: from its Unix time, else from the node's own clock.
  double At(double unix_seconds, double node_wall) const {
    return std::isnan(unix_seconds) ? node_wall : unix_seconds - origin;
  }
};

RunClock ClockOf(absl::Time start, const std::vector<NodeRecord>& recs) {
  const double start_unix = absl::ToDoubleSeconds(start - absl::UnixEpoch());
  RunClock clock;
  clock.origin = start_unix;
  for (const NodeRecord& n : recs) {
    for (const auto& [round, r] : n.rounds) {
      if (!std::isnan(r.unix_seconds)) {
        clock.origin = std::min(clock.origin, r.unix_seconds);
      }
    }
  }
  clock.start_offset = start_unix - clock.origin;
  return clock;
}

// The nodes' entries and totals.
struct MergedNodes {
  JsonArray json;  // summary.json's "nodes"
  double total_bytes = 0, equivalent = 0, compute = 0, node_wall = 0;
  double before = 0, after = 0;  // payload bytes before/after compression
  double relay_forwarded = 0;    // bytes relays forwarded (--nat)
  std::string compression;       // the first node's codec
  const NodeRecord* first_summary = nullptr;
  const NodeRecord* evaluated = nullptr;  // highest step with a val_loss
  double max_steps = -1;
};

bool Listed(const std::vector<std::string>& ids, const std::string& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// A node that ended apart from its swarm (gossip/swarm_end.h): it ran to its
// end, not left on a signal, and its summary says its model is not the
// swarm's final one (it stopped with exit code 3, or trained on alone).
bool EndedApart(const NodeRecord& n) {
  const Struct& fin = n.final_figures();
  const Value& is_swarms = FieldOf(fin, "model_is_swarms");
  return n.has_summary && !FieldOf(fin, "interrupted").bool_value() &&
         is_swarms.kind_case() == Value::kBoolValue && !is_swarms.bool_value();
}

// A node with no summary was killed: only its rounds' bytes count.
void MergeKilledNode(const NodeRecord& n, MergedNodes* m, ReportData* report) {
  m->json.Push(JsonObject().Add("id", n.id).Add("status", "killed"));
  double sent = 0;
  for (const auto& [round, r] : n.rounds) sent += r.bytes;
  m->total_bytes += sent;
  report->nodes.push_back({n.id, sent, 0, 0});
}

void MergeNode(const MergeInput& in, const NodeRecord& n, MergedNodes* m,
               ReportData* report) {
  if (m->first_summary == nullptr) m->first_summary = &n;
  const Struct& node = n.node();
  Struct with_status = node;
  const bool interrupted =
      FieldOf(n.final_figures(), "interrupted").bool_value();
  // A killed node's summary is from an earlier life.
  (*with_status.mutable_fields())["status"].set_string_value(
      Listed(in.faults.killed, n.id) ? "killed"
      : EndedApart(n)                ? "apart"
      : !interrupted                 ? "finished"
      : Listed(in.faults.left, n.id) ? "left"
                                     : "interrupted");
  Value v;
  *v.mutable_struct_value() = with_status;
  m->json.PushRaw(ToJson(v));
  auto figure = [&](const char* key) {
    return FieldOf(node, key).number_value();
  };
  m->total_bytes += figure("bytes_sent");
  m->before += figure("bytes_before_compression");
  // A top-level field of the node's summary, beside its reachability.
  m->relay_forwarded +=
      FieldOf(n.summary, "relay_forwarded_bytes").number_value();
  m->after += figure("bytes_after_compression");
  if (m->compression.empty()) {
    m->compression = FieldOf(node, "compression").string_value();
  }
  m->compute += figure("compute_seconds");
  m->node_wall += figure("wall_seconds");
  m->equivalent +=
      FieldOf(n.final_figures(), "allreduce_equivalent_bytes").number_value();
  const double w = figure("wall_seconds");
  report->nodes.push_back({n.id, figure("bytes_sent"), figure("bytes_received"),
                           w > 0 ? figure("compute_seconds") / w : 0});
  m->max_steps = std::max(m->max_steps, n.steps());
  if (IsNumber(FieldOf(n.final_figures(), "val_loss")) &&
      (m->evaluated == nullptr || n.steps() > m->evaluated->steps())) {
    m->evaluated = &n;
  }
}

MergedNodes MergeNodes(const MergeInput& in,
                       const std::vector<NodeRecord>& recs,
                       ReportData* report) {
  MergedNodes m;
  for (const NodeRecord& n : recs) {
    if (n.has_summary) {
      MergeNode(in, n, &m, report);
    } else {
      MergeKilledNode(n, &m, report);
    }
  }
  return m;
}

// The rounds, by round number over every node that logged them.
struct MergedRounds {
  JsonArray json;  // summary.json's "rounds"
  bool all_agree = true;
  std::vector<int64_t> split;  // rounds whose hashes differ
  std::vector<std::string> last_members;
  int64_t count = 0;
};

// The hash most nodes report for the round (the first such in id order on
// a tie), and the record of the first node that holds it.
const RoundSeen& MajorityRecord(int64_t round,
                                const std::vector<const NodeRecord*>& seen,
                                std::map<std::string, int>* votes) {
  for (const NodeRecord* n : seen) ++(*votes)[n->rounds.at(round).hash];
  std::string hash = seen.front()->rounds.at(round).hash;
  for (const auto& [h, count] : *votes) {
    if (count > (*votes)[hash]) hash = h;
  }
  for (const NodeRecord* n : seen) {
    if (n->rounds.at(round).hash == hash) return n->rounds.at(round);
  }
  return seen.front()->rounds.at(round);
}

// One round over the nodes in `seen` (which logged it, in id order).
void MergeRound(int64_t round, const std::vector<const NodeRecord*>& seen,
                const RunClock& clock, double* cumulative, MergedRounds* m,
                ReportData* report) {
  double loss = 0, bytes = 0, seconds = 0, t = 0;
  JsonArray hashes, reported_by;
  Value val_loss;
  for (const NodeRecord* n : seen) {
    const RoundSeen& r = n->rounds.at(round);
    hashes.Push(r.hash);
    reported_by.Push(n->id);
    loss += r.train_loss / seen.size();
    bytes += r.bytes;
    seconds = std::max(seconds, r.seconds);
    t = std::max(t, clock.At(r.unix_seconds, r.wall_seconds));
    if (!IsNumber(val_loss)) val_loss = r.val_loss;
  }
  std::map<std::string, int> votes;
  // Members as the first node holding the majority's hash saw them.
  const RoundSeen& ref = MajorityRecord(round, seen, &votes);
  const bool agree = votes.size() == 1;
  m->all_agree = m->all_agree && agree;
  if (!agree) m->split.push_back(round);
  *cumulative += bytes;
  m->last_members.clear();
  for (const Value& member : ref.members.list_value().values()) {
    m->last_members.push_back(MemberId(member));
  }
  JsonObject o;
  o.Add("round", round)
      .AddRaw("members", ToJson(ref.members))
      .Add("model_hash", ref.hash)
      .Add("hashes_agree", agree)
      .Add("node_hashes", hashes)
      .Add("reported_by", reported_by)
      .Add("train_loss", loss)
      .AddRaw("val_loss", ToJson(val_loss))
      .Add("bytes", bytes)
      .Add("seconds", seconds)
      .Add("wall_seconds", t);
  if (ref.residual_flush) o.Add("residual_flush", true);
  m->json.Push(o);
  report->rounds.push_back({round, *cumulative, loss, t, agree,
                            ref.members.list_value().values_size()});
}

MergedRounds MergeRounds(const std::vector<NodeRecord>& recs,
                         const RunClock& clock, ReportData* report) {
  std::map<int64_t, std::vector<const NodeRecord*>> by_round;
  for (const NodeRecord& n : recs) {
    for (const auto& [round, r] : n.rounds) by_round[round].push_back(&n);
  }
  MergedRounds m;
  double cumulative = 0;
  for (const auto& [round, seen] : by_round) {
    MergeRound(round, seen, clock, &cumulative, &m, report);
  }
  m.count = static_cast<int64_t>(by_round.size());
  return m;
}

// Validation loss (and a classifier's accuracy) over time: each evaluated
// step once, in time order.
void EvalsOverTime(const std::vector<NodeRecord>& recs, const RunClock& clock,
                   ReportData* report) {
  std::map<int64_t, const NodeRecord::Eval*> evals;  // by step, first wins
  for (const NodeRecord& n : recs) {
    for (const auto& e : n.evals) evals.emplace(e.step, &e);
  }
  for (const auto& [step, e] : evals) {
    const double t = clock.At(e->unix_seconds, e->wall_seconds);
    report->val_vs_time.push_back({t, e->val_loss});
    if (e->val_accuracy >= 0) {
      report->accuracy_vs_time.push_back({t, e->val_accuracy});
    }
  }
  std::sort(report->val_vs_time.begin(), report->val_vs_time.end());
  std::sort(report->accuracy_vs_time.begin(), report->accuracy_vs_time.end());
}

// Data drift (--drift) and drift detections, once per node and step (a
// restarted node may log one again), marked on the loss-vs-time chart.
struct MergedDrift {
  JsonArray drifts, detections;
};

MergedDrift MergeDrift(const std::vector<NodeRecord>& recs,
                       const RunClock& clock, ReportData* report) {
  MergedDrift m;
  for (const NodeRecord& n : recs) {
    std::set<std::pair<std::string, int64_t>> seen;
    for (const NodeRecord::Mark& mark : n.marks) {
      if (!seen.insert({mark.event, mark.step}).second) continue;
      const double t = clock.At(mark.unix_seconds, mark.wall_seconds);
      const bool drift = mark.event == "drift";
      (drift ? m.drifts : m.detections)
          .Push(JsonObject()
                    .Add("node", n.id)
                    .Add("step", mark.step)
                    .Add("seconds", t));
      report->loss_marks.push_back({t,
                                    drift
                                        ? absl::StrCat("drift ", n.id)
                                        : absl::StrCat("drift detected ", n.id),
                                    drift});
    }
  }
  std::sort(report->loss_marks.begin(), report->loss_marks.end(),
            [](const ReportData::LossMark& a, const ReportData::LossMark& b) {
              return a.wall_seconds < b.wall_seconds;
            });
  return m;
}

// The final model: every node that ran to the end holds the same one.
struct FinalModel {
  std::string hash;  // empty: no node ran to the end with a summary
  bool agree = true;
  std::optional<bool> agree_if_any() const {
    return hash.empty() ? std::nullopt : std::optional<bool>(agree);
  }
};

FinalModel FinalModelOf(const std::vector<NodeRecord>& recs, double max_steps) {
  FinalModel f;
  for (const NodeRecord& n : recs) {
    if (!n.has_summary || n.steps() != max_steps) continue;
    const std::string h =
        FieldOf(n.final_figures(), "model_hash").string_value();
    if (f.hash.empty()) f.hash = h;
    f.agree = f.agree && h == f.hash;
  }
  return f;
}

// The evaluated node's final figures (empty when none was evaluated).
const Struct& EvaluatedFigures(const MergedNodes& nodes) {
  static const Struct* empty = new Struct();
  return nodes.evaluated ? nodes.evaluated->final_figures() : *empty;
}

// The final validation loss: gossip's is the mean of the finished nodes'
// (each holds its own model); DiLoCo's, the evaluated node's.
void AddFinalLoss(const MergeInput& in, const std::vector<NodeRecord>& recs,
                  const MergedNodes& nodes, JsonObject* fin) {
  double gossip_loss = 0;
  int gossip_evaluated = 0;
  if (in.algo == "gossip") {
    for (const NodeRecord& n : recs) {
      const Value& v = n.has_summary ? FieldOf(n.final_figures(), "val_loss")
                                     : Value::default_instance();
      if (IsNumber(v)) {
        gossip_loss += v.number_value();
        ++gossip_evaluated;
      }
    }
  }
  const Struct& fe = EvaluatedFigures(nodes);
  if (gossip_evaluated > 0) {
    fin->Add("val_loss", gossip_loss / gossip_evaluated)
        .Add("val_loss_of", "mean of nodes");
  } else {
    fin->AddRaw("val_loss",
                ToJson(nodes.evaluated ? FieldOf(fe, "val_loss") : Value()));
  }
  if (fe.fields().count("val_accuracy")) {
    fin->AddRaw("val_accuracy", ToJson(FieldOf(fe, "val_accuracy")));
  }
}

JsonObject FinalJson(const MergeInput& in, const std::vector<NodeRecord>& recs,
                     const MergedNodes& nodes, const MergedRounds& rounds,
                     const FinalModel& model) {
  JsonObject fin;
  AddFinalLoss(in, recs, nodes, &fin);
  fin.Add("total_bytes", nodes.total_bytes)
      .Add("allreduce_equivalent_bytes", nodes.equivalent)
      .Add("relay_forwarded_bytes", nodes.relay_forwarded);
  if (!nodes.compression.empty()) {
    fin.Add("compression", nodes.compression)
        .Add("bytes_before_compression", nodes.before)
        .Add("bytes_after_compression", nodes.after);
  }
  if (nodes.total_bytes > 0) {
    fin.Add("comm_reduction", nodes.equivalent / nodes.total_bytes);
  } else {
    fin.AddNull("comm_reduction");
  }
  JsonArray split_rounds;
  for (int64_t r : rounds.split) split_rounds.Push(r);
  JsonArray members_at_end;
  for (const std::string& m : rounds.last_members) members_at_end.Push(m);
  JsonArray apart;
  for (const NodeRecord& n : recs) {
    if (!Listed(in.faults.killed, n.id) && EndedApart(n)) apart.Push(n.id);
  }
  fin.Add("utilization",
          nodes.node_wall > 0 ? nodes.compute / nodes.node_wall : 0.0)
      .Add("model_hash", model.hash)
      .Add("all_hashes_agree", rounds.all_agree && model.agree)
      .AddRaw("final_models_agree", model.hash.empty() ? "null"
                                    : model.agree      ? "true"
                                                       : "false")
      .Add("split_rounds", split_rounds)
      .Add("rounds", rounds.count)
      .Add("members_at_end", members_at_end)
      .Add("nodes_apart", apart)
      .Add("wall_seconds", in.wall);
  return fin;
}

std::string Title(const MergeInput& in) {
  const int joiners = static_cast<int>(in.ids.size()) - in.initial_nodes;
  return absl::StrCat(
      "Starling sim: ", in.initial_nodes, " nodes",
      joiners > 0 ? absl::StrCat(" (+", joiners, " joining)") : "", ", ",
      in.algo);
}

std::string Compression(const MergedNodes& n) {
  if (n.compression.empty()) return "-";
  return absl::StrFormat("%s: %s before, %s after (%.1fx)", n.compression,
                         FormatBytes(n.before), FormatBytes(n.after),
                         n.after > 0 ? n.before / n.after : 0.0);
}

// The report's table of figures.
std::vector<std::pair<std::string, std::string>> Facts(
    const MergeInput& in, const std::string& model, const MergedNodes& nodes,
    const MergedRounds& rounds, const FinalModel& final_model) {
  const Value& val = FieldOf(EvaluatedFigures(nodes), "val_loss");
  const Value& acc = FieldOf(EvaluatedFigures(nodes), "val_accuracy");
  std::vector<std::pair<std::string, std::string>> facts = {
      {"run directory", in.dir},
      {"model", model},
      {"algorithm", in.algo},
      {"final validation loss",
       IsNumber(val) ? absl::StrFormat("%.4f", val.number_value()) : "-"},
      {"final validation accuracy",
       IsNumber(acc) ? absl::StrFormat("%.2f%%", 100 * acc.number_value())
                     : "- (not a classifier)"},
      {"rounds", absl::StrCat(rounds.count)},
      {"pseudo-gradient compression", Compression(nodes)},
      {"bytes sent (all nodes)", FormatBytes(nodes.total_bytes)},
      {"per-step all-reduce would send", FormatBytes(nodes.equivalent)},
      {"communication reduction",
       nodes.total_bytes > 0
           ? absl::StrFormat("%.1fx", nodes.equivalent / nodes.total_bytes)
           : "-"},
      {"utilization (compute / wall)",
       absl::StrFormat("%.1f%%", nodes.node_wall > 0
                                     ? 100 * nodes.compute / nodes.node_wall
                                     : 0)},
      {"model hashes agree every round",
       in.algo == "gossip"
           ? "n/a (gossip)"
           : AgreementText(rounds.split, final_model.agree_if_any())},
      {"wall time", FormatDuration(in.wall)},
  };
  if (nodes.relay_forwarded > 0) {  // members behind NAT (--nat)
    facts.insert(facts.begin() + 9, {"forwarded by relays (all nodes)",
                                     FormatBytes(nodes.relay_forwarded)});
  }
  return facts;
}

// The facts that only some runs have: consensus, faults, drift.
void AddOptionalFacts(const MergeInput& in, const MergedRounds& rounds,
                      ReportData* report) {
  if (!report->consensus.empty()) {
    const ReportData::Consensus& c = report->consensus.back();
    report->facts.push_back({"consensus distance at the end (gossip)",
                             absl::StrFormat("%.6g at step %d over %d nodes",
                                             c.distance, c.step, c.nodes)});
  }
  if (!in.faults.marks.empty()) {
    report->facts.push_back(
        {"fault events",
         absl::StrCat(in.faults.marks.size(), " (table below)")});
    report->facts.push_back(
        {"members at the end", absl::StrJoin(rounds.last_members, ", ")});
  }
  if (!report->loss_marks.empty()) {
    std::vector<std::string> marks;
    for (const ReportData::LossMark& m : report->loss_marks) {
      marks.push_back(absl::StrFormat("%s at %.1fs", m.label, m.wall_seconds));
    }
    report->facts.push_back({"data drift", absl::StrJoin(marks, "; ")});
  }
}

JsonArray ConsensusJson(const std::vector<ConsensusPoint>& points,
                        ReportData* report) {
  JsonArray consensus;
  for (const ConsensusPoint& p : points) {
    consensus.Push(JsonObject()
                       .Add("step", p.step)
                       .Add("distance", p.distance)
                       .Add("nodes", static_cast<int64_t>(p.nodes)));
    report->consensus.push_back({p.step, p.distance, p.nodes});
  }
  return consensus;
}

}  // namespace

const Struct& NodeRecord::node() const {
  const auto& l = FieldOf(summary, "nodes").list_value();
  return l.values_size() > 0 ? l.values(0).struct_value()
                             : FieldOf(summary, "nodes").struct_value();
}

const Struct& NodeRecord::final_figures() const {
  return FieldOf(summary, "final").struct_value();
}

double NodeRecord::steps() const {
  const Value& v = FieldOf(final_figures(), "inner_steps");
  return IsNumber(v) ? v.number_value()
                     : FieldOf(node(), "inner_steps").number_value();
}

NodeRecord NodeRecordFrom(const std::string& id, const Struct* summary,
                          absl::string_view events) {
  NodeRecord n;
  n.id = id;
  if (summary != nullptr) {
    n.has_summary = true;
    n.summary = *summary;
  }
  ForEachEvent(events, [&](const Struct& ev) {
    const std::string kind = FieldOf(ev, "event").string_value();
    const int64_t step =
        static_cast<int64_t>(FieldOf(ev, "step").number_value());
    const double wall = FieldOf(ev, "wall_seconds").number_value();
    if (kind == "round") {
      RoundSeen r = RoundFrom(ev);
      r.unix_seconds = EventUnixSeconds(ev);
      r.wall_seconds = wall;
      n.rounds[static_cast<int64_t>(FieldOf(ev, "round").number_value())] =
          std::move(r);
    } else if (kind == "eval") {
      const Value& acc = FieldOf(ev, "val_accuracy");
      n.evals.push_back({step, FieldOf(ev, "val_loss").number_value(),
                         EventUnixSeconds(ev), wall,
                         IsNumber(acc) ? acc.number_value() : -1});
    } else if (kind == "drift" || kind == "drift_detected") {
      n.marks.push_back({kind, step, EventUnixSeconds(ev), wall});
    }
  });
  // Rounds the summary holds that the events lost.
  for (const Value& v : FieldOf(n.summary, "rounds").list_value().values()) {
    const int64_t round = FieldOf(v.struct_value(), "round").number_value();
    if (!n.rounds.count(round)) n.rounds[round] = RoundFrom(v.struct_value());
  }
  return n;
}

NodeRecord ReadNodeRecord(const std::string& dir, const std::string& id) {
  const std::string nd = absl::StrCat(dir, "/", id);
  absl::StatusOr<Struct> summary = ReadJsonFile(nd + "/summary.json");
  absl::StatusOr<std::string> events = ReadFile(nd + "/events.jsonl");
  return NodeRecordFrom(id, summary.ok() ? &*summary : nullptr,
                        events.ok() ? *events : "");
}

MergedRun MergeRun(const MergeInput& in, const std::vector<NodeRecord>& recs,
                   const TrainConfig& config, const JsonObject& sim_cfg,
                   const std::vector<ConsensusPoint>& consensus) {
  MergedRun run;
  ReportData& report = run.report;
  const RunClock clock = ClockOf(in.start, recs);
  const MergedNodes nodes = MergeNodes(in, recs, &report);
  const MergedRounds rounds = MergeRounds(recs, clock, &report);
  EvalsOverTime(recs, clock, &report);
  const MergedDrift drift = MergeDrift(recs, clock, &report);
  const FinalModel final_model = FinalModelOf(recs, nodes.max_steps);
  const Value& model = nodes.first_summary
                           ? FieldOf(nodes.first_summary->summary, "model")
                           : Value::default_instance();
  const JsonArray consensus_json = ConsensusJson(consensus, &report);
  run.summary.Add("command", "sim")
      .AddRaw("config", ConfigJson(config))
      .Add("sim", sim_cfg)
      .AddRaw("model", ToJson(model))
      .Add("nodes", nodes.json)
      .Add("rounds", rounds.json)
      .Add("faults", in.faults.json)
      .Add("drift", drift.drifts)
      .Add("drift_detected", drift.detections)
      .Add("final", FinalJson(in, recs, nodes, rounds, final_model));
  if (in.algo == "gossip") run.summary.Add("consensus", consensus_json);

  report.title = Title(in);
  const std::string architecture =
      FieldOf(model.struct_value(), "architecture").string_value();
  report.facts = Facts(in, architecture.empty() ? config.model() : architecture,
                       nodes, rounds, final_model);
  AddOptionalFacts(in, rounds, &report);
  for (ReportData::Fault f : in.faults.marks) {
    f.wall_seconds += clock.start_offset;
    report.faults.push_back(std::move(f));
  }
  return run;
}

absl::Status MergeOutputs(const MergeInput& in, const TrainConfig& config,
                          const JsonObject& sim_cfg) {
  std::vector<NodeRecord> recs;
  for (const std::string& id : in.ids) {
    recs.push_back(ReadNodeRecord(in.dir, id));
  }
  // Gossip: consensus distance from the nodes' snapshots (then deleted).
  std::vector<ConsensusPoint> consensus;
  if (in.algo == "gossip") {
    std::vector<std::string> node_dirs;
    for (const std::string& id : in.ids) node_dirs.push_back(in.dir + "/" + id);
    consensus = ConsensusFromSnapshots(node_dirs, /*remove=*/true);
  }
  const MergedRun run = MergeRun(in, recs, config, sim_cfg, consensus);
  STARLING_RETURN_IF_ERROR(
      WriteFileAtomic(in.dir + "/summary.json", run.summary.Dump() + "\n"));
  absl::Status rs = WriteReport(in.dir, run.report);
  if (!rs.ok()) STARLING_LOG(WARNING) << "report: " << rs.message();
  return absl::OkStatus();
}

std::string AgreementText(const std::vector<int64_t>& split,
                          std::optional<bool> final_agree) {
  if (split.empty() && final_agree.value_or(true)) return "yes";
  std::string out = "NO";
  if (!split.empty()) {
    std::vector<std::string> ranges;
    size_t shown = 0;
    for (size_t i = 0; i < split.size(); ++i) {
      size_t j = i;
      while (j + 1 < split.size() && split[j + 1] == split[j] + 1) ++j;
      if (ranges.size() < 4) {
        ranges.push_back(i == j ? absl::StrCat(split[i])
                                : absl::StrCat(split[i], "-", split[j]));
        shown = j + 1;
      }
      i = j;
    }
    absl::StrAppend(&out, " in round", split.size() > 1 ? "s " : " ",
                    absl::StrJoin(ranges, ", "));
    if (shown < split.size()) {
      absl::StrAppend(&out, " and ", split.size() - shown, " more");
    }
    if (!final_agree.has_value()) return out;
    absl::StrAppend(&out, ";");
  } else {
    absl::StrAppend(&out, ":");
  }
  absl::StrAppend(&out, *final_agree ? " the final models agree"
                                     : " the final models differ");
  return out;
}

std::string DoneLine(const Struct& summary, const std::string& algo,
                     double wall, const std::string& dir) {
  const Struct& fin = FieldOf(summary, "final").struct_value();
  std::vector<int64_t> split;
  for (const Value& v : FieldOf(fin, "split_rounds").list_value().values()) {
    split.push_back(static_cast<int64_t>(v.number_value()));
  }
  const Value& final_agree = FieldOf(fin, "final_models_agree");
  std::vector<std::string> apart;
  for (const Value& v : FieldOf(fin, "nodes_apart").list_value().values()) {
    apart.push_back(v.string_value());
  }
  const Value& acc = FieldOf(fin, "val_accuracy");
  return absl::StrFormat(
      "done: val_loss %s%s | sent %s (per-step all-reduce: %s, %.1fx less) | "
      "hashes agree: %s%s | %s\n  report: %s/report.html",
      ToJson(FieldOf(fin, "val_loss")),
      IsNumber(acc)
          ? absl::StrFormat(" | val_acc %.2f%%", 100 * acc.number_value())
          : "",
      FormatBytes(FieldOf(fin, "total_bytes").number_value()),
      FormatBytes(FieldOf(fin, "allreduce_equivalent_bytes").number_value()),
      FieldOf(fin, "comm_reduction").number_value(),
      algo == "gossip"
          ? "n/a (gossip: each node keeps its own model)"
          : AgreementText(split,
                          final_agree.kind_case() == Value::kBoolValue
                              ? std::optional<bool>(final_agree.bool_value())
                              : std::nullopt),
      apart.empty() ? ""
                    : absl::StrCat(" | ENDED APART from the swarm: ",
                                   absl::StrJoin(apart, ", "),
                                   " (not the swarm's model)"),
      FormatDuration(wall), dir);
}

}  // namespace starling
