#include "node/sim_command.h"

#include <fcntl.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <malloc.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/checkpoint.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/trainer.h"
#include "gossip/peer_credentials.h"
#include "node/consensus.h"
#include "node/faults.h"
#include "node/node_command.h"
#include "node/report.h"
#include "node/run_output.h"
#include "node/train_command.h"

ABSL_FLAG(int, nodes, 4, "sim: number of node processes");
ABSL_FLAG(std::string, kill, "",
          "sim: SIGKILL nodes (a crash): ID@TIME[,ID@TIME...], e.g. n2@30s. "
          "TIME counts from the start of the sim and needs a unit: 30s, "
          "1.5s, 2m, 500ms");
ABSL_FLAG(std::string, restart, "",
          "sim: start stopped nodes again with the same id, port and "
          "directory (with --resume when it holds a checkpoint): "
          "ID@TIME[,...], e.g. n2@60s. A node still running then is "
          "skipped with a warning");
ABSL_FLAG(std::string, join, "",
          "sim: start new nodes, each with its own port, directory and data "
          "shard: ID@TIME[,...], e.g. n5@45s. IDs must differ from n0 .. "
          "n{nodes-1}");
ABSL_FLAG(std::string, leave, "",
          "sim: SIGTERM nodes (a graceful leave: the node says goodbye, "
          "checkpoints and exits 1): ID@TIME[,...], e.g. n1@50s");
ABSL_FLAG(std::string, partition, "",
          "sim: from START to END the groups cannot reach each other: "
          "IDS|IDS[|IDS...]@START-END[;...], IDS = ID[,ID...], e.g. "
          "n0,n1|n2,n3@20s-40s. One partition at a time");
ABSL_FLAG(std::string, slow, "",
          "sim: slow nodes: ID:FACTORx[,ID:FACTORx...], e.g. n2:4x runs n2 "
          "with --slowdown=4 (each inner step takes 4 times its compute "
          "time). FACTOR from 1 to 1000");
ABSL_FLAG(std::string, poison, "",
          "sim: poisoned peers, for testing --aggregate and --norm_bound: "
          "ID:PLAN[,ID:PLAN...], PLAN = MODE@FIRST-LAST[+...] over rounds, "
          "MODE = nan | noise | xFACTOR; e.g. n4:nan@2-4+x1000@5-7+noise@8-10 "
          "(node n4 runs with --test_poison=PLAN)");

namespace starling {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

int Fail(const absl::Status& s, int code) {
  WriteStderrLine(absl::StrCat("starling sim: error: ", s.message()));
  return code;
}

// Free loopback ports, held open until all are chosen so they differ.
absl::StatusOr<std::vector<int>> PickPorts(int n) {
  std::vector<int> fds, ports;
  absl::Status status;
  for (int i = 0; i < n && status.ok(); ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      status = absl::UnavailableError("cannot find a free loopback port");
    } else {
      ports.push_back(ntohs(addr.sin_port));
    }
    if (fd >= 0) fds.push_back(fd);
  }
  for (int fd : fds) ::close(fd);
  if (!status.ok()) return status;
  return ports;
}

const Value& Get(const Struct& s, const std::string& key) {
  static const Value* null = new Value();
  auto it = s.fields().find(key);
  return it == s.fields().end() ? *null : it->second;
}

absl::StatusOr<Struct> ReadJsonFile(const std::string& path) {
  STARLING_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  Struct s;
  if (!google::protobuf::util::JsonStringToMessage(text, &s).ok()) {
    return absl::DataLossError(absl::StrCat(path, " is not valid JSON"));
  }
  return s;
}

// JSON text of `v`; null when it is unset (a missing field).
std::string ToJson(const Value& v) {
  if (v.kind_case() == Value::KIND_NOT_SET) return "null";
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(v, &out, o);
  return out;
}

// Calls `fn` with each complete, parseable line of JSON-lines `text`.
// Returns the length of the complete lines (what a follower has consumed).
size_t ForEachEvent(absl::string_view text,
                    const std::function<void(const Struct&)>& fn) {
  size_t end = text.rfind('\n');
  if (end == absl::string_view::npos) return 0;  // no complete line yet
  for (absl::string_view line :
       absl::StrSplit(text.substr(0, end), '\n', absl::SkipEmpty())) {
    Struct ev;
    if (google::protobuf::util::JsonStringToMessage(std::string(line), &ev)
            .ok()) {
      fn(ev);
    }
  }
  return end + 1;
}

// A member id from a "members" list: a string id, or an int rank ("nK")
// from nodes that predate elastic membership.
std::string MemberId(const Value& v) {
  return v.kind_case() == Value::kStringValue
             ? v.string_value()
             : absl::StrCat("n", static_cast<int64_t>(v.number_value()));
}

// Live view of the nodes' progress, from the tail of their events.jsonl.
class Progress {
 public:
  Progress(const std::string& dir, std::vector<std::string> ids,
           int total_steps, bool show_members, bool gossip)
      : dir_(dir),
        ids_(std::move(ids)),
        nodes_(ids_.size()),
        total_steps_(total_steps),
        show_members_(show_members),
        gossip_(gossip) {}

  // Whether node `i` counts for the step, loss and ETA: from its start
  // (a joiner: from its first round) until the sim stops it.
  void SetCounted(size_t i, bool counted) { nodes_[i].counted = counted; }

  // Whether a node has started training: the swarm formed.
  bool formed() const { return formed_; }

  // Reads only what each node appended since the last poll.
  void Poll() {
    for (size_t i = 0; i < ids_.size(); ++i) {
      Node& n = nodes_[i];
      absl::StatusOr<std::string> text =
          ReadFileFrom(absl::StrCat(dir_, "/", ids_[i], "/events.jsonl"),
                       static_cast<int64_t>(n.offset));
      if (!text.ok()) continue;
      n.offset += ForEachEvent(*text, [&](const Struct& ev) {
        const std::string kind = Get(ev, "event").string_value();
        const int step = static_cast<int>(Get(ev, "step").number_value());
        if (kind == "round") {
          const int64_t r = Get(ev, "round").number_value();
          if (r >= n.syncing) n.syncing = -1;
          if (r + 1 >= round_) {
            round_ = r + 1;
            members_ = Get(ev, "members").list_value().values_size();
          }
          n.step = step;
          n.loss = Get(ev, "train_loss").number_value();
          n.sent += Get(ev, "bytes").number_value();
          ++n.rounds;
        } else if (kind == "sync") {
          // A DiLoCo round's exchange began (again, on a retry).
          const int64_t r = Get(ev, "sync_round").number_value();
          if (r != n.syncing) {
            n.syncing = r;
            n.sync_since = absl::Now();
          }
        } else if (kind == "exchange") {
          // Gossip has no rounds: each push or absorb is progress.
          n.step = std::max(n.step, step);
          if (Get(ev, "kind").string_value() == "push") {
            ++pushes_;
            n.sent += Get(ev, "bytes").number_value();
            n.loss = Get(ev, "train_loss").number_value();
          }
          ++n.rounds;
        } else if (kind == "end" || kind == "leave") {
          // Gossip's last steps may end in a push that found nobody left.
          n.step = std::max(n.step, step);
          n.syncing = -1;  // a node that left mid-exchange waits no more
        } else if (kind == "eval") {
          val_ = n.val = Get(ev, "val_loss").number_value();
        } else if (kind == "start" || kind == "resume") {
          formed_ = true;  // its --min_members were there
        }
      });
    }
  }

  std::string Line(double elapsed) const {
    int min_step = -1, counted = 0, with_val = 0;
    double loss = 0, sent = 0, val_sum = 0;
    // The oldest exchange still open: a round's exchange that takes long (a
    // slow link, a member being waited for) is named, so that a line stuck
    // on a round says why.
    int64_t sync_round = -1;
    absl::Time since = absl::InfiniteFuture();
    for (const Node& n : nodes_) {
      sent += n.sent;
      if (!std::isnan(n.val)) {
        val_sum += n.val;
        ++with_val;
      }
      if (!n.counted) continue;
      min_step = min_step < 0 ? n.step : std::min(min_step, n.step);
      loss += n.loss;
      ++counted;
      if (n.syncing >= 0 && n.sync_since < since) {
        since = n.sync_since;
        sync_round = n.syncing;
      }
    }
    min_step = std::max(min_step, 0);
    if (counted > 0) loss /= counted;
    double eta =
        min_step > 0 ? elapsed * (total_steps_ - min_step) / min_step : NAN;
    const absl::Duration waited = absl::Now() - since;
    const std::string exchanging =
        sync_round >= 0 && waited >= absl::Seconds(5)
            ? absl::StrCat(" | exchanging round ", sync_round + 1, " for ",
                           FormatDuration(absl::ToDoubleSeconds(waited)))
            : "";
    // Gossip: each node evaluates its own model, so the mean of their
    // latest (as the run's result is); DiLoCo: the latest, of θ_global.
    const double val = !gossip_       ? val_
                       : with_val > 0 ? val_sum / with_val
                                      : NAN;
    return absl::StrFormat(
        "sim | %s %d%s | step %d/%d | loss %s | val %s | sent %s | %s | "
        "eta %s%s",
        gossip_ ? "pushes" : "round", gossip_ ? pushes_ : round_,
        show_members_ ? absl::StrFormat(" | members %d", members_) : "",
        min_step, total_steps_,
        min_step > 0 ? absl::StrFormat("%.4f", loss) : "-",
        std::isnan(val) ? "-" : absl::StrFormat("%.4f", val), FormatBytes(sent),
        FormatDuration(elapsed), FormatDuration(eta), exchanging);
  }

  // Whether node `i` has logged a round (gossip: an exchange) since the sim
  // started.
  bool HasRound(size_t i) const { return nodes_[i].rounds > 0; }

 private:
  struct Node {
    size_t offset = 0;  // into its events.jsonl
    int step = 0;
    double loss = 0, sent = 0;
    int rounds = 0;
    double val = NAN;  // its latest val_loss
    // The round whose exchange it is in (-1: none), and since when.
    int64_t syncing = -1;
    absl::Time sync_since = absl::InfiniteFuture();
    bool counted = false;
  };
  std::string dir_;
  std::vector<std::string> ids_;
  std::vector<Node> nodes_;
  int total_steps_;
  bool show_members_;
  bool gossip_;  // count pushes, not rounds
  int64_t round_ = 0;
  int64_t pushes_ = 0;  // all nodes' gossip pushes
  int members_ = 0;
  bool formed_ = false;
  double val_ = NAN;  // the latest val_loss of any node
};

std::atomic<int> g_sim_signal{0};
std::atomic<int> g_sim_signal_count{0};
void OnSimSignal(int sig) {
  g_sim_signal.store(sig);
  g_sim_signal_count.fetch_add(1);
}

// What MergeOutputs needs besides the config.
struct MergeInput {
  std::string dir;
  std::vector<std::string> ids;                // every node the sim started
  absl::Time start;                            // when the sim started its nodes
  double wall = 0;                             // seconds the sim ran
  JsonArray faults;                            // summary.json's "faults"
  std::vector<ReportData::Fault> fault_marks;  // seconds since `start`
  std::vector<std::string> left;               // ids that left via --leave
  std::vector<std::string> killed;  // ids killed and not restarted since
};

bool IsPartition(const FaultEvent& ev) {
  return ev.kind == FaultKind::kPartitionStart ||
         ev.kind == FaultKind::kPartitionEnd;
}

// What a fault event acts on: its node, or a partition's groups.
std::string FaultTarget(const FaultEvent& ev) {
  return IsPartition(ev) ? PartitionLine(ev.groups) : ev.node;
}

// Records `ev` for summary.json and the report: carried out at `t` seconds
// after the start, or skipped (then `t` is when, or < 0 when it never came
// due because every node had stopped).
void RecordFault(const FaultEvent& ev, double t, const std::string& skipped,
                 MergeInput* merge) {
  const double planned = absl::ToDoubleSeconds(ev.at);
  JsonObject o;
  o.Add("kind", FaultKindName(ev.kind))
      .Add(IsPartition(ev) ? "groups" : "node", FaultTarget(ev))
      .Add("planned_seconds", planned);
  if (t >= 0) o.Add("at_seconds", t);
  if (!skipped.empty()) o.Add("skipped", skipped);
  merge->faults.Push(o);
  merge->fault_marks.push_back({t >= 0 ? t : planned,
                                std::string(FaultKindName(ev.kind)),
                                FaultTarget(ev), skipped});
}

// One node's record of one round.
struct RoundSeen {
  Value members;
  std::string hash;
  double train_loss = 0;
  Value val_loss;
  double bytes = 0;
  double seconds = 0;
  double unix_seconds = NAN;  // from the event's "time"; NaN: unknown
  double wall_seconds = NAN;  // the node's own clock
  bool residual_flush = false;
};

RoundSeen RoundFrom(const Struct& r) {
  RoundSeen s;
  s.members = Get(r, "members");
  s.hash = Get(r, "model_hash").string_value();
  s.train_loss = Get(r, "train_loss").number_value();
  s.val_loss = Get(r, "val_loss");
  s.bytes = Get(r, "bytes").number_value();
  s.seconds = Get(r, "seconds").number_value();
  s.residual_flush = Get(r, "residual_flush").bool_value();
  return s;
}

double UnixSeconds(const Struct& ev) {
  absl::Time t;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, Get(ev, "time").string_value(), &t,
                       &err)) {
    return NAN;
  }
  return absl::ToDoubleSeconds(t - absl::UnixEpoch());
}

struct NodeRecord {
  std::string id;
  bool has_summary = false;
  Struct summary;
  std::map<int64_t, RoundSeen> rounds;  // by round; the last record wins
  struct Eval {
    int64_t step;
    double val_loss, unix_seconds, wall_seconds;
  };
  std::vector<Eval> evals;
  // "drift" and "drift_detected" events, in the order logged.
  struct Mark {
    std::string event;
    int64_t step;
    double unix_seconds, wall_seconds;
  };
  std::vector<Mark> marks;
  // The summary's nodes[0] and final (empty without a summary).
  const Struct& node() const {
    const auto& l = Get(summary, "nodes").list_value();
    return l.values_size() > 0 ? l.values(0).struct_value()
                               : Get(summary, "nodes").struct_value();
  }
  const Struct& final_figures() const {
    return Get(summary, "final").struct_value();
  }
  double steps() const {
    const Value& v = Get(final_figures(), "inner_steps");
    return v.kind_case() == Value::kNumberValue
               ? v.number_value()
               : Get(node(), "inner_steps").number_value();
  }
};

NodeRecord ReadNode(const std::string& dir, const std::string& id) {
  NodeRecord n;
  n.id = id;
  const std::string nd = absl::StrCat(dir, "/", id);
  if (absl::StatusOr<Struct> s = ReadJsonFile(nd + "/summary.json"); s.ok()) {
    n.has_summary = true;
    n.summary = std::move(*s);
  }
  if (absl::StatusOr<std::string> text = ReadFile(nd + "/events.jsonl");
      text.ok()) {
    ForEachEvent(*text, [&](const Struct& ev) {
      const std::string kind = Get(ev, "event").string_value();
      if (kind == "round") {
        RoundSeen r = RoundFrom(ev);
        r.unix_seconds = UnixSeconds(ev);
        r.wall_seconds = Get(ev, "wall_seconds").number_value();
        n.rounds[static_cast<int64_t>(Get(ev, "round").number_value())] =
            std::move(r);
      } else if (kind == "eval") {
        n.evals.push_back({static_cast<int64_t>(Get(ev, "step").number_value()),
                           Get(ev, "val_loss").number_value(), UnixSeconds(ev),
                           Get(ev, "wall_seconds").number_value()});
      } else if (kind == "drift" || kind == "drift_detected") {
        n.marks.push_back(
            {kind, static_cast<int64_t>(Get(ev, "step").number_value()),
             UnixSeconds(ev), Get(ev, "wall_seconds").number_value()});
      }
    });
  }
  // Rounds the summary holds that the events lost.
  for (const Value& v : Get(n.summary, "rounds").list_value().values()) {
    const int64_t round = Get(v.struct_value(), "round").number_value();
    if (!n.rounds.count(round)) n.rounds[round] = RoundFrom(v.struct_value());
  }
  return n;
}

// Whether the members' model hashes agreed, in words: "yes", or where they
// did not. `split`: the rounds whose nodes logged different hashes (sorted);
// `final_agree`: every node that ran to the end holds the same model (none
// when no node did). A partition's sides train apart (split rounds) and end
// on one model.
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

// Merges the nodes' outputs into the sim's summary.json and report.html.
// Nodes may have joined late, left, or been killed (no summary.json): rounds
// are merged by round number over every node that logged them.
absl::Status MergeOutputs(const MergeInput& in, const TrainConfig& config,
                          const JsonObject& sim_cfg) {
  std::vector<NodeRecord> recs;
  for (const std::string& id : in.ids) recs.push_back(ReadNode(in.dir, id));
  // Wall seconds count from the sim's start, or from the first event a
  // resumed run logged before it.
  double origin = absl::ToDoubleSeconds(in.start - absl::UnixEpoch());
  for (const NodeRecord& n : recs) {
    for (const auto& [round, r] : n.rounds) {
      if (!std::isnan(r.unix_seconds))
        origin = std::min(origin, r.unix_seconds);
    }
  }
  auto sim_seconds = [&](double unix_seconds, double node_wall) {
    return std::isnan(unix_seconds) ? node_wall : unix_seconds - origin;
  };
  const double start_offset =
      absl::ToDoubleSeconds(in.start - absl::UnixEpoch()) - origin;

  JsonArray nodes;
  double total_bytes = 0, equivalent = 0, compute = 0, node_wall = 0;
  double before = 0, after = 0;
  std::string compression;
  ReportData report;
  const NodeRecord* first_summary = nullptr;
  const NodeRecord* evaluated = nullptr;  // highest step with a val_loss
  double max_steps = -1;
  for (const NodeRecord& n : recs) {
    if (!n.has_summary) {
      JsonObject o;
      o.Add("id", n.id).Add("status", "killed");
      nodes.Push(o);
      double sent = 0;
      for (const auto& [round, r] : n.rounds) sent += r.bytes;
      total_bytes += sent;
      report.nodes.push_back({n.id, sent, 0, 0});
      continue;
    }
    if (first_summary == nullptr) first_summary = &n;
    const Struct& node = n.node();
    Struct with_status = node;
    const bool interrupted = Get(n.final_figures(), "interrupted").bool_value();
    auto listed = [&](const std::vector<std::string>& ids) {
      return std::find(ids.begin(), ids.end(), n.id) != ids.end();
    };
    // A killed node's summary is from an earlier life.
    (*with_status.mutable_fields())["status"].set_string_value(
        listed(in.killed) ? "killed"
        : !interrupted    ? "finished"
        : listed(in.left) ? "left"
                          : "interrupted");
    Value v;
    *v.mutable_struct_value() = with_status;
    nodes.PushRaw(ToJson(v));
    total_bytes += Get(node, "bytes_sent").number_value();
    before += Get(node, "bytes_before_compression").number_value();
    after += Get(node, "bytes_after_compression").number_value();
    if (compression.empty()) {
      compression = Get(node, "compression").string_value();
    }
    compute += Get(node, "compute_seconds").number_value();
    node_wall += Get(node, "wall_seconds").number_value();
    equivalent +=
        Get(n.final_figures(), "allreduce_equivalent_bytes").number_value();
    double w = Get(node, "wall_seconds").number_value();
    report.nodes.push_back(
        {n.id, Get(node, "bytes_sent").number_value(),
         Get(node, "bytes_received").number_value(),
         w > 0 ? Get(node, "compute_seconds").number_value() / w : 0});
    max_steps = std::max(max_steps, n.steps());
    if (Get(n.final_figures(), "val_loss").kind_case() == Value::kNumberValue &&
        (evaluated == nullptr || n.steps() > evaluated->steps())) {
      evaluated = &n;
    }
  }

  // Rounds, by round number over every node that logged them.
  std::map<int64_t, std::vector<const NodeRecord*>> by_round;
  for (const NodeRecord& n : recs) {
    for (const auto& [round, r] : n.rounds) by_round[round].push_back(&n);
  }
  JsonArray rounds;
  bool all_agree = true;
  std::vector<int64_t> split;  // rounds whose hashes differ
  double cumulative = 0;
  std::vector<std::string> last_members;
  for (const auto& [round, seen] : by_round) {
    std::map<std::string, int> votes;
    double loss = 0, bytes = 0, seconds = 0, t = 0;
    JsonArray hashes, reported_by;
    const RoundSeen* first = nullptr;
    Value val_loss;
    for (const NodeRecord* n : seen) {
      const RoundSeen& r = n->rounds.at(round);
      if (first == nullptr) first = &r;
      ++votes[r.hash];
      hashes.Push(r.hash);
      reported_by.Push(n->id);
      loss += r.train_loss / seen.size();
      bytes += r.bytes;
      seconds = std::max(seconds, r.seconds);
      t = std::max(t, sim_seconds(r.unix_seconds, r.wall_seconds));
      if (val_loss.kind_case() != Value::kNumberValue) val_loss = r.val_loss;
    }
    // The hash most nodes report (the first such in id order on a tie).
    std::string hash = first->hash;
    for (const auto& [h, count] : votes) {
      if (count > votes[hash]) hash = h;
    }
    // Members as the first node holding that hash saw them.
    const RoundSeen* ref = first;
    for (const NodeRecord* n : seen) {
      if (n->rounds.at(round).hash == hash) {
        ref = &n->rounds.at(round);
        break;
      }
    }
    const bool agree = votes.size() == 1;
    all_agree = all_agree && agree;
    if (!agree) split.push_back(round);
    cumulative += bytes;
    last_members.clear();
    for (const Value& m : ref->members.list_value().values()) {
      last_members.push_back(MemberId(m));
    }
    JsonObject o;
    o.Add("round", round)
        .AddRaw("members", ToJson(ref->members))
        .Add("model_hash", hash)
        .Add("hashes_agree", agree)
        .Add("node_hashes", hashes)
        .Add("reported_by", reported_by)
        .Add("train_loss", loss)
        .AddRaw("val_loss", ToJson(val_loss))
        .Add("bytes", bytes)
        .Add("seconds", seconds)
        .Add("wall_seconds", t);
    if (ref->residual_flush) o.Add("residual_flush", true);
    rounds.Push(o);
    report.rounds.push_back({round, cumulative, loss, t, agree,
                             ref->members.list_value().values_size()});
  }
  // Validation loss over time: each evaluated step once.
  std::map<int64_t, std::pair<double, double>> evals;  // step -> (t, loss)
  for (const NodeRecord& n : recs) {
    for (const auto& e : n.evals) {
      evals.emplace(e.step,
                    std::make_pair(sim_seconds(e.unix_seconds, e.wall_seconds),
                                   e.val_loss));
    }
  }
  for (const auto& [step, point] : evals) report.val_vs_time.push_back(point);
  std::sort(report.val_vs_time.begin(), report.val_vs_time.end());

  // Data drift (--drift) and drift detections, once per node and step (a
  // restarted node may log one again), marked on the loss-vs-time chart.
  JsonArray drifts, detections;
  for (const NodeRecord& n : recs) {
    std::set<std::pair<std::string, int64_t>> seen;
    for (const NodeRecord::Mark& m : n.marks) {
      if (!seen.insert({m.event, m.step}).second) continue;
      const double t = sim_seconds(m.unix_seconds, m.wall_seconds);
      JsonObject o;
      o.Add("node", n.id).Add("step", m.step).Add("seconds", t);
      (m.event == "drift" ? drifts : detections).Push(o);
      report.loss_marks.push_back({t,
                                   m.event == "drift"
                                       ? absl::StrCat("drift ", n.id)
                                       : absl::StrCat("drift detected ", n.id),
                                   m.event == "drift"});
    }
  }
  std::sort(report.loss_marks.begin(), report.loss_marks.end(),
            [](const ReportData::LossMark& a, const ReportData::LossMark& b) {
              return a.wall_seconds < b.wall_seconds;
            });

  // The final model: every node that ran to the end holds the same one.
  std::string final_hash;
  bool final_agree = true;
  for (const NodeRecord& n : recs) {
    if (!n.has_summary || n.steps() != max_steps) continue;
    const std::string h = Get(n.final_figures(), "model_hash").string_value();
    if (final_hash.empty()) final_hash = h;
    final_agree = final_agree && h == final_hash;
  }
  all_agree = all_agree && final_agree;
  static const Struct* empty = new Struct();
  const Struct& fe = evaluated ? evaluated->final_figures() : *empty;
  JsonObject fin;
  // Gossip: every node holds its own model; the final val_loss is the mean
  // of the finished nodes' final val_loss.
  const bool gossip = absl::GetFlag(FLAGS_algo) == "gossip";
  double gossip_loss = 0;
  int gossip_evaluated = 0;
  if (gossip) {
    for (const NodeRecord& n : recs) {
      const Value& v = n.has_summary ? Get(n.final_figures(), "val_loss")
                                     : Value::default_instance();
      if (v.kind_case() == Value::kNumberValue) {
        gossip_loss += v.number_value();
        ++gossip_evaluated;
      }
    }
  }
  if (gossip_evaluated > 0) {
    fin.Add("val_loss", gossip_loss / gossip_evaluated)
        .Add("val_loss_of", "mean of nodes");
  } else {
    fin.AddRaw("val_loss", ToJson(evaluated ? Get(fe, "val_loss") : Value()));
  }
  if (fe.fields().count("val_accuracy")) {
    fin.AddRaw("val_accuracy", ToJson(Get(fe, "val_accuracy")));
  }
  fin.Add("total_bytes", total_bytes)
      .Add("allreduce_equivalent_bytes", equivalent);
  if (!compression.empty()) {
    fin.Add("compression", compression)
        .Add("bytes_before_compression", before)
        .Add("bytes_after_compression", after);
  }
  if (total_bytes > 0) {
    fin.Add("comm_reduction", equivalent / total_bytes);
  } else {
    fin.AddNull("comm_reduction");
  }
  JsonArray split_rounds;
  for (int64_t r : split) split_rounds.Push(r);
  JsonArray members_at_end;
  for (const std::string& m : last_members) members_at_end.Push(m);
  fin.Add("utilization", node_wall > 0 ? compute / node_wall : 0.0)
      .Add("model_hash", final_hash)
      .Add("all_hashes_agree", all_agree)
      .AddRaw("final_models_agree", final_hash.empty() ? "null"
                                    : final_agree      ? "true"
                                                       : "false")
      .Add("split_rounds", split_rounds)
      .Add("rounds", static_cast<int64_t>(by_round.size()))
      .Add("members_at_end", members_at_end)
      .Add("wall_seconds", in.wall);
  const Value no_model;
  const Value& model =
      first_summary ? Get(first_summary->summary, "model") : no_model;
  // Gossip: consensus distance from the nodes' snapshots (then deleted).
  JsonArray consensus;
  if (gossip) {
    std::vector<std::string> node_dirs;
    for (const std::string& id : in.ids) node_dirs.push_back(in.dir + "/" + id);
    for (const ConsensusPoint& p :
         ConsensusFromSnapshots(node_dirs, /*remove=*/true)) {
      consensus.Push(JsonObject()
                         .Add("step", p.step)
                         .Add("distance", p.distance)
                         .Add("nodes", static_cast<int64_t>(p.nodes)));
      report.consensus.push_back({p.step, p.distance, p.nodes});
    }
  }
  JsonObject summary;
  summary.Add("command", "sim")
      .AddRaw("config", ConfigJson(config))
      .Add("sim", sim_cfg)
      .AddRaw("model", ToJson(model))
      .Add("nodes", nodes)
      .Add("rounds", rounds)
      .Add("faults", in.faults)
      .Add("drift", drifts)
      .Add("drift_detected", detections)
      .Add("final", fin);
  if (gossip) summary.Add("consensus", consensus);
  STARLING_RETURN_IF_ERROR(
      WriteFileAtomic(in.dir + "/summary.json", summary.Dump() + "\n"));

  const int joiners =
      static_cast<int>(in.ids.size()) - absl::GetFlag(FLAGS_nodes);
  report.title =
      absl::StrCat("Starling sim: ", absl::GetFlag(FLAGS_nodes), " nodes",
                   joiners > 0 ? absl::StrCat(" (+", joiners, " joining)") : "",
                   ", ", absl::GetFlag(FLAGS_algo));
  auto num = [](const Value& v, const absl::FormatSpec<double>& fmt) {
    return v.kind_case() == Value::kNumberValue
               ? absl::StrFormat(fmt, v.number_value())
               : std::string("-");
  };
  const std::string architecture =
      Get(model.struct_value(), "architecture").string_value();
  report.facts = {
      {"run directory", in.dir},
      {"model", architecture.empty() ? config.model() : architecture},
      {"algorithm", absl::GetFlag(FLAGS_algo)},
      {"final validation loss", num(Get(fe, "val_loss"), "%.4f")},
      {"rounds", absl::StrCat(by_round.size())},
      {"pseudo-gradient compression",
       compression.empty()
           ? std::string("-")
           : absl::StrFormat("%s: %s before, %s after (%.1fx)", compression,
                             FormatBytes(before), FormatBytes(after),
                             after > 0 ? before / after : 0.0)},
      {"bytes sent (all nodes)", FormatBytes(total_bytes)},
      {"per-step all-reduce would send", FormatBytes(equivalent)},
      {"communication reduction",
       total_bytes > 0 ? absl::StrFormat("%.1fx", equivalent / total_bytes)
                       : "-"},
      {"utilization (compute / wall)",
       absl::StrFormat("%.1f%%",
                       node_wall > 0 ? 100 * compute / node_wall : 0)},
      {"model hashes agree every round",
       absl::GetFlag(FLAGS_algo) == "gossip"
           ? "n/a (gossip)"
           : AgreementText(split, final_hash.empty()
                                      ? std::nullopt
                                      : std::optional<bool>(final_agree))},
      {"wall time", FormatDuration(in.wall)},
  };
  if (!report.consensus.empty()) {
    report.facts.push_back({"consensus distance at the end (gossip)",
                            absl::StrFormat("%.6g at step %d over %d nodes",
                                            report.consensus.back().distance,
                                            report.consensus.back().step,
                                            report.consensus.back().nodes)});
  }
  if (!in.fault_marks.empty()) {
    report.facts.push_back({"fault events", absl::StrCat(in.fault_marks.size(),
                                                         " (table below)")});
    report.facts.push_back(
        {"members at the end", absl::StrJoin(last_members, ", ")});
  }
  if (!report.loss_marks.empty()) {
    std::vector<std::string> marks;
    for (const ReportData::LossMark& m : report.loss_marks) {
      marks.push_back(absl::StrFormat("%s at %.1fs", m.label, m.wall_seconds));
    }
    report.facts.push_back({"data drift", absl::StrJoin(marks, "; ")});
  }
  for (ReportData::Fault f : in.fault_marks) {
    f.wall_seconds += start_offset;
    report.faults.push_back(std::move(f));
  }
  absl::Status rs = WriteReport(in.dir, report);
  if (!rs.ok()) STARLING_LOG(WARNING) << "report: " << rs.message();
  return absl::OkStatus();
}

// Whether `starling node` accepts --NAME (the sim runs the same binary).
bool NodeAccepts(absl::string_view name) {
  const std::vector<std::string>& names = NodeFlagNames();
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Flags of `starling sim` itself, never passed to the nodes.
const std::vector<std::string>& SimOnlyFlagNames() {
  static const auto* names = new std::vector<std::string>{"nodes",
                                                          "kill",
                                                          "restart",
                                                          "join",
                                                          "leave",
                                                          "partition",
                                                          "slow",
                                                          "drift",
                                                          "link_bandwidth_mbps",
                                                          "link_latency_ms",
                                                          "poison"};
  return *names;
}

// The node flags the sim sets per node.
bool SetPerNode(absl::string_view name) {
  return name == "listen" || name == "peers" || name == "node_id" ||
         name == "min_members" || name == "partition_file" ||
         name == "test_crash_at" || name == "test_poison" ||
         // In the sim by node id (sim-only); each node gets its addresses.
         name == "link_bandwidth_mbps" || name == "link_latency_ms";
}

}  // namespace

const Subcommand& SimSubcommand() {
  static const Subcommand* sub = [] {
    std::vector<std::string> flags = SimOnlyFlagNames();
    for (const std::string& f : NodeFlagNames()) {
      if (!SetPerNode(f)) flags.push_back(f);
    }
    // The sim sets these per node (--slow and --drift say how).
    for (const std::string& f : TrainFlagNames()) {
      if (f != "shard" && f != "slowdown" && f != "drift") flags.push_back(f);
    }
    return new Subcommand{
        "sim",
        "run N nodes as local processes (the default: 4-node DiLoCo on KJV)",
        "Starts --nodes `starling node` processes on 127.0.0.1, node K with "
        "--shard=K/N, waits for them with one live progress line, and writes "
        "--out/summary.json, --out/report.html and --out/nK/ (events.jsonl, "
        "summary.json, node.log, checkpoint.ckpt). Ctrl-C stops every node; "
        "if a node fails the others are stopped and its log is named. The "
        "training and node flags are passed to every node; --threads "
        "defaults to 1 per node.\n\n"
        "The progress line (every 5 s off a terminal, and once at the end): "
        "rounds committed (gossip: pushes), the slowest node's step, mean "
        "training loss, the latest validation loss, bytes sent, elapsed "
        "time, ETA, and a round's exchange that has run for 5 s or more "
        "(exchanging round R for T: a slow link, or a member waited for).\n\n"
        "Fault injection (elastic membership): --kill, --restart, --join, "
        "--leave and --partition carry out events at times counted from the "
        "start of the sim. Node ids are n0 .. n{nodes-1}, plus the ids that "
        "--join names; joiners get their own shard (--shard=K/S with S = "
        "nodes + joiners). Killed and leaving nodes are expected to stop; "
        "any other failure still stops the sim. summary.json lists the "
        "events as carried out under \"faults\", and the report marks them "
        "on the membership-over-time chart.\n\n"
        "Heterogeneity: --slow=n2:4x runs n2 four times slower (its "
        "--slowdown); --drift=n0,n1@400 switches n0 and n1 to the second "
        "data region at inner step 400 (their --drift=400) while every other "
        "node gets --drift=never. summary.json lists the switches under "
        "\"drift\" (and drift detections under \"drift_detected\"), and the "
        "report marks them on the loss-vs-time chart.\n\n"
        "Slow links: --link_bandwidth_mbps and --link_latency_ms shape "
        "every link (DEFAULT), the links from and to a node (n3=10) or "
        "between two nodes (n0-n1=1000); each node gets them as "
        "per-address flags. summary.json records them under \"sim\".\n\n"
        "Default: 4 nodes, DiLoCo with H=50 (16 rounds), the small gpt on "
        "KJV, 800 inner steps per node.\n"
        "  starling sim\n"
        "  starling sim --algo=ddp --out=runs/ddp\n"
        "  starling sim --inner_steps=10 --steps=800 --seed=1\n"
        "  starling sim --kill=n2@30s --restart=n2@60s --join=n4@45s "
        "--leave=n1@50s --partition='n0,n1|n2,n3@20s-40s'\n"
        "  starling sim --slow=n3:4x --drift=n0,n1@400\n"
        "  starling sim --link_bandwidth_mbps=100 --link_latency_ms=50\n"
        "  starling sim --link_bandwidth_mbps=100,n3=10 "
        "--link_latency_ms=20,n0-n1=200",
        flags};
  }();
  return *sub;
}

int RunSimCommand() {
  const int n = absl::GetFlag(FLAGS_nodes);
  if (n < 1 || n > 64) {
    return Fail(absl::InvalidArgumentError(
                    absl::StrCat("--nodes=", n, ": must be in [1, 64]")),
                2);
  }
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) ids.push_back(absl::StrCat("n", i));
  absl::StatusOr<FaultPlan> plan =
      ParseFaultPlan({absl::GetFlag(FLAGS_kill), absl::GetFlag(FLAGS_restart),
                      absl::GetFlag(FLAGS_join), absl::GetFlag(FLAGS_leave),
                      absl::GetFlag(FLAGS_partition)},
                     ids);
  if (!plan.ok()) return Fail(plan.status(), 2);
  // Nodes learn their id, quorum and partition file once `starling node`
  // has elastic membership; fault injection needs it.
  const bool elastic = NodeAccepts("node_id") && NodeAccepts("min_members") &&
                       NodeAccepts("partition_file");
  if (!plan->empty() && !elastic) {
    return Fail(absl::InvalidArgumentError(
                    "--kill/--restart/--join/--leave/--partition: this "
                    "`starling node` has no elastic membership (--node_id, "
                    "--min_members, --partition_file), so it cannot survive "
                    "faults"),
                2);
  }
  for (const std::string& j : plan->joiners) ids.push_back(j);
  const int total = static_cast<int>(ids.size());

  TrainConfig config = ConfigFromFlags();
  // In the sim --drift is IDS@STEP; each node gets its own --drift.
  const std::string drift_flag = config.drift();
  config.set_drift("");
  absl::StatusOr<std::map<std::string, double>> slow =
      ParseSlowSpec(absl::GetFlag(FLAGS_slow), ids);
  if (!slow.ok()) return Fail(slow.status(), 2);
  absl::StatusOr<std::map<std::string, std::string>> poison =
      ParsePoisonSpec(absl::GetFlag(FLAGS_poison), ids);
  if (!poison.ok()) return Fail(poison.status(), 2);
  absl::StatusOr<std::map<std::string, int64_t>> drift =
      ParseDriftSpec(drift_flag, ids);
  if (!drift.ok()) return Fail(drift.status(), 2);
  absl::StatusOr<SimLinks> links =
      ParseSimLinks(absl::GetFlag(FLAGS_link_bandwidth_mbps),
                    absl::GetFlag(FLAGS_link_latency_ms), ids);
  if (!links.ok()) return Fail(links.status(), 2);
  if (absl::Status s = ResolveTrainConfig(&config); !s.ok()) return Fail(s, 2);
  // The flags every node gets: a bad one fails here, once, before the run
  // directory exists, not in every child after its data load.
  if (absl::Status s = CheckNodeFlags(); !s.ok()) return Fail(s, 2);
  // And the data and model, which every node loads: a missing file, an
  // unknown model, or a model and batch whose weights, training state and
  // activations in every node (joiners included) cannot fit in memory,
  // fails here, before the run directory and the node processes exist.
  if (absl::Status s = CheckTrainConfig(
          config, total, WeightCopiesOfNode(absl::GetFlag(FLAGS_algo)));
      !s.ok()) {
    return Fail(s, 2);
  }
  // main() keeps up to 512 MiB of freed heap for the all-reduce; the probe
  // model's was the sim's only large allocation, so give it back rather
  // than hold it for the whole run (588 MB of RSS with --width=1024
  // --layers=8).
  malloc_trim(0);
  // The nodes talk over 127.0.0.1: plaintext (the sim adds --insecure)
  // unless a --tls_* flag asks for TLS. Their TLS files and join token are
  // checked here too.
  PeerSecurityOptions security = PeerSecurityFromFlags();
  const bool plaintext = !security.asks_for_tls();
  if (plaintext) security.insecure = true;
  security.node_id.clear();  // each node's is its own
  if (absl::Status s = CheckPeerSecurity(security); !s.ok()) {
    return Fail(s, 2);
  }
  if (security.tls_bind_node_ids) {
    return Fail(absl::InvalidArgumentError(
                    "--tls_bind_node_ids: starling sim gives every node the "
                    "same --tls_cert, which cannot name each node's id; use "
                    "it with starling node, one certificate per node"),
                2);
  }
  if (config.out().empty()) {
    config.set_out(absl::StrCat(
        "runs/sim-",
        absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone())));
  }
  const std::string dir = config.out();
  if (!config.resume() &&
      (FileExists(dir + "/n0") || FileExists(dir + "/summary.json"))) {
    return Fail(absl::InvalidArgumentError(
                    absl::StrCat("--out=", dir,
                                 " already holds a sim run; pass --resume "
                                 "to continue it, or choose another --out")),
                2);
  }
  if (config.resume()) {
    // Every node resumes from its own checkpoint: a run that never
    // checkpointed (or another --out) fails here, not in each node.
    std::vector<std::string> missing;
    for (int i = 0; i < n; ++i) {
      const std::string ckpt =
          CheckpointPathInRunDir(absl::StrCat(dir, "/", ids[i]));
      if (!FileExists(ckpt)) missing.push_back(ckpt);
    }
    if (!missing.empty()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
                      "--resume: --out=", dir, " holds no checkpoint for ",
                      missing.size(), " of its ", n, " nodes (",
                      absl::StrJoin(missing, ", "),
                      "); check --out and --nodes, or start the run "
                      "again without --resume")),
                  2);
    }
  }
  if (absl::Status s = MakeDirs(dir); !s.ok()) return Fail(s, 2);
  const std::string partition_file = dir + "/partition";
  if (elastic) {
    if (absl::Status s = WriteFileAtomic(partition_file, ""); !s.ok()) {
      return Fail(s, 1);
    }
  }
  absl::StatusOr<std::vector<int>> ports = PickPorts(total);
  if (!ports.ok()) return Fail(ports.status(), 1);
  std::vector<std::string> addrs;
  for (int p : *ports) addrs.push_back(absl::StrCat("127.0.0.1:", p));
  // Ranks follow the sorted member list; sorting here makes node K rank K.
  std::sort(addrs.begin(), addrs.end());
  std::map<std::string, std::string> address_of;  // node id -> host:port
  for (int i = 0; i < total; ++i) address_of[ids[i]] = addrs[i];
  std::string run_id = absl::GetFlag(FLAGS_run_id);
  if (run_id == "starling") {
    run_id = absl::StrCat("sim-", absl::ToUnixMillis(absl::Now()));
  }
  // Flags every child gets: the current value of each training/node flag.
  std::vector<std::string> common;
  const std::vector<std::string>& sim_only = SimOnlyFlagNames();
  for (const std::string& name : SimSubcommand().flags) {
    if (std::find(sim_only.begin(), sim_only.end(), name) != sim_only.end() ||
        name == "out" || name == "run_id" || name == "threads") {
      continue;
    }
    absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
    if (f != nullptr)
      common.push_back(absl::StrCat("--", name, "=", f->CurrentValue()));
  }
  common.push_back(absl::StrCat("--run_id=", run_id));
  common.push_back(absl::StrCat("--threads=", std::max(1, config.threads())));
  // Plaintext unless TLS was asked for (then --tls_* reach every node above).
  if (plaintext) common.push_back("--insecure=true");

  struct sigaction sa = {};
  sa.sa_handler = OnSimSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  WriteStderrLine(absl::StrFormat(
      "starling sim: %d nodes (%s), %s on %s, %d steps per node, run %s -> %s",
      n, absl::GetFlag(FLAGS_algo), config.model(), config.data(),
      config.steps(), run_id, dir));
  if (!plan->empty()) {
    WriteStderrLine(absl::StrFormat(
        "starling sim: %d fault events planned; joiners: %s",
        plan->events.size(),
        plan->joiners.empty() ? "none" : absl::StrJoin(plan->joiners, ", ")));
  }
  const auto start = absl::Now();
  std::vector<pid_t> pids(total, -1);
  std::vector<bool> leaving(total, false);
  // Starts node i. A restart (or a joiner) resumes from its checkpoint when
  // it has one and joins a running swarm, so it waits for no quorum.
  auto start_node = [&](int i, bool restart) -> absl::Status {
    const std::string node_dir = absl::StrCat(dir, "/", ids[i]);
    STARLING_RETURN_IF_ERROR(MakeDirs(node_dir));
    std::vector<std::string> args = {"starling", "node"};
    args.push_back(absl::StrCat("--listen=", addrs[i]));
    std::vector<std::string> others;
    for (int j = 0; j < n; ++j) {
      if (j != i) others.push_back(addrs[j]);
    }
    args.push_back(absl::StrCat("--peers=", absl::StrJoin(others, ",")));
    const bool late = restart || i >= n;
    if (elastic) {
      args.push_back(absl::StrCat("--node_id=", ids[i]));
      args.push_back(absl::StrCat("--min_members=", late ? 1 : n));
      args.push_back(absl::StrCat("--partition_file=", partition_file));
    }
    args.push_back(absl::StrCat("--shard=", i, "/", total));
    args.push_back(absl::StrCat("--out=", node_dir));
    if (auto f = slow->find(ids[i]); f != slow->end()) {
      args.push_back(absl::StrCat("--slowdown=", f->second));
    }
    if (auto p = poison->find(ids[i]); p != poison->end()) {
      args.push_back(absl::StrCat("--test_poison=", p->second));
    }
    if (!drift->empty()) {
      auto d = drift->find(ids[i]);
      args.push_back(absl::StrCat(
          "--drift=", d == drift->end() ? "never" : absl::StrCat(d->second)));
    }
    if (links->shaped()) {
      auto [bandwidth, latency] = NodeLinkFlags(*links, ids[i], address_of);
      args.push_back(absl::StrCat("--link_bandwidth_mbps=", bandwidth));
      args.push_back(absl::StrCat("--link_latency_ms=", latency));
    }
    for (const std::string& a : common) args.push_back(a);
    if (absl::GetFlag(FLAGS_algo) == "gossip") {
      // Model snapshots for the consensus distance (the last flag wins).
      const absl::CommandLineFlag* f =
          absl::FindCommandLineFlag("snapshot_every");
      if (f != nullptr && f->CurrentValue() == "0") {
        args.push_back(absl::StrCat("--snapshot_every=",
                                    config.eval_every() > 0
                                        ? config.eval_every()
                                        : std::max(1, config.steps() / 10)));
      }
    }
    if (late) {
      args.push_back(absl::StrCat(
          "--resume=",
          FileExists(CheckpointPathInRunDir(node_dir)) ? "true" : "false"));
    }
    const std::string log = node_dir + "/node.log";
    if (restart) {
      (void)AppendLine(
          log, absl::StrCat("--- starling sim: restarting ", ids[i], " ---"));
    }
    const pid_t sim_pid = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) return absl::InternalError("fork failed");
    if (pid == 0) {
      ::setpgid(0, 0);  // a terminal's Ctrl-C reaches only the sim
      // A sim killed outright (it cannot stop its nodes) takes its nodes
      // with it; each keeps its last checkpoint. Forks happen on the sim's
      // main thread, whose exit is the sim's.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != sim_pid) _exit(127);
      int fd =
          ::open(log.c_str(),
                 O_WRONLY | O_CREAT | (restart ? O_APPEND : O_TRUNC), 0644);
      if (fd >= 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
        ::close(fd);
      }
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    pids[i] = pid;
    leaving[i] = false;
    return absl::OkStatus();
  };
  std::vector<std::string> started;  // ids, in the order first started
  for (int i = 0; i < n; ++i) {
    if (absl::Status s = start_node(i, false); !s.ok()) return Fail(s, 1);
    started.push_back(ids[i]);
  }

  Progress progress(dir, ids, config.steps(), !plan->empty(),
                    absl::GetFlag(FLAGS_algo) == "gossip");
  for (int i = 0; i < n; ++i) progress.SetCounted(i, true);
  const bool tty = ::isatty(STDERR_FILENO);
  auto last_print = absl::InfinitePast();
  std::string last_line;
  // A line of its own, clear of the live progress line.
  auto say = [&](const std::string& msg) {
    if (tty) std::fprintf(stderr, "\r%-110s\r", "");
    WriteStderrLine(msg);
  };
  int running = n;
  int failed = -1, failed_code = 0;
  // When to SIGKILL whatever is still running: nodes finish their round
  // after SIGTERM; a node blocked on a dead peer never would. Before that,
  // at a second Ctrl-C or after 45 s, a second SIGTERM tells the nodes to
  // leave at once (abandoning a round, or an evaluation, still in progress)
  // and checkpoint what they committed, rather than be killed unsaved.
  absl::Time kill_at = absl::InfiniteFuture();
  absl::Time leave_now_at = absl::InfiniteFuture();
  auto stop_all = [&](int sig) {
    for (pid_t p : pids) {
      if (p > 0) ::kill(p, sig);
    }
  };
  auto index_of = [&](const std::string& id) {
    return static_cast<int>(std::find(ids.begin(), ids.end(), id) -
                            ids.begin());
  };

  // The fault plan, carried out from the wait loop.
  size_t next_event = 0;
  MergeInput merge;
  auto carry_out = [&](const FaultEvent& ev, double t) {
    const std::string what = FaultTarget(ev);
    const int i = IsPartition(ev) ? -1 : index_of(ev.node);
    std::string skipped;
    switch (ev.kind) {
      case FaultKind::kKill:
        if (pids[i] <= 0) {
          skipped = "not running";
        } else {
          ::kill(pids[i], SIGKILL);
          int status = 0;
          ::waitpid(pids[i], &status, 0);  // at once, so a restart can follow
          pids[i] = -1;
          --running;
          merge.killed.push_back(ev.node);
          progress.SetCounted(i, false);
        }
        break;
      case FaultKind::kLeave:
        if (pids[i] <= 0) {
          skipped = "not running";
        } else {
          ::kill(pids[i], SIGTERM);
          leaving[i] = true;
          merge.left.push_back(ev.node);
          progress.SetCounted(i, false);
        }
        break;
      case FaultKind::kRestart:
      case FaultKind::kJoin:
        if (pids[i] > 0) {
          skipped = "still running";
        } else if (absl::Status s =
                       start_node(i, ev.kind == FaultKind::kRestart);
                   !s.ok()) {
          skipped = std::string(s.message());
        } else {
          ++running;
          merge.killed.erase(
              std::remove(merge.killed.begin(), merge.killed.end(), ev.node),
              merge.killed.end());
          if (std::find(started.begin(), started.end(), ev.node) ==
              started.end()) {
            started.push_back(ev.node);
          }
          // A joiner counts once it has a round; a restarted node at once.
          progress.SetCounted(
              i, ev.kind == FaultKind::kRestart || progress.HasRound(i));
        }
        break;
      case FaultKind::kPartitionStart:
      case FaultKind::kPartitionEnd:
        if (absl::Status s = WriteFileAtomic(
                partition_file, ev.kind == FaultKind::kPartitionStart
                                    ? what + "\n"
                                    : std::string());
            !s.ok()) {
          skipped = std::string(s.message());
        }
        break;
    }
    RecordFault(ev, t, skipped, &merge);
    std::string note;
    if (!skipped.empty()) {
      note = absl::StrCat(" skipped (", skipped, ")");
    } else if (elastic && i >= 0 && i < n &&
               (ev.kind == FaultKind::kKill || ev.kind == FaultKind::kLeave)) {
      progress.Poll();
      if (!progress.formed()) {
        const absl::CommandLineFlag* timeout =
            absl::FindCommandLineFlag("connect_timeout");
        note = absl::StrCat(
            " before the swarm formed: the others wait for all ", n,
            " starting nodes (--min_members) and fail after --connect_timeout=",
            timeout != nullptr ? timeout->CurrentValue() : "?",
            " s unless it comes back");
      }
    }
    say(absl::StrFormat("starling sim: %.1fs: %s %s%s", t,
                        FaultKindName(ev.kind), what, note));
  };
  auto stopping = [&] { return failed >= 0 || g_sim_signal.load() != 0; };
  // A restart or join still to come keeps the sim waiting.
  auto starts_pending = [&] {
    for (size_t k = next_event; k < plan->events.size(); ++k) {
      const FaultKind kind = plan->events[k].kind;
      if (kind == FaultKind::kRestart || kind == FaultKind::kJoin) return true;
    }
    return false;
  };

  while (running > 0 || (!stopping() && starts_pending())) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      int idx = static_cast<int>(std::find(pids.begin(), pids.end(), pid) -
                                 pids.begin());
      if (idx < total) {
        pids[idx] = -1;
        --running;
        const int code =
            WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        bool ok = WIFEXITED(status) && code == 0;
        // A node that was asked to leave exits 1 ("interrupted").
        if (leaving[idx] && (code == 1 || code == 128 + SIGTERM)) {
          ok = true;
          say(absl::StrCat("starling sim: ", ids[idx], " left (exit ", code,
                           ")"));
        }
        if (!ok && failed < 0 && g_sim_signal.load() == 0) {
          failed = idx;
          failed_code = code;
          stop_all(SIGTERM);
        }
      }
      continue;
    }
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
    while (!stopping() && next_event < plan->events.size() &&
           absl::ToDoubleSeconds(plan->events[next_event].at) <= elapsed) {
      carry_out(plan->events[next_event++], elapsed);
    }
    if (g_sim_signal.load() != 0 && kill_at == absl::InfiniteFuture()) {
      WriteStderrLine(
          "\nstarling sim: stopping all nodes after their current round "
          "(Ctrl-C again: at once)");
      stop_all(SIGTERM);
      leave_now_at = absl::Now() + absl::Seconds(45);
      kill_at = absl::Now() + absl::Seconds(75);
    }
    if (leave_now_at != absl::InfiniteFuture() &&
        (g_sim_signal_count.load() >= 2 || absl::Now() > leave_now_at)) {
      WriteStderrLine("starling sim: telling the nodes to leave at once");
      stop_all(SIGTERM);
      leave_now_at = absl::InfiniteFuture();
    }
    if (failed >= 0 && kill_at == absl::InfiniteFuture()) {
      kill_at = absl::Now() + absl::Seconds(10);  // their round cannot finish
    }
    if (absl::Now() > kill_at) stop_all(SIGKILL);
    progress.Poll();
    for (int i = n; i < total; ++i) {
      if (pids[i] > 0 && !leaving[i] && progress.HasRound(i)) {
        progress.SetCounted(i, true);
      }
    }
    std::string line = progress.Line(elapsed);
    if (tty) {
      std::fprintf(stderr, "\r%-110s", line.c_str());
      std::fflush(stderr);
    } else if (line != last_line &&
               absl::Now() - last_print > absl::Seconds(5)) {
      WriteStderrLine(line);
      last_print = absl::Now();
      last_line = line;
    }
    absl::Duration nap = absl::Milliseconds(250);
    if (!stopping() && next_event < plan->events.size()) {
      nap = std::min(
          nap, std::max(absl::ZeroDuration(),
                        plan->events[next_event].at - (absl::Now() - start)));
    }
    absl::SleepFor(nap);
  }
  // The state the nodes ended in, which the last line (at most 5 s old, or
  // a poll before the last node's final events) may not show.
  progress.Poll();
  const std::string final_line =
      progress.Line(absl::ToDoubleSeconds(absl::Now() - start));
  if (tty) {
    std::fprintf(stderr, "\r%-110s\n", final_line.c_str());
  } else if (final_line != last_line) {
    WriteStderrLine(final_line);
  }
  // Events that never came due: every node had stopped before them.
  if (!stopping()) {
    for (; next_event < plan->events.size(); ++next_event) {
      RecordFault(plan->events[next_event], -1, "every node had stopped",
                  &merge);
    }
  }
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  if (g_sim_signal.load() != 0) {
    WriteStderrLine(
        absl::StrCat("starling sim: interrupted; node logs and "
                     "checkpoints are in ",
                     dir, "/n*/"));
    return 1;
  }
  if (failed >= 0) {
    const std::string log = absl::StrCat(dir, "/", ids[failed], "/node.log");
    // Its error, or else its last line: the swarm's threads may log after
    // the error, while the node shuts down.
    std::string last, error;
    if (absl::StatusOr<std::string> text = ReadFile(log); text.ok()) {
      for (absl::string_view l :
           absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
        last = std::string(l);
        if (absl::StrContains(l, "starling node: error:")) error = last;
      }
    }
    if (!error.empty()) last = error;
    // 128 + N: killed by signal N, so its log cannot say why. SIGKILL that
    // nobody here sent is most often the kernel's out-of-memory killer.
    std::string how = absl::StrCat("failed (exit ", failed_code, ")");
    if (failed_code > 128) {
      const int sig = failed_code - 128;
      how = absl::StrCat("was killed by signal ", sig, " (", strsignal(sig),
                         sig == SIGKILL
                             ? "; kill -9 or the kernel's out-of-memory "
                               "killer: see dmesg, or lower --batch or the "
                               "model size"
                             : "",
                         "); its last log line");
    }
    WriteStderrLine(absl::StrCat("starling sim: node ", ids[failed], " ", how,
                                 ": ", last, "\n  its log: ", log));
    // A node that refused its flags, config or input (exit 2) makes it the
    // sim's too; anything else is a failure at run time.
    return failed_code == 2 ? 2 : 1;
  }
  JsonObject sim_cfg;
  sim_cfg.Add("nodes", static_cast<int64_t>(n))
      .Add("algo", absl::GetFlag(FLAGS_algo))
      .Add("inner_steps",
           static_cast<int64_t>(absl::GetFlag(FLAGS_inner_steps)))
      .Add("outer", absl::GetFlag(FLAGS_outer))
      .Add("outer_lr", absl::GetFlag(FLAGS_outer_lr))
      .Add("outer_momentum", absl::GetFlag(FLAGS_outer_momentum))
      .Add("run_id", run_id);
  if (!plan->empty()) {
    JsonArray joiners;
    for (const std::string& j : plan->joiners) joiners.Push(j);
    sim_cfg.Add("joiners", joiners)
        .Add("kill", absl::GetFlag(FLAGS_kill))
        .Add("restart", absl::GetFlag(FLAGS_restart))
        .Add("join", absl::GetFlag(FLAGS_join))
        .Add("leave", absl::GetFlag(FLAGS_leave))
        .Add("partition", absl::GetFlag(FLAGS_partition));
  }
  if (!slow->empty()) sim_cfg.Add("slow", absl::GetFlag(FLAGS_slow));
  if (!drift->empty()) sim_cfg.Add("drift", drift_flag);
  if (links->shaped()) {
    sim_cfg.Add("link_bandwidth_mbps", absl::GetFlag(FLAGS_link_bandwidth_mbps))
        .Add("link_latency_ms", absl::GetFlag(FLAGS_link_latency_ms));
  }
  merge.dir = dir;
  merge.ids = started;
  merge.start = start;
  merge.wall = wall;
  if (absl::Status s = MergeOutputs(merge, config, sim_cfg); !s.ok()) {
    return Fail(s, 1);
  }
  absl::StatusOr<Struct> summary = ReadJsonFile(dir + "/summary.json");
  if (summary.ok()) {
    const Struct& fin = Get(*summary, "final").struct_value();
    std::vector<int64_t> split;
    for (const Value& v : Get(fin, "split_rounds").list_value().values()) {
      split.push_back(static_cast<int64_t>(v.number_value()));
    }
    const Value& final_agree = Get(fin, "final_models_agree");
    WriteStderrLine(absl::StrFormat(
        "done: val_loss %s | sent %s (per-step all-reduce: %s, %.1fx less) | "
        "hashes agree: %s | %s\n  report: %s/report.html",
        ToJson(Get(fin, "val_loss")),
        FormatBytes(Get(fin, "total_bytes").number_value()),
        FormatBytes(Get(fin, "allreduce_equivalent_bytes").number_value()),
        Get(fin, "comm_reduction").number_value(),
        absl::GetFlag(FLAGS_algo) == "gossip"
            ? "n/a (gossip: each node keeps its own model)"
            : AgreementText(split,
                            final_agree.kind_case() == Value::kBoolValue
                                ? std::optional<bool>(final_agree.bool_value())
                                : std::nullopt),
        FormatDuration(wall), dir));
  }
  return 0;
}

}  // namespace starling
