#include "node/diloco_loop.h"

#include <future>

#include "node/node_flags.h"

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

// DiLoCo's adaptive sync (flags --round_seconds ... --divergence_threshold):

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

}  // namespace

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

}  // namespace starling
