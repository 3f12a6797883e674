// One push-sum gossip period (--algo=gossip) after a member's inner steps:
// absorb the pushes received since the last period (gossip/push_sum.h),
// apply the optional SlowMo-style outer momentum, forget the public copies
// of members that left or died, then push (y, w/2) to one live peer
// (--gossip_peers), trying another when a push fails. The node's loop
// (gossip_loop.h) and the Python module's driver (embedded_gossip.h) both
// run their periods through it, so a Python member and `starling node`
// members gossip alike in one swarm.
// Thread-safety: thread-compatible; one thread (the one that trains) calls
// it, and no one else touches the model while Run runs.
#ifndef STARLING_NODE_GOSSIP_PERIOD_H_
#define STARLING_NODE_GOSSIP_PERIOD_H_

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gossip/push_sum.h"
#include "gossip/swarm.h"
#include "node/metrics.h"
#include "node/node_run.h"
#include "node/run_output.h"

namespace starling {

struct GossipPeriodOptions {
  std::string self;                  // this node's id
  std::string peer_mode = "random";  // random | exponential
  absl::Duration push_timeout = absl::Seconds(5);
  double momentum = 0;           // SlowMo β (0: off)
  double outer_lr = 1;           // SlowMo α (1: plain gossip)
  const Codec* codec = nullptr;  // a lossy push codec, or null (fp32)
  int64_t n_params = 0;
  uint64_t seed = 0;  // the peer choice's random generator
  // Where the "exchange" events go (absorb, push); null: nowhere.
  EventLog* events = nullptr;
  NodeMetrics* metrics = nullptr;  // the consensus distance; null: none
  Watchdog* watchdog = nullptr;    // armed for each push; null: none
};

// The node's options for its gossip: --gossip_peers, --gossip_timeout,
// --gossip_momentum, --gossip_outer_lr, the push codec (lossy only) and the
// peer choice's seed (node id and --seed). Sinks left null.
GossipPeriodOptions GossipPeriodOptionsOf(const NodeConfig& config,
                                          const NodeCodecs& codecs,
                                          int64_t n_params);

// The elastic swarm's options (elastic_swarm.h) plus the gossip's: the
// pushes' element count, codec (lossy only) and timeout, and the codec's
// name in the handshake's identity.
SwarmOptions GossipSwarmOptions(SwarmOptions so, const NodeConfig& config,
                                const NodeCodecs& codecs, int64_t n_params);

// InvalidArgument unless --gossip_peers is random or exponential.
absl::Status CheckGossipPeers(const std::string& mode);

// What the periods did so far, for the summaries and the metrics.
struct GossipCounters {
  int64_t exchanges = 0, pushes = 0, absorbs = 0, failed_pushes = 0;
  int64_t raw_bytes = 0, wire_bytes = 0;  // of the pushes' payloads
  int max_world = 1;  // the most members seen alive, this one included
};

class GossipPeriod {
 public:
  explicit GossipPeriod(GossipPeriodOptions options);
  GossipPeriod(const GossipPeriod&) = delete;
  GossipPeriod& operator=(const GossipPeriod&) = delete;

  // The model the first period starts from (SlowMo's first anchor) and the
  // push-sum weight (> 0: a resumed node's; else 1).
  void Start(std::vector<float> y, double weight);
  // SlowMo's momentum u (empty when SlowMo is off), for a checkpoint; the
  // anchor x0 is y() after a period, so u is all a resume needs besides y
  // and the weight.
  const std::vector<float>& momentum() const { return u_; }
  // Whether SlowMo is on (--gossip_momentum > 0 or --gossip_outer_lr != 1).
  bool slowmo() const { return momentum_; }
  // After Start: a checkpoint's u. InvalidArgument for a size other than
  // the model's; nothing to do when SlowMo is off.
  absl::Status RestoreMomentum(std::vector<float> u);

  // One period after the inner steps, `trained` the model they left (`step`
  // and `train_loss` go into the events). y() is then the model to train
  // on. Fails only for this node's own reasons: a share it cannot make, or
  // an emulated link too slow for any push (link_failed()); y() and the
  // weight are then as before the failed push, and the caller leaves.
  absl::Status Run(Swarm& swarm, std::vector<float> trained, int64_t step,
                   double train_loss);

  const std::vector<float>& y() const { return y_; }
  double weight() const { return push_sum_.weight(); }
  const GossipCounters& counters() const { return counters_; }
  bool link_failed() const { return link_failed_; }
  // The peer the last period pushed to ("" if none took it).
  const std::string& last_peer() const { return last_peer_; }

 private:
  void AbsorbInbox(Swarm& swarm, int64_t step);
  void ApplyMomentum();
  void ForgetDeparted(const Swarm& swarm);
  // Peers to try for one push, best first (at most three).
  std::vector<std::string> Candidates(const Swarm& swarm);
  absl::Status PushToOnePeer(Swarm& swarm, int64_t step, double train_loss);
  void Event(const char* event, const JsonObject& fields);

  const GossipPeriodOptions options_;
  const bool lossy_;     // pushes carry the difference to a public copy
  const bool momentum_;  // SlowMo on
  PushSum push_sum_;
  std::vector<float> y_;       // the model, as push-sum sees it
  std::vector<float> x0_, u_;  // SlowMo's anchor and momentum
  std::mt19937_64 rng_;
  // What each peer holds of this node's last push to it (lossy pushes).
  std::map<std::string, PublicCopy> public_copies_;
  GossipCounters counters_;
  int exp_step_ = 0;  // exponential graph: the next offset's exponent
  bool link_failed_ = false;
  std::string last_peer_;
};

}  // namespace starling

#endif  // STARLING_NODE_GOSSIP_PERIOD_H_
