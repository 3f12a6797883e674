#include "node/gossip_period.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "gossip/crash_point.h"

namespace starling {

GossipPeriodOptions GossipPeriodOptionsOf(const NodeConfig& config,
                                          const NodeCodecs& codecs,
                                          int64_t n_params) {
  GossipPeriodOptions o;
  o.self = config.net.node_id;
  o.peer_mode = config.gossip.peer_mode;
  o.push_timeout = config.gossip.push_timeout;
  o.momentum = config.gossip.momentum;
  o.outer_lr = config.gossip.outer_lr;
  o.codec = codecs.params->lossless() ? nullptr : codecs.params.get();
  o.n_params = n_params;
  o.seed = std::hash<std::string>()(config.net.node_id) ^
           static_cast<uint64_t>(config.train.seed());
  return o;
}

SwarmOptions GossipSwarmOptions(SwarmOptions so, const NodeConfig& config,
                                const NodeCodecs& codecs, int64_t n_params) {
  so.identity.compression = codecs.params->Name();
  so.push_elements = n_params;
  so.push_codec = codecs.params->lossless() ? nullptr : codecs.params.get();
  so.push_timeout = config.gossip.push_timeout;
  return so;
}

absl::Status CheckGossipPeers(const std::string& mode) {
  if (mode == "random" || mode == "exponential") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--gossip_peers=", mode, ": expected random or exponential"));
}

GossipPeriod::GossipPeriod(GossipPeriodOptions options)
    : options_(std::move(options)),
      lossy_(options_.codec != nullptr),
      momentum_(options_.momentum > 0 || options_.outer_lr != 1),
      push_sum_(1.0),
      rng_(options_.seed) {}

void GossipPeriod::Start(std::vector<float> y, double weight) {
  if (weight > 0) push_sum_.set_weight(weight);
  y_ = std::move(y);
  // SlowMo's anchor x0 is the model after the previous gossip.
  if (momentum_) {
    x0_ = y_;
    u_.assign(y_.size(), 0.0f);
  }
}

absl::Status GossipPeriod::RestoreMomentum(std::vector<float> u) {
  if (!momentum_) return absl::OkStatus();
  if (u.size() != y_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SlowMo momentum of ", u.size(), " values for a model of ",
                     y_.size(), " parameters"));
  }
  u_ = std::move(u);
  return absl::OkStatus();
}

absl::Status GossipPeriod::Run(Swarm& swarm, std::vector<float> trained,
                               int64_t step, double train_loss) {
  y_ = std::move(trained);
  last_peer_.clear();
  AbsorbInbox(swarm, step);
  ApplyMomentum();
  ForgetDeparted(swarm);
  if (absl::Status s = PushToOnePeer(swarm, step, train_loss); !s.ok()) {
    return s;
  }
  if (momentum_) x0_ = y_;
  return absl::OkStatus();
}

void GossipPeriod::Event(const char* event, const JsonObject& fields) {
  if (options_.events != nullptr) options_.events->Write(event, fields);
}

void GossipPeriod::AbsorbInbox(Swarm& swarm, int64_t step) {
  for (ReceivedPush& p : swarm.TakePushes()) {
    absl::StatusOr<double> d2 =
        push_sum_.Absorb(absl::MakeSpan(y_), p.values, p.weight);
    if (!d2.ok()) {
      LogEvent(LogLevel::kWarning, "exchange",
               absl::StrCat("dropped a push from ", p.from, ": ",
                            d2.status().message()));
      continue;
    }
    ++counters_.exchanges;
    ++counters_.absorbs;
    if (options_.metrics) options_.metrics->SetConsensusDistance(*d2);
    Event("exchange", JsonObject()
                          .Add("kind", "absorb")
                          .Add("peer", p.from)
                          .Add("step", step)
                          .Add("weight", push_sum_.weight())
                          .Add("bytes", p.wire_bytes)
                          .Add("distance2", *d2));
  }
}

void GossipPeriod::ApplyMomentum() {
  // SlowMo: u ← βu + (x0 − y), y ← x0 − αu (off when β = 0 and α = 1).
  if (!momentum_) return;
  const double beta = options_.momentum;
  const double alpha = options_.outer_lr;
  for (size_t i = 0; i < y_.size(); ++i) {
    u_[i] = static_cast<float>(beta * u_[i] + (x0_[i] - y_[i]));
    y_[i] = static_cast<float>(x0_[i] - alpha * u_[i]);
  }
}

void GossipPeriod::ForgetDeparted(const Swarm& swarm) {
  // Copies for peers that left or died would grow with churn; one that
  // comes back is pushed to in full.
  if (!lossy_) return;
  for (const peer::v1::MemberEntry& e : swarm.Members()) {
    if (e.state() == peer::v1::MEMBER_DEAD ||
        e.state() == peer::v1::MEMBER_LEFT) {
      public_copies_.erase(e.id());
    }
  }
}

std::vector<std::string> GossipPeriod::Candidates(const Swarm& swarm) {
  // The exponential graph's next neighbour (offsets 2^0, 2^1, ... over the
  // sorted live ids, cycling) first, or a random order.
  std::vector<std::string> peers = swarm.AlivePeers();
  counters_.max_world =
      std::max(counters_.max_world, static_cast<int>(peers.size()) + 1);
  std::shuffle(peers.begin(), peers.end(), rng_);
  const std::string& self = options_.self;
  if (options_.peer_mode == "exponential" && !peers.empty()) {
    std::vector<std::string> ids = swarm.AlivePeers();
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

absl::Status GossipPeriod::PushToOnePeer(Swarm& swarm, int64_t step,
                                         double train_loss) {
  const absl::Duration timeout = options_.push_timeout;
  for (const std::string& peer : Candidates(swarm)) {
    // With a lossy codec, push y minus the copy `peer` holds of this node's
    // last push to it (its first push to a peer is absolute).
    absl::StatusOr<PushShare> share =
        push_sum_.Share(absl::MakeSpan(y_), options_.codec,
                        lossy_ ? &public_copies_[peer] : nullptr);
    if (!share.ok()) return share.status();
    SetCrashRound(counters_.pushes + 1);
    if (options_.watchdog) options_.watchdog->Waiting(timeout);
    const int64_t sent_before = swarm.bytes_sent();
    int64_t sequence = 0;
    absl::Status s = swarm.Push(peer, *share, timeout, &sequence);
    if (!s.ok()) {
      push_sum_.Restore(*share, absl::MakeSpan(y_));
      if (!swarm.LinkError().ok()) {
        // An emulated link too slow for any push: retrying cannot help.
        link_failed_ = true;
        return s;
      }
      // The peer lacks the copy this share was relative to (it restarted,
      // or took a push this node saw fail): the next push is absolute.
      if (absl::IsFailedPrecondition(s)) public_copies_.erase(peer);
      ++counters_.failed_pushes;
      LogEvent(LogLevel::kInfo, "exchange",
               absl::StrCat("push failed, trying another peer: ", s.message()),
               {{"peer", peer}});
      continue;
    }
    ++counters_.pushes;
    ++counters_.exchanges;
    last_peer_ = peer;
    if (lossy_) {
      public_copies_[peer] = PublicCopy{sequence, std::move(share->sent)};
    }
    counters_.raw_bytes +=
        options_.n_params * static_cast<int64_t>(sizeof(float));
    counters_.wire_bytes += static_cast<int64_t>(share->payload.size());
    Event("exchange", JsonObject()
                          .Add("kind", "push")
                          .Add("peer", peer)
                          .Add("step", step)
                          .Add("weight", push_sum_.weight())
                          .Add("bytes", swarm.bytes_sent() - sent_before)
                          .Add("relative_to", share->base_sequence)
                          .Add("train_loss", train_loss));
    break;
  }
  return absl::OkStatus();
}

}  // namespace starling
