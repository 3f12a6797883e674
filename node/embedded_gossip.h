// Push-sum gossip (--algo=gossip) driven by a training loop outside
// Starling: the Python module (python/starling_module.cc) hands over a
// PyTorch model's tensors and calls Period() after every H inner steps that
// its own optimizer ran. What a period does is the node's own
// (node/gossip_period.h, as node/gossip_loop.h runs it): absorb the pushes
// received, the optional SlowMo momentum (--gossip_momentum,
// --gossip_outer_lr), push (y, w/2) to one live peer (--gossip_peers,
// --gossip_timeout, the push codec of --compression), then the model is
// written back into the caller's parameters. The swarm is the node's
// (elastic_swarm.h) with the same fingerprint as EmbeddedDiloco's
// (embedded_diloco.h), so Python members and `starling node --algo=gossip`
// members of one model gossip in one swarm.
//
// As in the node, only the parameters are gossiped: the buffers (BatchNorm
// statistics) stay each member's own. Health and metrics are the node's
// (node_ops.h): readiness SERVING once joined, liveness from the watchdog
// that InnerStep feeds and each push arms.
//
// Checkpoints are the node's (--out, --checkpoint_every, --resume,
// --resume_if_exists, the run directory's rules as EmbeddedDiloco's):
// OUT/checkpoint.ckpt in core/checkpoint.h's format with the node's
// sections for the model (architecture, tensor_signature, model_tensors
// holding y after the last period and this member's buffers) and its
// gossip_weight (the push-sum weight, as `starling node --algo=gossip`
// writes it), plus step, periods, model_hash (FlatHash of y, checked on
// resume), gossip_momentum (SlowMo's u, with SlowMo on; its anchor is y)
// and user_state (the caller's bytes: the inner optimizer's state_dict).
// A resumed member starts from the saved y, weight, u, period and step.
// The lossy pushes' public copies are not saved: a resumed member's first
// push to each peer is absolute, as after any copy is lost. Restore
// refuses a node's checkpoint and a DiLoCo member's (and EmbeddedDiloco a
// Gossip member's).
//
// Left to the caller (the node's loop does them; this driver does not):
// the inner steps, their data and schedule; evaluation; snapshots.
// Not available (refused at Start): --snapshot_every.
//
// Thread-safety: one thread calls Start, Period and Leave (the Python
// module calls them without the GIL). The model's tensors must not change
// while Period runs.
#ifndef STARLING_NODE_EMBEDDED_GOSSIP_H_
#define STARLING_NODE_EMBEDDED_GOSSIP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gossip/swarm.h"
#include "node/embedded_diloco.h"
#include "node/gossip_period.h"
#include "node/node_ops.h"
#include "node/node_run.h"

namespace starling {

// What one call of Period did.
struct EmbeddedPeriod {
  int64_t period = 0;      // periods done, this one included
  std::string peer;        // whom it pushed to; "" when no peer took it
  int64_t absorbed = 0;    // pushes absorbed in it
  double weight = 0;       // the push-sum weight after it
  int members = 0;         // live members as this one sees them, itself too
  std::string model_hash;  // of the parameters now (FlatHash)
  double seconds = 0;      // of the whole call
  int64_t wire_bytes = 0;  // the push's payload
  // The period crossed a --checkpoint_every boundary of steps (with
  // --out): the caller should call Checkpoint now.
  bool checkpoint_due = false;
};

class EmbeddedGossip {
 public:
  // Checks the model and the flags (`config` from NodeConfigFromFlags,
  // --algo=gossip), builds the push codec, starts the swarm, joins it
  // through config.net.peers within --connect_timeout and waits for
  // --min_members. InvalidArgument naming the flag or the tensor for bad
  // settings; FailedPrecondition for a refused handshake (naming what
  // differs); Unavailable / DeadlineExceeded when nobody answered.
  static absl::StatusOr<std::unique_ptr<EmbeddedGossip>> Start(
      NodeConfig config, EmbeddedModel model, NodeOps ops = NodeOps());
  // Leaves, if Leave was not called.
  ~EmbeddedGossip();
  EmbeddedGossip(const EmbeddedGossip&) = delete;
  EmbeddedGossip& operator=(const EmbeddedGossip&) = delete;

  // One gossip period after `steps` inner steps whose mean loss was
  // `train_loss` (NaN: unknown): the parameters are read, gossiped, and
  // written back. A failure is this node's own (a share it cannot make, an
  // emulated link too slow for any push): it has then left the swarm.
  absl::StatusOr<EmbeddedPeriod> Period(int steps, double train_loss);

  // Writes OUT/checkpoint.ckpt (atomically) for the last period, with
  // `user_state`. FailedPrecondition without --out.
  absl::Status Checkpoint(const std::string& user_state);
  // Whether there is an --out to checkpoint into.
  bool checkpoints() const { return !config_.train.out().empty(); }
  // The user_state of the checkpoint this member resumed from ("" if none).
  const std::string& resumed_user_state() const { return user_state_; }
  bool resumed() const { return config_.train.resume(); }

  // One inner step of the caller's loop done: the watchdog and the step
  // metrics.
  void InnerStep(const StepResult& step) { RecordInnerStep(ops_, step); }
  std::string health_address() const {
    return ops_.health ? ops_.health->address() : "";
  }
  std::string metrics_address() const {
    return ops_.metrics ? ops_.metrics->address() : "";
  }

  // Says goodbye and stops the swarm. Idempotent.
  void Leave();

  const std::string& address() const { return address_; }
  std::vector<peer::v1::MemberEntry> Members() const {
    return swarm_ ? swarm_->Members() : std::vector<peer::v1::MemberEntry>();
  }
  int64_t periods() const { return periods_; }
  int64_t step() const { return step_; }
  double weight() const { return period_->weight(); }
  const GossipCounters& counters() const { return period_->counters(); }
  const std::string& architecture() const { return architecture_; }
  int64_t n_params() const { return n_params_; }
  // The parameters' hash as the node's start event gives it (FlatHash).
  std::string model_hash() const;

 private:
  EmbeddedGossip(NodeConfig config, EmbeddedModel model, NodeOps ops);
  absl::Status Init();
  // --resume: the checkpoint in --out into the model and the period.
  absl::Status Restore();

  const NodeConfig config_;
  EmbeddedModel model_;
  int64_t n_params_ = 0;
  std::string architecture_;
  NodeCodecs codecs_;
  std::unique_ptr<GossipPeriod> period_;
  int64_t periods_ = 0;
  int64_t step_ = 0;  // the caller's inner steps so far
  std::string user_state_;
  std::string address_;
  // Before swarm_: its servers read the watchdog, which outlives them.
  NodeOps ops_;
  bool left_ = false;
  // Last: stopped first.
  std::unique_ptr<Swarm> swarm_;
};

}  // namespace starling

#endif  // STARLING_NODE_EMBEDDED_GOSSIP_H_
