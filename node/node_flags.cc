#include "node/node_flags.h"

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
#include "node/node_command.h"
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

std::string NodeIdFromFlags() {
  std::string id = absl::GetFlag(FLAGS_node_id);
  return id.empty() ? absl::GetFlag(FLAGS_listen) : id;
}

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

}  // namespace starling
