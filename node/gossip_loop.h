// Asynchronous push-sum gossip (SGP) on one node (--algo=gossip), over a
// Swarm's membership: no rounds, no barrier, no quorum. In each period a
// node runs --inner_steps local steps, then one gossip period
// (node/gossip_period.h): absorbs the pushes it received, applies the
// optional SlowMo-style outer momentum, then pushes (y, w/2) to one live
// peer (--gossip_peers), trying another when a push fails; a slow or dead
// peer never blocks anyone. Every member evaluates. Thread-safety: the loop
// runs on the training thread.
#ifndef STARLING_NODE_GOSSIP_LOOP_H_
#define STARLING_NODE_GOSSIP_LOOP_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gossip/swarm.h"
#include "node/gossip_period.h"
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
  // After a failed period: a checkpoint when the link failed (the model,
  // weight and what it absorbed first, as a node leaving on a signal keeps:
  // the senders gave that mass away), an "error" event, a goodbye.
  absl::Status FailPeriod(absl::Status s);
  // After a period: evaluation, snapshot, log line, checkpoint.
  absl::Status EndPeriod(int prev_step, double train_loss);
  // Puts what a checkpoint needs of the period (weight, SlowMo's momentum)
  // in run_.state.
  void KeepForCheckpoint();
  int End(bool left);

  // Constant after construction.
  NodeRun& run_;
  Trainer& trainer_;
  const NodeConfig& config_;
  const int total_;
  const bool lossy_;  // pushes carry the difference to a public copy

  NodeSession session_;
  Swarm* swarm_ = nullptr;  // the session's
  GossipPeriod period_;
};

}  // namespace starling

#endif  // STARLING_NODE_GOSSIP_LOOP_H_
