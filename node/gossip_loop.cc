#include "node/gossip_loop.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/logging.h"
#include "core/status.h"
#include "gossip/crash_point.h"
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
      codec_(lossy_ ? run.codecs.params.get() : nullptr),
      momentum_(run.config.gossip.momentum > 0 ||
                run.config.gossip.outer_lr != 1),
      session_(run, run.config.net.node_id),
      push_sum_(1.0),
      rng_(std::hash<std::string>()(run.config.net.node_id) ^
           static_cast<uint64_t>(run.config.train.seed())) {}

int GossipLoop::Run() {
  if (absl::Status s = Start(); !s.ok()) return Fail(s);
  absl::StatusOr<bool> left = Train();
  if (!left.ok()) return Fail(left.status());
  return End(*left);
}

absl::Status GossipLoop::Start() {
  absl::StatusOr<SwarmOptions> shared = ElasticSwarmOptions(run_, "gossip");
  if (!shared.ok()) return WithExitCode(shared.status(), 2);
  const std::string& mode = config_.gossip.peer_mode;
  if (mode != "random" && mode != "exponential") {
    return WithExitCode(
        absl::InvalidArgumentError(absl::StrCat(
            "--gossip_peers=", mode, ": expected random or exponential")),
        2);
  }
  SwarmOptions so = *std::move(shared);
  so.identity.compression = run_.codecs.params->Name();
  so.push_elements = run_.n_params;
  so.push_codec = lossy_ ? run_.codecs.params.get() : nullptr;
  so.push_timeout = config_.gossip.push_timeout;
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
  if (run_.state.gossip_weight > 0) {
    push_sum_.set_weight(run_.state.gossip_weight);
  }
  y_ = Flatten(run_.params);
  session_.Start(JsonObject()
                     .Add("algo", "gossip")
                     .Add("address", swarm_->address())
                     .Add("step", static_cast<int64_t>(trainer_.state().step()))
                     .Add("parameters", run_.n_params)
                     .Add("weight", push_sum_.weight())
                     .Add("model_hash", FlatHash(y_)));
  // SlowMo's anchor x0 is the model after the previous gossip.
  if (momentum_) {
    x0_ = y_;
    u_.assign(y_.size(), 0.0f);
  }
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
    y_ = Flatten(run_.params);
    AbsorbInbox();
    ApplyMomentum();
    ForgetDeparted();
    STARLING_RETURN_IF_ERROR(PushToOnePeer(train_loss));
    if (momentum_) x0_ = y_;
    STARLING_RETURN_IF_ERROR(Unflatten(y_, run_.params));
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
    STARLING_ASSIGN_OR_RETURN(const StepResult r,
                              session_.Step(pushes_, /*log_data_drift=*/false));
    loss_sum += r.loss;
  }
  return loss_sum;
}

void GossipLoop::AbsorbInbox() {
  for (ReceivedPush& p : swarm_->TakePushes()) {
    absl::StatusOr<double> d2 =
        push_sum_.Absorb(absl::MakeSpan(y_), p.values, p.weight);
    if (!d2.ok()) {
      LogEvent(LogLevel::kWarning, "exchange",
               absl::StrCat("dropped a push from ", p.from, ": ",
                            d2.status().message()));
      continue;
    }
    ++exchanges_;
    ++absorbs_;
    if (run_.ops.metrics) run_.ops.metrics->SetConsensusDistance(*d2);
    session_.events().Write(
        "exchange",
        JsonObject()
            .Add("kind", "absorb")
            .Add("peer", p.from)
            .Add("step", static_cast<int64_t>(trainer_.state().step()))
            .Add("weight", push_sum_.weight())
            .Add("bytes", p.wire_bytes)
            .Add("distance2", *d2));
  }
}

void GossipLoop::ApplyMomentum() {
  if (!momentum_) return;
  const double beta = config_.gossip.momentum;
  const double alpha = config_.gossip.outer_lr;
  for (size_t i = 0; i < y_.size(); ++i) {
    u_[i] = static_cast<float>(beta * u_[i] + (x0_[i] - y_[i]));
    y_[i] = static_cast<float>(x0_[i] - alpha * u_[i]);
  }
}

void GossipLoop::ForgetDeparted() {
  // Copies for peers that left or died would grow with churn; one that
  // comes back is pushed to in full.
  if (!lossy_) return;
  for (const peer::v1::MemberEntry& e : swarm_->Members()) {
    if (e.state() == peer::v1::MEMBER_DEAD ||
        e.state() == peer::v1::MEMBER_LEFT) {
      public_copies_.erase(e.id());
    }
  }
}

std::vector<std::string> GossipLoop::Candidates() {
  // The exponential graph's next neighbour (offsets 2^0, 2^1, ... over the
  // sorted live ids, cycling) first, or a random order.
  std::vector<std::string> peers = swarm_->AlivePeers();
  max_world_ = std::max(max_world_, static_cast<int>(peers.size()) + 1);
  std::shuffle(peers.begin(), peers.end(), rng_);
  const std::string& self = config_.net.node_id;
  if (config_.gossip.peer_mode == "exponential" && !peers.empty()) {
    std::vector<std::string> ids = swarm_->AlivePeers();
    ids.push_back(self);
    std::sort(ids.begin(), ids.end());
    const int n = static_cast<int>(ids.size());
    const int me =
        static_cast<int>(std::find(ids.begin(), ids.end(), self) - ids.begin());
    int levels = 0;
    while ((1 << levels) < n) ++levels;
    const int offset = 1 << (exp_step_ % std::max(1, levels));
    ++exp_step_;
    const std::string& first = ids[(me + offset) % n];
    auto it = std::find(peers.begin(), peers.end(), first);
    if (it != peers.end()) std::rotate(peers.begin(), it, it + 1);
  }
  if (peers.size() > 3) peers.resize(3);
  return peers;
}

absl::Status GossipLoop::PushToOnePeer(double train_loss) {
  const absl::Duration timeout = config_.gossip.push_timeout;
  for (const std::string& peer : Candidates()) {
    // With a lossy codec, push y minus the copy `peer` holds of this node's
    // last push to it (its first push to a peer is absolute).
    absl::StatusOr<PushShare> share = push_sum_.Share(
        absl::MakeSpan(y_), codec_, lossy_ ? &public_copies_[peer] : nullptr);
    if (!share.ok()) {
      session_.events().Write(
          "error", JsonObject().Add("message", share.status().message()));
      swarm_->Leave();
      return share.status();
    }
    SetCrashRound(pushes_ + 1);
    run_.ops.watchdog->Waiting(timeout);
    const int64_t sent_before = session_.BytesSent();
    int64_t sequence = 0;
    absl::Status s = swarm_->Push(peer, *share, timeout, &sequence);
    if (!s.ok()) {
      push_sum_.Restore(*share, absl::MakeSpan(y_));
      if (!swarm_->LinkError().ok()) {
        // An emulated link too slow for any push: retrying cannot help.
        // Keep this node's model, weight and what it absorbed first, as a
        // node leaving on a signal does: the senders gave that mass away.
        run_.state.gossip_weight = push_sum_.weight();
        session_.CheckpointBeforeFailing(Unflatten(y_, run_.params), 0);
        session_.events().Write("error",
                                JsonObject().Add("message", s.message()));
        swarm_->Leave();
        return s;
      }
      // The peer lacks the copy this share was relative to (it restarted,
      // or took a push this node saw fail): the next push is absolute.
      if (absl::IsFailedPrecondition(s)) public_copies_.erase(peer);
      ++failed_pushes_;
      LogEvent(LogLevel::kInfo, "exchange",
               absl::StrCat("push failed, trying another peer: ", s.message()),
               {{"peer", peer}});
      continue;
    }
    ++pushes_;
    ++exchanges_;
    if (lossy_) {
      public_copies_[peer] = PublicCopy{sequence, std::move(share->sent)};
    }
    raw_bytes_ += run_.n_params * static_cast<int64_t>(sizeof(float));
    wire_bytes_ += static_cast<int64_t>(share->payload.size());
    session_.events().Write(
        "exchange",
        JsonObject()
            .Add("kind", "push")
            .Add("peer", peer)
            .Add("step", static_cast<int64_t>(trainer_.state().step()))
            .Add("weight", push_sum_.weight())
            .Add("bytes", session_.BytesSent() - sent_before)
            .Add("relative_to", share->base_sequence)
            .Add("train_loss", train_loss));
    break;
  }
  return absl::OkStatus();
}

absl::Status GossipLoop::EndPeriod(int prev_step, double train_loss) {
  const int step = trainer_.state().step();
  STARLING_RETURN_IF_ERROR(session_.MaybeEvaluate(step == total_, prev_step));
  if (const int every = config_.gossip.snapshot_every;
      every > 0 && (step / every > prev_step / every || step == total_)) {
    if (absl::Status s = WriteSnapshot(run_.out(), step, y_); !s.ok()) {
      LogEvent(LogLevel::kWarning, "snapshot", std::string(s.message()));
    }
  }
  LogEvent(
      LogLevel::kInfo, "gossip",
      absl::StrFormat("%s step %d/%d | loss %.4f | w %.4f | pushes %d "
                      "absorbed %d | sent %s | eta %s",
                      config_.net.node_id, step, total_, train_loss,
                      push_sum_.weight(), pushes_, absorbs_,
                      FormatBytes(static_cast<double>(session_.BytesSent())),
                      session_.Eta(step)));
  run_.state.gossip_weight = push_sum_.weight();
  session_.SetCompressionTraffic(raw_bytes_, wire_bytes_);
  if (session_.CheckpointDue(prev_step, step)) {
    session_.PeriodicCheckpoint(0);
  }
  return absl::OkStatus();
}

int GossipLoop::End(bool left) {
  session_.LogMemberChanges();
  run_.ops.SetReady(false);
  // Goodbye first, so that nobody pushes to this node any more.
  swarm_->Leave();
  run_.state.gossip_weight = push_sum_.weight();
  const int step = trainer_.state().step();
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
  end.world = max_world_;
  end.totals.compression = run_.codecs.params->Name();
  if (lossy_) end.totals.compression += " + error feedback (gossip)";
  end.totals.bytes_before_compression = raw_bytes_;
  end.totals.bytes_after_compression = wire_bytes_;
  end.end_fields.Add("exchanges", exchanges_);
  end.summary.Add("algo", "gossip")
      .Add("world", static_cast<int64_t>(max_world_))
      .Add("inner_steps_per_round", static_cast<int64_t>(config_.inner_steps))
      .Add("exchanges", exchanges_)
      .Add("pushes", pushes_)
      .Add("absorbs", absorbs_)
      .Add("failed_pushes", failed_pushes_)
      .Add("pushes_refused", swarm_->pushes_refused())
      .Add("push_sum_weight", push_sum_.weight());
  end.done = absl::StrFormat(", %d exchanges (%d pushes, %d absorbed)",
                             exchanges_, pushes_, absorbs_);
  end.stopped_by = absl::StrCat(config_.net.node_id, " left the swarm on");
  end.shutdown = [this] { swarm_->Shutdown(); };
  return session_.Finish(std::move(end));
}

}  // namespace starling
