// `starling node`, the entry point: from the parsed flags to one of the
// three loops. RunNodeCommand reads the NodeConfig (node_flags.h), starts
// the operational side (node_ops.h), builds the trainer and the codecs,
// restores a checkpoint on --resume and hands the NodeRun (node_run.h) to
// RunDiloco (diloco_loop.h), RunGossip (gossip_loop.h) or RunDdp
// (ddp_loop.h).
#include "node/node_command.h"

#include <grpc/support/log.h>
#include <torch/torch.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "compression/codec.h"
#include "compression/tensor_policy.h"
#include "core/checkpoint.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/logging.h"
#include "core/status.h"
#include "gossip/membership.h"
#include "node/ddp_loop.h"
#include "node/diloco_loop.h"
#include "node/gossip_loop.h"
#include "node/node_flags.h"
#include "node/node_ops.h"
#include "node/node_run.h"
#include "node/node_session.h"
#include "node/run_output.h"
#include "node/train_command.h"
#include "outer_opt/weighting.h"

namespace starling {
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

absl::Status SetUpLogging() {
  LogFormat format;
  STARLING_RETURN_IF_ERROR(
      ParseLogFormat(absl::GetFlag(FLAGS_log_format), &format));
  SetLogFormat(format);
  gpr_set_log_function(LogFromGrpc);
  return absl::OkStatus();
}

// The name this node's log lines carry: its id, or ddp's "nRANK" (which
// checks the member list before any slow setup).
absl::StatusOr<std::string> LogNodeName(const NodeConfig& config) {
  if (config.algo != "ddp") return config.net.node_id;
  STARLING_ASSIGN_OR_RETURN(StaticMembers m,
                            ParseMembers(config.net.listen, config.net.peers));
  return absl::StrCat("n", m.rank);
}

// How peer traffic is protected, and the join token and link emulator.
void LogPeerSecurity(const NodeConfig& config) {
  const PeerCredentials& credentials = config.net.credentials;
  const PeerSecurityOptions security = PeerSecurityFromFlags();
  if (!credentials.tls) {
    LogEvent(LogLevel::kWarning, "insecure",
             credentials.join_auth == nullptr
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
                          credentials.mutual ? " (mutual)" : "", ", CA ",
                          security.tls_ca));
  }
  if (credentials.join_auth != nullptr) {
    LogEvent(LogLevel::kInfo, "join_token",
             absl::StrCat("calls are signed and checked with the join token "
                          "in ",
                          security.join_token_file));
  }
  if (config.net.links) {
    auto [bandwidth, latency] = FormatLinkFlags(config.net.links->options());
    LogEvent(LogLevel::kInfo, "links",
             absl::StrCat("link emulator: bandwidth (Mbit/s) ", bandwidth,
                          "; latency (ms) ", latency),
             {{"bandwidth_mbps", bandwidth}, {"latency_ms", latency}});
  }
}

// --resume_if_exists, the run directory and the trainer, whose memory it
// checks for this algorithm's copies of the weights.
absl::StatusOr<std::unique_ptr<Trainer>> StartTrainer(NodeConfig* config) {
  TrainConfig& train = config->train;
  ApplyResumeIfExists(&train);
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = StartRun(&train, "node");
  if (!trainer.ok()) {
    return WithExitCode(trainer.status(), ExitCodeFor(trainer.status()));
  }
  const MemoryPlanOptions plan =
      (*trainer)->MemoryPlan(NodeMemoryPlan(*config));
  absl::Status s = (*trainer)->CheckMemory(1, plan);
  if (!s.ok()) return WithExitCode(s, 2);
  // bench/memory.py sets the plan beside the RSS it measures.
  const MemoryEstimate estimate = EstimateMemory(plan);
  LogEvent(LogLevel::kInfo, "memory_plan",
           absl::StrCat("memory plan (", static_cast<int64_t>(estimate.Peak()),
                        " bytes): ", estimate.Describe()),
           {{"peak_bytes", absl::StrCat(static_cast<int64_t>(estimate.Peak()))},
            {"peak_phase", estimate.PeakPhase()}});
  return trainer;
}

// --error_feedback as asked: "on", or "auto" and a codec that keeps a
// residual by default. A lossless codec has none either way.
bool WantsErrorFeedback(const NodeConfig& config) {
  const std::string& ef = config.error_feedback;
  return ef == "on" ||
         (ef == "auto" && ErrorFeedbackByDefault(config.compression));
}

// The checkpoint's "comm": sent, received, and the pseudo-gradient bytes
// before and after compression.
PriorTraffic ParseTraffic(const std::string& comm) {
  PriorTraffic prior;
  int64_t* fields[] = {&prior.sent, &prior.received, &prior.before_compression,
                       &prior.after_compression};
  std::vector<std::string> values = absl::StrSplit(comm, ',');
  for (size_t i = 0; i < values.size() && i < 4; ++i) {
    (void)absl::SimpleAtoi(values[i], fields[i]);
  }
  return prior;
}

// --resume: the trainer's checkpoint, the outer optimizer (DiLoCo), the
// residual, the round, the lineage weight, the traffic, the gossip weight
// and the rounds as this node logged them.
absl::Status Resume(NodeRun& run) {
  NodeState& state = run.state;
  std::map<std::string, std::string> sections;
  absl::Status s =
      run.trainer.RestoreCheckpoint(run.CheckpointPath(), &sections);
  if (s.ok() && run.config.algo == "diloco") {
    s = state.outer->LoadState(sections["outer"]);
  }
  if (s.ok() && state.feedback) {
    s = state.feedback->LoadState(sections["error_feedback"]);
  }
  if (!s.ok()) return WithExitCode(s, ExitCodeFor(s));
  (void)absl::SimpleAtoi(sections["round"], &state.round);
  // Absent from checkpoints written before lineages had a weight: 0.
  if (!absl::SimpleAtoi(sections["member_rounds"], &state.member_rounds) ||
      state.member_rounds < 0 || state.member_rounds > kMaxMemberRounds) {
    state.member_rounds = 0;
  }
  state.prior = ParseTraffic(sections["comm"]);
  double w = 0;
  if (run.config.algo == "gossip" &&
      absl::SimpleAtod(sections["gossip_weight"], &w) && w > 0) {
    state.gossip_weight = w;
  }
  if (run.config.algo == "gossip" && sections.count("gossip_momentum") > 0) {
    const std::string& u = sections["gossip_momentum"];
    if (u.size() != static_cast<size_t>(run.n_params) * sizeof(float)) {
      return WithExitCode(absl::DataLossError(absl::StrCat(
                              "--resume: checkpoint ", run.CheckpointPath(),
                              " section gossip_momentum holds ", u.size(),
                              " bytes, not ", run.n_params, " floats")),
                          2);
    }
    state.gossip_momentum.resize(static_cast<size_t>(run.n_params));
    std::memcpy(state.gossip_momentum.data(), u.data(), u.size());
  }
  // Rounds before the checkpoint, as this node logged them.
  state.rounds =
      ReadRoundEvents(absl::StrCat(run.out(), "/events.jsonl"), state.round);
  return absl::OkStatus();
}

// Builds the run around the trainer: its model, the codecs, the outer
// optimizer and the residual, restored on --resume.
absl::StatusOr<std::unique_ptr<NodeRun>> MakeRun(NodeConfig config,
                                                 Trainer& trainer,
                                                 NodeOps& ops) {
  std::vector<torch::Tensor> params = trainer.Parameters();
  std::vector<torch::Tensor> buffers = trainer.model().Buffers();
  const int64_t n = NumElements(params);
  // Every member must start from the same θ (the same --seed).
  std::string init_hash = ModelHash(params, buffers);
  absl::StatusOr<std::unique_ptr<OuterOptimizer>> outer =
      OuterOptimizer::Create(config.diloco.outer, n);
  if (!outer.ok()) return WithExitCode(outer.status(), 2);
  absl::StatusOr<NodeCodecs> codecs =
      MakeCodecs(config, params, NumElements(buffers));
  if (!codecs.ok()) return WithExitCode(codecs.status(), 2);
  auto run = std::unique_ptr<NodeRun>(new NodeRun{
      std::move(config), trainer, ops, std::move(params), std::move(buffers), n,
      std::move(init_hash), *std::move(codecs), NodeState()});
  run->state.outer = *std::move(outer);
  if (run->codecs.error_feedback) {
    run->state.feedback = std::make_unique<ErrorFeedback>(n);
  }
  if (run->config.train.resume()) STARLING_RETURN_IF_ERROR(Resume(*run));
  return run;
}

}  // namespace

void ApplyResumeIfExists(TrainConfig* train) {
  if (absl::GetFlag(FLAGS_resume_if_exists) && !train->resume() &&
      !train->out().empty() &&
      FileExists(CheckpointPathInRunDir(train->out()))) {
    LogEvent(LogLevel::kInfo, "resume",
             absl::StrCat("--resume_if_exists: continuing the run in ",
                          train->out()));
    train->set_resume(true);
  }
}

absl::StatusOr<NodeCodecs> MakeCodecs(const NodeConfig& config,
                                      const std::vector<torch::Tensor>& params,
                                      int64_t n_buffers) {
  NodeCodecs codecs;
  std::vector<int64_t> tensor_sizes;
  for (const auto& p : params) tensor_sizes.push_back(p.numel());
  PolicyOptions po = config.policy;
  STARLING_ASSIGN_OR_RETURN(codecs.params,
                            PolicyCodec::Create(tensor_sizes, po));
  po.trailing_fp32 = kWeightingSlots + 1 + n_buffers;
  STARLING_ASSIGN_OR_RETURN(codecs.ring, PolicyCodec::Create(tensor_sizes, po));
  const std::string& compression = config.compression;
  codecs.ring_codec = compression == "fp32" ? nullptr : codecs.ring.get();
  codecs.sparse_gather = IsSparseSpec(compression);
  codecs.error_feedback =
      !codecs.params->lossless() && WantsErrorFeedback(config);
  codecs.ef_in_model = codecs.error_feedback && config.algo == "diloco" &&
                       !config.diloco.overlap && config.diloco.ef_decay == 0;
  if (codecs.ef_in_model) {
    // The flush goes in the run's own codec when it is dense (int4's
    // residual is its rounding, which int4 again keeps well), in int8 after
    // top-k and sparse.
    PolicyOptions fo = po;
    if (absl::StartsWith(compression, "topk") || codecs.sparse_gather) {
      fo.main = "int8";
    }
    STARLING_ASSIGN_OR_RETURN(codecs.flush,
                              PolicyCodec::Create(tensor_sizes, fo));
  }
  return codecs;
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

MemoryPlanOptions NodeMemoryPlan(const NodeConfig& config) {
  MemoryPlanOptions plan;
  plan.algo = config.algo;
  plan.sparse = IsSparseSpec(config.compression);
  plan.error_feedback =
      config.compression != "fp32" && WantsErrorFeedback(config);
  plan.overlap = config.algo == "diloco" && config.diloco.overlap;
  plan.outer_momentum = config.diloco.outer.kind == "nesterov" &&
                        config.diloco.outer.momentum > 0;
  plan.gossip_momentum = config.gossip.momentum > 0;
  plan.checkpoints = !config.train.out().empty();
  return plan;
}

int RunNodeCommand() {
  if (absl::Status s = SetUpLogging(); !s.ok()) return Fail(s, 2);
  absl::StatusOr<NodeConfig> config = NodeConfigFromFlags();
  if (!config.ok()) return Fail(config.status(), 2);
  absl::StatusOr<std::string> log_node = LogNodeName(*config);
  if (!log_node.ok()) return Fail(log_node.status(), 2);
  SetLogNode(*log_node);
  LogPeerSecurity(*config);
  // Health and metrics answer from the start (a probe during the data load
  // sees "not ready", not a refused connection).
  NodeOps ops;
  if (absl::Status s =
          StartOps(*log_node, config->algo, config->train.device(), &ops);
      !s.ok()) {
    return Fail(s, absl::IsInvalidArgument(s) ? 2 : 1);
  }
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = StartTrainer(&*config);
  if (!trainer.ok()) return Fail(trainer.status());
  absl::StatusOr<std::unique_ptr<NodeRun>> run =
      MakeRun(*std::move(config), **trainer, ops);
  if (!run.ok()) return Fail(run.status());
  NodeRun& r = **run;
  if (r.config.train.resume() &&
      r.trainer.state().step() >= r.config.train.steps()) {
    // Finished already: keep its summary.json as it is.
    WriteStderrLine(absl::StrCat("starling node: the run in ", r.out(),
                                 " is already complete (",
                                 r.trainer.state().step(), " steps)"));
    return 0;
  }
  if (r.config.algo == "gossip") return RunGossip(r);
  return r.config.algo == "ddp" ? RunDdp(r) : RunDiloco(r);
}

}  // namespace starling
