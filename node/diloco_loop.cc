#include "node/diloco_loop.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/flat_params.h"
#include "core/logging.h"
#include "core/status.h"
#include "node/elastic_swarm.h"
#include "node/swarm_end_report.h"
#include "node/swarm_metrics.h"

namespace starling {
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

ExchangeSettings ExchangeSettingsOf(const NodeRun& run) {
  return DilocoExchangeSettings(run.config, run.codecs, run.n_params,
                                NumElements(run.buffers),
                                run.ops.watchdog.get());
}

}  // namespace

ExchangeSettings DilocoExchangeSettings(const NodeConfig& config,
                                        const NodeCodecs& codecs,
                                        int64_t n_params, int64_t n_buffers,
                                        Watchdog* watchdog) {
  ExchangeSettings s;
  s.rpc_timeout = config.net.round_timeout;
  s.round_deadline = config.net.round_deadline;
  s.ring_codec = codecs.ring_codec;
  s.flush_codec = codecs.flush.get();
  s.robust = config.diloco.robust;
  s.sparse_gather = codecs.sparse_gather;
  s.aggregate = config.diloco.aggregate;
  s.norm_bound = config.diloco.norm_bound;
  s.n_params = n_params;
  s.n_buffers = n_buffers;
  s.watchdog = watchdog;
  s.leave_when_cut_off = !config.diloco.train_alone;
  return s;
}

DilocoRoundOptions DilocoRoundOptionsOf(const NodeConfig& config,
                                        const NodeCodecs& codecs) {
  DilocoRoundOptions o;
  o.weighting = config.diloco.sync.weighting;
  o.inner_steps = config.inner_steps;
  o.ef_in_model = codecs.ef_in_model;
  o.ef_decay = config.diloco.ef_decay;
  return o;
}

SwarmOptions DilocoRoundSwarmOptions(SwarmOptions so, const NodeConfig& config,
                                     const NodeCodecs& codecs, int64_t n_params,
                                     int64_t n_buffers) {
  const int64_t pack = n_params + kWeightingSlots + 1 + n_buffers;
  so.identity.compression = codecs.ring->Name();
  so.identity.aggregate = AggregateName(config.diloco.aggregate);
  if (config.diloco.norm_bound > 0) {
    absl::StrAppend(&so.identity.aggregate,
                    ",norm_bound=", config.diloco.norm_bound);
  }
  so.round_deadline = config.net.round_deadline;
  so.mailbox.run_id = so.identity.run_id;
  so.mailbox.tensors = {{kPseudoGrad, pack}, {kPseudoGradWhole, pack}};
  so.mailbox.whole_tensors = {kPseudoGradWhole};
  if (codecs.ring_codec != nullptr) {
    so.mailbox.compressed_bytes_per_element = {{kPseudoGrad, 8}};
  }
  if (codecs.sparse_gather) {
    so.mailbox.tensors[kPseudoGradSparse] = pack;
    so.mailbox.whole_tensors.insert(kPseudoGradSparse);
    so.mailbox.compressed_bytes_per_element[kPseudoGradSparse] = 8;
  }
  if (codecs.ef_in_model) {
    so.mailbox.tensors[kResidualFlush] = pack;
    so.mailbox.compressed_bytes_per_element[kResidualFlush] = 8;
    // Members that flush and members that do not cannot share rounds.
    absl::StrAppend(&so.identity.compression, " with error feedback");
  }
  return so;
}

int RunDiloco(NodeRun& run) { return DilocoLoop(run).Run(); }

DilocoLoop::DilocoLoop(NodeRun& run)
    : run_(run),
      trainer_(run.trainer),
      config_(run.config),
      total_(run.config.train.steps()),
      n_rounds_((total_ + run.config.inner_steps - 1) / run.config.inner_steps +
                (run.codecs.ef_in_model ? 1 : 0)),  // the flush
      round_options_(DilocoRoundOptionsOf(run.config, run.codecs)),
      exchange_settings_(ExchangeSettingsOf(run)),
      session_(run, run.config.net.node_id),
      sync_(run.config.diloco.sync) {
  session_.SetSharedModelScope([this](const std::function<absl::Status()>& fn) {
    return WithGlobalModel(fn);
  });
}

DilocoLoop::~DilocoLoop() { abandon_ = true; }

int DilocoLoop::Run() {
  if (absl::Status s = Start(); !s.ok()) return Fail(s);
  absl::StatusOr<bool> left = Train();
  if (!left.ok()) return Fail(left.status());
  return End(*left);
}

// ---------------------------------------------------------------------------
// Start

SwarmOptions DilocoLoop::DilocoSwarmOptions(SwarmOptions so) {
  so = DilocoRoundSwarmOptions(std::move(so), config_, run_.codecs,
                               run_.n_params, NumElements(run_.buffers));
  MemberChanges* changes = &session_.changes();
  so.on_member_change = [changes](const MembershipChange& c) {
    changes->Add(c);
  };
  // A second SIGINT/SIGTERM leaves at once, also from the middle of an
  // all-reduce that waits for a slow or silent peer; so does a loop that
  // ends with a round in flight.
  so.interrupted = [abandon = &abandon_] {
    return StopSignalCount() >= 2 || abandon->load();
  };
  return so;
}

absl::Status DilocoLoop::Start() {
  absl::StatusOr<SwarmOptions> shared = ElasticSwarmOptions(run_, "diloco");
  if (!shared.ok()) return WithExitCode(shared.status(), 2);
  theta_global_ = Flatten(run_.params);
  buffers_global_ = Flatten(run_.buffers);
  lineage_ = FlatHash(theta_global_, buffers_global_);
  // A resumed node trains on from its own model (its residual restored).
  STARLING_RETURN_IF_ERROR(LoadNodeModel());
  const SwarmOptions so = DilocoSwarmOptions(*std::move(shared));
  STARLING_ASSIGN_OR_RETURN(std::unique_ptr<Swarm> swarm, StartSwarm(so));
  swarm_ = &session_.AttachSwarm(std::move(swarm));
  // Not joining: a fresh node starts on the initial lineage with the others;
  // one that is behind turns to joining while it catches up.
  swarm_->SetProgress(Here(), /*joining=*/false);
  session_.LogModel(absl::StrCat(config_.net.node_id,
                                 " (diloco, elastic) listening on ",
                                 ListenLine(*swarm_)));
  run_.ops.watchdog->Waiting(2 * config_.net.connect_timeout);
  session_.SetCompressionTraffic(run_.state.prior.before_compression,
                                 run_.state.prior.after_compression);
  session_.StartMetricsPoller();
  if (run_.ops.metrics) run_.ops.metrics->SetOuterLr(config_.diloco.outer.lr);
  STARLING_RETURN_IF_ERROR(JoinSwarm(run_, session_, *swarm_));
  STARLING_RETURN_IF_ERROR(WaitForMembers(run_, *swarm_));
  session_.Start(JsonObject()
                     .Add("algo", "diloco")
                     .Add("address", swarm_->address())
                     .Add("round", run_.state.round)
                     .Add("step", static_cast<int64_t>(trainer_.state().step()))
                     .Add("parameters", run_.n_params)
                     .Add("model_hash", lineage_));
  Serve();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// The round loop

absl::StatusOr<bool> DilocoLoop::Train() {
  for (;;) {
    STARLING_ASSIGN_OR_RETURN(const bool left, RunRounds());
    if (pending_) {
      // Left while a round was in flight (a second signal): settle it, so
      // that the checkpoint holds a θ_global the swarm agreed on.
      std::unique_ptr<RoundInFlight> prev = std::move(pending_);
      STARLING_RETURN_IF_ERROR(
          FinishRound(*prev, /*overlapped=*/true).status());
    }
    session_.LogMemberChanges();
    run_.ops.SetReady(false);
    if (left) return true;
    if (!StayUntilCaughtUp()) return false;
  }
}

absl::StatusOr<bool> DilocoLoop::RunRounds() {
  while (trainer_.state().step() < total_ || FlushDue()) {
    session_.LogMemberChanges();
    // A second SIGINT/SIGTERM leaves at once (the first: see the vote).
    if (StopSignalCount() >= 2) return true;
    STARLING_ASSIGN_OR_RETURN(const bool go_on, RunRound());
    // Not on a signal, the round was given up because this node woke from
    // a pause or was cut off from the swarm (round_exchange.h); one that is
    // back goes on.
    if (!go_on && (StopSignal() != 0 || ApartFromSwarm())) return true;
  }
  return false;
}

absl::StatusOr<bool> DilocoLoop::RunRound() {
  const Swarm::Lineage best = swarm_->Best();
  if (!pending_ && Swarm::Ahead(best, Here()) && !best.donors.empty()) {
    CatchUpOrPause(best);
    return true;
  }
  // Nobody live to catch up from, and the swarm gone: no round alone. (Not
  // with an overlapped round in flight: its commit may be on its way while
  // a member that committed it has already left. Checked again below.)
  if (!pending_ && ApartFromSwarm()) return false;
  // Woken from a pause, and nobody has answered yet: wait for an answer,
  // or for the failure detector to decide (no round that would hold this
  // node alone).
  if (!pending_ && swarm_->Judge().waking) {
    absl::SleepFor(absl::Milliseconds(100));
    return true;
  }
  swarm_->SetProgress(Here(), /*joining=*/false);
  // On the best lineage, with the model: ready (and it stays so).
  run_.ops.SetReady(StopSignal() == 0);
  STARLING_ASSIGN_OR_RETURN(InnerSteps inner, RunInnerSteps());
  if (inner.abandoned) {
    trainer_.set_step(inner.prev_step);
    STARLING_RETURN_IF_ERROR(LoadNodeModel());
    return false;
  }
  std::vector<float> delta = RoundPseudoGradient(&inner);
  // The node's own buffers, before a commit below puts the shared ones in.
  std::vector<float> own_buffers = Flatten(run_.buffers);
  if (pending_) {
    // --overlap: the previous round's outcome. When it did not commit,
    // this round's inner steps are dropped too: they started from a
    // θ_global the swarm did not keep.
    std::unique_ptr<RoundInFlight> prev = std::move(pending_);
    STARLING_ASSIGN_OR_RETURN(const RoundAction a,
                              FinishRound(*prev, /*overlapped=*/true));
    if (a == RoundAction::kLeave) return false;
    if (a == RoundAction::kRetry) return true;
  }
  if (ApartFromSwarm()) {
    // The swarm went on and left while these inner steps ran: they are
    // dropped, and End checkpoints the last commit.
    trainer_.set_step(inner.prev_step);
    STARLING_RETURN_IF_ERROR(LoadNodeModel());
    return false;
  }
  std::vector<float> eager_start;
  if (config_.diloco.overlap) {
    eager_start = theta_global_;
    for (size_t i = 0; i < delta.size(); ++i) eager_start[i] -= delta[i];
  }
  STARLING_ASSIGN_OR_RETURN(
      std::unique_ptr<RoundInFlight> round,
      BuildRound(inner, std::move(delta),
                 BufferDelta(buffers_global_, own_buffers)));
  const bool overlap_now = OverlapNow(inner.prev_step);
  // Not "round": scripts read "round":N as that round's commit.
  session_.events().Write(
      "sync", JsonObject()
                  .Add("sync_round", run_.state.round)
                  .Add("step", static_cast<int64_t>(trainer_.state().step()))
                  .Add("overlapped", overlap_now));
  round->exchange->Launch(*swarm_, Here(), overlap_now, abandon_);
  if (overlap_now && config_.diloco.overlap_steps > 0) {
    return SettleBehindHead(std::move(round));
  }
  if (overlap_now) {
    STARLING_RETURN_IF_ERROR(StartEagerly(std::move(eager_start), own_buffers));
    pending_ = std::move(round);
    return true;
  }
  STARLING_ASSIGN_OR_RETURN(const RoundAction a,
                            FinishRound(*round, /*overlapped=*/false));
  return a != RoundAction::kLeave;
}

// ---------------------------------------------------------------------------
// Catching up

absl::Status DilocoLoop::CatchUp(const Swarm::Lineage& best) {
  // What failed attempts moved and retried counts in the transfer that
  // succeeds after them (e.g. a donor died mid-transfer, and the others had
  // not reached its round yet).
  const absl::Duration timeout = config_.net.round_timeout;
  run_.ops.watchdog->Waiting(timeout);
  swarm_->SetProgress(Here(), /*joining=*/true);
  STARLING_ASSIGN_OR_RETURN(
      SwarmState st, swarm_->FetchState(best.donors, &best,
                                        absl::Now() + timeout, &fetch_stats_));
  NodeState& state = run_.state;
  STARLING_RETURN_IF_ERROR(state.outer->LoadState(st.outer_state));
  theta_global_ = std::move(st.theta);
  buffers_global_ = std::move(st.buffers);
  STARLING_RETURN_IF_ERROR(Unflatten(theta_global_, run_.params));
  STARLING_RETURN_IF_ERROR(Unflatten(buffers_global_, run_.buffers));
  const int64_t from_round = state.round;
  state.round = st.round;
  lineage_ = st.lineage;
  state.member_rounds = st.member_rounds;
  trainer_.set_step(static_cast<int>(st.step));
  head_.reset();  // steps on the abandoned lineage
  // The residual belongs to the abandoned lineage.
  if (state.feedback) *state.feedback = ErrorFeedback(run_.n_params);
  session_.events().Write(
      "state_transfer",
      JsonObject()
          .Add("from", fetch_stats_.donor)
          .Add("round", state.round)
          .Add("from_round", from_round)
          .Add("step", static_cast<int64_t>(st.step))
          .Add("bytes", fetch_stats_.bytes)
          .Add("seconds", fetch_stats_.seconds)
          .Add("retries", static_cast<int64_t>(fetch_stats_.retries))
          .Add("model_hash", lineage_));
  SetLogPosition(state.round, st.step);
  LogEvent(LogLevel::kInfo, "state_transfer",
           absl::StrFormat(
               "%s caught up: round %d, step %d from %s (%s in %.2f s)",
               config_.net.node_id, state.round, st.step, fetch_stats_.donor,
               FormatBytes(static_cast<double>(fetch_stats_.bytes)),
               fetch_stats_.seconds),
           {{"peer", fetch_stats_.donor}});
  fetch_stats_ = Swarm::FetchStats();
  Serve();
  swarm_->SetProgress(Here(), /*joining=*/false);
  return absl::OkStatus();
}

bool DilocoLoop::CatchUpOrPause(const Swarm::Lineage& best) {
  committed_at_ = absl::InfiniteFuture();
  absl::Status s = CatchUp(best);
  if (s.ok()) return true;
  LogEvent(LogLevel::kWarning, "state_transfer",
           absl::StrCat(config_.net.node_id, ": catching up failed (",
                        s.message(), "); retrying"));
  absl::SleepFor(absl::Seconds(1));
  return false;
}

// ---------------------------------------------------------------------------
// Inner steps

DilocoLoop::InnerSteps DilocoLoop::NewInnerSteps() const {
  InnerSteps in;
  in.round_start = absl::Now();
  in.sent_before = session_.BytesSent();
  in.prev_step = trainer_.state().step();
  in.flush = in.prev_step >= total_;
  return in;
}

absl::StatusOr<StepResult> DilocoLoop::InnerStep(InnerSteps& in,
                                                 int64_t round) {
  STARLING_ASSIGN_OR_RETURN(const StepResult r,
                            session_.Step(round, /*log_data_drift=*/true));
  ++in.steps;
  in.loss_sum += r.loss;
  in.samples += r.samples;
  return r;
}

absl::StatusOr<DilocoLoop::InnerSteps> DilocoLoop::RunInnerSteps() {
  // --overlap_steps: the round's first steps ran behind the last exchange.
  InnerSteps in = head_.has_value() ? *std::move(head_) : NewInnerSteps();
  head_.reset();
  // How many inner steps this round: H (adaptive between --min_inner_steps
  // and --max_inner_steps), or as many as fit in --round_seconds. Either
  // way a drift alarm or divergence here, or an early-sync request from any
  // member, ends the round sooner.
  const bool timed = sync_.round_seconds > 0;
  int cap = total_ - in.prev_step;
  if (!timed) {
    cap = std::min(cap, sync_.h->current());
  } else if (sync_.max_steps > 0) {
    cap = std::min(cap, sync_.max_steps);
  }
  // The time budget counts from the previous commit, which every member saw
  // at about the same moment: a member that spent part of it evaluating or
  // checkpointing runs fewer steps instead of holding the others back.
  const absl::Time budget_end = std::min(in.round_start, committed_at_) +
                                absl::Seconds(timed ? sync_.round_seconds : 0);
  // The divergence trigger measures from where this round started: with the
  // residual in the model, θ_global − e (from θ_global, it would count the
  // residual, which an early round does not shrink).
  std::vector<float> own_start;
  if (run_.codecs.ef_in_model && sync_.divergence &&
      sync_.divergence->enabled()) {
    own_start = OwnModel();
  }
  while (in.steps < cap) {
    // SIGINT/SIGTERM: finish this round, then leave; a second one: leave
    // now, abandoning the round.
    if (StopSignalCount() >= 2) {
      in.abandoned = true;
      break;
    }
    if (in.steps > 0) {
      if (timed && absl::Now() >= budget_end) break;
      if (swarm_->EarlySyncRequested(run_.state.round)) {
        in.early = true;
        break;
      }
    }
    STARLING_ASSIGN_OR_RETURN(const StepResult r,
                              InnerStep(in, run_.state.round));
    if (trainer_.state().step() == config_.train.warmup() && sync_.detector) {
      sync_.detector->Suppress();  // the LR schedule turns
    }
    if (DriftTriggered(r, own_start)) {
      in.early = true;
      break;
    }
  }
  in.seconds = absl::ToDoubleSeconds(absl::Now() - in.round_start);
  return in;
}

bool DilocoLoop::DriftTriggered(const StepResult& r,
                                const std::vector<float>& own_start) {
  const char* trigger = nullptr;
  double statistic = 0;
  if (sync_.detector && sync_.detector->Add(r.loss)) {
    trigger = "page_hinkley";
    statistic = sync_.detector->statistic();
  } else if (sync_.divergence && sync_.divergence->enabled()) {
    std::vector<float> theta = Flatten(run_.params);
    if (sync_.divergence->Exceeded(
            theta, own_start.empty() ? theta_global_ : own_start, &statistic)) {
      trigger = "divergence";
    }
  }
  if (trigger == nullptr) return false;
  const int step = trainer_.state().step();
  swarm_->RequestEarlySync(run_.state.round);
  session_.events().Write("drift_detected",
                          JsonObject()
                              .Add("step", static_cast<int64_t>(step))
                              .Add("round", run_.state.round)
                              .Add("by", trigger)
                              .Add("statistic", statistic)
                              .Add("loss", r.loss));
  LogEvent(LogLevel::kInfo, "drift_detected",
           absl::StrFormat("%s: drift (%s, %.3g) at step %d: asking for an "
                           "early sync",
                           config_.net.node_id, trigger, statistic, step));
  return true;
}

// ---------------------------------------------------------------------------
// The round's contribution and its exchange

std::vector<float> DilocoLoop::RoundPseudoGradient(InnerSteps* inner) {
  // The round started from θ_global, or (when it ran behind an exchange,
  // --overlap) from eager_start_; with the residual in the model, from
  // θ_global − e (the node's own model).
  const absl::Span<const float> trained = staging_.Copy(run_.params);
  inner->copy_seconds = staging_.last_seconds();
  if (run_.codecs.ef_in_model) return PseudoGradient(OwnModel(), trained);
  return PseudoGradient(pending_ ? eager_start_ : theta_global_, trained);
}

absl::StatusOr<std::unique_ptr<DilocoLoop::RoundInFlight>>
DilocoLoop::BuildRound(const InnerSteps& inner, std::vector<float> delta,
                       const std::vector<float>& buffer_delta) {
  const int64_t n = static_cast<int64_t>(delta.size());
  RoundWork work;
  work.steps = inner.steps;
  work.samples = inner.samples;
  // FedNova weighs a node by its share of the data (its train set, in units
  // of 2^20 examples so that p·τ stays exact in fp32).
  work.data_share = std::ldexp(static_cast<double>(std::max<int64_t>(
                                   1, trainer_.dataset().train_size())),
                               -20);
  work.flush = inner.flush;
  // After a round whose votes sum above zero, every member that has a
  // pending signal leaves: members signalled together (a sim's Ctrl-C) all
  // stop after the same round and resume exactly, while one signalled alone
  // leaves and the others go on.
  work.stop_vote = StopSignal() != 0;
  work.lr_start = trainer_.lr_at(inner.prev_step);
  work.lr_end = trainer_.lr_at(inner.prev_step + inner.steps);
  STARLING_ASSIGN_OR_RETURN(
      DilocoRound round,
      DilocoRound::Begin(round_options_, work, std::move(delta),
                         run_.codecs.params.get(), run_.state.feedback.get(),
                         buffer_delta));
  const int64_t number = run_.state.round;
  if (const PoisonWindow* w = PoisonFor(config_.diloco.poison, number)) {
    const std::string what =
        ApplyPoison(*w, static_cast<uint64_t>(number) * 7919 + 17,
                    round.mutable_contribution().data(), n);
    LogEvent(LogLevel::kWarning, "test_poison",
             absl::StrCat("--test_poison: sending ", what,
                          " as this node's pseudo-gradient in round ", number));
  }
  auto c = std::make_unique<RoundInFlight>();
  c->inner = inner;
  c->exchange = std::make_unique<RoundExchange>(exchange_settings_,
                                                std::move(round), number);
  return c;
}

bool DilocoLoop::OverlapNow(int prev_step) const {
  // While the membership is steady, run this round's exchange behind the
  // next round's inner steps. Checkpoints, the last round and any change of
  // members (a joiner, a departure, a stale lineage) take the synchronous
  // path, which the elastic protocol already handles.
  const int end_step = trainer_.state().step();
  return (config_.diloco.overlap || config_.diloco.overlap_steps > 0) &&
         end_step < total_ && StopSignal() == 0 &&
         !session_.CheckpointDue(prev_step, end_step) &&
         SteadyMembers(*swarm_, last_members_, config_.net.node_id) &&
         !Swarm::Ahead(swarm_->Best(), Here());
}

absl::StatusOr<bool> DilocoLoop::SettleBehindHead(
    std::unique_ptr<RoundInFlight> round) {
  // The next round's first --overlap_steps steps run while the exchange
  // does; what they learn is kept through the round's outer step.
  const std::vector<float> launched = Flatten(run_.params);
  InnerSteps head = NewInnerSteps();
  const int n = std::min(config_.diloco.overlap_steps, total_ - head.prev_step);
  while (head.steps < n && !head.abandoned) {
    head.abandoned = StopSignalCount() >= 2;
    if (!head.abandoned) {
      STARLING_RETURN_IF_ERROR(InnerStep(head, run_.state.round + 1).status());
    }
  }
  if (head.abandoned) {
    // Leaving at once: the loop settles the round, without these steps.
    trainer_.set_step(head.prev_step);
    pending_ = std::move(round);
    return false;
  }
  const std::vector<float> trained = Flatten(run_.params);
  STARLING_ASSIGN_OR_RETURN(const RoundAction a,
                            FinishRound(*round, /*overlapped=*/true));
  // Not committed, or leaving: FinishRound went back without these steps.
  if (a != RoundAction::kNext) return a != RoundAction::kLeave;
  STARLING_RETURN_IF_ERROR(Unflatten(
      MergeDelayedUpdate(OwnModel(), launched, trained), run_.params));
  head_ = head;
  return true;
}

absl::Status DilocoLoop::StartEagerly(std::vector<float> eager_start,
                                      const std::vector<float>& own_buffers) {
  // The swarm's update for the round behind it replaces this node's own
  // progress one round later; its buffers go on from its own too.
  eager_start_ = std::move(eager_start);
  STARLING_RETURN_IF_ERROR(Unflatten(eager_start_, run_.params));
  STARLING_RETURN_IF_ERROR(Unflatten(own_buffers, run_.buffers));
  if (sync_.detector) sync_.detector->Suppress();  // θ jumps to θ_global
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// The round's outcome

absl::StatusOr<DilocoLoop::RoundAction> DilocoLoop::FinishRound(
    RoundInFlight& c, bool overlapped) {
  absl::StatusOr<Swarm::RoundResult> res = c.exchange->Wait();
  // The round protocol fails only for this node's own reasons (an emulated
  // link too slow for the run, say): go back to the last commit and
  // checkpoint it, as a node leaving on a signal does, before failing.
  if (!res.ok()) {
    session_.CheckpointBeforeFailing(BackToCommit(c), run_.state.round);
    return res.status();
  }
  if (c.exchange->attempts() > 0) {
    last_rank_ = c.exchange->rank();
    last_world_ = c.exchange->world();
  }
  ReportRoundMetrics(c, *res);
  if (res->outcome != Swarm::Outcome::kCommitted) return MissedRound(c, *res);
  return CommitRound(c, *res, overlapped);
}

absl::Status DilocoLoop::BackToCommit(const RoundInFlight& c) {
  if (run_.state.feedback) {
    (void)c.exchange->round().Restore(run_.state.feedback.get());
  }
  trainer_.set_step(c.inner.prev_step);
  return LoadNodeModel();
}

void DilocoLoop::ReportRoundMetrics(const RoundInFlight& c,
                                    const Swarm::RoundResult& res) const {
  starling::ReportRoundMetrics(run_.ops.metrics.get(), *c.exchange, res.outcome,
                               c.inner.round_start);
}

absl::StatusOr<DilocoLoop::RoundAction> DilocoLoop::MissedRound(
    const RoundInFlight& c, const Swarm::RoundResult& res) {
  committed_at_ = absl::InfiniteFuture();
  STARLING_RETURN_IF_ERROR(BackToCommit(c));
  if (res.outcome == Swarm::Outcome::kStopped) return RoundAction::kLeave;
  // Stale: the swarm committed this round without us. Wait (briefly) until
  // gossip shows who is ahead, then catch up at the loop's top.
  LogEvent(LogLevel::kInfo, "stale",
           absl::StrCat(config_.net.node_id, " missed round ", run_.state.round,
                        "; catching up"));
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (absl::Now() < until && !Swarm::Ahead(swarm_->Best(), Here())) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  return RoundAction::kRetry;
}

absl::StatusOr<DilocoLoop::RoundAction> DilocoLoop::CommitRound(
    RoundInFlight& c, const Swarm::RoundResult& res, bool overlapped) {
  STARLING_ASSIGN_OR_RETURN(const RoundUpdate update,
                            ApplyCommit(c, res, overlapped));
  STARLING_ASSIGN_OR_RETURN(const RoundRecord rec,
                            RecordCommit(c, res, overlapped));
  if (session_.CheckpointDue(c.inner.prev_step, rec.step)) {
    session_.PeriodicCheckpoint(run_.state.round);
  }
  if (update.stop_voted && StopSignal() != 0 && rec.step < total_) {
    // Overlapped: the inner steps run since are dropped, as at every
    // member, so all resume from this round.
    if (overlapped) trainer_.set_step(c.inner.prev_step + c.inner.steps);
    return RoundAction::kLeave;
  }
  return RoundAction::kNext;
}

absl::StatusOr<RoundUpdate> DilocoLoop::ApplyCommit(
    const RoundInFlight& c, const Swarm::RoundResult& res, bool overlapped) {
  NodeState& state = run_.state;
  const RoundExchange& x = *c.exchange;
  state.pseudo_gradient_bytes.raw_bytes += x.traffic().raw_bytes;
  state.pseudo_gradient_bytes.wire_bytes += x.traffic().wire_bytes;
  for (size_t i = 0; i < x.verdicts().size(); ++i) {
    const PackVerdict& v = x.verdicts()[i];
    if (v.accepted) continue;
    ++state.contributions_dropped;
    session_.events().Write(
        "contribution_dropped",
        JsonObject()
            .Add("round", state.round)
            .Add("peer", i < x.members().size() ? x.members()[i] : "")
            .Add("reason", v.reason)
            .Add("norm", v.norm));
  }
  session_.SetCompressionTraffic(
      state.prior.before_compression + state.pseudo_gradient_bytes.raw_bytes,
      state.prior.after_compression + state.pseudo_gradient_bytes.wire_bytes);
  if (x.sum() == nullptr || x.sum()->empty()) {
    return absl::InternalError(absl::StrCat(
        "round ", state.round, " committed without an all-reduce here"));
  }
  const absl::Time outer_start = absl::Now();
  STARLING_ASSIGN_OR_RETURN(const RoundUpdate update,
                            x.round().Commit(*x.sum(), &theta_global_,
                                             *state.outer, &buffers_global_));
  if (run_.ops.metrics) {
    run_.ops.metrics->SetPseudoGradientNorm(update.delta_norm);
  }
  STARLING_RETURN_IF_ERROR(LoadNodeModel());
  outer_seconds_ = absl::ToDoubleSeconds(absl::Now() - outer_start);
  lineage_ = FlatHash(theta_global_, buffers_global_);
  state.member_rounds =
      std::min(kMaxMemberRounds,
               state.member_rounds + static_cast<int64_t>(res.members.size()));
  committed_at_ = absl::Now();
  const bool flush = c.inner.flush;
  if (!overlapped && !flush) {
    // Every member moves the LR schedule by the round's mean step count
    // (FedNova's τ_eff; H when all ran H), so members that ran different
    // step counts agree on the step again. (--overlap needs a fixed H.)
    const int prev = c.inner.prev_step;
    trainer_.set_step(std::clamp(
        prev + static_cast<int>(std::llround(update.effective_steps)), prev + 1,
        total_));
  }
  if (c.inner.early) sync_.h->OnDrift();
  if (!flush) sync_.h->OnRoundEnd(c.inner.early);
  if (sync_.detector) sync_.detector->Suppress();  // θ → θ_global
  return update;
}

absl::StatusOr<RoundRecord> DilocoLoop::RecordCommit(
    const RoundInFlight& c, const Swarm::RoundResult& res, bool overlapped) {
  NodeState& state = run_.state;
  const InnerSteps& in = c.inner;
  RoundRecord rec;
  rec.round = state.round;
  rec.step = overlapped ? in.prev_step + in.steps : trainer_.state().step();
  rec.inner_steps = in.steps;
  rec.early = in.early;
  rec.sync_seconds = c.exchange->sync_seconds();
  if (!in.flush) {
    rec.inner_seconds = in.seconds;
    rec.copy_seconds = in.copy_seconds;
  }
  rec.outer_seconds = outer_seconds_;
  rec.overlapped = overlapped;
  rec.members = res.members;
  rec.model_hash = lineage_;
  rec.train_loss =
      in.flush ? last_train_loss_ : in.loss_sum / std::max(1, in.steps);
  last_train_loss_ = rec.train_loss;
  rec.residual_flush = in.flush;
  // What was sent since the last round was recorded (the first: since its
  // inner steps began). With --overlap a round's exchange runs during the
  // next round's inner steps, so counting from each round's own start
  // counted it twice. Attempts that did not commit count in the round that
  // did.
  const int64_t sent_now = session_.BytesSent();
  rec.bytes =
      sent_now - (recorded_sent_ >= 0 ? recorded_sent_ : in.sent_before);
  recorded_sent_ = sent_now;
  rec.seconds = absl::ToDoubleSeconds(absl::Now() - in.round_start);
  ++state.round;
  last_members_ = res.members;
  swarm_->SetProgress(Here(), /*joining=*/false);
  Serve(rec.step);
  // The round's first member evaluates; with a residual flush to come,
  // after it (the final model), not before.
  const bool flush_next = !in.flush && rec.step == total_ && FlushDue();
  const bool evaluator = !flush_next && !res.members.empty() &&
                         res.members[0] == config_.net.node_id;
  STARLING_RETURN_IF_ERROR(session_.RecordRound(rec, evaluator, in.prev_step));
  SetLogPosition(state.round, rec.step);
  LogEvent(
      LogLevel::kInfo, "round",
      absl::StrFormat("%s round %d/%d | step %d/%d | members %d | loss "
                      "%.4f | sent %s | hash %s | eta %s",
                      config_.net.node_id, state.round, n_rounds_, rec.step,
                      total_, res.members.size(), rec.train_loss,
                      FormatBytes(static_cast<double>(session_.BytesSent())),
                      rec.model_hash.substr(0, 8), session_.Eta(rec.step)),
      {{"members", absl::StrJoin(res.members, ",")},
       {"model_hash", rec.model_hash}});
  return rec;
}

// ---------------------------------------------------------------------------
// θ_global and the node's own model

Swarm::Lineage DilocoLoop::Here() const {
  return Swarm::Lineage{
      run_.state.round, lineage_, run_.state.member_rounds, {}};
}

void DilocoLoop::Serve(int step) {
  SwarmState st;
  st.round = run_.state.round;
  st.step = step >= 0 ? step : trainer_.state().step();
  st.lineage = lineage_;
  st.member_rounds = run_.state.member_rounds;
  st.theta = theta_global_;
  st.buffers = buffers_global_;
  st.outer_state = run_.state.outer->SaveState();
  swarm_->ServeState(std::move(st));
}

std::vector<float> DilocoLoop::OwnModel() const {
  return starling::OwnModel(theta_global_, run_.state.feedback.get(),
                            run_.codecs.ef_in_model);
}

bool DilocoLoop::FlushDue() const {
  return starling::FlushDue(run_.state.feedback.get(), run_.codecs.ef_in_model);
}

absl::Status DilocoLoop::LoadNodeModel() {
  STARLING_RETURN_IF_ERROR(Unflatten(buffers_global_, run_.buffers));
  return run_.codecs.ef_in_model ? Unflatten(OwnModel(), run_.params)
                                 : Unflatten(theta_global_, run_.params);
}

absl::Status DilocoLoop::WithGlobalModel(
    const std::function<absl::Status()>& fn) {
  if (!run_.codecs.ef_in_model) return fn();
  STARLING_RETURN_IF_ERROR(Unflatten(theta_global_, run_.params));
  absl::Status s = fn();
  absl::Status back = LoadNodeModel();
  return s.ok() ? back : s;
}

}  // namespace starling
