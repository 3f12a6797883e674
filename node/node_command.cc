#include "node/node_command.h"

#include <grpc/support/log.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "compression/codec.h"
#include "compression/tensor_policy.h"
#include "core/checkpoint.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/logging.h"
#include "core/status.h"
#include "gossip/crash_point.h"
#include "gossip/grpc_transport.h"
#include "gossip/link_shaper.h"
#include "gossip/peer_credentials.h"
#include "gossip/ring_allreduce.h"
#include "gossip/swarm.h"
#include "node/faults.h"
#include "node/health.h"
#include "node/metrics.h"
#include "node/run_output.h"
#include "node/train_command.h"
#include "outer_opt/outer_optimizer.h"
#include "outer_opt/robust_aggregate.h"
#include "outer_opt/sync_policy.h"
#include "outer_opt/weighting.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "host:port this node serves peers on; with --peers it must name a "
          "fixed port that the peers list too");
ABSL_FLAG(std::string, peers, "",
          "comma-separated host:port of members to join through. diloco: "
          "any live members (empty: this node starts the swarm); ddp: "
          "every other member (ranks follow the sorted list of all)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) this node presents to peers; with "
          "--tls_key and --tls_ca all peer traffic uses TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate(s): a peer's certificate must chain to one, "
          "and its name match the host it is reached at (or "
          "--tls_server_name)");
ABSL_FLAG(bool, tls_require_client_cert, false,
          "mutual TLS: refuse peers that connect without a certificate that "
          "chains to --tls_ca");
ABSL_FLAG(std::string, tls_server_name, "",
          "the name every peer's certificate must carry, instead of the host "
          "of its address (one certificate for the whole swarm)");
ABSL_FLAG(bool, tls_bind_node_ids, false,
          "diloco and gossip, with --tls_require_client_cert: each member's "
          "certificate names its --node_id (as CN or a DNS subjectAltName), "
          "and a join, gossip, round message or push sent under a member's "
          "id is refused unless the caller's certificate names that id");
ABSL_FLAG(bool, insecure, false,
          "plaintext peer traffic, without TLS: only on a network you trust "
          "(the node logs a warning); one of --insecure or --tls_cert/"
          "--tls_key/--tls_ca is required");
ABSL_FLAG(std::string, join_token_file, "",
          "file holding the swarm secret (16+ bytes, e.g. from `openssl "
          "rand -hex 32`): every call to and from this node proves it knows "
          "it (HMAC of a timestamp and a nonce; the secret never travels, a "
          "captured call cannot be replayed) and calls without the proof are "
          "refused UNAUTHENTICATED; empty: no admission check");
ABSL_FLAG(double, peer_rate_limit, 1000,
          "incoming calls per second each peer host may make (bursts of "
          "twice as many); beyond it calls are refused RESOURCE_EXHAUSTED "
          "and logged once a minute per host; 0 = no limit");
ABSL_FLAG(int, peer_max_streams, 256,
          "incoming streams (tensor chunks, pushes, state transfers) each "
          "peer host may have open at once, across all its connections; "
          "beyond it streams are refused RESOURCE_EXHAUSTED and logged once "
          "a minute per host; 0 = no limit. A sim's nodes share one host");
ABSL_FLAG(double, stream_idle_timeout, 60,
          "seconds an incoming stream (tensor chunks, pushes, state "
          "transfer) may go without a message before this node cancels it, "
          "so a slow-loris peer cannot hold it open; chunk streams also end "
          "after the round's deadline, a state transfer after 10 minutes "
          "(the joiner resumes)");
ABSL_FLAG(std::string, run_id, "starling",
          "peers must share it; the handshake refuses others");
ABSL_FLAG(std::string, algo, "diloco",
          "diloco (H inner steps, then an outer step) | ddp (all-reduce of "
          "gradients every step, the synchronous data-parallel baseline) | "
          "gossip (asynchronous push-sum gossip: after H inner steps, "
          "average with one peer; no rounds, no barrier)");
ABSL_FLAG(int, inner_steps, 50, "diloco: H, inner steps per round");
ABSL_FLAG(std::string, outer, "nesterov",
          "diloco outer optimizer: nesterov | average (lr 1, no momentum)");
ABSL_FLAG(double, outer_lr, 0.7, "diloco: outer learning rate");
ABSL_FLAG(double, outer_momentum, 0.9, "diloco: outer Nesterov momentum");
ABSL_FLAG(int, connect_timeout, 60,
          "seconds to keep retrying (with backoff) to reach every peer");
ABSL_FLAG(int, round_timeout, 300,
          "seconds one ring step of a round may wait for a peer (diloco: "
          "also the longest one attempt of a round may run)");
ABSL_FLAG(int, chunk_bytes, 1 << 20,
          "tensor stream chunk size in bytes (1 MiB; at most 4 MiB); over "
          "an emulated slow link, chunks are cut smaller so each arrives "
          "within a quarter of --stream_idle_timeout");
ABSL_FLAG(std::string, link_bandwidth_mbps, "",
          "emulated link bandwidth in megabits (1e6 bits) per second, 0 or "
          "empty = unlimited; each link is a token bucket over the bytes "
          "actually sent (tensor messages and gossip pushes; control RPCs "
          "are not shaped). node: DEFAULT[,HOST:PORT=MBPS...]: DEFAULT for "
          "the link to every peer, MBPS for the link to the peer at "
          "HOST:PORT, e.g. 100,127.0.0.1:7001=10. sim: "
          "DEFAULT[,ID=MBPS...][,ID-ID=MBPS...] with node ids: ID=MBPS "
          "applies to every link from or to that node (when both ends have "
          "one, the smaller wins), ID-ID=MBPS to both directions between "
          "the two and overrides the others, e.g. 100,n3=10,n0-n1=1000");
ABSL_FLAG(std::string, link_latency_ms, "",
          "emulated link latency in milliseconds (at most 60000), added once "
          "per message (tensor message or gossip push) before it is sent; 0 "
          "or empty = none. Same forms as --link_bandwidth_mbps: node "
          "DEFAULT[,HOST:PORT=MS...], sim DEFAULT[,ID=MS...][,ID-ID=MS...] "
          "(when both ends of a link have an ID value, the larger wins), "
          "e.g. 50,n3=200");
ABSL_FLAG(std::string, compression, "fp32",
          "diloco pseudo-gradient codec, and gossip push codec (lossy: a "
          "push carries the difference to the peer's copy of the last push): "
          "fp32 | fp16 | bf16 | int8[:BLOCK] | int4[:BLOCK] | "
          "topk:FRACTION[+int8|+fp16], each optionally +zstd, e.g. int8, "
          "int8+zstd, topk:0.01+int8");
ABSL_FLAG(bool, overlap, false,
          "diloco: delayed outer update (overlap of communication with "
          "compute): after a round's inner steps, start the next round's at "
          "once, from θ_global without that round's update, and apply the "
          "update when the next round ends. Hides the exchange behind compute "
          "at the cost of one round of staleness. Rounds stay synchronous "
          "while members change, at checkpoints and at the last round. Needs "
          "a fixed H");
ABSL_FLAG(std::string, error_feedback, "auto",
          "auto (on for int4 and topk, off otherwise) | on | off: keep what "
          "the codec dropped and add it to the next round's pseudo-gradient. "
          "DiLoCo keeps it in the node's own model (which trains from "
          "θ_global minus it) and, after the last round, averages the "
          "members' residuals in one more round (the codec's own, int8 after "
          "topk), so θ_global ends as the average of their models; with "
          "--overlap it shrinks with the learning rate instead (see the "
          "README)");
ABSL_FLAG(int, small_tensor_elems, 4096,
          "with a lossy --compression, tensors with fewer elements (norms, "
          "biases) use --small_tensor_codec instead");
ABSL_FLAG(std::string, small_tensor_codec, "bf16",
          "codec for small tensors: bf16 | fp16 | fp32");
ABSL_FLAG(std::string, node_id, "",
          "diloco: this node's id in the swarm, unique and stable across "
          "restarts (default: the --listen address)");
ABSL_FLAG(int, min_members, 1,
          "diloco and gossip: wait (up to --connect_timeout) until this "
          "many members (this one included) have joined, before the first "
          "step; one that joined and has since left still counts");
ABSL_FLAG(double, suspect_timeout, 3,
          "diloco: seconds without a heartbeat before a member is suspected; "
          "as long again and it is declared dead");
ABSL_FLAG(double, round_deadline, 60,
          "diloco: seconds the round's coordinator waits, after the first "
          "member is ready, for the others; later ones sit the round out");
ABSL_FLAG(std::string, partition_file, "",
          "diloco: emulated network partition (used by `starling sim "
          "--partition`): while the file's first line reads e.g. "
          "'n0,n1|n2,n3', no traffic crosses the groups");
ABSL_FLAG(std::string, gossip_peers, "random",
          "gossip: whom a push goes to: random (a random live member) | "
          "exponential (the sorted live ids' exponential graph: offsets "
          "1, 2, 4, ... in turn)");
ABSL_FLAG(double, gossip_timeout, 5,
          "gossip: seconds one push may take before the node restores its "
          "weight and tries another peer (also how long a receiver keeps a "
          "stalled incoming push)");
ABSL_FLAG(double, gossip_momentum, 0,
          "gossip: SlowMo-style outer momentum β on the gossiped update "
          "(0 = off, plain gossip)");
ABSL_FLAG(double, gossip_outer_lr, 1,
          "gossip: outer learning rate α of that update (1 = plain gossip)");
ABSL_FLAG(int, snapshot_every, 0,
          "gossip: write this node's model every N steps to "
          "OUT/snapshots/step_N.bin (flat fp32) for `starling sim`'s "
          "consensus distance; 0 = off");
ABSL_FLAG(std::string, test_crash_at, "",
          "testing only: SIGKILL this node at a protocol point "
          "(ready|send|reduce|all_gather|done|donate|commit|commit_partial"
          "[@ROUND]; gossip: "
          "push_mid_stream[@PUSH]), or "
          "corrupt_state to flip a bit in one served state chunk; "
          "freeze:POINT[@ROUND] stops it there with SIGSTOP instead (a hung "
          "process whose connections stay open)");

ABSL_FLAG(std::string, aggregate, "mean",
          "diloco: how a round's pseudo-gradients are combined: mean (the "
          "ring all-reduce), trimmed_mean:K (per coordinate, drop the K "
          "lowest and K highest), median (per coordinate) or norm_clip:C "
          "(clip each to C x the round's median norm, then mean). Every "
          "mode but plain mean (and --norm_bound) sends each member's whole "
          "pseudo-gradient to every other member: (N-1)xP values per member "
          "instead of the ring's 2(N-1)/N xP");
ABSL_FLAG(double, norm_bound, 0,
          "diloco: drop a member's pseudo-gradient whose norm exceeds this "
          "multiple of the round's median norm (logged with the peer and the "
          "reason; the round goes on without it); 0 = off. Like "
          "--aggregate, it takes the all-gather path");
ABSL_FLAG(std::string, test_poison, "",
          "testing only: send a hostile pseudo-gradient in some rounds: "
          "MODE@FIRST-LAST[+...], MODE = nan | noise | xFACTOR, e.g. "
          "nan@2-4+x1000@5-7+noise@8-10");

ABSL_FLAG(double, round_seconds, 0,
          "diloco: bound each round by time: a member runs as many inner "
          "steps as fit in this many seconds (at least 1, at most "
          "--max_inner_steps when set), so a slow node no longer holds the "
          "fast ones back; pseudo-gradients are then FedNova-normalized "
          "(--weighting). 0: rounds of --inner_steps steps");
ABSL_FLAG(std::string, weighting, "auto",
          "diloco: how members' pseudo-gradients are averaged: samples "
          "(weighted by samples processed) or fednova (each Δ normalized by "
          "its inner steps, weighted by the node's data share, scaled back "
          "by the mean step count; unbiased when step counts differ). auto: "
          "fednova when step counts can differ (--round_seconds, or "
          "--min_inner_steps < --max_inner_steps), else samples");
ABSL_FLAG(int, min_inner_steps, 0,
          "diloco: adaptive sync: the shortest H (0: --inner_steps). With "
          "--min_inner_steps < --max_inner_steps, drift (Page-Hinkley on the "
          "training loss, or --divergence_threshold) ends the round early "
          "and sets H to the minimum; quiet rounds double it again, up to "
          "the maximum");
ABSL_FLAG(int, max_inner_steps, 0,
          "diloco: adaptive sync: the longest H (0: --inner_steps); with "
          "--round_seconds, the most inner steps a round may take");
ABSL_FLAG(std::string, drift_detector, "auto",
          "diloco: page_hinkley (a Page-Hinkley test on the de-trended "
          "training loss asks the swarm for an early sync when the loss "
          "shifts up), off, or auto (page_hinkley when --min_inner_steps < "
          "--max_inner_steps)");
ABSL_FLAG(double, divergence_threshold, 0,
          "diloco: model-space trigger (dynamic averaging): ask the swarm "
          "for an early sync when ‖θ_local − θ_global‖² exceeds this; 0: off");
ABSL_FLAG(int, health_port, -1,
          "serve grpc.health.v1.Health (services readiness and liveness, for "
          "Kubernetes gRPC probes) on this port of the --listen host; 0 = any "
          "free port (logged), -1 = off");
ABSL_FLAG(int, metrics_port, -1,
          "serve Prometheus metrics (GET /metrics) on this port of the "
          "--listen host; 0 = any free port (logged), -1 = off");
ABSL_FLAG(std::string, log_format, "text",
          "stderr lines: text | json (one JSON object per line with time, "
          "level, node, round, step, event, peer and msg)");
ABSL_FLAG(std::string, hosts, "",
          "a hosts(5)-style file (\"ADDRESS NAME...\" per line) that maps "
          "host names in --peers to addresses before DNS: for machines "
          "without the cluster's DNS");
ABSL_FLAG(double, found_after, 10,
          "diloco: seconds a node that is itself one of --peers (e.g. by its "
          "DNS name) waits for another seed to admit it before it founds the "
          "swarm alone");
ABSL_FLAG(bool, resume_if_exists, false,
          "continue from the checkpoint in --out when there is one (as "
          "--resume), start fresh otherwise: for restarting containers");
ABSL_FLAG(double, watchdog_multiple, 100,
          "liveness turns NOT_SERVING when no inner step completes within "
          "this many expected step times (measured)...");
ABSL_FLAG(double, watchdog_min_seconds, 60,
          "...and never sooner than this many seconds (waits for a round's "
          "sync or a state transfer get their own timeouts on top)");
ABSL_FLAG(std::string, test_stall, "",
          "testing only: STEP:SECONDS stalls the training loop after inner "
          "step STEP for SECONDS (liveness must notice)");

namespace starling {
namespace {

// --node_id, or the --listen address when it is not given.
std::string NodeIdFromFlags() {
  std::string id = absl::GetFlag(FLAGS_node_id);
  return id.empty() ? absl::GetFlag(FLAGS_listen) : id;
}

constexpr char kPseudoGrad[] = "pseudo_grad";
// Each member's whole pack, for --aggregate / --norm_bound.
constexpr char kPseudoGradWhole[] = "pseudo_grad_whole";
// DiLoCo with error feedback: the members' residuals, averaged once after
// the last round (NodeRun::ef_in_model).
constexpr char kResidualFlush[] = "residual_flush";
constexpr char kGrad[] = "grad";

int Fail(const absl::Status& s, int code) {
  LogEvent(LogLevel::kError, "error",
           absl::StrCat("starling node: error: ", s.message()));
  return code;
}

struct StaticMembers {
  std::vector<std::string> members;  // sorted; index = rank
  int rank = 0;
};

bool ValidHostPort(absl::string_view a) {
  size_t colon = a.rfind(':');
  int port = 0;
  return colon != absl::string_view::npos && colon > 0 &&
         absl::SimpleAtoi(a.substr(colon + 1), &port) && port >= 0 &&
         port < 65536;
}

absl::StatusOr<StaticMembers> ParseMembers(const std::string& listen,
                                           const std::string& peers) {
  StaticMembers m;
  auto valid = ValidHostPort;
  if (!valid(listen)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen=", listen, ": expected host:port"));
  }
  m.members.push_back(listen);
  for (absl::string_view p : absl::StrSplit(peers, ',', absl::SkipEmpty())) {
    if (!valid(p)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peers: '", p, "' is not host:port"));
    }
    m.members.emplace_back(p);
  }
  std::sort(m.members.begin(), m.members.end());
  if (std::adjacent_find(m.members.begin(), m.members.end()) !=
      m.members.end()) {
    return absl::InvalidArgumentError(
        "--peers lists an address twice (or this node's own --listen)");
  }
  if (m.members.size() > 1 && absl::EndsWith(listen, ":0")) {
    return absl::InvalidArgumentError(
        "--listen needs a fixed port when --peers is set (peers must know it)");
  }
  m.rank =
      static_cast<int>(std::find(m.members.begin(), m.members.end(), listen) -
                       m.members.begin());
  return m;
}

// Gradients of `params` as one flat fp32 vector (missing grads are zeros).
std::vector<float> FlattenGrads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    grads.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
  }
  return Flatten(grads);
}

absl::Status UnflattenGrads(const std::vector<float>& flat,
                            const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  return Unflatten(flat, grads);
}

// "host" of "host:port" ("[::1]:7070" -> "::1"); empty for ":port".
std::string HostOf(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

// Reads a hosts(5)-style file into name -> address.
absl::StatusOr<std::map<std::string, std::string>> ReadHosts(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hosts=", path, ": cannot read it"));
  }
  std::map<std::string, std::string> names;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    line = line.substr(0, line.find('#'));
    std::vector<std::string> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.empty()) continue;
    if (words.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--hosts=", path, ":", n, ": expected ADDRESS NAME..."));
    }
    for (size_t i = 1; i < words.size(); ++i) names[words[i]] = words[0];
  }
  return names;
}

// The node's operational side: health (with its watchdog) and metrics,
// each off when its port flag is -1, and the test-only stall.
struct NodeOps {
  std::unique_ptr<Watchdog> watchdog;
  std::unique_ptr<HealthServer> health;
  std::unique_ptr<NodeMetrics> metrics;
  int stall_step = -1;
  double stall_seconds = 0;

  void Step(const StepResult& r, int step) {
    if (step == stall_step) {
      LogEvent(
          LogLevel::kWarning, "test_stall",
          absl::StrCat("--test_stall: stalling for ", stall_seconds, " s"));
      absl::SleepFor(absl::Seconds(stall_seconds));
    }
    watchdog->Step(absl::Seconds(r.seconds));
    if (metrics) {
      metrics->InnerStep(r.seconds, r.tokens, r.loss);
      metrics->SetInnerLr(r.lr);
    }
  }
  void SetReady(bool ready) {
    if (health) health->SetReady(ready);
  }
};

absl::Status StartOps(const std::string& node_id, const std::string& algo,
                      const std::string& device, NodeOps* ops) {
  WatchdogOptions wo;
  wo.multiple = absl::GetFlag(FLAGS_watchdog_multiple);
  const double min_s = absl::GetFlag(FLAGS_watchdog_min_seconds);
  if (!(wo.multiple > 0) || !(min_s >= 0)) {
    return absl::InvalidArgumentError(
        "--watchdog_multiple must be > 0 and --watchdog_min_seconds >= 0");
  }
  wo.min_allowance = absl::Seconds(min_s);
  ops->watchdog = std::make_unique<Watchdog>(wo);
  if (std::string stall = absl::GetFlag(FLAGS_test_stall); !stall.empty()) {
    std::pair<std::string, std::string> parts = absl::StrSplit(stall, ':');
    if (!absl::SimpleAtoi(parts.first, &ops->stall_step) ||
        !absl::SimpleAtod(parts.second, &ops->stall_seconds) ||
        ops->stall_step < 1 || !(ops->stall_seconds > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--test_stall=", stall, ": expected STEP:SECONDS, e.g. 20:5"));
    }
  }
  std::string host = HostOf(absl::GetFlag(FLAGS_listen));
  if (host == "localhost") host = "127.0.0.1";
  if (host.empty()) host = "0.0.0.0";
  const int health_port = absl::GetFlag(FLAGS_health_port);
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  for (auto [name, port] :
       {std::pair<const char*, int>{"health_port", health_port},
        {"metrics_port", metrics_port}}) {
    if (port < -1 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, "=", port, ": expected a port, 0 (any) or -1 (off)"));
    }
  }
  if (health_port >= 0) {
    STARLING_ASSIGN_OR_RETURN(
        ops->health,
        HealthServer::Start(host, health_port, ops->watchdog.get()));
    LogEvent(LogLevel::kInfo, "health",
             absl::StrCat("health checks (readiness, liveness) on ",
                          ops->health->address()),
             {{"address", ops->health->address()}});
  }
  if (metrics_port >= 0) {
    BuildInfo info;
    info.version = STARLING_VERSION;
    info.torch = TORCH_VERSION;
    info.device = device;
    info.algo = algo;
    info.node_id = node_id;
    absl::StatusOr<std::unique_ptr<NodeMetrics>> m =
        NodeMetrics::Start(host, metrics_port, info);
    if (!m.ok()) {
      return absl::Status(
          m.status().code(),
          absl::StrCat("--metrics_port: ", m.status().message()));
    }
    ops->metrics = std::move(m).value();
    LogEvent(LogLevel::kInfo, "metrics",
             absl::StrCat("Prometheus metrics on http://",
                          ops->metrics->address(), "/metrics"),
             {{"address", ops->metrics->address()}});
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& NodeFlagNames() {
  static const auto* names =
      new std::vector<std::string>{"listen",
                                   "peers",
                                   "tls_cert",
                                   "tls_key",
                                   "tls_ca",
                                   "tls_require_client_cert",
                                   "tls_server_name",
                                   "tls_bind_node_ids",
                                   "insecure",
                                   "join_token_file",
                                   "peer_rate_limit",
                                   "peer_max_streams",
                                   "stream_idle_timeout",
                                   "run_id",
                                   "algo",
                                   "inner_steps",
                                   "outer",
                                   "outer_lr",
                                   "outer_momentum",
                                   "overlap",
                                   "connect_timeout",
                                   "round_timeout",
                                   "chunk_bytes",
                                   "link_bandwidth_mbps",
                                   "link_latency_ms",
                                   "compression",
                                   "error_feedback",
                                   "small_tensor_elems",
                                   "small_tensor_codec",
                                   "node_id",
                                   "min_members",
                                   "suspect_timeout",
                                   "round_deadline",
                                   "round_seconds",
                                   "weighting",
                                   "min_inner_steps",
                                   "max_inner_steps",
                                   "drift_detector",
                                   "divergence_threshold",
                                   "partition_file",
                                   "gossip_peers",
                                   "gossip_timeout",
                                   "gossip_momentum",
                                   "gossip_outer_lr",
                                   "snapshot_every",
                                   "test_crash_at",
                                   "aggregate",
                                   "norm_bound",
                                   "test_poison",
                                   "health_port",
                                   "metrics_port",
                                   "log_format",
                                   "hosts",
                                   "found_after",
                                   "resume_if_exists",
                                   "watchdog_multiple",
                                   "watchdog_min_seconds",
                                   "test_stall"};
  return *names;
}

const Subcommand& NodeSubcommand() {
  static const Subcommand* sub = [] {
    std::vector<std::string> flags = NodeFlagNames();
    for (const std::string& f : TrainFlagNames()) flags.push_back(f);
    return new Subcommand{
        "node",
        "join a swarm and train with DiLoCo (elastic), gossip (push-sum) or "
        "ddp (static)",
        "Runs one member of a swarm. DiLoCo (the default) is elastic: a node "
        "starts with its own --listen address and --peers naming any live "
        "members (none for the first), the same --run_id, --seed and model "
        "flags, its own --shard=K/N and a unique --node_id. It joins "
        "(handshake: protocol, run id, codec, model fingerprint), learns the "
        "others by gossip, fetches θ_global, the outer optimizer state and "
        "the round from a member if the swarm is ahead, then runs rounds of "
        "--inner_steps (H) inner steps. After each round the members that "
        "are ready by --round_deadline average their pseudo-gradients "
        "Δ = θ_global − θ_local (weighted, --weighting) by ring all-reduce "
        "and "
        "apply the outer step once the round's coordinator confirms that "
        "every member got the sum, so members stay bit-identical. A member "
        "that dies mid-round is dropped and the round rerun by the others; "
        "SIGINT/SIGTERM makes a node finish its round and leave (goodbye, "
        "checkpoint; a second signal leaves at once); "
        "--resume rejoins and catches up. The first member of each round "
        "evaluates. --algo=ddp all-reduces gradients every step over the "
        "fixed --peers list instead (every member lists all others). "
        "--algo=gossip joins the same way but runs asynchronous push-sum "
        "gossip (SGP): after every --inner_steps local steps a node averages "
        "in the models pushed to it, then pushes (model, half its weight) to "
        "one live peer (--gossip_peers); no rounds, no barrier, and a slow "
        "or dead peer never blocks anyone. Every member evaluates.\n\n"
        "Adaptive sync (DiLoCo): --round_seconds bounds each round by time "
        "so every member runs as many steps as fit (a slow node no longer "
        "holds the others back); --min_inner_steps/--max_inner_steps let a "
        "drift detector (Page-Hinkley on the training loss, "
        "--drift_detector) or --divergence_threshold ask the swarm for an "
        "early sync and shorten H, which quiet rounds lengthen again; "
        "--weighting averages unequal step counts (FedNova).\n\n"
        "Operations: --health_port serves gRPC health checks (readiness, "
        "liveness) for Kubernetes probes, --metrics_port Prometheus "
        "/metrics, --log_format=json one JSON object per stderr line; "
        "deploy/ runs nodes as a Kubernetes StatefulSet.\n\n"
        "Security: peer traffic uses TLS with --tls_cert, --tls_key and "
        "--tls_ca (PEM files; --tls_require_client_cert for mutual TLS), or "
        "plaintext with an explicit --insecure; one of the two is "
        "required. --join_token_file admits only peers that know the "
        "swarm's secret; --peer_rate_limit bounds each peer host's calls; "
        "--aggregate and --norm_bound drop or outvote hostile "
        "pseudo-gradients (every received tensor is checked for its size "
        "and for NaN/Inf).\n\n"
        "Example, two members on one machine (plaintext on loopback):\n"
        "  starling node --insecure --node_id=a --listen=127.0.0.1:7001 "
        "--shard=0/2 --out=runs/a\n"
        "  starling node --insecure --node_id=b --listen=127.0.0.1:7002 "
        "--peers=127.0.0.1:7001 --shard=1/2 --out=runs/b",
        flags};
  }();
  return *sub;
}

namespace {

// --overlap: true when the members this node sees alive are exactly those of
// the last committed round (`last`, which holds this node), so the next
// round's members are known and nobody is joining or gone.
bool SteadyMembers(const Swarm& swarm, std::vector<std::string> last,
                   const std::string& self) {
  if (last.empty()) return false;
  std::vector<std::string> alive = swarm.AlivePeers();
  alive.push_back(self);
  std::sort(alive.begin(), alive.end());
  std::sort(last.begin(), last.end());
  return alive == last;
}

// DiLoCo's adaptive sync (flags --round_seconds ... --divergence_threshold):
// how long a round runs on this node and how the members' Δ are averaged.
struct AdaptiveSync {
  double round_seconds = 0;  // 0: rounds of H steps
  int max_steps = 0;         // cap per round with round_seconds (0: none)
  Weighting weighting = Weighting::kSamples;
  std::optional<InnerStepController> h;  // H per round
  std::optional<PageHinkley> detector;
  std::optional<DivergenceTrigger> divergence;
};

absl::StatusOr<AdaptiveSync> ParseAdaptiveSync(int h) {
  AdaptiveSync a;
  a.round_seconds = absl::GetFlag(FLAGS_round_seconds);
  if (!(a.round_seconds >= 0) || !std::isfinite(a.round_seconds)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--round_seconds=", a.round_seconds, ": must be >= 0 (0: off)"));
  }
  InnerStepOptions io;
  io.min_steps = absl::GetFlag(FLAGS_min_inner_steps);
  io.max_steps = absl::GetFlag(FLAGS_max_inner_steps);
  if (io.min_steps < 0 || io.max_steps < 0) {
    return absl::InvalidArgumentError(
        "--min_inner_steps and --max_inner_steps must be >= 0 (0: "
        "--inner_steps)");
  }
  if (io.min_steps == 0)
    io.min_steps = std::min(h, io.max_steps > 0 ? io.max_steps : h);
  if (io.max_steps == 0) io.max_steps = std::max(h, io.min_steps);
  io.initial = std::clamp(h, io.min_steps, io.max_steps);
  absl::StatusOr<InnerStepController> c = InnerStepController::Create(io);
  if (!c.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--min_inner_steps=", absl::GetFlag(FLAGS_min_inner_steps),
        " --max_inner_steps=", absl::GetFlag(FLAGS_max_inner_steps),
        " (--inner_steps=", h, "): ", c.status().message()));
  }
  a.h = std::move(c).value();
  if (a.round_seconds > 0 && absl::GetFlag(FLAGS_max_inner_steps) > 0) {
    a.max_steps = io.max_steps;
  }
  const bool varying = a.round_seconds > 0 || a.h->adaptive();
  const std::string weighting = absl::GetFlag(FLAGS_weighting);
  if (weighting == "auto") {
    a.weighting = varying ? Weighting::kFedNova : Weighting::kSamples;
  } else {
    absl::StatusOr<Weighting> w = ParseWeighting(weighting);
    if (!w.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--weighting=", weighting, ": expected auto, samples or fednova"));
    }
    a.weighting = *w;
  }
  const std::string detector = absl::GetFlag(FLAGS_drift_detector);
  if (detector != "auto" && detector != "page_hinkley" && detector != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--drift_detector=", detector, ": expected auto, page_hinkley or off"));
  }
  if (detector == "page_hinkley" || (detector == "auto" && a.h->adaptive())) {
    a.detector.emplace(PageHinkleyOptions());
  }
  const double threshold = absl::GetFlag(FLAGS_divergence_threshold);
  if (!(threshold >= 0) || !std::isfinite(threshold)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--divergence_threshold=", threshold, ": must be >= 0 (0: off)"));
  }
  if (threshold > 0) {
    DivergenceTriggerOptions d;
    d.threshold = threshold;
    a.divergence.emplace(d);
  }
  return a;
}

// What both algorithms share once the flags are checked and the trainer is
// built (and restored on --resume).
struct NodeRun {
  TrainConfig config;
  std::string algo;
  int h = 50;
  int chunk = 1 << 20;
  std::string out, ckpt_path;
  Trainer* trainer = nullptr;
  NodeOps* ops = nullptr;
  std::vector<torch::Tensor> params;
  int64_t n_params = 0;
  std::unique_ptr<OuterOptimizer> outer;
  std::unique_ptr<PolicyCodec> param_policy, ring_policy;
  const PolicyCodec* ring_codec = nullptr;
  bool use_ef = false;
  std::unique_ptr<ErrorFeedback> feedback;
  // DiLoCo with error feedback (not --overlap): the residual e stays in the
  // node's own model, which trains from θ_global − e instead of θ_global, so
  // its inner steps do not derive again what it holds back. After the last
  // round the members average their residuals densely (flush_policy: the
  // codec itself, or int8 after top-k) and θ_global becomes the average of
  // their models (README, compression section). theta_global: the node's,
  // while it runs.
  bool ef_in_model = false;
  std::unique_ptr<PolicyCodec> flush_policy;
  const std::vector<float>* theta_global = nullptr;
  AdaptiveSync sync;
  int64_t round = 0;
  // DiLoCo: the weight of θ_global's lineage (Swarm::Lineage::member_rounds).
  int64_t member_rounds = 0;
  // Traffic of earlier sessions of a resumed run: sent, received, and the
  // pseudo-gradient bytes before/after compression.
  int64_t prior[4] = {0, 0, 0, 0};
  std::vector<RoundRecord> rounds;
  std::string init_hash;
  RingStats ring_stats;
  EvalResult eval;
  int evaluated_step = -1;
  // The emulated links to peers (null: none shaped).
  std::shared_ptr<LinkEmulator> links;
  // TLS (--tls_*) or plaintext (--insecure) for all peer traffic.
  PeerCredentials credentials;
  absl::Duration stream_idle = absl::Seconds(60);  // --stream_idle_timeout
  int peer_max_streams = 0;                        // --peer_max_streams
  // --aggregate and --norm_bound; robust: the all-gather path.
  AggregateSpec aggregate;
  double norm_bound = 0;
  bool robust = false;
  std::vector<PoisonWindow> poison;  // --test_poison
  int64_t contributions_dropped = 0;
  // Gossip: this node's push-sum weight (0: not set), and as checkpointed.
  double gossip_weight = 0;
  std::string resumed_weight;

  // The node's own model, flat: θ_global − e with ef_in_model, θ_global
  // otherwise. Where each round starts.
  std::vector<float> OwnModel() const {
    std::vector<float> own = *theta_global;
    if (ef_in_model && feedback != nullptr) {
      absl::Span<const float> e = feedback->residual();
      for (size_t i = 0; i < own.size(); ++i) own[i] -= e[i];
    }
    return own;
  }
  absl::Status LoadNodeModel() {
    return ef_in_model ? Unflatten(OwnModel(), params)
                       : Unflatten(*theta_global, params);
  }

  // ef_in_model: after the last round, one more (the flush) while this
  // node still holds a residual.
  bool FlushDue() const {
    if (!ef_in_model || feedback == nullptr) return false;
    for (float v : feedback->residual()) {
      if (v != 0) return true;
    }
    return false;
  }

  // fn() with θ_global in the model, then the node's own model back:
  // checkpoints and evaluations are of θ_global, which all members share.
  absl::Status WithGlobalModel(const std::function<absl::Status()>& fn) {
    if (!ef_in_model || theta_global == nullptr) return fn();
    STARLING_RETURN_IF_ERROR(Unflatten(*theta_global, params));
    absl::Status s = fn();
    absl::Status back = LoadNodeModel();
    return s.ok() ? back : s;
  }

  absl::Status Checkpoint(int64_t next_round, int64_t sent, int64_t received,
                          double wall) {
    return WithGlobalModel(
        [&] { return CheckpointModel(next_round, sent, received, wall); });
  }

  absl::Status CheckpointModel(int64_t next_round, int64_t sent,
                               int64_t received, double wall) {
    trainer->set_wall_seconds(wall);
    std::map<std::string, std::string> extra = {
        {"outer", outer->SaveState()},
        {"round", absl::StrCat(next_round)},
        {"member_rounds", absl::StrCat(member_rounds)},
        {"comm",
         absl::StrCat(sent, ",", received, ",", prior[2] + ring_stats.raw_bytes,
                      ",", prior[3] + ring_stats.wire_bytes)}};
    if (feedback) extra["error_feedback"] = feedback->SaveState();
    if (gossip_weight > 0) {
      extra["gossip_weight"] = absl::StrFormat("%.17g", gossip_weight);
    }
    const absl::Time start = absl::Now();
    STARLING_RETURN_IF_ERROR(
        trainer->SaveCheckpoint(ckpt_path, std::move(extra)));
    if (ops->metrics) {
      ops->metrics->Checkpoint(absl::ToDoubleSeconds(absl::Now() - start),
                               absl::Now());
    }
    return absl::OkStatus();
  }

  // On the way out after an error: checkpoints the model as restored for
  // it (`restored`: how that went) so nothing is lost, or says why not.
  void CheckpointBeforeFailing(absl::Status restored, int64_t next_round,
                               int64_t sent, int64_t received, double wall) {
    if (restored.ok()) {
      restored = Checkpoint(next_round, sent, received, wall);
    }
    if (!restored.ok()) {
      LogEvent(LogLevel::kWarning, "checkpoint",
               absl::StrCat("no checkpoint at step ", trainer->state().step(),
                            ": ", restored.message()));
    }
  }

  // Evaluates when an --eval_every boundary was crossed or when forced.
  // `at_step` (>= 0) labels a model that the trainer's step has passed
  // (--overlap applies a round's update one round late).
  absl::Status MaybeEvaluate(bool force, int prev_step, EventLog& events,
                             int at_step = -1) {
    const int step = at_step >= 0 ? at_step : trainer->state().step();
    const int every = config.eval_every();
    bool due = every > 0 && step / every > prev_step / every;
    if (!(due || force) || evaluated_step == step) return absl::OkStatus();
    // A second signal leaves at once: the evaluation stops between batches
    // and this step goes without a val_loss.
    absl::StatusOr<EvalResult> r = EvalResult();
    STARLING_RETURN_IF_ERROR(WithGlobalModel([&] {
      r = trainer->Evaluate(64, [] { return StopSignalCount() >= 2; });
      return absl::OkStatus();
    }));
    if (absl::IsCancelled(r.status())) {
      LogEvent(LogLevel::kWarning, "eval",
               absl::StrCat("eval  step ", step, ": ", r.status().message(),
                            " (a second signal: leaving at once)"));
      return absl::OkStatus();
    }
    STARLING_ASSIGN_OR_RETURN(eval, std::move(r));
    evaluated_step = step;
    JsonObject f;
    f.Add("step", static_cast<int64_t>(step)).Add("val_loss", eval.loss);
    if (eval.accuracy >= 0) f.Add("val_accuracy", eval.accuracy);
    events.Write("eval", f);
    LogEvent(LogLevel::kInfo, "eval",
             absl::StrFormat("eval  step %d/%d | val_loss %.4f", step,
                             config.steps(), eval.loss),
             {{"val_loss", absl::StrFormat("%.6f", eval.loss)}});
    return absl::OkStatus();
  }

  // Evaluates (when `evaluator` and an --eval_every boundary was crossed or
  // this is the last step), then logs the round and keeps it for summary.json.
  absl::Status RecordRound(RoundRecord& rec, bool evaluator, int prev_step,
                           EventLog& events) {
    if (evaluator) {
      STARLING_RETURN_IF_ERROR(MaybeEvaluate(rec.step == config.steps(),
                                             prev_step, events, rec.step));
    }
    if (evaluated_step == rec.step) rec.val_loss = eval.loss;
    events.Write("round", RoundJson(rec));
    rounds.push_back(rec);
    return absl::OkStatus();
  }

  // The run's last event and its summary.json. Only a member that
  // evaluated the final step reports a final val_loss.
  absl::Status Finish(EventLog& events, const NodeTotals& totals, int rank,
                      int world, int per_round, bool stopped) {
    events.Write(stopped ? "interrupted" : "end",
                 JsonObject()
                     .Add("step", static_cast<int64_t>(trainer->state().step()))
                     .Add("round", round)
                     .Add("bytes_sent", totals.bytes_sent));
    JsonObject extra;
    extra.Add("algo", algo)
        .Add("rank", static_cast<int64_t>(rank))
        .Add("world", static_cast<int64_t>(world))
        .Add("inner_steps_per_round", static_cast<int64_t>(per_round));
    if (algo == "diloco") {
      extra.Add("aggregate", AggregateName(aggregate))
          .Add("norm_bound", norm_bound)
          .Add("contributions_dropped", contributions_dropped);
    }
    EvalResult final_eval = eval;
    if (evaluated_step != trainer->state().step()) final_eval = EvalResult();
    return WriteNodeSummary(out, "node", *trainer, final_eval, totals, rounds,
                            stopped, extra);
  }

  NodeTotals Totals(const std::string& id, int64_t sent, int64_t received,
                    double wall, int world) {
    NodeTotals t;
    t.id = id;
    t.bytes_sent = sent;
    t.bytes_received = received;
    t.wall_seconds = wall;
    if (algo == "diloco") {
      t.compression = ring_policy->Name();
      if (use_ef) t.compression += " + error feedback";
      t.bytes_before_compression = prior[2] + ring_stats.raw_bytes;
      t.bytes_after_compression = prior[3] + ring_stats.wire_bytes;
    }
    // Per-step ring all-reduce of fp32 gradients: 2·(N−1)/N · P · 4 bytes.
    t.allreduce_equivalent_bytes = static_cast<int64_t>(
        static_cast<double>(trainer->state().step()) * 2.0 * (world - 1) /
        std::max(1, world) * static_cast<double>(n_params) * 4.0);
    return t;
  }
};

// `step` < 0: the trainer's (--overlap serves a θ_global that its trainer
// has already trained past: the step its round ended at).
SwarmState CurrentState(const NodeRun& run,
                        const std::vector<float>& theta_global,
                        const std::string& lineage, int step = -1) {
  SwarmState st;
  st.round = run.round;
  st.step = step >= 0 ? step : run.trainer->state().step();
  st.lineage = lineage;
  st.member_rounds = run.member_rounds;
  st.theta = theta_global;
  st.outer_state = run.outer->SaveState();
  return st;
}

// The SwarmOptions both swarm algorithms share, from the flags: id, listen
// address, seeds (through --hosts), identity and failure detection. Checks
// the flags they share and arms --test_crash_at. InvalidArgument naming the
// flag.
absl::StatusOr<SwarmOptions> SharedSwarmOptions(const NodeRun& run,
                                                const std::string& algo) {
  SwarmOptions so;
  so.listen = absl::GetFlag(FLAGS_listen);
  so.node_id = NodeIdFromFlags();
  if (!ValidHostPort(so.listen)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen=", so.listen, ": expected host:port"));
  }
  std::map<std::string, std::string> hosts;
  if (std::string path = absl::GetFlag(FLAGS_hosts); !path.empty()) {
    STARLING_ASSIGN_OR_RETURN(hosts, ReadHosts(path));
  }
  for (absl::string_view p :
       absl::StrSplit(absl::GetFlag(FLAGS_peers), ',', absl::SkipEmpty())) {
    if (!ValidHostPort(p)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peers: '", p, "' is not host:port"));
    }
    std::string seed(p);
    if (auto it = hosts.find(HostOf(seed)); it != hosts.end()) {
      seed = absl::StrCat(it->second, seed.substr(seed.rfind(':')));
    }
    so.seeds.push_back(seed);
  }
  const double found_after = absl::GetFlag(FLAGS_found_after);
  const int min_members = absl::GetFlag(FLAGS_min_members);
  const double suspect = absl::GetFlag(FLAGS_suspect_timeout);
  if (absl::Status s = ArmCrashPoint(absl::GetFlag(FLAGS_test_crash_at));
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--test_crash_at: ", s.message()));
  }
  so.identity.run_id = absl::GetFlag(FLAGS_run_id);
  so.identity.algo = algo;  // a node of the other algorithm cannot join
  so.identity.model = MakeFingerprint(run.trainer->model().Architecture(),
                                      run.n_params, run.init_hash);
  so.chunk_bytes = run.chunk;
  so.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_round_timeout));
  so.suspect_after = absl::Seconds(suspect);
  so.partition_file = absl::GetFlag(FLAGS_partition_file);
  so.found_after = absl::Seconds(found_after);
  so.links = run.links;
  so.credentials = run.credentials;
  so.stream_idle_timeout = run.stream_idle;
  so.peer_max_streams = run.peer_max_streams;
  return so;
}

// Membership changes arrive on the gossip thread; the training thread logs
// them (EventLog has one writer). Thread-safe.
class MemberChanges {
 public:
  explicit MemberChanges(std::string self) : self_(std::move(self)) {}
  void Add(const MembershipChange& c) {
    absl::MutexLock lock(&mu_);
    pending_.push_back(c);
    if (c.id == self_ && c.to == peer::v1::MEMBER_ALIVE &&
        c.from != peer::v1::MEMBER_STATE_UNSPECIFIED) {
      last_refuted_ = absl::Now();
    }
  }
  // When this node last refuted a member's word that it was suspected or
  // dead: a sign that a partition just healed (or that this node was
  // paused), and that the views of the members take a few gossip exchanges
  // to agree again.
  absl::Time LastRefuted() const {
    absl::MutexLock lock(&mu_);
    return last_refuted_;
  }
  // Writes the pending changes as "member" events and log lines.
  void Log(EventLog& events) {
    std::vector<MembershipChange> batch;
    {
      absl::MutexLock lock(&mu_);
      batch.swap(pending_);
    }
    for (const MembershipChange& c : batch) {
      const char* to = MemberStateName(c.to);
      events.Write("member", JsonObject()
                                 .Add("id", c.id)
                                 .Add("state", to)
                                 .Add("incarnation", c.incarnation));
      LogEvent(LogLevel::kInfo, "member",
               absl::StrCat("member ", c.id, " is ", to),
               {{"peer", c.id}, {"state", to}});
    }
  }

 private:
  mutable absl::Mutex mu_;
  const std::string self_;
  std::vector<MembershipChange> pending_ ABSL_GUARDED_BY(mu_);
  absl::Time last_refuted_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// One inner step of an elastic member (DiLoCo or gossip). On a failure
// (e.g. a non-finite loss) it logs an "error" event and says goodbye to
// the swarm, so that nobody waits for this node; the caller then fails.
absl::StatusOr<StepResult> StepOrLeave(Trainer& trainer, EventLog& events,
                                       Swarm& swarm) {
  absl::StatusOr<StepResult> r = trainer.Step();
  if (!r.ok()) {
    events.Write("error", JsonObject().Add("message", r.status().message()));
    swarm.Leave();
  }
  return r;
}

// Elastic DiLoCo over a Swarm (gossip/swarm.h describes the protocol).
int RunDiloco(NodeRun& run) {
  Trainer& trainer = *run.trainer;
  const TrainConfig& config = run.config;
  absl::StatusOr<SwarmOptions> shared = SharedSwarmOptions(run, "diloco");
  if (!shared.ok()) return Fail(shared.status(), 2);
  SwarmOptions so = std::move(shared).value();
  const std::string node_id = so.node_id;
  const int min_members = absl::GetFlag(FLAGS_min_members);
  const double deadline_s = absl::GetFlag(FLAGS_round_deadline);

  std::vector<float> theta_global = Flatten(run.params);
  std::string lineage = FlatHash(theta_global);
  run.theta_global = &theta_global;
  // A resumed node trains on from its own model (its residual restored).
  if (absl::Status s = run.LoadNodeModel(); !s.ok()) return Fail(s, 1);
  // Where this node is: the next round, on θ_global (hash and weight).
  auto here = [&] {
    return Swarm::Lineage{run.round, lineage, run.member_rounds, {}};
  };
  EventLog events(absl::StrCat(run.out, "/events.jsonl"), node_id,
                  trainer.state().wall_seconds());
  MemberChanges changes(node_id);
  so.identity.compression = run.ring_policy->Name();
  so.identity.aggregate = AggregateName(run.aggregate);
  if (run.norm_bound > 0) {
    absl::StrAppend(&so.identity.aggregate, ",norm_bound=", run.norm_bound);
  }
  so.round_deadline = absl::Seconds(deadline_s);
  so.mailbox.run_id = so.identity.run_id;
  so.mailbox.tensors = {{kPseudoGrad, run.n_params + kWeightingSlots + 1},
                        {kPseudoGradWhole, run.n_params + kWeightingSlots + 1}};
  so.mailbox.whole_tensors = {kPseudoGradWhole};
  if (run.ring_codec != nullptr) {
    so.mailbox.compressed_bytes_per_element = {{kPseudoGrad, 8}};
  }
  if (run.ef_in_model) {
    so.mailbox.tensors[kResidualFlush] = run.n_params + kWeightingSlots + 1;
    so.mailbox.compressed_bytes_per_element[kResidualFlush] = 8;
    // Members that flush and members that do not cannot share rounds.
    absl::StrAppend(&so.identity.compression, " with error feedback");
  }
  so.on_member_change = [&](const MembershipChange& c) { changes.Add(c); };
  // A second SIGINT/SIGTERM leaves at once, also from the middle of an
  // all-reduce that waits for a slow or silent peer.
  so.interrupted = [] { return StopSignalCount() >= 2; };
  absl::StatusOr<std::unique_ptr<Swarm>> started = Swarm::Start(so);
  if (!started.ok()) {
    return Fail(started.status(),
                absl::IsInvalidArgument(started.status()) ? 2 : 1);
  }
  Swarm& swarm = **started;
  auto bytes_sent = [&] { return run.prior[0] + swarm.bytes_sent(); };
  auto bytes_received = [&] { return run.prior[1] + swarm.bytes_received(); };
  auto log_changes = [&] { changes.Log(events); };
  // Not joining: a fresh node starts on the initial lineage with the others;
  // one that is behind turns to joining while it catches up.
  swarm.SetProgress(here(), /*joining=*/false);
  STARLING_LOG(INFO) << node_id << " (diloco, elastic) listening on "
                     << swarm.address() << ", "
                     << trainer.model().Architecture() << ", " << run.n_params
                     << " parameters, data " << trainer.dataset().Describe();
  const absl::Duration connect =
      absl::Seconds(absl::GetFlag(FLAGS_connect_timeout));
  NodeOps& ops = *run.ops;
  ops.watchdog->Waiting(2 * connect);
  // Metrics that change outside the training thread: traffic, peers, RPC
  // errors, refreshed every second.
  std::atomic<int64_t> before_compression{run.prior[2]};
  std::atomic<int64_t> after_compression{run.prior[3]};
  std::atomic<bool> poll_stop{false};
  std::thread poller;
  if (ops.metrics) {
    poller = std::thread([&] {
      while (!poll_stop.load()) {
        ops.metrics->SetTraffic(bytes_sent(), bytes_received(),
                                before_compression.load(),
                                after_compression.load());
        int known = 0, connected = 0;
        for (const peer::v1::MemberEntry& e : swarm.Members()) {
          if (e.id() == node_id) continue;
          if (e.state() == peer::v1::MEMBER_ALIVE) ++connected;
          if (e.state() == peer::v1::MEMBER_ALIVE ||
              e.state() == peer::v1::MEMBER_SUSPECT) {
            ++known;
          }
        }
        ops.metrics->SetPeers(known, connected);
        ops.metrics->SetRpcErrors(swarm.rpc_errors());
        ops.metrics->SetRefusals(swarm.refusals());
        absl::SleepFor(absl::Seconds(1));
      }
    });
  }
  struct PollerJoin {
    std::atomic<bool>& stop;
    std::thread& t;
    ~PollerJoin() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } poller_join{poll_stop, poller};
  if (ops.metrics) ops.metrics->SetOuterLr(absl::GetFlag(FLAGS_outer_lr));
  if (absl::Status s = swarm.JoinSwarm(absl::Now() + connect); !s.ok()) {
    events.Write("error", JsonObject().Add("message", s.message()));
    return Fail(s, absl::IsFailedPrecondition(s) ? 2 : 1);
  }
  if (absl::Status s = swarm.WaitForMembers(min_members, absl::Now() + connect);
      !s.ok()) {
    return Fail(s, 1);
  }
  events.Write(config.resume() ? "resume" : "start",
               JsonObject()
                   .Add("algo", "diloco")
                   .Add("address", swarm.address())
                   .Add("round", run.round)
                   .Add("step", static_cast<int64_t>(trainer.state().step()))
                   .Add("parameters", run.n_params)
                   .Add("model_hash", lineage));
  InstallStopSignals();

  const int total = config.steps();
  const int64_t n_rounds =
      (total + run.h - 1) / run.h + (run.ef_in_model ? 1 : 0);  // the flush
  int last_rank = 0, last_world = 1;
  bool left = false;
  auto serve = [&](int step = -1) {
    swarm.ServeState(CurrentState(run, theta_global, lineage, step));
  };
  serve();

  // Catches up with the best lineage in the swarm (a joiner, a restarted
  // node, a member that missed a round, the losing side of a partition).
  // What failed attempts moved and retried counts in the transfer that
  // succeeds after them (e.g. a donor died mid-transfer, and the others had
  // not reached its round yet).
  Swarm::FetchStats fetch_stats;
  auto catch_up = [&](const Swarm::Lineage& best) -> absl::Status {
    ops.watchdog->Waiting(so.rpc_timeout);
    swarm.SetProgress(here(), /*joining=*/true);
    absl::StatusOr<SwarmState> st = swarm.FetchState(
        best.donors, &best, absl::Now() + so.rpc_timeout, &fetch_stats);
    if (!st.ok()) return st.status();
    STARLING_RETURN_IF_ERROR(run.outer->LoadState(st->outer_state));
    theta_global = std::move(st->theta);
    STARLING_RETURN_IF_ERROR(Unflatten(theta_global, run.params));
    const int64_t from_round = run.round;
    run.round = st->round;
    lineage = st->lineage;
    run.member_rounds = st->member_rounds;
    trainer.set_step(static_cast<int>(st->step));
    // The residual belongs to the abandoned lineage.
    if (run.feedback)
      run.feedback = std::make_unique<ErrorFeedback>(run.n_params);
    events.Write("state_transfer",
                 JsonObject()
                     .Add("from", fetch_stats.donor)
                     .Add("round", run.round)
                     .Add("from_round", from_round)
                     .Add("step", static_cast<int64_t>(st->step))
                     .Add("bytes", fetch_stats.bytes)
                     .Add("seconds", fetch_stats.seconds)
                     .Add("retries", static_cast<int64_t>(fetch_stats.retries))
                     .Add("model_hash", lineage));
    SetLogPosition(run.round, st->step);
    LogEvent(LogLevel::kInfo, "state_transfer",
             absl::StrFormat(
                 "%s caught up: round %d, step %d from %s (%s in %.2f s)",
                 node_id, run.round, st->step, fetch_stats.donor,
                 FormatBytes(static_cast<double>(fetch_stats.bytes)),
                 fetch_stats.seconds),
             {{"peer", fetch_stats.donor}});
    fetch_stats = Swarm::FetchStats();
    serve();
    swarm.SetProgress(here(), /*joining=*/false);
    return absl::OkStatus();
  };

  // When the last round committed here (see --round_seconds).
  absl::Time committed_at = absl::InfiniteFuture();
  // One round's exchange, from its inner steps to its outer step. With
  // --overlap it outlives the loop iteration that launched it.
  struct RoundCtx {
    int prev_step = 0, steps = 0;
    bool early = false;
    // The residual flush after the last round (ef_in_model): no inner
    // steps; the ring averages the members' residuals.
    bool flush = false;
    double loss_sum = 0;
    int64_t samples = 0, sent_before = 0;
    absl::Time round_start, sync_start, sync_end;
    std::string ef_before;
    std::vector<float> input, delta;
    // What the attempt all-reduces. Shared, because the ring sends from it
    // with no copy and gRPC may hold it after a failed send.
    std::shared_ptr<std::vector<float>> work;
    RingStats attempt_stats;
    int attempts_run = 0, rank = 0, world = 1;
    // --aggregate / --norm_bound: the last attempt's verdict on each
    // member's contribution, by rank (members: their ids).
    std::vector<PackVerdict> verdicts;
    std::vector<std::string> members;
    std::future<absl::StatusOr<Swarm::RoundResult>> result;
  };
  enum class RoundAction { kNext, kRetry, kLeave };
  const bool overlap = absl::GetFlag(FLAGS_overlap);
  // Set when this function returns with a round still in flight (an
  // error): the round then gives up at its next wait instead of holding the
  // exit up (the future's destructor waits for it).
  std::atomic<bool> abandon_round{false};
  std::shared_ptr<RoundCtx> pending;  // --overlap: the round in flight
  double last_train_loss = 0;         // of the last round recorded
  struct AbandonOnExit {
    std::atomic<bool>& flag;
    ~AbandonOnExit() { flag = true; }
  } abandon_on_exit{abandon_round};       // destroyed before `pending`
  std::vector<float> eager_start;         // where the round behind it started
  std::vector<std::string> last_members;  // of the last committed round
  int64_t recorded_sent = -1;  // bytes_sent() as the last round was recorded
  // Runs the round protocol for `ctx` on run.round: on a thread of its own
  // (async: the training thread goes on), or deferred to finish_round.
  auto launch_round = [&](const std::shared_ptr<RoundCtx>& ctx, bool async) {
    Swarm::Reduce reduce = [&ops, &so, &run, ctx, async, round = run.round](
                               Transport& t, int64_t seq,
                               const std::vector<std::string>& members) {
      ++ctx->attempts_run;
      if (!async) ops.watchdog->Waiting(so.rpc_timeout * 2);
      // Fresh memory per attempt: a failed attempt's send may still hold
      // the last one.
      ctx->work = std::make_shared<std::vector<float>>(ctx->input);
      ctx->attempt_stats = RingStats();
      RingOptions o;
      o.step_timeout = so.rpc_timeout;
      o.tensor = ctx->flush ? kResidualFlush : kPseudoGrad;
      o.round = seq;
      o.codec = ctx->flush ? run.flush_policy.get() : run.ring_codec;
      o.stats = &ctx->attempt_stats;
      ctx->rank = t.rank();
      ctx->world = t.world();
      if (!run.robust) {
        o.data_owner = ctx->work;
        return RingAllReduceSum(t, absl::MakeSpan(*ctx->work), o);
      }
      // Every member gets every member's pack, checks each and combines
      // the accepted ones by the same rule: the same bytes everywhere.
      o.tensor = kPseudoGradWhole;
      o.codec = nullptr;
      std::vector<std::vector<float>> packs;
      std::vector<std::string> refused;
      STARLING_RETURN_IF_ERROR(
          AllGatherWhole(t, ctx->input, o, &packs, &refused));
      std::vector<absl::Span<const float>> spans(packs.begin(), packs.end());
      ctx->verdicts.assign(packs.size(), PackVerdict());
      for (size_t i = 0; i < packs.size(); ++i) {
        ctx->verdicts[i].reason = refused[i];
      }
      ctx->members = members;
      absl::StatusOr<AggregateStats> st = AggregatePacks(
          run.aggregate, run.norm_bound, run.n_params, /*extras=*/1, spans,
          &ctx->verdicts, absl::MakeSpan(*ctx->work));
      for (size_t i = 0; i < ctx->verdicts.size(); ++i) {
        if (ctx->verdicts[i].accepted) continue;
        const std::string who =
            i < members.size() ? members[i] : absl::StrCat("rank ", i);
        LogEvent(LogLevel::kWarning, "contribution_dropped",
                 absl::StrCat("round ", round, ": dropped the contribution of ",
                              who, ": ", ctx->verdicts[i].reason),
                 {{"peer", who}});
      }
      if (!st.ok()) return st.status();
      if (st->fell_back_to_median) {
        LogEvent(
            LogLevel::kWarning, "aggregate",
            absl::StrCat("round ", round, ": only ", st->accepted,
                         " contributions passed, too few for ",
                         AggregateName(run.aggregate), "; used their median"));
      }
      return absl::OkStatus();
    };
    ctx->sync_start = absl::Now();
    auto body = [&swarm, &ops, &so, &abandon_round, at = here(), reduce, ctx,
                 async]() {
      // The training thread keeps the watchdog fed while it trains.
      auto alive = [&] {
        if (!async) ops.watchdog->Waiting(so.round_deadline + so.rpc_timeout);
      };
      alive();
      absl::StatusOr<Swarm::RoundResult> r = swarm.SyncRound(at, reduce, [&] {
        alive();  // polled while the protocol waits: the loop is alive
        return StopSignalCount() >= 2 || abandon_round.load();
      });
      ctx->sync_end = absl::Now();
      return r;
    };
    ctx->result = std::async(async ? std::launch::async : std::launch::deferred,
                             std::move(body));
  };
  // Waits for `c`'s outcome and applies it: the outer step on commit;
  // otherwise back to the round's start (and, overlapped, the inner steps
  // run since then are dropped too). kRetry: catch up, then go on.
  auto finish_round = [&](RoundCtx& c,
                          bool overlapped) -> absl::StatusOr<RoundAction> {
    if (overlapped) {
      ops.watchdog->Waiting(so.round_deadline + so.rpc_timeout);
      while (c.result.wait_for(std::chrono::milliseconds(200)) !=
             std::future_status::ready) {
        ops.watchdog->Waiting(so.round_deadline + so.rpc_timeout);
      }
    }
    absl::StatusOr<Swarm::RoundResult> res = c.result.get();
    // The round protocol fails only for this node's own reasons (an
    // emulated link too slow for the run, say): go back to the last commit
    // and checkpoint it, as a node leaving on a signal does, before failing.
    auto back_to_commit = [&] {
      if (run.feedback) (void)run.feedback->LoadState(c.ef_before);
      trainer.set_step(c.prev_step);
      return run.LoadNodeModel();
    };
    if (!res.ok()) {
      run.CheckpointBeforeFailing(back_to_commit(), run.round, bytes_sent(),
                                  bytes_received(), events.WallSeconds());
      return res.status();
    }
    if (c.attempts_run > 0) {
      last_rank = c.rank;
      last_world = c.world;
    }
    const double sync_seconds =
        absl::ToDoubleSeconds(c.sync_end - c.sync_start);
    if (ops.metrics) {
      const bool committed = res->outcome == Swarm::Outcome::kCommitted;
      for (int i = 0; i < c.attempts_run - (committed ? 1 : 0); ++i) {
        ops.metrics->Round(kRoundAborted, 0, 0);
      }
      ops.metrics->Round(committed ? "committed"
                         : res->outcome == Swarm::Outcome::kStopped ? "stopped"
                                                                    : "stale",
                         absl::ToDoubleSeconds(absl::Now() - c.round_start),
                         sync_seconds);
    }
    if (res->outcome != Swarm::Outcome::kCommitted) {
      committed_at = absl::InfiniteFuture();
      STARLING_RETURN_IF_ERROR(back_to_commit());
      if (res->outcome == Swarm::Outcome::kStopped) return RoundAction::kLeave;
      // Stale: the swarm committed this round without us. Wait (briefly)
      // until gossip shows who is ahead, then catch up at the loop's top.
      LogEvent(
          LogLevel::kInfo, "stale",
          absl::StrCat(node_id, " missed round ", run.round, "; catching up"));
      const absl::Time until = absl::Now() + absl::Seconds(5);
      while (absl::Now() < until && !Swarm::Ahead(swarm.Best(), here())) {
        absl::SleepFor(absl::Milliseconds(100));
      }
      return RoundAction::kRetry;
    }
    run.ring_stats.raw_bytes += c.attempt_stats.raw_bytes;
    run.ring_stats.wire_bytes += c.attempt_stats.wire_bytes;
    for (size_t i = 0; i < c.verdicts.size(); ++i) {
      if (c.verdicts[i].accepted) continue;
      ++run.contributions_dropped;
      events.Write("contribution_dropped",
                   JsonObject()
                       .Add("round", run.round)
                       .Add("peer", i < c.members.size() ? c.members[i] : "")
                       .Add("reason", c.verdicts[i].reason)
                       .Add("norm", c.verdicts[i].norm));
    }
    before_compression = run.prior[2] + run.ring_stats.raw_bytes;
    after_compression = run.prior[3] + run.ring_stats.wire_bytes;
    if (c.work == nullptr || c.work->empty()) {
      return absl::InternalError(absl::StrCat(
          "round ", run.round, " committed without an all-reduce here"));
    }
    const bool stop_voted = c.work->back() > 0;
    absl::StatusOr<Averaged> avg = UnpackAverage(
        run.sync.weighting,
        absl::MakeConstSpan(*c.work).subspan(0, c.work->size() - 1),
        absl::MakeSpan(c.delta));
    if (!avg.ok()) return avg.status();
    double norm2 = 0;
    for (float d : c.delta) norm2 += static_cast<double>(d) * d;
    if (ops.metrics) ops.metrics->SetPseudoGradientNorm(std::sqrt(norm2));
    // A round shorter or longer than H moves the outer momentum in
    // proportion (OuterOptimizer::Step's span).
    if (c.flush) {
      // θ_global − mean(e): the average of the members' models. The outer
      // momentum is left as it was.
      for (size_t i = 0; i < theta_global.size(); ++i) {
        theta_global[i] -= c.delta[i];
      }
    } else {
      STARLING_RETURN_IF_ERROR(
          run.outer->Step(absl::MakeSpan(theta_global), c.delta,
                          avg->effective_steps / static_cast<double>(run.h)));
    }
    STARLING_RETURN_IF_ERROR(run.LoadNodeModel());
    lineage = FlatHash(theta_global);
    run.member_rounds =
        std::min(kMaxMemberRounds,
                 run.member_rounds + static_cast<int64_t>(res->members.size()));
    committed_at = absl::Now();
    const int end_step = c.prev_step + c.steps;
    if (!overlapped && !c.flush) {
      // Every member moves the LR schedule by the round's mean step count
      // (FedNova's τ_eff; H when all ran H), so members that ran different
      // step counts agree on the step again. (--overlap needs a fixed H.)
      trainer.set_step(std::clamp(
          c.prev_step + static_cast<int>(std::llround(avg->effective_steps)),
          c.prev_step + 1, total));
    }
    if (c.early) run.sync.h->OnDrift();
    if (!c.flush) run.sync.h->OnRoundEnd(c.early);
    if (run.sync.detector) run.sync.detector->Suppress();  // θ → θ_global
    RoundRecord rec;
    rec.round = run.round;
    rec.step = overlapped ? end_step : trainer.state().step();
    rec.inner_steps = c.steps;
    rec.early = c.early;
    rec.sync_seconds = sync_seconds;
    rec.overlapped = overlapped;
    rec.members = res->members;
    rec.model_hash = lineage;
    rec.train_loss =
        c.flush ? last_train_loss : c.loss_sum / std::max(1, c.steps);
    last_train_loss = rec.train_loss;
    rec.residual_flush = c.flush;
    // What was sent since the last round was recorded (the first: since
    // its inner steps began). With --overlap a round's exchange runs during
    // the next round's inner steps, so counting from each round's own start
    // counted it twice. Attempts that did not commit count in the round
    // that did.
    const int64_t sent_now = bytes_sent();
    rec.bytes = sent_now - (recorded_sent >= 0 ? recorded_sent : c.sent_before);
    recorded_sent = sent_now;
    rec.seconds = absl::ToDoubleSeconds(absl::Now() - c.round_start);
    ++run.round;
    last_members = res->members;
    swarm.SetProgress(here(), /*joining=*/false);
    serve(rec.step);
    // The round's first member evaluates; with a residual flush to come,
    // after it (the final model), not before.
    const bool flush_next = !c.flush && rec.step == total && run.FlushDue();
    STARLING_RETURN_IF_ERROR(run.RecordRound(
        rec, !flush_next && !res->members.empty() && res->members[0] == node_id,
        c.prev_step, events));
    double elapsed = events.WallSeconds();
    double eta = rec.step > 0 ? elapsed * (total - rec.step) / rec.step : 0;
    SetLogPosition(run.round, rec.step);
    LogEvent(LogLevel::kInfo, "round",
             absl::StrFormat("%s round %d/%d | step %d/%d | members %d | loss "
                             "%.4f | sent %s | hash %s | eta %s",
                             node_id, run.round, n_rounds, rec.step, total,
                             res->members.size(), rec.train_loss,
                             FormatBytes(static_cast<double>(bytes_sent())),
                             rec.model_hash.substr(0, 8), FormatDuration(eta)),
             {{"members", absl::StrJoin(res->members, ",")},
              {"model_hash", rec.model_hash}});
    if (config.checkpoint_every() > 0 &&
        rec.step / config.checkpoint_every() >
            c.prev_step / config.checkpoint_every() &&
        rec.step < total) {
      STARLING_RETURN_IF_ERROR(run.Checkpoint(
          run.round, bytes_sent(), bytes_received(), events.WallSeconds()));
    }
    if (stop_voted && StopSignal() != 0 && rec.step < total) {
      // Overlapped: the inner steps run since are dropped, as at every
      // member, so all resume from this round.
      if (overlapped) trainer.set_step(end_step);
      return RoundAction::kLeave;
    }
    return RoundAction::kNext;
  };
  // catch_up from the round loop and from the end wait: false, after a
  // warning and a pause, when it failed (the caller tries again).
  auto catch_up_or_pause = [&](const Swarm::Lineage& best) -> bool {
    committed_at = absl::InfiniteFuture();
    absl::Status s = catch_up(best);
    if (s.ok()) return true;
    LogEvent(LogLevel::kWarning, "state_transfer",
             absl::StrCat(node_id, ": catching up failed (", s.message(),
                          "); retrying"));
    absl::SleepFor(absl::Seconds(1));
    return false;
  };
  // Done. A member that missed the last rounds (stopped, starved) catches
  // up from a member's served state; once every member on this lineage has
  // left it could only run those rounds alone, to another final model. So
  // stay, serving, while a live member is behind (at an earlier round, or
  // on a worse lineage at this one): until it has caught up, is declared
  // dead (2 × --suspect_timeout), or for as long as a round may wait for it
  // plus a transfer. And a member that sees a better lineage than its own
  // (the other side of a partition that healed as both sides finished, or
  // the swarm, after this node ran the last round apart) fetches its state
  // first, as it would before a round. A signal ends the wait. True when
  // the state fetched has steps left to train: back to the rounds.
  auto stay_until_caught_up = [&]() -> bool {
    const absl::Time start = absl::Now();
    const absl::Time until = start + so.round_deadline + so.rpc_timeout;
    std::string waited_for;
    while (StopSignal() == 0) {
      log_changes();  // the others leaving, as they catch up
      const Swarm::Lineage best = swarm.Best();
      if (Swarm::Ahead(best, here()) && !best.donors.empty()) {
        if (absl::Now() >= until) {
          LogEvent(LogLevel::kWarning, "straggler",
                   absl::StrCat(node_id, " leaves on its own model (round ",
                                run.round,
                                "): it could not fetch the state "
                                "of round ",
                                best.round, " of the others' lineage"));
          return false;
        }
        if (catch_up_or_pause(best) && trainer.state().step() < total) {
          return true;
        }
        continue;
      }
      std::vector<std::string> behind;
      for (const peer::v1::MemberEntry& e : swarm.Behind(here())) {
        behind.push_back(e.round() < run.round
                             ? absl::StrCat(e.id(), " (round ", e.round(), ")")
                             : absl::StrCat(e.id(), " (round ", e.round(),
                                            ", model ",
                                            e.lineage().substr(0, 8), ")"));
      }
      const std::string names = absl::StrJoin(behind, ", ");
      // Nobody behind, in a view that has settled: this node has not
      // refuted its death for 3 s. After a heal, a member of the other side
      // still dead here may be about to refute its own, which takes a
      // gossip exchange each way (each up to a second with a hung member).
      const bool settled =
          absl::Now() - changes.LastRefuted() >= absl::Seconds(3);
      if ((behind.empty() && settled) || absl::Now() >= until) {
        if (!behind.empty()) {
          LogEvent(LogLevel::kWarning, "straggler",
                   absl::StrCat(node_id, " leaves with ", names,
                                " still behind round ", run.round, ", model ",
                                lineage.substr(0, 8)));
        }
        return false;
      }
      // Gossip of the others' last commit takes an interval or two; said
      // only when the wait is longer than that.
      if (!behind.empty() && names != waited_for &&
          absl::Now() - start >= absl::Seconds(1)) {
        LogEvent(
            LogLevel::kInfo, "straggler",
            absl::StrCat(node_id, " is done and stays, serving round ",
                         run.round, ", until ", names,
                         behind.size() == 1 ? " catches up" : " catch up"));
        waited_for = names;
      }
      ops.watchdog->Waiting(absl::Seconds(5));
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  };
  for (bool training = true; training;) {
    while (trainer.state().step() < total || run.FlushDue()) {
      log_changes();
      // A second SIGINT/SIGTERM leaves at once (the first: see the vote).
      if (StopSignalCount() >= 2) {
        left = true;
        break;
      }
      Swarm::Lineage best = swarm.Best();
      if (!pending && Swarm::Ahead(best, here()) && !best.donors.empty()) {
        catch_up_or_pause(best);
        continue;
      }
      swarm.SetProgress(here(), /*joining=*/false);
      // On the best lineage, with the model: ready (and it stays so).
      ops.SetReady(StopSignal() == 0);
      const auto round_start = absl::Now();
      const int64_t sent_before = bytes_sent();
      const int prev_step = trainer.state().step();
      // How many inner steps this round: H (adaptive between
      // --min_inner_steps and --max_inner_steps), or as many as fit in
      // --round_seconds. Either way a drift alarm or divergence here, or an
      // early-sync request from any member, ends the round sooner.
      AdaptiveSync& sync = run.sync;
      const bool timed = sync.round_seconds > 0;
      const bool flush = prev_step >= total;
      int cap = total - prev_step;
      if (!timed) {
        cap = std::min(cap, sync.h->current());
      } else if (sync.max_steps > 0) {
        cap = std::min(cap, sync.max_steps);
      }
      // The time budget counts from the previous commit, which every member
      // saw at about the same moment: a member that spent part of it
      // evaluating or checkpointing runs fewer steps instead of holding the
      // others back.
      const absl::Time budget_end =
          std::min(round_start, committed_at) +
          absl::Seconds(timed ? sync.round_seconds : 0);
      double loss_sum = 0;
      int64_t samples = 0;
      int steps = 0;
      bool abandoned = false, early = false;
      // The divergence trigger measures from where this round started: with
      // the residual in the model, θ_global − e (from θ_global, it would
      // count the residual, which an early round does not shrink).
      std::vector<float> own_start;
      if (run.ef_in_model && sync.divergence && sync.divergence->enabled()) {
        own_start = run.OwnModel();
      }
      while (steps < cap) {
        // SIGINT/SIGTERM: finish this round, then leave; a second one: leave
        // now, abandoning the round.
        if (StopSignalCount() >= 2) {
          abandoned = true;
          break;
        }
        if (steps > 0) {
          if (timed && absl::Now() >= budget_end) break;
          if (swarm.EarlySyncRequested(run.round)) {
            early = true;
            break;
          }
        }
        absl::StatusOr<StepResult> r = StepOrLeave(trainer, events, swarm);
        if (!r.ok()) return Fail(r.status(), 1);
        ++steps;
        loss_sum += r->loss;
        samples += r->samples;
        LogDrift(events, trainer, *r);
        SetLogPosition(run.round, trainer.state().step());
        ops.Step(*r, trainer.state().step());
        if (trainer.state().step() == config.warmup() && sync.detector) {
          sync.detector->Suppress();  // the LR schedule turns
        }
        // Drift: the loss shifted up (Page-Hinkley), or θ strayed too far
        // from θ_global (dynamic averaging). Ask every member to sync now.
        const char* trigger = nullptr;
        double statistic = 0;
        if (sync.detector && sync.detector->Add(r->loss)) {
          trigger = "page_hinkley";
          statistic = sync.detector->statistic();
        } else if (sync.divergence && sync.divergence->enabled()) {
          std::vector<float> theta = Flatten(run.params);
          if (sync.divergence->Exceeded(
                  theta, own_start.empty() ? theta_global : own_start,
                  &statistic)) {
            trigger = "divergence";
          }
        }
        if (trigger != nullptr) {
          swarm.RequestEarlySync(run.round);
          events.Write(
              "drift_detected",
              JsonObject()
                  .Add("step", static_cast<int64_t>(trainer.state().step()))
                  .Add("round", run.round)
                  .Add("by", trigger)
                  .Add("statistic", statistic)
                  .Add("loss", r->loss));
          LogEvent(LogLevel::kInfo, "drift_detected",
                   absl::StrFormat("%s: drift (%s, %.3g) at step %d: asking "
                                   "for an early sync",
                                   node_id, trigger, statistic,
                                   trainer.state().step()));
          early = true;
          break;
        }
      }
      auto back_to_round_start = [&]() -> absl::Status {
        trainer.set_step(prev_step);
        return run.LoadNodeModel();
      };
      if (abandoned) {
        if (absl::Status s = back_to_round_start(); !s.ok()) return Fail(s, 1);
        left = true;
        break;
      }
      // Δ = θ_start − θ_local: the round started from θ_global, or (when it
      // ran behind an exchange, --overlap) from `eager_start`.
      // With ef_in_model, from θ_global − e (the node's own model).
      std::vector<float> delta = Flatten(run.params);
      {
        const std::vector<float> own =
            run.ef_in_model ? run.OwnModel() : std::vector<float>();
        const std::vector<float>& base = run.ef_in_model ? own
                                         : pending       ? eager_start
                                                         : theta_global;
        for (size_t i = 0; i < delta.size(); ++i) delta[i] = base[i] - delta[i];
      }
      if (pending) {
        // --overlap: the previous round's outcome. When it did not commit,
        // this round's inner steps are dropped too: they started from a
        // θ_global the swarm did not keep.
        std::shared_ptr<RoundCtx> prev = std::move(pending);
        absl::StatusOr<RoundAction> a =
            finish_round(*prev, /*overlapped=*/true);
        if (!a.ok()) return Fail(a.status(), 1);
        if (*a == RoundAction::kLeave) {
          left = true;
          break;
        }
        if (*a == RoundAction::kRetry) continue;
      }
      // An overlapped next round starts eagerly from the newest θ_global plus
      // this node's own progress (its Δ, before compression), which the
      // swarm's update for this round will replace one round later.
      std::vector<float> eager_next;
      if (overlap) {
        eager_next = theta_global;
        for (size_t i = 0; i < delta.size(); ++i) eager_next[i] -= delta[i];
      }
      auto ctx = std::make_shared<RoundCtx>();
      ctx->prev_step = prev_step;
      ctx->steps = steps;
      ctx->flush = flush;
      ctx->early = early;
      ctx->loss_sum = loss_sum;
      ctx->samples = samples;
      ctx->round_start = round_start;
      ctx->sent_before = sent_before;
      // Error feedback sends C(Δ + e) and keeps the rest (restored if the
      // round does not commit). With ef_in_model the residual is part of
      // the model this node trained on, so it is sent as it is, and the
      // flush sends it whole and leaves none. Otherwise (--overlap) the
      // residual first shrinks with the inner learning rate's decay over
      // this round's steps, so what was held back stays in proportion to the
      // steps now taken: unscaled, late rounds of a decayed schedule send
      // mostly stale progress from early ones, and the model gets worse
      // (README, compression section).
      if (run.feedback && flush) {
        ctx->ef_before = run.feedback->SaveState();
        delta.assign(run.feedback->residual().begin(),
                     run.feedback->residual().end());
        if (absl::Status s = run.feedback->ScaleResidual(0.0f); !s.ok()) {
          return Fail(s, 1);
        }
      } else if (run.feedback) {
        ctx->ef_before = run.feedback->SaveState();
        const double lr_start = trainer.lr_at(prev_step);
        const double lr_end = trainer.lr_at(prev_step + steps);
        if (!run.ef_in_model && lr_start > 0 && lr_end < lr_start) {
          if (absl::Status s = run.feedback->ScaleResidual(
                  static_cast<float>(lr_end / lr_start));
              !s.ok()) {
            return Fail(s, 1);
          }
        }
        std::vector<float> sent(delta.size());
        absl::StatusOr<std::string> enc = run.feedback->Compress(
            *run.param_policy, delta, absl::MakeSpan(sent));
        if (!enc.ok()) return Fail(enc.status(), 1);
        delta = std::move(sent);
      }
      // The ring's input: this node's weighted Δ and its weights
      // (outer_opt/weighting.h: samples, or FedNova when step counts differ)
      // and its stop vote. After a round whose votes sum above zero, every
      // member that has a pending signal leaves: members signalled together
      // (a sim's Ctrl-C) all stop after the same round and resume exactly,
      // while one signalled alone leaves and the others go on.
      ctx->input.resize(delta.size() + kWeightingSlots + 1);
      {
        Contribution c;
        c.delta = delta;
        c.steps = std::max(1, steps);
        // FedNova weighs a node by its share of the data (its train set, in
        // units of 2^20 examples so that p·τ stays exact in fp32).
        // The flush weighs every member alike (FedNova: by data share).
        c.weight = sync.weighting == Weighting::kFedNova
                       ? std::ldexp(static_cast<double>(std::max<int64_t>(
                                        1, trainer.dataset().train_size())),
                                    -20)
                   : flush ? 1.0
                           : static_cast<double>(samples);
        if (absl::Status s = PackContribution(
                sync.weighting, c,
                absl::MakeSpan(ctx->input).subspan(0, ctx->input.size() - 1));
            !s.ok()) {
          return Fail(s, 1);
        }
      }
      if (const PoisonWindow* w = PoisonFor(run.poison, run.round)) {
        const std::string what =
            ApplyPoison(*w, static_cast<uint64_t>(run.round) * 7919 + 17,
                        ctx->input.data(), static_cast<int64_t>(delta.size()));
        LogEvent(LogLevel::kWarning, "test_poison",
                 absl::StrCat("--test_poison: sending ", what,
                              " as this node's pseudo-gradient in round ",
                              run.round));
      }
      ctx->input.back() = StopSignal() != 0 ? 1.0f : 0.0f;
      ctx->delta = std::move(delta);
      // --overlap: while the membership is steady, run this round's exchange
      // behind the next round's inner steps. Checkpoints, the last round and
      // any change of members (a joiner, a departure, a stale lineage) take
      // the synchronous path, which the elastic protocol already handles.
      const int end_step = trainer.state().step();
      const int every = config.checkpoint_every();
      const bool overlap_now =
          overlap && end_step < total && StopSignal() == 0 &&
          !(every > 0 && end_step / every > prev_step / every) &&
          SteadyMembers(swarm, last_members, node_id) &&
          !Swarm::Ahead(swarm.Best(), here());
      // Not "round": scripts read "round":N as that round's commit.
      events.Write("sync", JsonObject()
                               .Add("sync_round", run.round)
                               .Add("step", static_cast<int64_t>(end_step))
                               .Add("overlapped", overlap_now));
      launch_round(ctx, overlap_now);
      if (overlap_now) {
        eager_start = std::move(eager_next);
        if (absl::Status s = Unflatten(eager_start, run.params); !s.ok()) {
          return Fail(s, 1);
        }
        if (sync.detector) sync.detector->Suppress();  // θ jumps to θ_global
        pending = std::move(ctx);
        continue;
      }
      absl::StatusOr<RoundAction> a = finish_round(*ctx, /*overlapped=*/false);
      if (!a.ok()) return Fail(a.status(), 1);
      if (*a == RoundAction::kLeave) {
        left = true;
        break;
      }
    }
    if (pending) {
      // Left while a round was in flight (a second signal): settle it, so that
      // the checkpoint holds a θ_global the swarm agreed on.
      std::shared_ptr<RoundCtx> prev = std::move(pending);
      absl::StatusOr<RoundAction> a = finish_round(*prev, /*overlapped=*/true);
      if (!a.ok()) return Fail(a.status(), 1);
    }
    log_changes();
    ops.SetReady(false);
    training = !left && stay_until_caught_up();
  }
  // Goodbye first, so that nobody waits for this node, then the checkpoint.
  swarm.Leave();
  if (left) {
    events.Write(
        "leave",
        JsonObject()
            .Add("round", run.round)
            .Add("step", static_cast<int64_t>(trainer.state().step())));
  }
  if (absl::Status s = run.Checkpoint(run.round, bytes_sent(), bytes_received(),
                                      events.WallSeconds());
      !s.ok()) {
    return Fail(s, 1);
  }
  NodeTotals totals = run.Totals(node_id, bytes_sent(), bytes_received(),
                                 events.WallSeconds(), last_world);
  if (absl::Status s =
          run.Finish(events, totals, last_rank, last_world, run.h, left);
      !s.ok()) {
    return Fail(s, 1);
  }
  swarm.Shutdown();
  if (left) {
    WriteStderrLine(absl::StrCat(
        "starling node: ", node_id, " left the swarm on signal ", StopSignal(),
        " at step ", trainer.state().step(), " (round ", run.round,
        "); checkpoint in ", run.ckpt_path));
    return 1;
  }
  WriteStderrLine(absl::StrFormat("%s done: %d steps in %d rounds, sent %s",
                                  node_id, trainer.state().step(), run.round,
                                  FormatBytes(totals.bytes_sent)));
  return 0;
}

}  // namespace

namespace {

// Writes y as flat little-endian fp32 to OUT/snapshots/step_<S>.bin, for
// `starling sim`'s consensus distance (node/consensus.h).
absl::Status WriteSnapshot(const std::string& out, int step,
                           const std::vector<float>& y) {
  const std::string dir = absl::StrCat(out, "/snapshots");
  STARLING_RETURN_IF_ERROR(MakeDirs(dir));
  return WriteFileAtomic(
      absl::StrCat(dir, "/step_", step, ".bin"),
      absl::string_view(reinterpret_cast<const char*>(y.data()),
                        y.size() * sizeof(float)));
}

// Asynchronous push-sum gossip (SGP) over a Swarm's membership: no rounds,
// no barrier, no quorum. After every --inner_steps local steps a node
// absorbs the pushes it received, then pushes (y, w/2) to one live peer
// (gossip/push_sum.h), trying another when a push fails.
int RunGossip(NodeRun& run) {
  Trainer& trainer = *run.trainer;
  const TrainConfig& config = run.config;
  absl::StatusOr<SwarmOptions> shared = SharedSwarmOptions(run, "gossip");
  if (!shared.ok()) return Fail(shared.status(), 2);
  SwarmOptions so = std::move(shared).value();
  const std::string node_id = so.node_id;
  const std::string peer_mode = absl::GetFlag(FLAGS_gossip_peers);
  if (peer_mode != "random" && peer_mode != "exponential") {
    return Fail(
        absl::InvalidArgumentError(absl::StrCat(
            "--gossip_peers=", peer_mode, ": expected random or exponential")),
        2);
  }
  const double push_timeout_s = absl::GetFlag(FLAGS_gossip_timeout);
  const double beta = absl::GetFlag(FLAGS_gossip_momentum);
  const double alpha = absl::GetFlag(FLAGS_gossip_outer_lr);
  const int snapshot_every = absl::GetFlag(FLAGS_snapshot_every);
  const int min_members = absl::GetFlag(FLAGS_min_members);
  const bool lossy = !run.param_policy->lossless();
  const Codec* codec = lossy ? run.param_policy.get() : nullptr;
  // What each peer holds of this node's last push to it (lossy pushes).
  std::map<std::string, PublicCopy> public_copies;

  EventLog events(absl::StrCat(run.out, "/events.jsonl"), node_id,
                  trainer.state().wall_seconds());
  MemberChanges changes(so.node_id);
  so.identity.compression = run.param_policy->Name();
  so.push_elements = run.n_params;
  so.push_codec = lossy ? run.param_policy.get() : nullptr;
  so.push_timeout = absl::Seconds(push_timeout_s);
  so.on_member_change = [&](const MembershipChange& c) { changes.Add(c); };
  absl::StatusOr<std::unique_ptr<Swarm>> started = Swarm::Start(so);
  if (!started.ok()) {
    return Fail(started.status(),
                absl::IsInvalidArgument(started.status()) ? 2 : 1);
  }
  Swarm& swarm = **started;
  auto bytes_sent = [&] { return run.prior[0] + swarm.bytes_sent(); };
  auto bytes_received = [&] { return run.prior[1] + swarm.bytes_received(); };
  auto log_changes = [&] { changes.Log(events); };
  STARLING_LOG(INFO) << node_id << " (gossip, push-sum) listening on "
                     << swarm.address() << ", "
                     << trainer.model().Architecture() << ", " << run.n_params
                     << " parameters, data " << trainer.dataset().Describe();
  const absl::Duration connect =
      absl::Seconds(absl::GetFlag(FLAGS_connect_timeout));
  NodeOps& ops = *run.ops;
  ops.watchdog->Waiting(2 * connect);
  if (absl::Status s = swarm.JoinSwarm(absl::Now() + connect); !s.ok()) {
    events.Write("error", JsonObject().Add("message", s.message()));
    return Fail(s, absl::IsFailedPrecondition(s) ? 2 : 1);
  }
  // Only now do the others count this node towards --min_members: counted
  // earlier (they hear of it from its first gossip), they could train and
  // leave while it is still in JoinSwarm, and it would wait for them in vain.
  swarm.SetProgress({}, /*joining=*/false);
  if (absl::Status s = swarm.WaitForMembers(min_members, absl::Now() + connect);
      !s.ok()) {
    return Fail(s, 1);
  }
  PushSum push_sum(1.0);
  if (run.gossip_weight > 0) push_sum.set_weight(run.gossip_weight);
  std::vector<float> y = Flatten(run.params);
  events.Write(config.resume() ? "resume" : "start",
               JsonObject()
                   .Add("algo", "gossip")
                   .Add("address", swarm.address())
                   .Add("step", static_cast<int64_t>(trainer.state().step()))
                   .Add("parameters", run.n_params)
                   .Add("weight", push_sum.weight())
                   .Add("model_hash", FlatHash(y)));
  InstallStopSignals();

  // SlowMo-style outer momentum on the gossiped update (off when β = 0 and
  // α = 1): anchor x0 is the model after the previous gossip.
  const bool momentum = beta > 0 || alpha != 1;
  std::vector<float> x0, u;
  if (momentum) {
    x0 = y;
    u.assign(y.size(), 0.0f);
  }
  std::mt19937_64 rng(std::hash<std::string>()(node_id) ^
                      static_cast<uint64_t>(config.seed()));
  const absl::Duration push_timeout = absl::Seconds(push_timeout_s);
  int64_t exchanges = 0, pushes = 0, absorbs = 0, failed_pushes = 0;
  int64_t raw_bytes = 0, wire_bytes = 0;
  int exp_step = 0;  // exponential graph: the next offset's exponent
  const int total = config.steps();
  bool left = false;

  auto absorb_inbox = [&]() -> absl::Status {
    for (ReceivedPush& p : swarm.TakePushes()) {
      absl::StatusOr<double> d2 =
          push_sum.Absorb(absl::MakeSpan(y), p.values, p.weight);
      if (!d2.ok()) {
        LogEvent(LogLevel::kWarning, "exchange",
                 absl::StrCat("dropped a push from ", p.from, ": ",
                              d2.status().message()));
        continue;
      }
      ++exchanges;
      ++absorbs;
      if (ops.metrics) ops.metrics->SetConsensusDistance(*d2);
      events.Write(
          "exchange",
          JsonObject()
              .Add("kind", "absorb")
              .Add("peer", p.from)
              .Add("step", static_cast<int64_t>(trainer.state().step()))
              .Add("weight", push_sum.weight())
              .Add("bytes", p.wire_bytes)
              .Add("distance2", *d2));
    }
    return absl::OkStatus();
  };

  // Peers to try for one push, best first: the exponential graph's next
  // neighbour (offsets 2^0, 2^1, ... over the sorted live ids, cycling) or a
  // random order; at most three tries.
  int max_world = 1;  // the most members seen alive, for the summary
  auto candidates = [&]() {
    std::vector<std::string> peers = swarm.AlivePeers();
    max_world = std::max(max_world, static_cast<int>(peers.size()) + 1);
    std::shuffle(peers.begin(), peers.end(), rng);
    if (peer_mode == "exponential" && !peers.empty()) {
      std::vector<std::string> ids = swarm.AlivePeers();
      ids.push_back(node_id);
      std::sort(ids.begin(), ids.end());
      const int n = static_cast<int>(ids.size());
      const int me = static_cast<int>(
          std::find(ids.begin(), ids.end(), node_id) - ids.begin());
      int levels = 0;
      while ((1 << levels) < n) ++levels;
      const int offset = 1 << (exp_step % std::max(1, levels));
      ++exp_step;
      const std::string& first = ids[(me + offset) % n];
      auto it = std::find(peers.begin(), peers.end(), first);
      if (it != peers.end()) std::rotate(peers.begin(), it, it + 1);
    }
    if (peers.size() > 3) peers.resize(3);
    return peers;
  };

  while (trainer.state().step() < total) {
    log_changes();
    ops.SetReady(StopSignal() == 0);
    const int prev_step = trainer.state().step();
    const int steps = std::min(run.h, total - prev_step);
    double loss_sum = 0;
    for (int i = 0; i < steps; ++i) {
      if (StopSignalCount() >= 2) break;  // a second signal: leave now
      absl::StatusOr<StepResult> r = StepOrLeave(trainer, events, swarm);
      if (!r.ok()) return Fail(r.status(), 1);
      loss_sum += r->loss;
      SetLogPosition(pushes, trainer.state().step());
      ops.Step(*r, trainer.state().step());
    }
    y = Flatten(run.params);
    if (absl::Status s = absorb_inbox(); !s.ok()) return Fail(s, 1);
    if (momentum) {
      for (size_t i = 0; i < y.size(); ++i) {
        u[i] = static_cast<float>(beta * u[i] + (x0[i] - y[i]));
        y[i] = static_cast<float>(x0[i] - alpha * u[i]);
      }
    }
    if (lossy) {
      // Copies for peers that left or died would grow with churn; one that
      // comes back is pushed to in full.
      for (const peer::v1::MemberEntry& e : swarm.Members()) {
        if (e.state() == peer::v1::MEMBER_DEAD ||
            e.state() == peer::v1::MEMBER_LEFT) {
          public_copies.erase(e.id());
        }
      }
    }
    std::vector<std::string> peers = candidates();
    for (const std::string& peer : peers) {
      // With a lossy codec, push y minus the copy `peer` holds of this
      // node's last push to it (its first push to a peer is absolute).
      absl::StatusOr<PushShare> share = push_sum.Share(
          absl::MakeSpan(y), codec, lossy ? &public_copies[peer] : nullptr);
      if (!share.ok()) {
        events.Write("error",
                     JsonObject().Add("message", share.status().message()));
        swarm.Leave();
        return Fail(share.status(), 1);
      }
      SetCrashRound(pushes + 1);
      ops.watchdog->Waiting(push_timeout);
      const int64_t sent_before = bytes_sent();
      int64_t sequence = 0;
      absl::Status s = swarm.Push(peer, *share, push_timeout, &sequence);
      if (!s.ok()) {
        push_sum.Restore(*share, absl::MakeSpan(y));
        if (!swarm.LinkError().ok()) {
          // An emulated link too slow for any push: retrying cannot help.
          // Keep this node's model, weight and what it absorbed first, as a
          // node leaving on a signal does: the senders gave that mass away.
          run.gossip_weight = push_sum.weight();
          run.CheckpointBeforeFailing(Unflatten(y, run.params), 0, bytes_sent(),
                                      bytes_received(), events.WallSeconds());
          events.Write("error", JsonObject().Add("message", s.message()));
          swarm.Leave();
          return Fail(s, 1);
        }
        // The peer lacks the copy this share was relative to (it restarted,
        // or took a push this node saw fail): the next push is absolute.
        if (absl::IsFailedPrecondition(s)) public_copies.erase(peer);
        ++failed_pushes;
        LogEvent(
            LogLevel::kInfo, "exchange",
            absl::StrCat("push failed, trying another peer: ", s.message()),
            {{"peer", peer}});
        continue;
      }
      ++pushes;
      ++exchanges;
      if (lossy) {
        public_copies[peer] = PublicCopy{sequence, std::move(share->sent)};
      }
      raw_bytes += run.n_params * static_cast<int64_t>(sizeof(float));
      wire_bytes += static_cast<int64_t>(share->payload.size());
      events.Write(
          "exchange",
          JsonObject()
              .Add("kind", "push")
              .Add("peer", peer)
              .Add("step", static_cast<int64_t>(trainer.state().step()))
              .Add("weight", push_sum.weight())
              .Add("bytes", bytes_sent() - sent_before)
              .Add("relative_to", share->base_sequence)
              .Add("train_loss", loss_sum / std::max(1, steps)));
      break;
    }
    if (momentum) x0 = y;
    if (absl::Status s = Unflatten(y, run.params); !s.ok()) return Fail(s, 1);
    const int step = trainer.state().step();
    if (absl::Status s = run.MaybeEvaluate(step == total, prev_step, events);
        !s.ok()) {
      return Fail(s, 1);
    }
    if (snapshot_every > 0 &&
        (step / snapshot_every > prev_step / snapshot_every || step == total)) {
      if (absl::Status s = WriteSnapshot(run.out, step, y); !s.ok()) {
        LogEvent(LogLevel::kWarning, "snapshot", std::string(s.message()));
      }
    }
    double elapsed = events.WallSeconds();
    double eta = step > 0 ? elapsed * (total - step) / step : 0;
    LogEvent(
        LogLevel::kInfo, "gossip",
        absl::StrFormat("%s step %d/%d | loss %.4f | w %.4f | pushes %d "
                        "absorbed %d | sent %s | eta %s",
                        node_id, step, total, loss_sum / std::max(1, steps),
                        push_sum.weight(), pushes, absorbs,
                        FormatBytes(static_cast<double>(bytes_sent())),
                        FormatDuration(eta)));
    run.gossip_weight = push_sum.weight();
    if (ops.metrics) {
      ops.metrics->SetTraffic(bytes_sent(), bytes_received(), raw_bytes,
                              wire_bytes);
      const int alive = static_cast<int>(swarm.AlivePeers().size());
      ops.metrics->SetPeers(alive, alive);
      ops.metrics->SetRpcErrors(swarm.rpc_errors());
      ops.metrics->SetRefusals(swarm.refusals());
    }
    if (config.checkpoint_every() > 0 &&
        step / config.checkpoint_every() >
            prev_step / config.checkpoint_every() &&
        step < total) {
      if (absl::Status s = run.Checkpoint(0, bytes_sent(), bytes_received(),
                                          events.WallSeconds());
          !s.ok()) {
        return Fail(s, 1);
      }
    }
    // SIGINT/SIGTERM: leave after the current local steps.
    if (StopSignal() != 0 && step < total) {
      left = true;
      break;
    }
  }
  log_changes();
  ops.SetReady(false);
  // Goodbye first, so that nobody pushes to this node any more.
  swarm.Leave();
  const int world = max_world;
  run.gossip_weight = push_sum.weight();
  if (left) {
    events.Write(
        "leave",
        JsonObject().Add("step", static_cast<int64_t>(trainer.state().step())));
  } else if (run.evaluated_step != trainer.state().step()) {
    if (absl::Status s =
            run.MaybeEvaluate(true, trainer.state().step(), events);
        !s.ok()) {
      return Fail(s, 1);
    }
  }
  if (absl::Status s = run.Checkpoint(0, bytes_sent(), bytes_received(),
                                      events.WallSeconds());
      !s.ok()) {
    return Fail(s, 1);
  }
  NodeTotals totals = run.Totals(node_id, bytes_sent(), bytes_received(),
                                 events.WallSeconds(), world);
  totals.compression = run.param_policy->Name();
  if (lossy) totals.compression += " + error feedback (gossip)";
  totals.bytes_before_compression = raw_bytes;
  totals.bytes_after_compression = wire_bytes;
  events.Write(left ? "interrupted" : "end",
               JsonObject()
                   .Add("step", static_cast<int64_t>(trainer.state().step()))
                   .Add("exchanges", exchanges)
                   .Add("bytes_sent", totals.bytes_sent));
  JsonObject extra;
  extra.Add("algo", "gossip")
      .Add("world", static_cast<int64_t>(world))
      .Add("inner_steps_per_round", static_cast<int64_t>(run.h))
      .Add("exchanges", exchanges)
      .Add("pushes", pushes)
      .Add("absorbs", absorbs)
      .Add("failed_pushes", failed_pushes)
      .Add("pushes_refused", swarm.pushes_refused())
      .Add("push_sum_weight", push_sum.weight());
  EvalResult final_eval = run.eval;
  if (run.evaluated_step != trainer.state().step()) final_eval = EvalResult();
  if (absl::Status s = WriteNodeSummary(run.out, "node", trainer, final_eval,
                                        totals, run.rounds, left, extra);
      !s.ok()) {
    return Fail(s, 1);
  }
  swarm.Shutdown();
  if (left) {
    WriteStderrLine(absl::StrCat("starling node: ", node_id,
                                 " left the swarm on signal ", StopSignal(),
                                 " at step ", trainer.state().step(),
                                 "; checkpoint in ", run.ckpt_path));
    return 1;
  }
  WriteStderrLine(absl::StrFormat(
      "%s done: %d steps, %d exchanges (%d pushes, %d absorbed), sent %s",
      node_id, trainer.state().step(), exchanges, pushes, absorbs,
      FormatBytes(totals.bytes_sent)));
  return 0;
}

}  // namespace

namespace {

// Synchronous data-parallel baseline over a fixed member list: gradients are
// all-reduced every step; members vote in every all-reduce so that a
// SIGINT/SIGTERM stops all of them after the same step.
int RunDdp(NodeRun& run) {
  Trainer& trainer = *run.trainer;
  const TrainConfig& config = run.config;
  absl::StatusOr<StaticMembers> membership =
      ParseMembers(absl::GetFlag(FLAGS_listen), absl::GetFlag(FLAGS_peers));
  if (!membership.ok()) return Fail(membership.status(), 2);
  const int world = static_cast<int>(membership->members.size());
  const int rank = membership->rank;
  const std::string node_id = absl::StrCat("n", rank);
  EventLog events(absl::StrCat(run.out, "/events.jsonl"), node_id,
                  trainer.state().wall_seconds());
  STARLING_LOG(INFO) << node_id << " of " << world << " (ddp), "
                     << trainer.model().Architecture() << ", " << run.n_params
                     << " parameters, data " << trainer.dataset().Describe();
  std::unique_ptr<GrpcTransport> transport;
  if (world > 1) {
    GrpcTransportOptions to;
    to.listen = membership->members[rank];
    to.chunk_bytes = run.chunk;
    to.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_round_timeout));
    to.links = run.links;
    to.credentials = run.credentials;
    to.stream_idle_timeout = run.stream_idle;
    to.peer_max_streams = run.peer_max_streams;
    to.chunk_stream_deadline = to.rpc_timeout + absl::Minutes(1);
    PeerIdentity id;
    id.run_id = absl::GetFlag(FLAGS_run_id);
    id.algo = "ddp";
    id.world = world;
    id.compression = "fp32";
    id.model = MakeFingerprint(trainer.model().Architecture(), run.n_params,
                               run.init_hash);
    absl::StatusOr<std::unique_ptr<GrpcTransport>> t =
        GrpcTransport::Start(to, id);
    if (!t.ok()) return Fail(t.status(), 1);
    transport = std::move(t).value();
    MailboxOptions mo;
    mo.run_id = id.run_id;
    mo.tensors = {{kGrad, run.n_params + 2}};
    mo.first_round = run.round;
    STARLING_LOG(INFO) << "listening on " << transport->address()
                       << "; connecting to " << world - 1 << " peers";
    absl::Status s = transport->Connect(
        membership->members, rank, mo,
        absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_connect_timeout)));
    if (!s.ok()) return Fail(s, absl::IsFailedPrecondition(s) ? 2 : 1);
    transport->mailbox().AdvanceRound(run.round);
  }
  events.Write(config.resume() ? "resume" : "start",
               JsonObject()
                   .Add("rank", static_cast<int64_t>(rank))
                   .Add("world", static_cast<int64_t>(world))
                   .Add("algo", "ddp")
                   .Add("round", run.round)
                   .Add("step", static_cast<int64_t>(trainer.state().step()))
                   .Add("parameters", run.n_params)
                   .Add("model_hash", run.init_hash));
  InstallStopSignals();
  auto bytes_sent = [&] {
    return run.prior[0] + (transport ? transport->bytes_sent() : 0);
  };
  auto bytes_received = [&] {
    return run.prior[1] + (transport ? transport->bytes_received() : 0);
  };
  std::vector<std::string> all_members;
  for (int r = 0; r < world; ++r) all_members.push_back(absl::StrCat("n", r));
  RingOptions ring;
  ring.step_timeout = absl::Seconds(absl::GetFlag(FLAGS_round_timeout));
  bool interrupted = false, stop_voted = false;
  const int total = config.steps();
  while (trainer.state().step() < total) {
    if (!transport && StopSignal() != 0) {
      interrupted = true;
      break;
    }
    const auto round_start = absl::Now();
    const int64_t sent_before = bytes_sent();
    const int prev_step = trainer.state().step();
    if (transport) transport->mailbox().AdvanceRound(run.round);
    Trainer::GradientHook hook = nullptr;
    if (world > 1) {
      hook = [&](const std::vector<torch::Tensor>& ps) -> absl::Status {
        std::vector<float> g = FlattenGrads(ps);
        RingOptions o = ring;
        o.tensor = kGrad;
        o.round = run.round;
        std::vector<float> votes = {StopSignal() != 0 ? 1.0f : 0.0f};
        o.extra_sums = &votes;
        STARLING_RETURN_IF_ERROR(RingWeightedAverage(
            *transport, g, static_cast<double>(config.batch()), o));
        stop_voted = stop_voted || votes[0] > 0;
        return UnflattenGrads(g, ps);
      };
    }
    run.ops->SetReady(StopSignal() == 0);
    // A step waits for the all-reduce: its timeout on top of the step.
    run.ops->watchdog->Waiting(ring.step_timeout);
    absl::StatusOr<StepResult> r = trainer.Step(hook);
    if (!r.ok()) {
      events.Write("error", JsonObject().Add("message", r.status().message()));
      return Fail(r.status(), 1);
    }
    LogDrift(events, trainer, *r);
    SetLogPosition(run.round + 1, trainer.state().step());
    run.ops->Step(*r, trainer.state().step());
    if (run.ops->metrics) {
      run.ops->metrics->SetTraffic(bytes_sent(), bytes_received(), 0, 0);
      run.ops->metrics->Round(kRoundCommitted, r->seconds, 0);
    }
    RoundRecord rec;
    rec.round = run.round;
    rec.step = trainer.state().step();
    rec.members = all_members;
    rec.model_hash = ModelHash(run.params);
    rec.train_loss = r->loss;
    rec.bytes = bytes_sent() - sent_before;
    rec.seconds = absl::ToDoubleSeconds(absl::Now() - round_start);
    ++run.round;
    if (absl::Status s = run.RecordRound(rec, rank == 0, prev_step, events);
        !s.ok()) {
      return Fail(s, 1);
    }
    if ((config.log_every() > 0 && rec.step % config.log_every() == 0) ||
        rec.step == total) {
      double elapsed = events.WallSeconds();
      double eta = rec.step > 0 ? elapsed * (total - rec.step) / rec.step : 0;
      WriteStderrLine(absl::StrFormat(
          "%s step %d/%d | loss %.4f | sent %s | hash %s | eta %s", node_id,
          rec.step, total, rec.train_loss,
          FormatBytes(static_cast<double>(bytes_sent())),
          rec.model_hash.substr(0, 8), FormatDuration(eta)));
    }
    if (config.checkpoint_every() > 0 &&
        rec.step / config.checkpoint_every() >
            prev_step / config.checkpoint_every() &&
        rec.step < total) {
      if (absl::Status s = run.Checkpoint(
              run.round, bytes_sent(), bytes_received(), events.WallSeconds());
          !s.ok()) {
        return Fail(s, 1);
      }
    }
    if (stop_voted && rec.step < total) {
      interrupted = true;
      break;
    }
  }
  run.ops->SetReady(false);
  if (absl::Status s = run.Checkpoint(run.round, bytes_sent(), bytes_received(),
                                      events.WallSeconds());
      !s.ok()) {
    return Fail(s, 1);
  }
  NodeTotals totals = run.Totals(node_id, bytes_sent(), bytes_received(),
                                 events.WallSeconds(), world);
  if (absl::Status s = run.Finish(events, totals, rank, world, 1, interrupted);
      !s.ok()) {
    return Fail(s, 1);
  }
  if (transport) transport->Shutdown();
  if (interrupted) {
    WriteStderrLine(absl::StrCat(
        "starling node: interrupted by signal ", StopSignal(), " at step ",
        trainer.state().step(), "; checkpoint in ", run.ckpt_path));
    return 1;
  }
  WriteStderrLine(absl::StrFormat("%s done: %d steps, sent %s", node_id,
                                  trainer.state().step(),
                                  FormatBytes(totals.bytes_sent)));
  return 0;
}

}  // namespace

namespace {

// gRPC's own log lines (connection errors and the like) go through the
// node's logger, so that --log_format=json keeps every stderr line JSON.
void LogFromGrpc(gpr_log_func_args* args) {
  const char* base = std::strrchr(args->file, '/');
  LogEvent(args->severity == GPR_LOG_SEVERITY_ERROR ? LogLevel::kError
                                                    : LogLevel::kInfo,
           "grpc", args->message,
           {{"source",
             absl::StrCat(base ? base + 1 : args->file, ":", args->line)}});
}

OuterOptions OuterOptionsFromFlags() {
  OuterOptions oo;
  oo.kind = absl::GetFlag(FLAGS_outer);
  oo.lr = absl::GetFlag(FLAGS_outer_lr);
  oo.momentum = absl::GetFlag(FLAGS_outer_momentum);
  return oo;
}

PolicyOptions PolicyOptionsFromFlags() {
  PolicyOptions po;
  po.main = absl::GetFlag(FLAGS_compression);
  po.small = absl::GetFlag(FLAGS_small_tensor_codec);
  po.small_elements = absl::GetFlag(FLAGS_small_tensor_elems);
  return po;
}

// Reads the node-only flags that need no model, data, file or peer into
// `run` and checks them: InvalidArgument naming the flag. `--test_poison`
// and the link flags are left out (the sim sets them per node).
absl::Status ParseNodeFlags(NodeRun& run) {
  run.algo = absl::GetFlag(FLAGS_algo);
  if (run.algo != "diloco" && run.algo != "ddp" && run.algo != "gossip") {
    return absl::InvalidArgumentError(
        absl::StrCat("--algo=", run.algo, ": expected diloco, ddp or gossip"));
  }
  run.h = absl::GetFlag(FLAGS_inner_steps);
  if (run.h < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--inner_steps=", run.h, ": must be >= 1"));
  }
  if (absl::StatusOr<AdaptiveSync> a = ParseAdaptiveSync(run.h); !a.ok()) {
    return a.status();
  } else {
    run.sync = std::move(a).value();
  }
  if (absl::GetFlag(FLAGS_overlap)) {
    if (run.algo != "diloco") {
      return absl::InvalidArgumentError(
          absl::StrCat("--overlap: only --algo=diloco has outer rounds to "
                       "overlap (got --algo=",
                       run.algo, ")"));
    }
    if (run.sync.round_seconds > 0 || run.sync.h->adaptive() ||
        run.sync.detector || run.sync.divergence) {
      return absl::InvalidArgumentError(
          "--overlap needs a fixed H: drop --round_seconds, "
          "--min_inner_steps/--max_inner_steps, "
          "--drift_detector=page_hinkley and "
          "--divergence_threshold");
    }
  }
  if (const std::string c = absl::GetFlag(FLAGS_compression);
      run.algo == "ddp" && c != "fp32") {
    // ddp would silently send fp32 anyway.
    return absl::InvalidArgumentError(absl::StrCat(
        "--compression=", c,
        ": ddp all-reduces fp32 gradients every step; --compression applies "
        "to --algo=diloco and --algo=gossip"));
  }
  if (absl::StatusOr<AggregateSpec> a =
          ParseAggregate(absl::GetFlag(FLAGS_aggregate));
      !a.ok()) {
    return a.status();
  } else {
    run.aggregate = *a;
  }
  run.norm_bound = absl::GetFlag(FLAGS_norm_bound);
  if (!(run.norm_bound >= 0) || !std::isfinite(run.norm_bound) ||
      (run.norm_bound > 0 && run.norm_bound < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--norm_bound=", run.norm_bound,
                     ": must be 0 (off) or a multiple >= 1 of the round's "
                     "median norm"));
  }
  run.robust = run.aggregate.kind != AggregateKind::kMean || run.norm_bound > 0;
  if (run.robust && run.algo != "diloco") {
    return absl::InvalidArgumentError(
        absl::StrCat("--aggregate/--norm_bound apply to --algo=diloco rounds "
                     "(got --algo=",
                     run.algo, ")"));
  }
  run.chunk = absl::GetFlag(FLAGS_chunk_bytes);
  if (run.chunk < 1024 || run.chunk > (4 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--chunk_bytes=", run.chunk, ": must be in [1024, 4194304]"));
  }
  // Timeouts and the like, checked before any slow setup (and by `starling
  // sim` before any node starts): a negative --round_timeout used to leave
  // every node waiting forever.
  auto positive = [](absl::string_view flag, double v, absl::string_view unit) {
    return v > 0 && std::isfinite(v)
               ? absl::OkStatus()
               : absl::InvalidArgumentError(
                     absl::StrCat("--", flag, "=", v, ": must be > 0", unit));
  };
  const double idle = absl::GetFlag(FLAGS_stream_idle_timeout);
  STARLING_RETURN_IF_ERROR(positive("stream_idle_timeout", idle, " seconds"));
  run.stream_idle = absl::Seconds(idle);
  STARLING_RETURN_IF_ERROR(positive(
      "round_timeout", absl::GetFlag(FLAGS_round_timeout), " seconds"));
  STARLING_RETURN_IF_ERROR(positive(
      "connect_timeout", absl::GetFlag(FLAGS_connect_timeout), " seconds"));
  STARLING_RETURN_IF_ERROR(positive(
      "round_deadline", absl::GetFlag(FLAGS_round_deadline), " seconds"));
  STARLING_RETURN_IF_ERROR(positive(
      "suspect_timeout", absl::GetFlag(FLAGS_suspect_timeout), " seconds"));
  STARLING_RETURN_IF_ERROR(positive(
      "gossip_timeout", absl::GetFlag(FLAGS_gossip_timeout), " seconds"));
  STARLING_RETURN_IF_ERROR(
      positive("gossip_outer_lr", absl::GetFlag(FLAGS_gossip_outer_lr), ""));
  if (const double found_after = absl::GetFlag(FLAGS_found_after);
      !(found_after >= 0) || !std::isfinite(found_after)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--found_after=", found_after, ": must be >= 0 seconds"));
  }
  if (const int m = absl::GetFlag(FLAGS_min_members); m < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--min_members=", m, ": must be >= 1"));
  }
  if (const double beta = absl::GetFlag(FLAGS_gossip_momentum);
      !(beta >= 0 && beta < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gossip_momentum=", beta, ": must be in [0, 1)"));
  }
  if (const int every = absl::GetFlag(FLAGS_snapshot_every); every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--snapshot_every=", every, ": must be >= 0"));
  }
  run.peer_max_streams = absl::GetFlag(FLAGS_peer_max_streams);
  if (run.peer_max_streams < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer_max_streams=", run.peer_max_streams,
                     ": must be a number of streams >= 0 (0 = no limit)"));
  }
  // Checked here so that a bad value fails before the data load; built
  // again once the model's size is known.
  STARLING_RETURN_IF_ERROR(
      OuterOptimizer::Create(OuterOptionsFromFlags(), 1).status());
  STARLING_RETURN_IF_ERROR(
      PolicyCodec::Create({}, PolicyOptionsFromFlags()).status());
  const std::string ef_flag = absl::GetFlag(FLAGS_error_feedback);
  if (ef_flag != "auto" && ef_flag != "on" && ef_flag != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--error_feedback=", ef_flag, ": expected auto, on or off"));
  }
  return absl::OkStatus();
}

}  // namespace

PeerSecurityOptions PeerSecurityFromFlags() {
  PeerSecurityOptions security;
  security.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  security.tls_key = absl::GetFlag(FLAGS_tls_key);
  security.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  security.tls_require_client_cert =
      absl::GetFlag(FLAGS_tls_require_client_cert);
  security.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  security.tls_bind_node_ids = absl::GetFlag(FLAGS_tls_bind_node_ids);
  security.node_id = NodeIdFromFlags();
  security.insecure = absl::GetFlag(FLAGS_insecure);
  security.join_token_file = absl::GetFlag(FLAGS_join_token_file);
  security.peer_rate_limit = absl::GetFlag(FLAGS_peer_rate_limit);
  return security;
}

int WeightCopiesOfNode(const std::string& algo) {
  return algo == "diloco" ? 3 : 1;
}

absl::Status CheckNodeFlags() {
  NodeRun run;
  return ParseNodeFlags(run);
}

int RunNodeCommand() {
  LogFormat format;
  if (absl::Status s = ParseLogFormat(absl::GetFlag(FLAGS_log_format), &format);
      !s.ok()) {
    return Fail(s, 2);
  }
  SetLogFormat(format);
  gpr_set_log_function(LogFromGrpc);
  NodeRun run;
  run.config = ConfigFromFlags();
  TrainConfig& config = run.config;
  if (absl::Status s = ResolveTrainConfig(&config); !s.ok()) return Fail(s, 2);
  if (absl::Status s = ParseNodeFlags(run); !s.ok()) return Fail(s, 2);
  if (absl::StatusOr<std::vector<PoisonWindow>> p =
          ParsePoisonPlan(absl::GetFlag(FLAGS_test_poison));
      !p.ok()) {
    return Fail(p.status(), 2);
  } else {
    run.poison = *std::move(p);
  }
  if (absl::StatusOr<LinkEmulatorOptions> links =
          ParseLinkFlags(absl::GetFlag(FLAGS_link_bandwidth_mbps),
                         absl::GetFlag(FLAGS_link_latency_ms));
      !links.ok()) {
    return Fail(links.status(), 2);
  } else if (links->shaped()) {
    run.links = std::make_shared<LinkEmulator>(*std::move(links));
  }
  const PeerSecurityOptions security = PeerSecurityFromFlags();
  if (security.tls_bind_node_ids && run.algo == "ddp") {
    return Fail(absl::InvalidArgumentError(
                    "--tls_bind_node_ids: --algo=ddp has no node ids (ranks "
                    "follow --peers); use it with diloco or gossip"),
                2);
  }
  if (absl::StatusOr<PeerCredentials> c = LoadPeerCredentials(security);
      !c.ok()) {
    return Fail(c.status(), 2);
  } else {
    run.credentials = *std::move(c);
  }
  std::string log_node = NodeIdFromFlags();
  if (run.algo == "ddp") {
    // Check the member list before any slow setup.
    absl::StatusOr<StaticMembers> m =
        ParseMembers(absl::GetFlag(FLAGS_listen), absl::GetFlag(FLAGS_peers));
    if (!m.ok()) return Fail(m.status(), 2);
    log_node = absl::StrCat("n", m->rank);
  }
  SetLogNode(log_node);
  if (!run.credentials.tls) {
    LogEvent(LogLevel::kWarning, "insecure",
             run.credentials.join_auth == nullptr
                 ? "--insecure: peer traffic is plaintext and "
                   "unauthenticated; use it only on a network you trust "
                   "(--tls_cert, --tls_key and --tls_ca turn TLS on)"
                 : "--insecure: peer traffic is plaintext (the join token "
                   "admits callers, but anyone on the path can read or alter "
                   "a call); use it only on a network you trust (--tls_cert, "
                   "--tls_key and --tls_ca turn TLS on)");
  } else {
    LogEvent(LogLevel::kInfo, "tls",
             absl::StrCat("peer traffic uses TLS",
                          run.credentials.mutual ? " (mutual)" : "", ", CA ",
                          security.tls_ca));
  }
  if (run.credentials.join_auth != nullptr) {
    LogEvent(LogLevel::kInfo, "join_token",
             absl::StrCat("calls are signed and checked with the join token "
                          "in ",
                          security.join_token_file));
  }
  if (run.links) {
    auto [bandwidth, latency] = FormatLinkFlags(run.links->options());
    LogEvent(LogLevel::kInfo, "links",
             absl::StrCat("link emulator: bandwidth (Mbit/s) ", bandwidth,
                          "; latency (ms) ", latency),
             {{"bandwidth_mbps", bandwidth}, {"latency_ms", latency}});
  }
  // Health and metrics answer from the start (a probe during the data load
  // sees "not ready", not a refused connection).
  NodeOps ops;
  if (absl::Status s = StartOps(log_node, run.algo, config.device(), &ops);
      !s.ok()) {
    return Fail(s, absl::IsInvalidArgument(s) ? 2 : 1);
  }
  run.ops = &ops;
  if (absl::GetFlag(FLAGS_resume_if_exists) && !config.resume() &&
      !config.out().empty() &&
      FileExists(CheckpointPathInRunDir(config.out()))) {
    LogEvent(LogLevel::kInfo, "resume",
             absl::StrCat("--resume_if_exists: continuing the run in ",
                          config.out()));
    config.set_resume(true);
  }
  absl::StatusOr<std::unique_ptr<Trainer>> created = StartRun(&config, "node");
  if (!created.ok()) {
    return Fail(created.status(), ExitCodeFor(created.status()));
  }
  std::unique_ptr<Trainer> trainer_owner = std::move(created).value();
  if (absl::Status s =
          trainer_owner->CheckMemory(1, WeightCopiesOfNode(run.algo));
      !s.ok()) {
    return Fail(s, 2);
  }
  run.trainer = trainer_owner.get();
  run.out = config.out();
  run.ckpt_path = CheckpointPathInRunDir(run.out);
  Trainer& trainer = *run.trainer;
  run.params = trainer.Parameters();
  run.n_params = NumElements(run.params);
  // Every member must start from the same θ (the same --seed).
  run.init_hash = ModelHash(run.params);

  absl::StatusOr<std::unique_ptr<OuterOptimizer>> outer =
      OuterOptimizer::Create(OuterOptionsFromFlags(), run.n_params);
  if (!outer.ok()) return Fail(outer.status(), 2);
  run.outer = std::move(outer).value();

  // Pseudo-gradient compression: a per-tensor policy over the flat view
  // (params) and the same plus the fp32 averaging weight (the ring's tensor).
  const std::string compression = absl::GetFlag(FLAGS_compression);
  std::vector<int64_t> tensor_sizes;
  for (const auto& p : run.params) tensor_sizes.push_back(p.numel());
  PolicyOptions po = PolicyOptionsFromFlags();
  absl::StatusOr<std::unique_ptr<PolicyCodec>> param_policy =
      PolicyCodec::Create(tensor_sizes, po);
  if (!param_policy.ok()) return Fail(param_policy.status(), 2);
  run.param_policy = std::move(param_policy).value();
  // The averaging weights (outer_opt/weighting.h) and the stop vote.
  po.trailing_fp32 = kWeightingSlots + 1;
  absl::StatusOr<std::unique_ptr<PolicyCodec>> ring_policy =
      PolicyCodec::Create(tensor_sizes, po);
  if (!ring_policy.ok()) return Fail(ring_policy.status(), 2);
  run.ring_policy = std::move(ring_policy).value();
  run.ring_codec = compression == "fp32" ? nullptr : run.ring_policy.get();
  const std::string ef_flag = absl::GetFlag(FLAGS_error_feedback);
  run.use_ef = !run.param_policy->lossless() &&
               (ef_flag == "on" ||
                (ef_flag == "auto" && ErrorFeedbackByDefault(compression)));
  if (run.use_ef) run.feedback = std::make_unique<ErrorFeedback>(run.n_params);
  run.ef_in_model =
      run.feedback && run.algo == "diloco" && !absl::GetFlag(FLAGS_overlap);
  if (run.ef_in_model) {
    // The flush goes in the run's own codec when it is dense (int4's
    // residual is its rounding, which int4 again keeps well), in int8 after
    // top-k.
    PolicyOptions fo = po;
    if (absl::StartsWith(compression, "topk")) fo.main = "int8";
    absl::StatusOr<std::unique_ptr<PolicyCodec>> flush_policy =
        PolicyCodec::Create(tensor_sizes, fo);
    if (!flush_policy.ok()) return Fail(flush_policy.status(), 2);
    run.flush_policy = std::move(flush_policy).value();
  }

  if (config.resume()) {
    std::map<std::string, std::string> sections;
    absl::Status s = trainer.RestoreCheckpoint(run.ckpt_path, &sections);
    if (s.ok() && run.algo == "diloco") {
      s = run.outer->LoadState(sections["outer"]);
    }
    if (s.ok() && run.feedback) {
      s = run.feedback->LoadState(sections["error_feedback"]);
    }
    if (!s.ok()) return Fail(s, ExitCodeFor(s));
    (void)absl::SimpleAtoi(sections["round"], &run.round);
    // Absent from checkpoints written before lineages had a weight: 0.
    if (!absl::SimpleAtoi(sections["member_rounds"], &run.member_rounds) ||
        run.member_rounds < 0 || run.member_rounds > kMaxMemberRounds) {
      run.member_rounds = 0;
    }
    run.resumed_weight = sections["gossip_weight"];
    std::vector<std::string> comm = absl::StrSplit(sections["comm"], ',');
    for (size_t i = 0; i < comm.size() && i < 4; ++i) {
      (void)absl::SimpleAtoi(comm[i], &run.prior[i]);
    }
    // Rounds before the checkpoint, as this node logged them.
    run.rounds =
        ReadRoundEvents(absl::StrCat(run.out, "/events.jsonl"), run.round);
    if (trainer.state().step() >= config.steps()) {
      // Finished already: keep its summary.json as it is.
      WriteStderrLine(absl::StrCat("starling node: the run in ", run.out,
                                   " is already complete (",
                                   trainer.state().step(), " steps)"));
      return 0;
    }
  }
  if (run.algo == "gossip") {
    double w = 0;
    if (config.resume() && absl::SimpleAtod(run.resumed_weight, &w) && w > 0) {
      run.gossip_weight = w;
    }
    return RunGossip(run);
  }
  return run.algo == "ddp" ? RunDdp(run) : RunDiloco(run);
}

}  // namespace starling
