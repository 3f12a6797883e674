#include "node/embedded_diloco.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/flat_params.h"
#include "core/model.h"
#include "core/status.h"
#include "gossip/protocol.h"
#include "node/diloco_loop.h"
#include "node/elastic_swarm.h"
#include "node/node_command.h"
#include "node/run_output.h"

namespace starling {
absl::Status CheckEmbeddedModel(const EmbeddedModel& m) {
  if (m.params.empty()) {
    return absl::InvalidArgumentError("the model has no parameters");
  }
  auto check = [](const char* kind, const std::vector<std::string>& names,
                  const std::vector<torch::Tensor>& tensors,
                  bool float_only) -> absl::Status {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const torch::Tensor& t = tensors[i];
      const std::string name =
          i < names.size() ? names[i] : absl::StrCat("#", i);
      if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous()) {
        return absl::InvalidArgumentError(absl::StrCat(
            kind, " ", name, " must be a contiguous tensor on the CPU"));
      }
      if (float_only && t.scalar_type() != torch::kFloat32) {
        return absl::InvalidArgumentError(absl::StrCat(
            kind, " ", name, " is ", c10::toString(t.scalar_type()),
            ": the swarm averages float32 parameters"));
      }
    }
    return absl::OkStatus();
  };
  STARLING_RETURN_IF_ERROR(check("parameter", m.param_names, m.params, true));
  return check("buffer", m.buffer_names, m.buffers, false);
}

std::string EmbeddedArchitecture(const EmbeddedModel& model) {
  if (!model.architecture.empty()) return model.architecture;
  const std::string text =
      absl::StrJoin(SignatureLines(model.param_names, model.params,
                                   model.buffer_names, model.buffers),
                    "\n");
  return absl::StrFormat("python(%016x)", HashBytes(text.data(), text.size()));
}

peer::v1::ModelFingerprint EmbeddedFingerprint(const EmbeddedModel& model,
                                               const std::string& init_hash) {
  return MakeFingerprint(EmbeddedArchitecture(model), NumElements(model.params),
                         init_hash,
                         SignatureLines(model.param_names, model.params,
                                        model.buffer_names, model.buffers));
}

void RefreshEmbeddedMetrics(NodeMetrics* metrics, const Swarm& swarm,
                            const std::string& node_id,
                            const RingStats& compressed) {
  if (metrics == nullptr) return;
  metrics->SetTraffic(swarm.bytes_sent(), swarm.bytes_received(),
                      compressed.raw_bytes, compressed.wire_bytes);
  RefreshSwarmMetrics(swarm, node_id, *metrics);
}

EmbeddedDiloco::EmbeddedDiloco(NodeConfig config, EmbeddedModel model,
                               NodeOps ops)
    : config_(std::move(config)),
      model_(std::move(model)),
      ops_(std::move(ops)) {}

EmbeddedDiloco::~EmbeddedDiloco() { Leave(); }

absl::StatusOr<std::unique_ptr<EmbeddedDiloco>> EmbeddedDiloco::Start(
    NodeConfig config, EmbeddedModel model, NodeOps ops) {
  STARLING_RETURN_IF_ERROR(CheckEmbeddedModel(model));
  if (config.algo != "diloco") {
    return absl::InvalidArgumentError(
        absl::StrCat("--algo=", config.algo, ": DiLoCo needs --algo=diloco"));
  }
  if (config.diloco.overlap || config.diloco.overlap_steps > 0) {
    return absl::InvalidArgumentError(
        "--overlap and --overlap_steps: not available from Python (the "
        "exchange runs while d.step() waits)");
  }
  // The node's run directory rules: --resume needs a checkpoint in --out,
  // and a checkpoint there needs --resume (or --resume_if_exists, which the
  // caller applied). No --out: no checkpoints.
  if (!config.train.out().empty() || config.train.resume()) {
    STARLING_RETURN_IF_ERROR(PrepareRunDir(&config.train, "python"));
  }
  auto d = std::unique_ptr<EmbeddedDiloco>(
      new EmbeddedDiloco(std::move(config), std::move(model), std::move(ops)));
  STARLING_RETURN_IF_ERROR(d->Init());
  return d;
}

absl::Status EmbeddedDiloco::Init() {
  n_params_ = NumElements(model_.params);
  n_buffers_ = NumElements(model_.buffers);
  STARLING_ASSIGN_OR_RETURN(codecs_,
                            MakeCodecs(config_, model_.params, n_buffers_));
  round_options_ = DilocoRoundOptionsOf(config_, codecs_);
  exchange_settings_ = DilocoExchangeSettings(config_, codecs_, n_params_,
                                              n_buffers_, ops_.watchdog.get());
  STARLING_ASSIGN_OR_RETURN(
      outer_, OuterOptimizer::Create(config_.diloco.outer, n_params_));
  if (codecs_.error_feedback) {
    feedback_ = std::make_unique<ErrorFeedback>(n_params_);
  }
  theta_global_ = Flatten(model_.params);
  buffers_global_ = Flatten(model_.buffers);
  lineage_ = FlatHash(theta_global_, buffers_global_);
  architecture_ = EmbeddedArchitecture(model_);
  const peer::v1::ModelFingerprint fingerprint =
      EmbeddedFingerprint(model_, lineage_);
  // After the fingerprint, which names the model every member starts from.
  if (config_.train.resume()) STARLING_RETURN_IF_ERROR(Restore());
  STARLING_ASSIGN_OR_RETURN(
      SwarmOptions so, ElasticSwarmOptions(config_.net, "diloco", fingerprint));
  so = DilocoRoundSwarmOptions(std::move(so), config_, codecs_, n_params_,
                               n_buffers_);
  so.interrupted = [this] { return abandon_.load(); };
  STARLING_ASSIGN_OR_RETURN(swarm_, StartSwarm(so));
  address_ = swarm_->address();
  swarm_->SetProgress(Here(), /*joining=*/false);
  STARLING_RETURN_IF_ERROR(
      swarm_->JoinSwarm(absl::Now() + config_.net.connect_timeout));
  STARLING_RETURN_IF_ERROR(swarm_->WaitForMembers(
      config_.net.min_members, absl::Now() + config_.net.connect_timeout));
  Serve();
  if (ops_.metrics) ops_.metrics->SetOuterLr(config_.diloco.outer.lr);
  RefreshMetrics();
  ops_.SetReady(true);
  return absl::OkStatus();
}

absl::StatusOr<EmbeddedRound> EmbeddedDiloco::Round(int steps,
                                                    int64_t samples) {
  if (left_) return absl::FailedPreconditionError("this member has left");
  const absl::Time start = absl::Now();
  EmbeddedRound out;
  auto finish = [&](std::string outcome) {
    out.outcome = std::move(outcome);
    out.round = round_;
    out.model_hash = lineage_;
    out.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return out;
  };
  // A member that the swarm went past (a joiner, one that missed rounds)
  // drops its steps and adopts the swarm's state, as the node does before
  // its inner steps.
  STARLING_ASSIGN_OR_RETURN(std::string caught,
                            CatchUpIfBehind(absl::ZeroDuration()));
  if (!caught.empty()) return finish(caught);
  const std::vector<float> trained = Flatten(model_.params);
  std::vector<float> delta = PseudoGradient(
      OwnModel(theta_global_, feedback_.get(), codecs_.ef_in_model), trained);
  const std::vector<float> own_buffers = Flatten(model_.buffers);
  RoundWork work;
  work.steps = std::max(1, steps);
  work.samples = std::max<int64_t>(1, samples);
  work.data_share = 1;
  STARLING_ASSIGN_OR_RETURN(
      DilocoRound unit,
      DilocoRound::Begin(round_options_, work, std::move(delta),
                         codecs_.params.get(), feedback_.get(),
                         BufferDelta(buffers_global_, own_buffers)));
  RoundExchange exchange(exchange_settings_, std::move(unit), round_);
  swarm_->SetProgress(Here(), /*joining=*/false);
  exchange.Launch(*swarm_, Here(), /*async=*/false, abandon_);
  absl::StatusOr<Swarm::RoundResult> res = exchange.Wait();
  out.wire_bytes = exchange.traffic().wire_bytes;
  pseudo_gradient_bytes_.raw_bytes += exchange.traffic().raw_bytes;
  pseudo_gradient_bytes_.wire_bytes += exchange.traffic().wire_bytes;
  if (res.ok()) {
    ReportRoundMetrics(ops_.metrics.get(), exchange, res->outcome, start);
  }
  RefreshMetrics();
  if (!res.ok() || res->outcome != Swarm::Outcome::kCommitted) {
    if (feedback_) (void)exchange.round().Restore(feedback_.get());
    STARLING_RETURN_IF_ERROR(LoadModel());
    if (!res.ok()) return res.status();
    if (res->outcome == Swarm::Outcome::kStopped) return finish("stopped");
    STARLING_ASSIGN_OR_RETURN(caught, CatchUpIfBehind(absl::Seconds(5)));
    return finish(caught.empty() ? "stale" : caught);
  }
  if (exchange.sum() == nullptr || exchange.sum()->empty()) {
    return absl::InternalError(absl::StrCat(
        "round ", round_, " committed without an all-reduce here"));
  }
  STARLING_ASSIGN_OR_RETURN(
      const RoundUpdate update,
      exchange.round().Commit(*exchange.sum(), &theta_global_, *outer_,
                              &buffers_global_));
  STARLING_RETURN_IF_ERROR(LoadModel());
  if (ops_.metrics) ops_.metrics->SetPseudoGradientNorm(update.delta_norm);
  lineage_ = FlatHash(theta_global_, buffers_global_);
  member_rounds_ =
      std::min(kMaxMemberRounds,
               member_rounds_ + static_cast<int64_t>(res->members.size()));
  const int64_t prev_step = step_;
  step_ += std::max<int64_t>(1, std::llround(update.effective_steps));
  const int every = config_.train.checkpoint_every();
  out.checkpoint_due =
      checkpoints() && every > 0 && step_ / every > prev_step / every;
  ++round_;
  out.members = static_cast<int>(res->members.size());
  Serve();
  swarm_->SetProgress(Here(), /*joining=*/false);
  return finish("committed");
}

absl::StatusOr<std::string> EmbeddedDiloco::CatchUpIfBehind(
    absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  for (;;) {
    const Swarm::Lineage best = swarm_->Best();
    if (Swarm::Ahead(best, Here()) && !best.donors.empty()) {
      STARLING_RETURN_IF_ERROR(CatchUp(best));
      return std::string("caught_up");
    }
    if (absl::Now() >= until) return std::string();
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::Status EmbeddedDiloco::CatchUp(const Swarm::Lineage& best) {
  // Not ready while catching up, as the node.
  ops_.SetReady(false);
  if (ops_.watchdog) ops_.watchdog->Waiting(config_.net.round_timeout);
  swarm_->SetProgress(Here(), /*joining=*/true);
  Swarm::FetchStats stats;
  STARLING_ASSIGN_OR_RETURN(
      SwarmState st,
      swarm_->FetchState(best.donors, &best,
                         absl::Now() + config_.net.round_timeout, &stats));
  STARLING_RETURN_IF_ERROR(outer_->LoadState(st.outer_state));
  theta_global_ = std::move(st.theta);
  buffers_global_ = std::move(st.buffers);
  round_ = st.round;
  lineage_ = st.lineage;
  member_rounds_ = st.member_rounds;
  step_ = st.step;
  // The residual belongs to the abandoned lineage.
  if (feedback_) *feedback_ = ErrorFeedback(n_params_);
  STARLING_RETURN_IF_ERROR(LoadModel());
  Serve();
  swarm_->SetProgress(Here(), /*joining=*/false);
  ops_.SetReady(true);
  return absl::OkStatus();
}

void EmbeddedDiloco::InnerStep(const StepResult& step) {
  RecordInnerStep(ops_, step);
}

void EmbeddedDiloco::RefreshMetrics() {
  if (swarm_ == nullptr) return;
  RefreshEmbeddedMetrics(ops_.metrics.get(), *swarm_, config_.net.node_id,
                         pseudo_gradient_bytes_);
}

void EmbeddedDiloco::Leave() {
  if (left_ || swarm_ == nullptr) return;
  left_ = true;
  ops_.SetReady(false);
  swarm_->Leave();
  swarm_->Shutdown();
}

Swarm::Lineage EmbeddedDiloco::Here() const {
  return Swarm::Lineage{round_, lineage_, member_rounds_, {}};
}

void EmbeddedDiloco::Serve() {
  SwarmState st;
  st.round = round_;
  st.step = step_;
  st.lineage = lineage_;
  st.member_rounds = member_rounds_;
  st.theta = theta_global_;
  st.buffers = buffers_global_;
  st.outer_state = outer_->SaveState();
  swarm_->ServeState(std::move(st));
}

absl::Status EmbeddedDiloco::LoadModel() {
  STARLING_RETURN_IF_ERROR(Unflatten(buffers_global_, model_.buffers));
  return Unflatten(
      OwnModel(theta_global_, feedback_.get(), codecs_.ef_in_model),
      model_.params);
}

}  // namespace starling
