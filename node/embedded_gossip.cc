#include "node/embedded_gossip.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/flat_params.h"
#include "core/status.h"
#include "node/elastic_swarm.h"
#include "node/node_command.h"

namespace starling {

EmbeddedGossip::EmbeddedGossip(NodeConfig config, EmbeddedModel model,
                               NodeOps ops)
    : config_(std::move(config)),
      model_(std::move(model)),
      ops_(std::move(ops)) {}

EmbeddedGossip::~EmbeddedGossip() { Leave(); }

absl::StatusOr<std::unique_ptr<EmbeddedGossip>> EmbeddedGossip::Start(
    NodeConfig config, EmbeddedModel model, NodeOps ops) {
  STARLING_RETURN_IF_ERROR(CheckEmbeddedModel(model));
  if (config.algo != "gossip") {
    return absl::InvalidArgumentError(
        absl::StrCat("--algo=", config.algo, ": Gossip needs --algo=gossip"));
  }
  if (config.gossip.snapshot_every > 0) {
    return absl::InvalidArgumentError(
        "--snapshot_every: not available from starling.Gossip (the model "
        "is the caller's to save)");
  }
  STARLING_RETURN_IF_ERROR(CheckGossipPeers(config.gossip.peer_mode));
  // EmbeddedDiloco's run directory rules (embedded_diloco.cc).
  if (!config.train.out().empty() || config.train.resume()) {
    STARLING_RETURN_IF_ERROR(PrepareRunDir(&config.train, "python"));
  }
  auto g = std::unique_ptr<EmbeddedGossip>(
      new EmbeddedGossip(std::move(config), std::move(model), std::move(ops)));
  STARLING_RETURN_IF_ERROR(g->Init());
  return g;
}

absl::Status EmbeddedGossip::Init() {
  n_params_ = NumElements(model_.params);
  STARLING_ASSIGN_OR_RETURN(
      codecs_, MakeCodecs(config_, model_.params, NumElements(model_.buffers)));
  architecture_ = EmbeddedArchitecture(model_);
  const std::vector<float> y = Flatten(model_.params);
  const peer::v1::ModelFingerprint fingerprint =
      EmbeddedFingerprint(model_, FlatHash(y, Flatten(model_.buffers)));
  GossipPeriodOptions po = GossipPeriodOptionsOf(config_, codecs_, n_params_);
  po.metrics = ops_.metrics.get();
  po.watchdog = ops_.watchdog.get();
  period_ = std::make_unique<GossipPeriod>(std::move(po));
  period_->Start(y, /*weight=*/1.0);
  // After the fingerprint, which names the model every member starts from.
  if (config_.train.resume()) STARLING_RETURN_IF_ERROR(Restore());
  STARLING_ASSIGN_OR_RETURN(
      SwarmOptions so, ElasticSwarmOptions(config_.net, "gossip", fingerprint));
  so = GossipSwarmOptions(std::move(so), config_, codecs_, n_params_);
  STARLING_ASSIGN_OR_RETURN(swarm_, StartSwarm(so));
  address_ = swarm_->address();
  STARLING_RETURN_IF_ERROR(
      swarm_->JoinSwarm(absl::Now() + config_.net.connect_timeout));
  // Counted towards --min_members only once joined, as the node (see
  // GossipLoop::Start).
  swarm_->SetProgress({}, /*joining=*/false);
  STARLING_RETURN_IF_ERROR(swarm_->WaitForMembers(
      config_.net.min_members, absl::Now() + config_.net.connect_timeout));
  RefreshEmbeddedMetrics(ops_.metrics.get(), *swarm_, config_.net.node_id,
                         RingStats());
  ops_.SetReady(true);
  return absl::OkStatus();
}

absl::StatusOr<EmbeddedPeriod> EmbeddedGossip::Period(int steps,
                                                      double train_loss) {
  if (left_) return absl::FailedPreconditionError("this member has left");
  const absl::Time start = absl::Now();
  const int64_t prev_step = step_;
  step_ += std::max(0, steps);
  const GossipCounters before = period_->counters();
  if (absl::Status s =
          period_->Run(*swarm_, Flatten(model_.params), step_, train_loss);
      !s.ok()) {
    // As the node: its push-sum mass is its own to keep, and it leaves.
    (void)Unflatten(period_->y(), model_.params);
    Leave();
    return s;
  }
  STARLING_RETURN_IF_ERROR(Unflatten(period_->y(), model_.params));
  ++periods_;
  const GossipCounters& now = period_->counters();
  RingStats compressed;
  compressed.raw_bytes = now.raw_bytes;
  compressed.wire_bytes = now.wire_bytes;
  RefreshEmbeddedMetrics(ops_.metrics.get(), *swarm_, config_.net.node_id,
                         compressed);
  EmbeddedPeriod out;
  out.period = periods_;
  out.peer = period_->last_peer();
  out.absorbed = now.absorbs - before.absorbs;
  out.weight = period_->weight();
  out.members = static_cast<int>(swarm_->AlivePeers().size()) + 1;
  out.model_hash = FlatHash(period_->y());
  out.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  out.wire_bytes = now.wire_bytes - before.wire_bytes;
  const int every = config_.train.checkpoint_every();
  out.checkpoint_due =
      checkpoints() && every > 0 && step_ / every > prev_step / every;
  return out;
}

std::string EmbeddedGossip::model_hash() const {
  return FlatHash(period_->y());
}

void EmbeddedGossip::Leave() {
  if (left_ || swarm_ == nullptr) return;
  left_ = true;
  ops_.SetReady(false);
  swarm_->Leave();
  swarm_->Shutdown();
}

}  // namespace starling
