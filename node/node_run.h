// What the node's loops share (intermediate split).
#ifndef STARLING_NODE_NODE_RUN_H_
#define STARLING_NODE_NODE_RUN_H_

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

namespace starling {

constexpr char kPseudoGrad[] = "pseudo_grad";
// Each member's whole pack, for --aggregate / --norm_bound.
constexpr char kPseudoGradWhole[] = "pseudo_grad_whole";
// DiLoCo with error feedback: the members' residuals, averaged once after
// the last round (NodeRun::ef_in_model).
constexpr char kResidualFlush[] = "residual_flush";
constexpr char kGrad[] = "grad";

int Fail(const absl::Status& s, int code);

struct StaticMembers {
  std::vector<std::string> members;  // sorted; index = rank
  int rank = 0;
};
bool ValidHostPort(absl::string_view a);
absl::StatusOr<StaticMembers> ParseMembers(const std::string& listen,
                                           const std::string& peers);
std::string HostOf(const std::string& address);
absl::StatusOr<std::map<std::string, std::string>> ReadHosts(
    const std::string& path);

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
                      const std::string& device, NodeOps* ops);

struct AdaptiveSync {
  double round_seconds = 0;  // 0: rounds of H steps
  int max_steps = 0;         // cap per round with round_seconds (0: none)
  Weighting weighting = Weighting::kSamples;
  std::optional<InnerStepController> h;  // H per round
  std::optional<PageHinkley> detector;
  std::optional<DivergenceTrigger> divergence;
};

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

absl::StatusOr<SwarmOptions> SharedSwarmOptions(const NodeRun& run,
                                                const std::string& algo);

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
absl::StatusOr<StepResult> StepOrLeave(Trainer& trainer, EventLog& events,
                                       Swarm& swarm);

}  // namespace starling

#endif  // STARLING_NODE_NODE_RUN_H_
