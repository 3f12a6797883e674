// Asynchronous push-sum gossip (SGP) on one node (--algo=gossip), over a
// Swarm's membership: no rounds, no barrier, no quorum. In each period a
// node runs --inner_steps local steps, absorbs the pushes it received
// (gossip/push_sum.h), applies the optional SlowMo-style outer momentum,
// then pushes (y, w/2) to one live peer (--gossip_peers), trying another
// when a push fails; a slow or dead peer never blocks anyone. Every member
// evaluates. Thread-safety: the loop runs on the training thread.
#ifndef STARLING_NODE_GOSSIP_LOOP_H_
#define STARLING_NODE_GOSSIP_LOOP_H_

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gossip/push_sum.h"
#include "gossip/swarm.h"
#include "node/node_run.h"
#include "node/node_session.h"

namespace starling {

// Runs `run` with push-sum gossip: the process exit code (node_session.h).
int RunGossip(NodeRun& run);

class GossipLoop {
 public:
  explicit GossipLoop(NodeRun& run);
  GossipLoop(const GossipLoop&) = delete;
  GossipLoop& operator=(const GossipLoop&) = delete;

  int Run();

 private:
  // Starts and joins the swarm; the "start" event.
  absl::Status Start();
  // Periods until the run is done or this node leaves on a signal (true).
  absl::StatusOr<bool> Train();
  // Up to `steps` inner steps (fewer after a second signal): their loss sum.
  absl::StatusOr<double> RunInnerSteps(int steps);
  // Averages in the pushes received since the last period.
  void AbsorbInbox();
  // SlowMo: u ← βu + (x0 − y), y ← x0 − αu (off when β = 0 and α = 1).
  void ApplyMomentum();
  // Drops the public copies of members that left or died.
  void ForgetDeparted();
  // Peers to try for one push, best first (at most three).
  std::vector<std::string> Candidates();
  // Pushes to the first candidate that takes it. Fails (after a goodbye)
  // only for this node's own reasons: a share it cannot make, or an
  // emulated link too slow for any push.
  absl::Status PushToOnePeer(double train_loss);
  // After a period: evaluation, snapshot, log line, checkpoint.
  absl::Status EndPeriod(int prev_step, double train_loss);
  int End(bool left);

  // Constant after construction.
  NodeRun& run_;
  Trainer& trainer_;
  const NodeConfig& config_;
  const int total_;
  const bool lossy_;     // pushes carry the difference to a public copy
  const Codec* codec_;   // the push codec when lossy_, else null
  const bool momentum_;  // SlowMo on

  NodeSession session_;
  Swarm* swarm_ = nullptr;  // the session's
  PushSum push_sum_;
  std::vector<float> y_;       // the model, as push-sum sees it
  std::vector<float> x0_, u_;  // SlowMo's anchor and momentum
  std::mt19937_64 rng_;
  // What each peer holds of this node's last push to it (lossy pushes).
  std::map<std::string, PublicCopy> public_copies_;
  int64_t exchanges_ = 0, pushes_ = 0, absorbs_ = 0, failed_pushes_ = 0;
  int64_t raw_bytes_ = 0, wire_bytes_ = 0;
  int exp_step_ = 0;   // exponential graph: the next offset's exponent
  int max_world_ = 1;  // the most members seen alive, for the summary
};

}  // namespace starling

#endif  // STARLING_NODE_GOSSIP_LOOP_H_
