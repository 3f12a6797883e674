#include "node/node_flags.h"

#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "compression/tensor_policy.h"
#include "core/status.h"
#include "gossip/link_shaper.h"
#include "gossip/peer_credentials.h"
#include "node/faults.h"
#include "node/flags.h"
#include "node/node_command.h"
#include "node/peer_address.h"
#include "node/train_command.h"
#include "outer_opt/outer_optimizer.h"
#include "outer_opt/robust_aggregate.h"
#include "outer_opt/sync_policy.h"
#include "outer_opt/weighting.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "host:port this node serves peers on; with --peers it must name a "
          "fixed port that the peers list too");
ABSL_FLAG(std::string, advertise, "",
          "diloco and gossip: host:port (a fixed port) peers are told to "
          "dial to reach this node, when that is not --listen: a port "
          "forward, a load balancer, or a public name for a node listening "
          "on 0.0.0.0; it travels in the join and the membership table. "
          "Empty: the --listen address");
ABSL_FLAG(std::string, relay, "auto",
          "diloco and gossip: what this node does when the member that "
          "admits it cannot dial it back (behind NAT or a firewall): "
          "'auto' keeps a stream open to a reachable member, which carries "
          "the peers' traffic to it (end-to-end TLS; the member that the "
          "fewest others relay through, another one when it dies); "
          "HOST:PORT names that member; 'off' stays unreachable");
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
ABSL_FLAG(bool, tls_bind_node_ids, true,
          "diloco and gossip, with --tls_require_client_cert (on by default "
          "there; off without mutual TLS, with --algo=ddp and in starling "
          "sim unless given): each member's certificate names its --node_id "
          "(as CN or a DNS subjectAltName), and a join, gossip, round "
          "message, push or tensor chunk sent under a member's id is "
          "refused unless the caller's certificate names that id; "
          "--tls_bind_node_ids=false for one certificate for every node");
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
          "topk:FRACTION[+int8|+fp16], each optionally +zstd, or "
          "sparse:FRACTION[:CHUNK][+int2|+int3|+int4] (chunk-wise top-k, "
          "few-bit values, Rice-coded indices; DiLoCo gathers the members' "
          "contributions instead of a ring), e.g. int8, int8+zstd, "
          "topk:0.01+int8, sparse:0.01");
ABSL_FLAG(bool, overlap, false,
          "diloco: delayed outer update (overlap of communication with "
          "compute): after a round's inner steps, start the next round's at "
          "once, from θ_global without that round's update, and apply the "
          "update when the next round ends. Hides the exchange behind compute "
          "at the cost of one round of staleness. Rounds stay synchronous "
          "while members change, at checkpoints and at the last round. Needs "
          "a fixed H");
ABSL_FLAG(int, overlap_steps, 0,
          "diloco: τ-delayed outer update (0: off): a round's exchange runs "
          "behind the first N inner steps of the next round, then its update "
          "is merged into the node's model, which keeps what those N steps "
          "learned (Streaming DiLoCo's delayed merge, with the node's own "
          "sent progress replaced by the swarm's). Staleness of N steps "
          "instead of --overlap's whole round; the residual of error feedback "
          "stays in the model. N < --inner_steps; not with --overlap. Needs a "
          "fixed H");
ABSL_FLAG(std::string, error_feedback, "auto",
          "auto (on for int4, topk and sparse, off otherwise) | on | off: "
          "keep what the codec dropped and add it to the next round's "
          "pseudo-gradient. DiLoCo keeps it in the node's own model (which "
          "trains from θ_global minus it) and, after the last round, "
          "averages the members' residuals in one more round (the codec's "
          "own, int8 after topk and sparse), so θ_global ends as the average "
          "of their models; with --overlap it shrinks with the learning rate "
          "instead, with --ef_decay by its factor (docs/compression.md)");
ABSL_FLAG(double, ef_decay, 0,
          "diloco: SparseLoCo's error feedback (0: off): each round restarts "
          "from θ_global and the residual decays by this factor β in (0, 1] "
          "before the round's Δ is added (e ← β·e + Δ; send C(e); "
          "e ← e − C(e)), standing in for the outer momentum: pair it with "
          "--outer_momentum=0 and an --outer_lr of about 1. No residual "
          "flush; needs error feedback");
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
ABSL_FLAG(double, linger_seconds, 30,
          "diloco: a node done with its run stays up to this many seconds, "
          "serving its final state, while a member behind it is declared "
          "dead but may come back (its address still takes connections: "
          "stopped, asleep or paused), so that it can catch up to the "
          "swarm's final model; it leaves at once when no such member is "
          "known, or on SIGINT/SIGTERM. 0 = do not linger");
ABSL_FLAG(bool, train_alone, false,
          "diloco: a node that finds the swarm gone before its last round "
          "(it went on and left without this node, or none of the members "
          "answers after this process was paused) trains the remaining "
          "rounds alone instead of stopping with exit code 3; summary.json "
          "then says final.trained_alone and final.model_is_swarms=false");
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

ABSL_FLAG(std::string, test_relay_fault, "",
          "testing only: as a relay, misbehave: cut:BYTES ends every "
          "relayed connection once it has carried BYTES (a relay that drops "
          "what it forwards); delay:MS holds every forwarded frame MS "
          "milliseconds");

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

// --algo, --inner_steps, the adaptive-sync flags, --overlap, and
// --compression against ddp.
absl::Status ParseAlgorithm(NodeConfig* c) {
  c->algo = absl::GetFlag(FLAGS_algo);
  if (c->algo != "diloco" && c->algo != "ddp" && c->algo != "gossip") {
    return absl::InvalidArgumentError(
        absl::StrCat("--algo=", c->algo, ": expected diloco, ddp or gossip"));
  }
  c->inner_steps = absl::GetFlag(FLAGS_inner_steps);
  if (c->inner_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--inner_steps=", c->inner_steps, ": must be >= 1"));
  }
  DilocoConfig& d = c->diloco;
  STARLING_ASSIGN_OR_RETURN(d.sync, ParseAdaptiveSync(c->inner_steps));
  d.overlap = absl::GetFlag(FLAGS_overlap);
  d.overlap_steps = absl::GetFlag(FLAGS_overlap_steps);
  if (d.overlap_steps < 0 || d.overlap_steps >= c->inner_steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--overlap_steps=", d.overlap_steps,
        ": must be in [0, --inner_steps) (0: off; --inner_steps is ",
        c->inner_steps, ")"));
  }
  if (d.overlap && d.overlap_steps > 0) {
    return absl::InvalidArgumentError(
        "--overlap and --overlap_steps are two ways to overlap the exchange: "
        "pick one");
  }
  if (d.overlap || d.overlap_steps > 0) {
    const char* flag = d.overlap ? "--overlap" : "--overlap_steps";
    if (c->algo != "diloco") {
      return absl::InvalidArgumentError(
          absl::StrCat(flag,
                       ": only --algo=diloco has outer rounds to "
                       "overlap (got --algo=",
                       c->algo, ")"));
    }
    if (d.sync.round_seconds > 0 || d.sync.h->adaptive() || d.sync.detector ||
        d.sync.divergence) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag,
                       " needs a fixed H: drop --round_seconds, "
                       "--min_inner_steps/--max_inner_steps, "
                       "--drift_detector=page_hinkley and "
                       "--divergence_threshold"));
    }
  }
  c->compression = absl::GetFlag(FLAGS_compression);
  if (c->algo == "ddp" && c->compression != "fp32") {
    // ddp would silently send fp32 anyway.
    return absl::InvalidArgumentError(absl::StrCat(
        "--compression=", c->compression,
        ": ddp all-reduces fp32 gradients every step; --compression applies "
        "to --algo=diloco and --algo=gossip"));
  }
  return absl::OkStatus();
}

// --aggregate and --norm_bound.
absl::Status ParseAggregation(NodeConfig* c) {
  DilocoConfig& d = c->diloco;
  STARLING_ASSIGN_OR_RETURN(d.aggregate,
                            ParseAggregate(absl::GetFlag(FLAGS_aggregate)));
  d.norm_bound = absl::GetFlag(FLAGS_norm_bound);
  if (!(d.norm_bound >= 0) || !std::isfinite(d.norm_bound) ||
      (d.norm_bound > 0 && d.norm_bound < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--norm_bound=", d.norm_bound,
                     ": must be 0 (off) or a multiple >= 1 of the round's "
                     "median norm"));
  }
  d.robust = d.aggregate.kind != AggregateKind::kMean || d.norm_bound > 0;
  if (d.robust && c->algo != "diloco") {
    return absl::InvalidArgumentError(
        absl::StrCat("--aggregate/--norm_bound apply to --algo=diloco rounds "
                     "(got --algo=",
                     c->algo, ")"));
  }
  return absl::OkStatus();
}

absl::Status Positive(absl::string_view flag, double v,
                      absl::string_view unit) {
  return v > 0 && std::isfinite(v)
             ? absl::OkStatus()
             : absl::InvalidArgumentError(
                   absl::StrCat("--", flag, "=", v, ": must be > 0", unit));
}

// --chunk_bytes, the timeouts, --found_after, --min_members, the gossip
// knobs and --peer_max_streams: checked before any slow setup (and by
// `starling sim` before any node starts), so that a bad value cannot leave
// every node waiting forever.
absl::Status ParseLimits(NodeConfig* c) {
  NetworkConfig& net = c->net;
  net.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  if (net.chunk_bytes < 1024 || net.chunk_bytes > (4 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--chunk_bytes=", net.chunk_bytes, ": must be in [1024, 4194304]"));
  }
  const double idle = absl::GetFlag(FLAGS_stream_idle_timeout);
  STARLING_RETURN_IF_ERROR(Positive("stream_idle_timeout", idle, " seconds"));
  net.stream_idle_timeout = absl::Seconds(idle);
  STARLING_RETURN_IF_ERROR(Positive(
      "round_timeout", absl::GetFlag(FLAGS_round_timeout), " seconds"));
  STARLING_RETURN_IF_ERROR(Positive(
      "connect_timeout", absl::GetFlag(FLAGS_connect_timeout), " seconds"));
  STARLING_RETURN_IF_ERROR(Positive(
      "round_deadline", absl::GetFlag(FLAGS_round_deadline), " seconds"));
  STARLING_RETURN_IF_ERROR(Positive(
      "suspect_timeout", absl::GetFlag(FLAGS_suspect_timeout), " seconds"));
  if (const double linger = absl::GetFlag(FLAGS_linger_seconds);
      !(linger >= 0) || !std::isfinite(linger)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--linger_seconds=", linger, ": must be >= 0 seconds (0 = off)"));
  }
  STARLING_RETURN_IF_ERROR(Positive(
      "gossip_timeout", absl::GetFlag(FLAGS_gossip_timeout), " seconds"));
  STARLING_RETURN_IF_ERROR(
      Positive("gossip_outer_lr", absl::GetFlag(FLAGS_gossip_outer_lr), ""));
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
  net.peer_max_streams = absl::GetFlag(FLAGS_peer_max_streams);
  if (net.peer_max_streams < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer_max_streams=", net.peer_max_streams,
                     ": must be a number of streams >= 0 (0 = no limit)"));
  }
  return absl::OkStatus();
}

// The outer optimizer, the codecs and --error_feedback. The first two are
// built again once the model's size is known; checked here so that a bad
// value fails before the data load.
absl::Status ParseCodecs(NodeConfig* c) {
  c->diloco.outer = OuterOptionsFromFlags();
  STARLING_RETURN_IF_ERROR(OuterOptimizer::Create(c->diloco.outer, 1).status());
  c->policy = PolicyOptionsFromFlags();
  STARLING_RETURN_IF_ERROR(PolicyCodec::Create({}, c->policy).status());
  c->error_feedback = absl::GetFlag(FLAGS_error_feedback);
  if (c->error_feedback != "auto" && c->error_feedback != "on" &&
      c->error_feedback != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--error_feedback=", c->error_feedback, ": expected auto, on or off"));
  }
  c->diloco.ef_decay = absl::GetFlag(FLAGS_ef_decay);
  if (!(c->diloco.ef_decay >= 0 && c->diloco.ef_decay <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ef_decay=", c->diloco.ef_decay, ": must be in (0, 1], or 0 (off)"));
  }
  if (c->diloco.ef_decay > 0 &&
      (c->algo != "diloco" || c->diloco.overlap || c->error_feedback == "off" ||
       (c->error_feedback == "auto" &&
        !ErrorFeedbackByDefault(c->policy.main)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ef_decay=", c->diloco.ef_decay,
        ": SparseLoCo's error feedback needs --algo=diloco without --overlap "
        "and error feedback on (a lossy --compression; on by default for "
        "int4, topk and sparse)"));
  }
  return absl::OkStatus();
}

// The values the loops check where they use them (addresses, the hosts
// file, --test_crash_at, --gossip_peers), and those checked above.
void ReadUncheckedFlags(NodeConfig* c) {
  NetworkConfig& net = c->net;
  net.listen = absl::GetFlag(FLAGS_listen);
  net.advertise = absl::GetFlag(FLAGS_advertise);
  net.relay = absl::GetFlag(FLAGS_relay);
  net.peers = absl::GetFlag(FLAGS_peers);
  net.node_id = NodeIdFromFlags();
  net.run_id = absl::GetFlag(FLAGS_run_id);
  net.hosts_file = absl::GetFlag(FLAGS_hosts);
  net.partition_file = absl::GetFlag(FLAGS_partition_file);
  net.test_crash_at = absl::GetFlag(FLAGS_test_crash_at);
  net.min_members = absl::GetFlag(FLAGS_min_members);
  net.connect_timeout = absl::Seconds(absl::GetFlag(FLAGS_connect_timeout));
  net.round_timeout = absl::Seconds(absl::GetFlag(FLAGS_round_timeout));
  net.round_deadline = absl::Seconds(absl::GetFlag(FLAGS_round_deadline));
  net.suspect_timeout = absl::Seconds(absl::GetFlag(FLAGS_suspect_timeout));
  net.linger = absl::Seconds(absl::GetFlag(FLAGS_linger_seconds));
  c->diloco.train_alone = absl::GetFlag(FLAGS_train_alone);
  net.found_after = absl::Seconds(absl::GetFlag(FLAGS_found_after));
  GossipConfig& g = c->gossip;
  g.peer_mode = absl::GetFlag(FLAGS_gossip_peers);
  g.push_timeout = absl::Seconds(absl::GetFlag(FLAGS_gossip_timeout));
  g.momentum = absl::GetFlag(FLAGS_gossip_momentum);
  g.outer_lr = absl::GetFlag(FLAGS_gossip_outer_lr);
  g.snapshot_every = absl::GetFlag(FLAGS_snapshot_every);
}

// --advertise: empty, or host:port with a fixed port, for an algorithm
// whose members learn addresses from each other (ddp ranks follow --peers).
absl::Status CheckAdvertise(const std::string& advertise,
                            const std::string& algo) {
  if (advertise.empty()) return absl::OkStatus();
  if (!ValidHostPort(advertise) || PortOf(advertise) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--advertise=", advertise,
        ": expected host:port with a fixed port (1-65535) that peers can "
        "dial"));
  }
  if (algo == "ddp") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--advertise=", advertise,
        ": --algo=ddp has no membership to advertise in (ranks dial the "
        "--peers list); use it with diloco or gossip"));
  }
  return absl::OkStatus();
}

// --relay: auto, off or host:port with a fixed port.
absl::Status CheckRelay(const std::string& relay) {
  if (relay == "auto" || relay == "off") return absl::OkStatus();
  if (!ValidHostPort(relay) || PortOf(relay) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--relay=", relay,
        ": expected auto, off, or the host:port (a fixed port) of a "
        "reachable member to relay through"));
  }
  return absl::OkStatus();
}

// --test_relay_fault: "", cut:BYTES or delay:MS.
absl::Status ParseRelayFault(const std::string& spec, NetworkConfig* net) {
  if (spec.empty()) return absl::OkStatus();
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  int64_t n = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(spec.substr(colon + 1), &n) || n <= 0 ||
      (kind != "cut" && kind != "delay")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--test_relay_fault=", spec,
        ": expected cut:BYTES or delay:MS with a positive number"));
  }
  if (kind == "cut") net->test_relay_cut_after = n;
  if (kind == "delay") net->test_relay_delay = absl::Milliseconds(n);
  return absl::OkStatus();
}

// --test_poison, the link flags and the peer credentials.
absl::Status ParsePeerFlags(NodeConfig* c) {
  STARLING_ASSIGN_OR_RETURN(c->diloco.poison,
                            ParsePoisonPlan(absl::GetFlag(FLAGS_test_poison)));
  STARLING_ASSIGN_OR_RETURN(
      LinkEmulatorOptions links,
      ParseLinkFlags(absl::GetFlag(FLAGS_link_bandwidth_mbps),
                     absl::GetFlag(FLAGS_link_latency_ms)));
  if (links.shaped()) {
    c->net.links = std::make_shared<LinkEmulator>(std::move(links));
  }
  const PeerSecurityOptions security = PeerSecurityFromFlags();
  if (security.tls_bind_node_ids && c->algo == "ddp") {
    return absl::InvalidArgumentError(
        "--tls_bind_node_ids: --algo=ddp has no node ids (ranks follow "
        "--peers); use it with diloco or gossip");
  }
  STARLING_ASSIGN_OR_RETURN(c->net.credentials, LoadPeerCredentials(security));
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseNodeFlags(NodeConfig* config) {
  STARLING_RETURN_IF_ERROR(ParseAlgorithm(config));
  STARLING_RETURN_IF_ERROR(ParseAggregation(config));
  STARLING_RETURN_IF_ERROR(ParseLimits(config));
  STARLING_RETURN_IF_ERROR(ParseCodecs(config));
  ReadUncheckedFlags(config);
  STARLING_RETURN_IF_ERROR(CheckRelay(config->net.relay));
  STARLING_RETURN_IF_ERROR(
      ParseRelayFault(absl::GetFlag(FLAGS_test_relay_fault), &config->net));
  return CheckAdvertise(config->net.advertise, config->algo);
}

absl::StatusOr<NodeConfig> NodeConfigFromFlags() {
  NodeConfig config;
  config.train = ConfigFromFlags();
  STARLING_RETURN_IF_ERROR(ResolveTrainConfig(&config.train));
  STARLING_RETURN_IF_ERROR(ParseNodeFlags(&config));
  STARLING_RETURN_IF_ERROR(ParsePeerFlags(&config));
  return config;
}

absl::Status CheckNodeFlags() {
  NodeConfig config;
  return ParseNodeFlags(&config);
}

PeerSecurityOptions PeerSecurityFromFlags() {
  PeerSecurityOptions security;
  security.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  security.tls_key = absl::GetFlag(FLAGS_tls_key);
  security.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  security.tls_require_client_cert =
      absl::GetFlag(FLAGS_tls_require_client_cert);
  security.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  // On by default wherever it can hold (mutual TLS, members with ids);
  // given explicitly, it must hold (ParsePeerFlags, CheckPeerSecurity).
  security.tls_bind_node_ids =
      absl::GetFlag(FLAGS_tls_bind_node_ids) &&
      (FlagGiven("tls_bind_node_ids") || (security.tls_require_client_cert &&
                                          absl::GetFlag(FLAGS_algo) != "ddp"));
  security.node_id = NodeIdFromFlags();
  security.listen_host = HostOf(absl::GetFlag(FLAGS_listen));
  security.insecure = absl::GetFlag(FLAGS_insecure);
  security.join_token_file = absl::GetFlag(FLAGS_join_token_file);
  security.peer_rate_limit = absl::GetFlag(FLAGS_peer_rate_limit);
  return security;
}

const std::vector<std::string>& NodeFlagNames() {
  static const auto* names =
      new std::vector<std::string>{"listen",
                                   "advertise",
                                   "relay",
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
                                   "overlap_steps",
                                   "connect_timeout",
                                   "round_timeout",
                                   "chunk_bytes",
                                   "link_bandwidth_mbps",
                                   "link_latency_ms",
                                   "compression",
                                   "error_feedback",
                                   "ef_decay",
                                   "small_tensor_elems",
                                   "small_tensor_codec",
                                   "node_id",
                                   "min_members",
                                   "suspect_timeout",
                                   "round_deadline",
                                   "linger_seconds",
                                   "train_alone",
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
                                   "test_relay_fault",
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

}  // namespace starling
