// DiLoCo rounds driven by a training loop outside Starling: the Python
// module (python/starling_module.cc) hands over a PyTorch model's tensors
// and calls Round() after every H inner steps that its own optimizer ran.
// What a round does is the node's own: the swarm (gossip/swarm.h) with the
// options of `starling node`'s flags (elastic_swarm.h), the round unit
// (outer_opt/diloco_round.h: Δ against θ_global, error feedback, the outer
// Nesterov step, the buffers' mean) and its exchange (round_exchange.h:
// Swarm::SyncRound and the ring all-reduce). Members that commit a round
// hold bit-identical θ_global whichever loop drives them, so a Python
// member and `starling node` members with the same fingerprint share a run.
//
// Checkpoints are the node's (--out, --checkpoint_every, --resume,
// --resume_if_exists): OUT/checkpoint.ckpt in core/checkpoint.h's format,
// with the node's sections for what a DiLoCo member shares (architecture,
// tensor_signature, model_tensors holding θ_global and the buffers, round,
// member_rounds, outer, error_feedback) and, since no Trainer runs here,
// step, lineage, buffers_global (the buffers' exact mean) and user_state
// (the caller's bytes: the Python module keeps the inner optimizer's
// state_dict there) instead of the trainer's. A resumed member starts from
// the checkpoint's round and θ_global, then catches up if the swarm is
// ahead. `starling node --resume` and `starling export` refuse such a file
// (it has no trainer_state section), and Restore refuses a node's and a
// Gossip member's (embedded_checkpoint.h).
//
// Health and metrics are the node's too (node_ops.h, from --health_port,
// --metrics_port and --watchdog_*): readiness is SERVING once joined and
// not catching up; liveness follows the watchdog, which InnerStep feeds and
// a round's exchange arms; the metrics count the caller's inner steps
// (InnerStep) and the rounds, traffic and peers as the node's do.
//
// Left to the caller (the node's loop does them; this driver does not):
// the inner steps, their learning-rate schedule and data; --overlap,
// adaptive sync; the residual flush after
// the last round (with error feedback the members' residuals stay theirs);
// staying on to serve members that are behind after this one leaves.
//
// Model identity in the handshake: `architecture` when given (a PyTorch
// twin of a built-in model names the node's, e.g. "gpt(layers=2,...)"),
// else "python(DIGEST)", 16 hex digits of a hash of the tensors' names,
// shapes and dtypes (core/model.h's SignatureLines); with them the
// parameter count, the initial model hash and the signature lines.
//
// Thread-safety: one thread calls Start, Round and Leave (the Python
// module calls them without the GIL); Abandon may be called from any
// thread. The model's tensors must not change while Round runs.
#ifndef STARLING_NODE_EMBEDDED_DILOCO_H_
#define STARLING_NODE_EMBEDDED_DILOCO_H_

#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gossip/swarm.h"
#include "node/node_ops.h"
#include "node/node_run.h"
#include "node/round_exchange.h"
#include "node/swarm_metrics.h"
#include "outer_opt/diloco_round.h"

namespace starling {

// The caller's model: its tensors are read and written in place.
struct EmbeddedModel {
  std::vector<std::string> param_names;
  std::vector<torch::Tensor> params;  // float32, contiguous, on the CPU
  std::vector<std::string> buffer_names;
  std::vector<torch::Tensor> buffers;  // floating or integer, on the CPU
  std::string architecture;            // "": python(DIGEST)
};

// The model's handshake identity, as above.
std::string EmbeddedArchitecture(const EmbeddedModel& model);
// The handshake's fingerprint of `model`, which starts from `init_hash`
// (FlatHash of its parameters and buffers): the name above, the parameter
// count, the hash and the signature lines, as a node fingerprints its own.
peer::v1::ModelFingerprint EmbeddedFingerprint(const EmbeddedModel& model,
                                               const std::string& init_hash);
// The swarm averages fp32 tensors held on the host: InvalidArgument naming
// the tensor for anything else, before the swarm starts.
absl::Status CheckEmbeddedModel(const EmbeddedModel& model);
// The traffic (with `compressed`: the payloads before and after their
// codec) and the swarm's side of the metrics, now; nothing without metrics.
void RefreshEmbeddedMetrics(NodeMetrics* metrics, const Swarm& swarm,
                            const std::string& node_id,
                            const RingStats& compressed);

// What one call of Round did.
struct EmbeddedRound {
  // "committed": the outer step was applied; "caught_up": the swarm was
  // ahead, so this node's steps were dropped and it adopted the swarm's
  // state; "stopped": the round was abandoned (Abandon); "stale": the
  // swarm committed the round without this node and no member could hand
  // its state over yet (the next Round catches up).
  std::string outcome;
  int64_t round = 0;  // the next round after it
  int members = 0;    // of the committed round
  std::string model_hash;
  double seconds = 0;  // of the whole call
  int64_t wire_bytes = 0;
  // The committed round crossed a --checkpoint_every boundary of steps
  // (with --out): the caller should call Checkpoint now.
  bool checkpoint_due = false;
};

class EmbeddedDiloco {
 public:
  // Checks the model, builds the codecs and the outer optimizer from
  // `config` (NodeConfigFromFlags), starts the swarm, joins it through
  // config.net.peers within --connect_timeout and waits for
  // --min_members. InvalidArgument naming the flag or the tensor for bad
  // settings; FailedPrecondition for a refused handshake (naming what
  // differs); Unavailable / DeadlineExceeded when nobody answered. `ops`:
  // the health and metrics servers StartOps started (none: both off).
  static absl::StatusOr<std::unique_ptr<EmbeddedDiloco>> Start(
      NodeConfig config, EmbeddedModel model, NodeOps ops = NodeOps());
  // Leaves, if Leave was not called.
  ~EmbeddedDiloco();
  EmbeddedDiloco(const EmbeddedDiloco&) = delete;
  EmbeddedDiloco& operator=(const EmbeddedDiloco&) = delete;

  // One round after `steps` inner steps over `samples` examples: Δ from
  // where the model started, the exchange, and, on commit, the node's own
  // model (θ_global, less the residual with error feedback in the model)
  // and the shared buffers written into the caller's tensors. When the
  // round does not commit, the model goes back to where it started.
  absl::StatusOr<EmbeddedRound> Round(int steps, int64_t samples);

  // Writes OUT/checkpoint.ckpt (atomically) for the last committed round,
  // with `user_state`. FailedPrecondition without --out.
  absl::Status Checkpoint(const std::string& user_state);
  // Whether there is an --out to checkpoint into.
  bool checkpoints() const { return !config_.train.out().empty(); }
  // The user_state of the checkpoint this member resumed from ("" if none).
  const std::string& resumed_user_state() const { return user_state_; }
  bool resumed() const { return config_.train.resume(); }

  // One inner step of the caller's loop done: the watchdog and the step
  // metrics (starling_inner_steps_total, _tokens_total, _train_loss, ...).
  void InnerStep(const StepResult& step);
  // "host:port" of the health and metrics servers; "" when off.
  std::string health_address() const {
    return ops_.health ? ops_.health->address() : "";
  }
  std::string metrics_address() const {
    return ops_.metrics ? ops_.metrics->address() : "";
  }

  // Says goodbye and stops the swarm. Idempotent.
  void Leave();
  // Makes a round in flight give up at its next wait; Round then returns
  // "stopped". Any thread.
  void Abandon() { abandon_ = true; }

  const std::string& address() const { return address_; }
  // The swarm's table as this member sees it (Swarm::Members).
  std::vector<peer::v1::MemberEntry> Members() const {
    return swarm_ ? swarm_->Members() : std::vector<peer::v1::MemberEntry>();
  }
  int64_t round() const { return round_; }
  int64_t step() const { return step_; }
  const std::string& model_hash() const { return lineage_; }
  const std::string& architecture() const { return architecture_; }
  int64_t n_params() const { return n_params_; }

 private:
  EmbeddedDiloco(NodeConfig config, EmbeddedModel model, NodeOps ops);
  // The traffic and the swarm's side of the metrics, now.
  void RefreshMetrics();
  absl::Status Init();
  // --resume: the checkpoint in --out into the model and the round state.
  absl::Status Restore();
  Swarm::Lineage Here() const;
  void Serve();
  // The node's own model and the shared buffers into the caller's tensors.
  absl::Status LoadModel();
  absl::Status CatchUp(const Swarm::Lineage& best);
  // The swarm is ahead: catch up within a few seconds of gossip.
  absl::StatusOr<std::string> CatchUpIfBehind(absl::Duration wait);

  const NodeConfig config_;
  EmbeddedModel model_;
  int64_t n_params_ = 0;
  int64_t n_buffers_ = 0;
  std::string architecture_;
  NodeCodecs codecs_;
  DilocoRoundOptions round_options_;
  ExchangeSettings exchange_settings_;
  std::unique_ptr<OuterOptimizer> outer_;
  std::unique_ptr<ErrorFeedback> feedback_;  // null without error feedback
  std::vector<float> theta_global_;
  std::vector<float> buffers_global_;
  std::string lineage_;
  int64_t round_ = 0;
  int64_t member_rounds_ = 0;
  int64_t step_ = 0;  // the inner steps the swarm's rounds stand for
  std::string address_;
  std::string user_state_;
  RingStats pseudo_gradient_bytes_;  // this session's, for the metrics
  // Before swarm_: its servers read the watchdog, which outlives them.
  NodeOps ops_;
  std::atomic<bool> abandon_{false};
  bool left_ = false;
  // Last: stopped first, its threads use nothing above but abandon_.
  std::unique_ptr<Swarm> swarm_;
};

}  // namespace starling

#endif  // STARLING_NODE_EMBEDDED_DILOCO_H_
