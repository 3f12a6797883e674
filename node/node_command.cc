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
#include "node/ddp_loop.h"
#include "node/diloco_loop.h"
#include "node/faults.h"
#include "node/gossip_loop.h"
#include "node/health.h"
#include "node/metrics.h"
#include "node/node_flags.h"
#include "node/node_run.h"
#include "node/run_output.h"
#include "node/train_command.h"
#include "outer_opt/outer_optimizer.h"
#include "outer_opt/robust_aggregate.h"
#include "outer_opt/sync_policy.h"
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

}  // namespace

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
