#include "node/gossip_loop.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/logging.h"
#include "core/status.h"
#include "node/elastic_swarm.h"

namespace starling {
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

}  // namespace

int RunGossip(NodeRun& run) { return GossipLoop(run).Run(); }

GossipLoop::GossipLoop(NodeRun& run)
    : run_(run),
      trainer_(run.trainer),
      config_(run.config),
      total_(run.config.train.steps()),
      lossy_(!run.codecs.params->lossless()),
      session_(run, run.config.net.node_id),
      period_([&] {
        GossipPeriodOptions o =
            GossipPeriodOptionsOf(run.config, run.codecs, run.n_params);
        o.events = &session_.events();
        o.metrics = run.ops.metrics.get();
        o.watchdog = run.ops.watchdog.get();
        return o;
      }()) {}

int GossipLoop::Run() {
  if (absl::Status s = Start(); !s.ok()) return Fail(s);
  absl::StatusOr<bool> left = Train();
  if (!left.ok()) return Fail(left.status());
  return End(*left);
}

absl::Status GossipLoop::Start() {
  absl::StatusOr<SwarmOptions> shared = ElasticSwarmOptions(run_, "gossip");
  if (!shared.ok()) return WithExitCode(shared.status(), 2);
  if (absl::Status s = CheckGossipPeers(config_.gossip.peer_mode); !s.ok()) {
    return WithExitCode(s, 2);
  }
  SwarmOptions so = GossipSwarmOptions(*std::move(shared), config_, run_.codecs,
                                       run_.n_params);
  MemberChanges* changes = &session_.changes();
  so.on_member_change = [changes](const MembershipChange& c) {
    changes->Add(c);
  };
  STARLING_ASSIGN_OR_RETURN(std::unique_ptr<Swarm> swarm, StartSwarm(so));
  swarm_ = &session_.AttachSwarm(std::move(swarm));
  session_.LogModel(absl::StrCat(config_.net.node_id,
                                 " (gossip, push-sum) listening on ",
                                 ListenLine(*swarm_)));
  run_.ops.watchdog->Waiting(2 * config_.net.connect_timeout);
  session_.StartMetricsPoller();
  STARLING_RETURN_IF_ERROR(JoinSwarm(run_, session_, *swarm_));
  // Only now do the others count this node towards --min_members: counted
  // earlier (they hear of it from its first gossip), they could train and
  // leave while it is still in JoinSwarm, and it would wait for them in vain.
  swarm_->SetProgress({}, /*joining=*/false);
  STARLING_RETURN_IF_ERROR(WaitForMembers(run_, *swarm_));
  period_.Start(Flatten(run_.params), run_.state.gossip_weight);
  if (period_.slowmo() && !run_.state.gossip_momentum.empty()) {
    STARLING_RETURN_IF_ERROR(
        period_.RestoreMomentum(std::move(run_.state.gossip_momentum)));
    run_.state.gossip_momentum.clear();
  } else if (period_.slowmo() && config_.train.resume()) {
    // A checkpoint written without SlowMo, or before it was saved.
    LogEvent(LogLevel::kWarning, "resume",
             "--resume: the checkpoint holds no SlowMo momentum; it starts "
             "again at zero");
  }
  session_.Start(JsonObject()
                     .Add("algo", "gossip")
                     .Add("address", swarm_->address())
                     .Add("step", static_cast<int64_t>(trainer_.state().step()))
                     .Add("parameters", run_.n_params)
                     .Add("weight", period_.weight())
                     .Add("model_hash", FlatHash(period_.y())));
  return absl::OkStatus();
}

absl::StatusOr<bool> GossipLoop::Train() {
  while (trainer_.state().step() < total_) {
    session_.LogMemberChanges();
    run_.ops.SetReady(StopSignal() == 0);
    const int prev_step = trainer_.state().step();
    const int steps = std::min(config_.inner_steps, total_ - prev_step);
    STARLING_ASSIGN_OR_RETURN(const double loss_sum, RunInnerSteps(steps));
    const double train_loss = loss_sum / std::max(1, steps);
    if (absl::Status s = period_.Run(*swarm_, Flatten(run_.params),
                                     trainer_.state().step(), train_loss);
        !s.ok()) {
      return FailPeriod(std::move(s));
    }
    STARLING_RETURN_IF_ERROR(Unflatten(period_.y(), run_.params));
    STARLING_RETURN_IF_ERROR(EndPeriod(prev_step, train_loss));
    // SIGINT/SIGTERM: leave after the current local steps.
    if (StopSignal() != 0 && trainer_.state().step() < total_) return true;
  }
  return false;
}

absl::StatusOr<double> GossipLoop::RunInnerSteps(int steps) {
  double loss_sum = 0;
  for (int i = 0; i < steps; ++i) {
    if (StopSignalCount() >= 2) break;  // a second signal: leave now
    STARLING_ASSIGN_OR_RETURN(
        const StepResult r,
        session_.Step(period_.counters().pushes, /*log_data_drift=*/false));
    loss_sum += r.loss;
  }
  return loss_sum;
}

absl::Status GossipLoop::FailPeriod(absl::Status s) {
  if (period_.link_failed()) {
    KeepForCheckpoint();
    session_.CheckpointBeforeFailing(Unflatten(period_.y(), run_.params), 0);
  }
  session_.events().Write("error", JsonObject().Add("message", s.message()));
  swarm_->Leave();
  return s;
}

absl::Status GossipLoop::EndPeriod(int prev_step, double train_loss) {
  const int step = trainer_.state().step();
  const GossipCounters& c = period_.counters();
  STARLING_RETURN_IF_ERROR(session_.MaybeEvaluate(step == total_, prev_step));
  if (const int every = config_.gossip.snapshot_every;
      every > 0 && (step / every > prev_step / every || step == total_)) {
    if (absl::Status s = WriteSnapshot(run_.out(), step, period_.y());
        !s.ok()) {
      LogEvent(LogLevel::kWarning, "snapshot", std::string(s.message()));
    }
  }
  LogEvent(
      LogLevel::kInfo, "gossip",
      absl::StrFormat("%s step %d/%d | loss %.4f | w %.4f | pushes %d "
                      "absorbed %d | sent %s | eta %s",
                      config_.net.node_id, step, total_, train_loss,
                      period_.weight(), c.pushes, c.absorbs,
                      FormatBytes(static_cast<double>(session_.BytesSent())),
                      session_.Eta(step)));
  run_.state.gossip_weight = period_.weight();
  session_.SetCompressionTraffic(c.raw_bytes, c.wire_bytes);
  if (session_.CheckpointDue(prev_step, step)) {
    KeepForCheckpoint();
    session_.PeriodicCheckpoint(0);
    run_.state.gossip_momentum.clear();
  }
  return absl::OkStatus();
}

void GossipLoop::KeepForCheckpoint() {
  run_.state.gossip_weight = period_.weight();
  if (period_.slowmo()) run_.state.gossip_momentum = period_.momentum();
}

int GossipLoop::End(bool left) {
  session_.LogMemberChanges();
  run_.ops.SetReady(false);
  // Goodbye first, so that nobody pushes to this node any more.
  swarm_->Leave();
  KeepForCheckpoint();
  const int step = trainer_.state().step();
  const GossipCounters& c = period_.counters();
  if (left) {
    session_.events().Write(
        "leave", JsonObject().Add("step", static_cast<int64_t>(step)));
  } else if (run_.state.evaluated_step != step) {
    if (absl::Status s = session_.MaybeEvaluate(true, step); !s.ok()) {
      return Fail(s);
    }
  }
  SessionEnd end;
  end.stopped = left;
  end.next_round = 0;
  end.world = c.max_world;
  end.totals.compression = run_.codecs.params->Name();
  if (lossy_) end.totals.compression += " + error feedback (gossip)";
  end.totals.bytes_before_compression = c.raw_bytes;
  end.totals.bytes_after_compression = c.wire_bytes;
  end.end_fields.Add("exchanges", c.exchanges);
  end.summary.Add("algo", "gossip")
      .Add("world", static_cast<int64_t>(c.max_world))
      .Add("inner_steps_per_round", static_cast<int64_t>(config_.inner_steps))
      .Add("exchanges", c.exchanges)
      .Add("pushes", c.pushes)
      .Add("absorbs", c.absorbs)
      .Add("failed_pushes", c.failed_pushes)
      .Add("pushes_refused", swarm_->pushes_refused())
      .Add("push_sum_weight", period_.weight());
  end.done = absl::StrFormat(", %d exchanges (%d pushes, %d absorbed)",
                             c.exchanges, c.pushes, c.absorbs);
  end.stopped_by = absl::StrCat(config_.net.node_id, " left the swarm on");
  end.shutdown = [this] { swarm_->Shutdown(); };
  return session_.Finish(std::move(end));
}

}  // namespace starling
