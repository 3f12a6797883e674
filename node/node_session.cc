#include "node/node_session.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/checkpoint.h"
#include "core/logging.h"
#include "core/status.h"
#include "gossip/reachability.h"
#include "node/embedded_checkpoint.h"
#include "node/swarm_end_report.h"
#include "node/swarm_metrics.h"

namespace starling {
namespace {

constexpr char kExitCodeUrl[] = "type.starling.dev/node.exit_code";

}  // namespace

absl::Status WithExitCode(absl::Status s, int code) {
  if (!s.ok()) s.SetPayload(kExitCodeUrl, absl::Cord(absl::StrCat(code)));
  return s;
}

int ExitCodeOf(const absl::Status& s) {
  const auto payload = s.GetPayload(kExitCodeUrl);
  int code = 1;
  if (payload && absl::SimpleAtoi(std::string(*payload), &code)) return code;
  return 1;
}

int Fail(const absl::Status& s, int code) {
  LogEvent(LogLevel::kError, "error",
           absl::StrCat("starling node: error: ", s.message()));
  return code;
}

int Fail(const absl::Status& s) { return Fail(s, ExitCodeOf(s)); }

void MemberChanges::Add(const MembershipChange& c) {
  absl::MutexLock lock(&mu_);
  pending_.push_back(c);
  if (c.id == self_ && c.to == peer::v1::MEMBER_ALIVE &&
      c.from != peer::v1::MEMBER_STATE_UNSPECIFIED) {
    last_refuted_ = absl::Now();
  }
}

absl::Time MemberChanges::LastRefuted() const {
  absl::MutexLock lock(&mu_);
  return last_refuted_;
}

void MemberChanges::Log(EventLog& events) {
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

NodeSession::NodeSession(NodeRun& run, std::string node_id)
    : run_(run),
      node_id_(std::move(node_id)),
      events_(absl::StrCat(run.out(), "/events.jsonl"), node_id_,
              run.trainer.state().wall_seconds()),
      changes_(node_id_),
      shared_model_(
          [](const std::function<absl::Status()>& fn) { return fn(); }),
      sent_([] { return int64_t{0}; }),
      received_([] { return int64_t{0}; }),
      checkpoint_step_(run.config.train.resume() ? run.trainer.state().step()
                                                 : -1) {}

NodeSession::~NodeSession() {
  StopPoller();
  swarm_.reset();
}

void NodeSession::SetTraffic(std::function<int64_t()> sent,
                             std::function<int64_t()> received) {
  sent_ = std::move(sent);
  received_ = std::move(received);
}

Swarm& NodeSession::AttachSwarm(std::unique_ptr<Swarm> swarm) {
  swarm_ = std::move(swarm);
  Swarm* s = swarm_.get();
  SetTraffic([s] { return s->bytes_sent(); },
             [s] { return s->bytes_received(); });
  return *s;
}

int64_t NodeSession::BytesSent() const {
  return run_.state.prior.sent + sent_();
}

int64_t NodeSession::BytesReceived() const {
  return run_.state.prior.received + received_();
}

void NodeSession::SetCompressionTraffic(int64_t before, int64_t after) {
  before_compression_ = before;
  after_compression_ = after;
}

void NodeSession::StartMetricsPoller() {
  if (!run_.ops.metrics || poller_.joinable()) return;
  poller_ = std::thread([this] {
    do {
      RefreshMetrics();
    } while (!stop_poller_.WaitForNotificationWithTimeout(absl::Seconds(1)));
  });
}

void NodeSession::StopPoller() {
  if (!poller_.joinable()) return;
  stop_poller_.Notify();
  poller_.join();
  RefreshMetrics();  // the session's last word
}

void NodeSession::RefreshMetrics() const {
  NodeMetrics& metrics = *run_.ops.metrics;
  metrics.SetTraffic(BytesSent(), BytesReceived(), before_compression_.load(),
                     after_compression_.load());
  if (swarm_ != nullptr) RefreshSwarmMetrics(*swarm_, node_id_, metrics);
}

void NodeSession::LogModel(const std::string& who) const {
  STARLING_LOG(INFO) << who << ", " << run_.trainer.model().Architecture()
                     << ", " << run_.n_params << " parameters, data "
                     << run_.trainer.dataset().Describe();
}

void NodeSession::Start(const JsonObject& fields) {
  events_.Write(run_.config.train.resume() ? "resume" : "start", fields);
  InstallStopSignals();
}

absl::StatusOr<StepResult> NodeSession::Step(
    int64_t log_round, bool log_data_drift, const Trainer::GradientHook& hook) {
  Trainer& trainer = run_.trainer;
  absl::StatusOr<StepResult> r = trainer.Step(hook);
  if (!r.ok()) {
    events_.Write("error", JsonObject().Add("message", r.status().message()));
    if (swarm_ != nullptr) swarm_->Leave();
    return r;
  }
  if (log_data_drift) LogDrift(events_, trainer, *r);
  SetLogPosition(log_round, trainer.state().step());
  run_.ops.Step(*r, trainer.state().step());
  return r;
}

absl::Status NodeSession::MaybeEvaluate(bool force, int prev_step,
                                        int at_step) {
  Trainer& trainer = run_.trainer;
  NodeState& state = run_.state;
  const int step = at_step >= 0 ? at_step : trainer.state().step();
  const int every = run_.config.train.eval_every();
  bool due = every > 0 && step / every > prev_step / every;
  if (!(due || force) || state.evaluated_step == step) {
    return absl::OkStatus();
  }
  // A second signal leaves at once: the evaluation stops between batches
  // and this step goes without a val_loss.
  absl::StatusOr<EvalResult> r = EvalResult();
  STARLING_RETURN_IF_ERROR(shared_model_([&] {
    r = trainer.Evaluate(64, [] { return StopSignalCount() >= 2; });
    return absl::OkStatus();
  }));
  if (absl::IsCancelled(r.status())) {
    LogEvent(LogLevel::kWarning, "eval",
             absl::StrCat("eval  step ", step, ": ", r.status().message(),
                          " (a second signal: leaving at once)"));
    return absl::OkStatus();
  }
  STARLING_ASSIGN_OR_RETURN(state.eval, std::move(r));
  state.evaluated_step = step;
  if (run_.ops.metrics) {
    run_.ops.metrics->SetValidation(state.eval.loss, state.eval.accuracy);
  }
  JsonObject f;
  f.Add("step", static_cast<int64_t>(step)).Add("val_loss", state.eval.loss);
  if (state.eval.accuracy >= 0) f.Add("val_accuracy", state.eval.accuracy);
  events_.Write("eval", f);
  LogFields fields = {{"val_loss", absl::StrFormat("%.6f", state.eval.loss)}};
  std::string acc;
  if (state.eval.accuracy >= 0) {
    acc = absl::StrFormat(" | val_acc %.2f%%", 100 * state.eval.accuracy);
    fields.emplace_back("val_accuracy",
                        absl::StrFormat("%.6f", state.eval.accuracy));
  }
  LogEvent(LogLevel::kInfo, "eval",
           absl::StrFormat("eval  step %d/%d | val_loss %.4f%s", step,
                           run_.config.train.steps(), state.eval.loss, acc),
           fields);
  return absl::OkStatus();
}

absl::Status NodeSession::RecordRound(RoundRecord& rec, bool evaluator,
                                      int prev_step) {
  if (evaluator) {
    STARLING_RETURN_IF_ERROR(MaybeEvaluate(
        rec.step == run_.config.train.steps(), prev_step, rec.step));
  }
  if (run_.state.evaluated_step == rec.step)
    rec.val_loss = run_.state.eval.loss;
  events_.Write("round", RoundJson(rec));
  run_.state.rounds.push_back(rec);
  return absl::OkStatus();
}

bool NodeSession::CheckpointDue(int prev_step, int step) const {
  const int every = run_.config.train.checkpoint_every();
  return every > 0 && step / every > prev_step / every &&
         step < run_.config.train.steps();
}

absl::Status NodeSession::Checkpoint(int64_t next_round) {
  // Arguments as of the call: the traffic and wall time written are those
  // before the model goes in and out.
  const int64_t sent = BytesSent(), received = BytesReceived();
  const double wall = events_.WallSeconds();
  return shared_model_([&]() -> absl::Status {
    NodeState& state = run_.state;
    run_.trainer.set_wall_seconds(wall);
    // Model-sized sections are moved in: an initializer list would copy.
    std::map<std::string, std::string> extra = {
        {"round", absl::StrCat(next_round)},
        {"member_rounds", absl::StrCat(state.member_rounds)},
        {"comm", absl::StrCat(sent, ",", received, ",",
                              state.prior.before_compression +
                                  state.pseudo_gradient_bytes.raw_bytes,
                              ",",
                              state.prior.after_compression +
                                  state.pseudo_gradient_bytes.wire_bytes)}};
    extra["outer"] = state.outer->SaveState();
    if (state.feedback) extra["error_feedback"] = state.feedback->SaveState();
    if (state.gossip_weight > 0) {
      extra["gossip_weight"] = absl::StrFormat("%.17g", state.gossip_weight);
    }
    if (!state.gossip_momentum.empty()) {
      extra["gossip_momentum"] = FloatBytes(state.gossip_momentum);
    }
    const absl::Time start = absl::Now();
    STARLING_RETURN_IF_ERROR(
        run_.trainer.SaveCheckpoint(run_.CheckpointPath(), std::move(extra)));
    checkpoint_step_ = run_.trainer.state().step();
    if (run_.ops.metrics) {
      run_.ops.metrics->Checkpoint(absl::ToDoubleSeconds(absl::Now() - start),
                                   absl::Now());
    }
    return absl::OkStatus();
  });
}

std::string NodeSession::KeptCheckpoint() const {
  if (checkpoint_step_ < 0) return "no earlier checkpoint exists";
  return absl::StrCat("keeping the previous checkpoint (step ",
                      checkpoint_step_, ") in ", run_.CheckpointPath());
}

void NodeSession::PeriodicCheckpoint(int64_t next_round) {
  const int step = run_.trainer.state().step();
  absl::Status s = Checkpoint(next_round);
  if (s.ok()) return;
  events_.Write("checkpoint_failed",
                JsonObject()
                    .Add("step", static_cast<int64_t>(step))
                    .Add("message", s.message()));
  LogEvent(LogLevel::kWarning, "checkpoint",
           absl::StrCat("checkpoint at step ", step, " failed: ", s.message(),
                        "; ", KeptCheckpoint(), "; training goes on"));
}

void NodeSession::CheckpointBeforeFailing(absl::Status restored,
                                          int64_t next_round) {
  if (restored.ok()) restored = Checkpoint(next_round);
  if (!restored.ok()) {
    LogEvent(LogLevel::kWarning, "checkpoint",
             absl::StrCat("no checkpoint at step ", run_.trainer.state().step(),
                          ": ", restored.message()));
  }
}

std::string NodeSession::Eta(int step) const {
  const double elapsed = events_.WallSeconds();
  const int total = run_.config.train.steps();
  return FormatDuration(step > 0 ? elapsed * (total - step) / step : 0);
}

int NodeSession::Finish(SessionEnd end) {
  Trainer& trainer = run_.trainer;
  const NodeState& state = run_.state;
  if (absl::Status s = Checkpoint(end.next_round); !s.ok()) {
    return Fail(absl::Status(
        s.code(), absl::StrCat("the final checkpoint failed: ", s.message(),
                               "; ", KeptCheckpoint())));
  }
  NodeTotals& totals = end.totals;
  totals.id = node_id_;
  totals.bytes_sent = BytesSent();
  totals.bytes_received = BytesReceived();
  totals.wall_seconds = events_.WallSeconds();
  // Per-step ring all-reduce of fp32 gradients: 2·(N−1)/N · P · 4 bytes.
  totals.allreduce_equivalent_bytes = static_cast<int64_t>(
      static_cast<double>(trainer.state().step()) * 2.0 * (end.world - 1) /
      std::max(1, end.world) * static_cast<double>(run_.n_params) * 4.0);
  StopPoller();
  events_.Write(end.stopped ? "interrupted" : "end",
                JsonObject()
                    .Add("step", static_cast<int64_t>(trainer.state().step()))
                    .Merge(end.end_fields)
                    .Add("bytes_sent", totals.bytes_sent));
  // Only a member that evaluated the final step reports a final val_loss.
  EvalResult final_eval = state.eval;
  if (state.evaluated_step != trainer.state().step()) final_eval = EvalResult();
  if (swarm_ != nullptr) {
    end.summary.Merge(ReachabilityFields(swarm_->Members(), node_id_))
        .Merge(RelayFields(*swarm_));
  }
  if (absl::Status s = WriteNodeSummary(run_.out(), "node", trainer, final_eval,
                                        totals, state.rounds, end.stopped,
                                        end.summary, end.final_fields);
      !s.ok()) {
    return Fail(s);
  }
  if (end.shutdown) end.shutdown();
  if (!end.apart.empty()) {
    WriteStderrLine(end.apart);
    return kExitEndedApart;
  }
  if (end.stopped) {
    WriteStderrLine(absl::StrCat("starling node: ", end.stopped_by, " signal ",
                                 StopSignal(), " at step ",
                                 trainer.state().step(), end.stopped_at,
                                 "; checkpoint in ", run_.CheckpointPath()));
    return 1;
  }
  WriteStderrLine(absl::StrCat(node_id_, " done: ", trainer.state().step(),
                               " steps", end.done, ", sent ",
                               FormatBytes(totals.bytes_sent)));
  return 0;
}

}  // namespace starling
