#include "node/sim_command.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/checkpoint.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/trainer.h"
#include "gossip/peer_credentials.h"
#include "node/faults.h"
#include "node/flags.h"
#include "node/node_command.h"
#include "node/node_flags.h"
#include "node/node_run.h"
#include "node/run_output.h"
#include "node/sim_events.h"
#include "node/sim_merge.h"
#include "node/sim_processes.h"
#include "node/sim_run.h"
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
ABSL_FLAG(std::string, nat, "",
          "sim: nodes behind emulated NAT: ID[,ID...], e.g. n2,n3. Each "
          "advertises a loopback port where nothing listens (a connection "
          "is refused, as NAT refuses one from outside), joins through the "
          "other nodes and is nobody's seed, so peers reach it only through "
          "a relay (--relay). At least one starting node stays reachable");
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

int Fail(const absl::Status& s, int code) {
  WriteStderrLine(absl::StrCat("starling sim: error: ", s.message()));
  return code;
}

// Whether `starling node` accepts --NAME (the sim runs the same binary).
bool NodeAccepts(absl::string_view name) {
  const std::vector<std::string>& names = NodeFlagNames();
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Flags of `starling sim` itself, never passed to the nodes.
const std::vector<std::string>& SimOnlyFlagNames() {
  static const auto* names = new std::vector<std::string>{
      "nodes",           "kill",  "restart", "join",  "leave",
      "partition",       "nat",   "slow",    "drift", "link_bandwidth_mbps",
      "link_latency_ms", "poison"};
  return *names;
}

// The node flags the sim sets per node.
bool SetPerNode(absl::string_view name) {
  return name == "listen" || name == "advertise" || name == "peers" ||
         name == "node_id" || name == "min_members" ||
         name == "partition_file" || name == "test_crash_at" ||
         name == "test_poison" ||
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
    auto* sub = new Subcommand{
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
    sub->help["metrics_port"] =
        "serve each node's Prometheus metrics (GET /metrics) on 127.0.0.1: "
        "node K (n0, n1, ..., then the joiners) on port P+K, e.g. 9100 "
        "gives n0 9100 and n3 9103; 0 = each node any free port (logged in "
        "its node.log), -1 = off";
    sub->help["health_port"] =
        "serve each node's gRPC health checks on 127.0.0.1: node K on port "
        "P+K; 0 = any free port, -1 = off";
    return sub;
  }();
  return *sub;
}

namespace {

// The sim's flags, checked: what the run and its nodes need.
struct SimSetup {
  int nodes = 0;                 // --nodes
  std::vector<std::string> ids;  // n0 .. n{nodes-1}, then the joiners
  FaultPlan plan;
  // Nodes learn their id, quorum and partition file once `starling node`
  // has elastic membership; fault injection needs it.
  bool elastic = false;
  TrainConfig config;      // --drift cleared: each node gets its own
  std::string drift_flag;  // the sim's --drift=IDS@STEP
  std::map<std::string, double> slow;
  std::map<std::string, std::string> poison;
  std::map<std::string, int64_t> drift;
  std::set<std::string> nat;  // --nat
  SimLinks links;
  // The nodes talk over 127.0.0.1: plaintext (the sim adds --insecure)
  // unless a --tls_* flag asks for TLS.
  bool plaintext = false;
};

// --metrics_port=P and --health_port=P give node K port P+K: the last
// node's must exist.
absl::Status CheckSimPorts(int nodes) {
  for (const auto& [name, base] :
       {std::pair<const char*, int>{"metrics_port",
                                    absl::GetFlag(FLAGS_metrics_port)},
        {"health_port", absl::GetFlag(FLAGS_health_port)}}) {
    if (base > 0 && base + nodes - 1 > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, "=", base, ": the sim gives node K port ", base,
          "+K, and its ", nodes, " nodes would need ports up to ",
          base + nodes - 1, ", past 65535; choose a lower port"));
    }
  }
  return absl::OkStatus();
}

// --nodes, the fault plan and the per-node specs.
absl::Status ParseSimFlags(SimSetup* s) {
  s->nodes = absl::GetFlag(FLAGS_nodes);
  if (s->nodes < 1 || s->nodes > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nodes=", s->nodes, ": must be in [1, 64]"));
  }
  for (int i = 0; i < s->nodes; ++i) s->ids.push_back(absl::StrCat("n", i));
  STARLING_ASSIGN_OR_RETURN(
      s->plan,
      ParseFaultPlan({absl::GetFlag(FLAGS_kill), absl::GetFlag(FLAGS_restart),
                      absl::GetFlag(FLAGS_join), absl::GetFlag(FLAGS_leave),
                      absl::GetFlag(FLAGS_partition)},
                     s->ids));
  s->elastic = NodeAccepts("node_id") && NodeAccepts("min_members") &&
               NodeAccepts("partition_file");
  if (!s->plan.empty() && !s->elastic) {
    return absl::InvalidArgumentError(
        "--kill/--restart/--join/--leave/--partition: this `starling node` "
        "has no elastic membership (--node_id, --min_members, "
        "--partition_file), so it cannot survive faults");
  }
  for (const std::string& j : s->plan.joiners) s->ids.push_back(j);
  s->config = ConfigFromFlags();
  // In the sim --drift is IDS@STEP; each node gets its own --drift.
  s->drift_flag = s->config.drift();
  s->config.set_drift("");
  STARLING_ASSIGN_OR_RETURN(s->slow,
                            ParseSlowSpec(absl::GetFlag(FLAGS_slow), s->ids));
  STARLING_ASSIGN_OR_RETURN(
      s->poison, ParsePoisonSpec(absl::GetFlag(FLAGS_poison), s->ids));
  STARLING_ASSIGN_OR_RETURN(s->drift, ParseDriftSpec(s->drift_flag, s->ids));
  STARLING_ASSIGN_OR_RETURN(
      s->nat, ParseNatSpec(absl::GetFlag(FLAGS_nat), s->ids, s->nodes));
  if (!s->nat.empty() && !s->elastic) {
    return absl::InvalidArgumentError(
        "--nat: this `starling node` has no elastic membership, so its "
        "members cannot relay");
  }
  STARLING_ASSIGN_OR_RETURN(
      s->links, ParseSimLinks(absl::GetFlag(FLAGS_link_bandwidth_mbps),
                              absl::GetFlag(FLAGS_link_latency_ms), s->ids));
  return CheckSimPorts(static_cast<int>(s->ids.size()));
}

// What every node would check after its data load, checked once here,
// before the run directory and the node processes exist.
absl::Status CheckNodesCanStart(SimSetup* s) {
  STARLING_RETURN_IF_ERROR(ResolveTrainConfig(&s->config));
  NodeConfig node;
  node.train = s->config;
  STARLING_RETURN_IF_ERROR(ParseNodeFlags(&node));
  // The data and model, which every node loads: a missing file, an unknown
  // model, or a run whose nodes (joiners included) cannot fit in memory at
  // their peak: the trainer, what the algorithm keeps, a round's exchange
  // or a checkpoint (core/memory.h).
  STARLING_RETURN_IF_ERROR(CheckTrainConfig(
      s->config, static_cast<int>(s->ids.size()), NodeMemoryPlan(node)));
  // main() keeps up to 512 MiB of freed heap for the all-reduce; the probe
  // model's was the sim's only large allocation, so give it back rather
  // than hold it for the whole run (588 MB of RSS with --width=1024
  // --layers=8).
  malloc_trim(0);
  // The nodes' TLS files and join token.
  PeerSecurityOptions security = PeerSecurityFromFlags();
  s->plaintext = !security.asks_for_tls();
  if (s->plaintext) security.insecure = true;
  security.node_id.clear();            // each node's is its own
  security.listen_host = "127.0.0.1";  // every node's --listen host
  STARLING_RETURN_IF_ERROR(CheckPeerSecurity(security));
  // Off by default here (every node gets the same certificate): only an
  // explicit --tls_bind_node_ids asks for it.
  if (FlagGiven("tls_bind_node_ids") && security.tls_bind_node_ids) {
    return absl::InvalidArgumentError(
        "--tls_bind_node_ids: starling sim gives every node the same "
        "--tls_cert, which cannot name each node's id; use it with "
        "starling node, one certificate per node");
  }
  return absl::OkStatus();
}

// --out (runs/sim-TIMESTAMP by default) and --resume against what it
// holds; then makes it.
absl::Status PrepareRunDirectory(SimSetup* s) {
  TrainConfig& config = s->config;
  if (config.out().empty()) {
    config.set_out(absl::StrCat(
        "runs/sim-",
        absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone())));
  }
  const std::string dir = config.out();
  if (!config.resume() &&
      (FileExists(dir + "/n0") || FileExists(dir + "/summary.json"))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out=", dir,
                     " already holds a sim run; pass --resume to continue "
                     "it, or choose another --out"));
  }
  if (config.resume()) {
    // Every node resumes from its own checkpoint: a run that never
    // checkpointed (or another --out) fails here, not in each node.
    std::vector<std::string> missing;
    for (int i = 0; i < s->nodes; ++i) {
      const std::string ckpt =
          CheckpointPathInRunDir(absl::StrCat(dir, "/", s->ids[i]));
      if (!FileExists(ckpt)) missing.push_back(ckpt);
    }
    if (!missing.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--resume: --out=", dir, " holds no checkpoint for ", missing.size(),
          " of its ", s->nodes, " nodes (", absl::StrJoin(missing, ", "),
          "); check --out and --nodes, or start the run again without "
          "--resume"));
    }
  }
  return CheckOutWritable(dir);
}

// Everything that a bad flag, config, input or --out fails (exit 2). --out
// comes before the data and model checks, which may take long (a large
// model, the KJV download): an unwritable directory fails at once. A run
// directory made here is removed again when a later check fails.
absl::StatusOr<SimSetup> CheckSim() {
  SimSetup s;
  STARLING_RETURN_IF_ERROR(ParseSimFlags(&s));
  const std::string out = s.config.out();
  const bool existed = !out.empty() && FileExists(out);
  STARLING_RETURN_IF_ERROR(PrepareRunDirectory(&s));
  if (absl::Status st = CheckNodesCanStart(&s); !st.ok()) {
    if (!existed) (void)::rmdir(s.config.out().c_str());
    return st;
  }
  return s;
}

// The run id every node gets: --run_id, or a fresh one for the default.
std::string SimRunId() {
  std::string run_id = absl::GetFlag(FLAGS_run_id);
  if (run_id == "starling") {
    run_id = absl::StrCat("sim-", absl::ToUnixMillis(absl::Now()));
  }
  return run_id;
}

// Each node's --gpu_memory_fraction: as given, or, for nodes sharing a GPU
// (--device=cuda), an equal share of 90% of its memory for every node the
// sim may run at once (joiners included): the rest is for the processes'
// CUDA contexts, which the cap does not count.
double NodeGpuMemoryFraction(const SimSetup& s) {
  const double given = s.config.gpu_memory_fraction();
  if (given > 0 || s.config.device() == "cpu") return given;
  return 0.9 / static_cast<double>(std::max<size_t>(1, s.ids.size()));
}

// Flags every node gets: the current value of each training and node flag
// that the sim does not set per node.
std::vector<std::string> CommonNodeFlags(const SimSetup& s,
                                         const std::string& run_id) {
  std::vector<std::string> common;
  const std::vector<std::string>& sim_only = SimOnlyFlagNames();
  for (const std::string& name : SimSubcommand().flags) {
    if (std::find(sim_only.begin(), sim_only.end(), name) != sim_only.end() ||
        name == "out" || name == "run_id" || name == "threads" ||
        name == "gpu_memory_fraction" || name == "tls_bind_node_ids" ||
        name == "metrics_port" || name == "health_port") {
      continue;
    }
    absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
    if (f != nullptr) {
      common.push_back(absl::StrCat("--", name, "=", f->CurrentValue()));
    }
  }
  common.push_back("--tls_bind_node_ids=false");  // see CheckNodesCanStart
  common.push_back(absl::StrCat("--run_id=", run_id));
  common.push_back(absl::StrCat("--threads=", std::max(1, s.config.threads())));
  common.push_back(
      absl::StrCat("--gpu_memory_fraction=", NodeGpuMemoryFraction(s)));
  // Plaintext unless TLS was asked for (then --tls_* reach every node above).
  if (s.plaintext) common.push_back("--insecure=true");
  return common;
}

// Gossip's model snapshots for the consensus distance, unless
// --snapshot_every was given: the default cadence, or 0 for none.
int DefaultSnapshotEvery(const TrainConfig& config) {
  if (absl::GetFlag(FLAGS_algo) != "gossip") return 0;
  const absl::CommandLineFlag* f = absl::FindCommandLineFlag("snapshot_every");
  if (f == nullptr || f->CurrentValue() != "0") return 0;
  return config.eval_every() > 0 ? config.eval_every()
                                 : std::max(1, config.steps() / 10);
}

// The partition file, the ports and each node's command line (exit 1 on
// failure: the flags were fine).
absl::StatusOr<NodeLaunch> PrepareLaunch(const SimSetup& s,
                                         const std::string& run_id) {
  NodeLaunch launch;
  launch.dir = s.config.out();
  launch.ids = s.ids;
  launch.initial = s.nodes;
  launch.elastic = s.elastic;
  launch.partition_file = launch.dir + "/partition";
  if (s.elastic) {
    STARLING_RETURN_IF_ERROR(WriteFileAtomic(launch.partition_file, ""));
  }
  STARLING_ASSIGN_OR_RETURN(std::vector<int> ports,
                            PickLoopbackPorts(static_cast<int>(s.ids.size())));
  for (int p : ports) {
    launch.addresses.push_back(absl::StrCat("127.0.0.1:", p));
  }
  // Ranks follow the sorted member list; sorting here makes node K rank K.
  std::sort(launch.addresses.begin(), launch.addresses.end());
  if (!s.nat.empty()) {
    STARLING_ASSIGN_OR_RETURN(std::vector<int> closed,
                              HoldClosedLoopbackPorts(s.nat.size()));
    size_t k = 0;
    for (const std::string& id : s.nat) {
      launch.nat_advertise[id] = absl::StrCat("127.0.0.1:", closed[k++]);
    }
  }
  launch.slow = s.slow;
  launch.poison = s.poison;
  launch.drift = s.drift;
  launch.links = s.links;
  launch.common = CommonNodeFlags(s, run_id);
  launch.snapshot_every = DefaultSnapshotEvery(s.config);
  launch.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  launch.health_port = absl::GetFlag(FLAGS_health_port);
  return launch;
}

void SayStart(const SimSetup& s, const std::string& run_id) {
  WriteStderrLine(absl::StrFormat(
      "starling sim: %d nodes (%s), %s on %s, %d steps per node, run %s -> %s",
      s.nodes, absl::GetFlag(FLAGS_algo), s.config.model(), s.config.data(),
      s.config.steps(), run_id, s.config.out()));
  if (!s.plan.empty()) {
    WriteStderrLine(absl::StrFormat(
        "starling sim: %d fault events planned; joiners: %s",
        s.plan.events.size(),
        s.plan.joiners.empty() ? "none" : absl::StrJoin(s.plan.joiners, ", ")));
  }
}

// summary.json's "sim": how the sim ran its nodes.
JsonObject SimConfigJson(const SimSetup& s, const std::string& run_id) {
  JsonObject sim_cfg;
  sim_cfg.Add("nodes", static_cast<int64_t>(s.nodes))
      .Add("algo", absl::GetFlag(FLAGS_algo))
      .Add("inner_steps",
           static_cast<int64_t>(absl::GetFlag(FLAGS_inner_steps)))
      .Add("outer", absl::GetFlag(FLAGS_outer))
      .Add("outer_lr", absl::GetFlag(FLAGS_outer_lr))
      .Add("outer_momentum", absl::GetFlag(FLAGS_outer_momentum))
      .Add("run_id", run_id);
  if (!s.plan.empty()) {
    JsonArray joiners;
    for (const std::string& j : s.plan.joiners) joiners.Push(j);
    sim_cfg.Add("joiners", joiners)
        .Add("kill", absl::GetFlag(FLAGS_kill))
        .Add("restart", absl::GetFlag(FLAGS_restart))
        .Add("join", absl::GetFlag(FLAGS_join))
        .Add("leave", absl::GetFlag(FLAGS_leave))
        .Add("partition", absl::GetFlag(FLAGS_partition));
  }
  if (!s.slow.empty()) sim_cfg.Add("slow", absl::GetFlag(FLAGS_slow));
  if (!s.drift.empty()) sim_cfg.Add("drift", s.drift_flag);
  if (s.links.shaped()) {
    sim_cfg.Add("link_bandwidth_mbps", absl::GetFlag(FLAGS_link_bandwidth_mbps))
        .Add("link_latency_ms", absl::GetFlag(FLAGS_link_latency_ms));
  }
  return sim_cfg;
}

// Names the failed node and its log. A node that refused its flags, config
// or input (exit 2) makes it the sim's too; anything else is a failure at
// run time (1).
int ReportFailedNode(const SimSetup& s, const SimRunResult& run) {
  const std::string& id = s.ids[run.failed];
  const std::string log = NodeLogPath(s.config.out(), id);
  absl::StatusOr<std::string> text = ReadFile(log);
  WriteStderrLine(
      FailedNodeMessage(id, run.failed_code, text.ok() ? *text : "", log));
  return run.failed_code == 2 ? 2 : 1;
}

// Merges the nodes' outputs and says how the run went.
int MergeAndReport(const SimSetup& s, const std::string& run_id,
                   SimRunResult run, double wall) {
  const std::string& dir = s.config.out();
  MergeInput merge;
  merge.dir = dir;
  merge.ids = run.started;
  merge.initial_nodes = s.nodes;
  merge.algo = absl::GetFlag(FLAGS_algo);
  merge.start = run.start;
  merge.wall = wall;
  merge.faults = std::move(run.faults);
  if (absl::Status st = MergeOutputs(merge, s.config, SimConfigJson(s, run_id));
      !st.ok()) {
    return Fail(st, 1);
  }
  absl::StatusOr<google::protobuf::Struct> summary =
      ReadJsonFile(dir + "/summary.json");
  if (!summary.ok()) return 0;
  WriteStderrLine(DoneLine(*summary, merge.algo, wall, dir));
  const google::protobuf::Struct& fin =
      FieldOf(*summary, "final").struct_value();
  return FieldOf(fin, "nodes_apart").list_value().values_size() > 0
             ? kExitEndedApart
             : 0;
}

}  // namespace

int RunSimCommand() {
  absl::StatusOr<SimSetup> setup = CheckSim();
  if (!setup.ok()) return Fail(setup.status(), 2);
  const std::string run_id = SimRunId();
  absl::StatusOr<NodeLaunch> launch = PrepareLaunch(*setup, run_id);
  if (!launch.ok()) return Fail(launch.status(), 1);
  InstallStopSignals();
  SayStart(*setup, run_id);
  absl::StatusOr<SimRunResult> run = RunSimNodes(
      *std::move(launch), setup->plan,
      {setup->config.steps(), absl::GetFlag(FLAGS_algo) == "gossip"});
  if (!run.ok()) return Fail(run.status(), 1);
  const double wall = absl::ToDoubleSeconds(absl::Now() - run->start);
  if (StopSignal() != 0) {
    WriteStderrLine(absl::StrCat(
        "starling sim: interrupted; node logs and checkpoints are in ",
        setup->config.out(), "/n*/"));
    return 1;
  }
  if (run->failed >= 0) return ReportFailedNode(*setup, *run);
  return MergeAndReport(*setup, run_id, *std::move(run), wall);
}

}  // namespace starling
