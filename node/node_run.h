// A node's run once its flags are checked and its trainer is built: what
// the three loops (diloco_loop.h, gossip_loop.h, ddp_loop.h) share.
//  - NodeConfig: the settings, from the flags; constant once the run starts.
//  - NodeCodecs: the codecs for pseudo-gradients, pushes and the flush.
//  - NodeState: what a run carries from round to round and across restarts
//    (the checkpoint holds it; node_session.h writes and reads it).
// RunNodeCommand (node_command.h) builds one NodeRun and hands it to a loop.
// Thread-safety: owned by the training thread; nothing in it is locked.
#ifndef STARLING_NODE_NODE_RUN_H_
#define STARLING_NODE_NODE_RUN_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "compression/codec.h"
#include "compression/tensor_policy.h"
#include "core/trainer.h"
#include "gossip/link_shaper.h"
#include "gossip/peer_credentials.h"
#include "gossip/ring_allreduce.h"
#include "node/faults.h"
#include "node/node_ops.h"
#include "node/run_output.h"
#include "outer_opt/outer_optimizer.h"
#include "outer_opt/robust_aggregate.h"
#include "outer_opt/sync_policy.h"
#include "outer_opt/weighting.h"

namespace starling {

// DiLoCo's adaptive sync (--round_seconds ... --divergence_threshold): how
// long a round runs on this node and how the members' Δ are averaged. The
// controllers start from these values; the DiLoCo loop owns its copy.
struct AdaptiveSync {
  double round_seconds = 0;  // 0: rounds of H steps
  int max_steps = 0;         // cap per round with round_seconds (0: none)
  Weighting weighting = Weighting::kSamples;
  std::optional<InnerStepController> h;  // H per round
  std::optional<PageHinkley> detector;
  std::optional<DivergenceTrigger> divergence;
};

// How the node reaches its peers (diloco and gossip through a Swarm, ddp
// over a fixed list).
struct NetworkConfig {
  std::string listen;          // --listen, host:port
  std::string advertise;       // --advertise ("": the listen address)
  std::string relay = "auto";  // --relay
  std::string peers;           // --peers, as given
  std::string node_id;         // --node_id, or --listen when not given
  std::string run_id;          // --run_id
  std::string hosts_file;      // --hosts ("": none)
  std::string partition_file;  // --partition_file
  std::string test_crash_at;   // --test_crash_at
  // --test_relay_fault: cut relayed connections after this many bytes
  // (0: never), hold each forwarded frame this long.
  int64_t test_relay_cut_after = 0;
  absl::Duration test_relay_delay = absl::ZeroDuration();
  int min_members = 1;
  int chunk_bytes = 1 << 20;
  int peer_max_streams = 0;
  absl::Duration connect_timeout = absl::Seconds(60);
  absl::Duration round_timeout = absl::Seconds(300);  // also the RPC timeout
  absl::Duration round_deadline = absl::Seconds(60);
  absl::Duration suspect_timeout = absl::Seconds(3);
  // --linger_seconds: how long a node done with its run stays for members
  // that may come back (DilocoLoop::StayUntilCaughtUp).
  absl::Duration linger = absl::Seconds(30);
  absl::Duration found_after = absl::Seconds(10);
  absl::Duration stream_idle_timeout = absl::Seconds(60);
  std::shared_ptr<LinkEmulator> links;  // emulated links (null: none)
  PeerCredentials credentials;          // TLS or plaintext
};

// --algo=diloco's own settings.
struct DilocoConfig {
  bool overlap = false;   // --overlap: the delayed outer update
  int overlap_steps = 0;  // --overlap_steps: the τ-delayed update (0: off)
  double ef_decay = 0;    // --ef_decay: SparseLoCo's error feedback (0: off)
  OuterOptions outer;
  AdaptiveSync sync;
  // --aggregate and --norm_bound; robust: the all-gather path.
  AggregateSpec aggregate;
  double norm_bound = 0;
  bool robust = false;
  std::vector<PoisonWindow> poison;  // --test_poison
  // --train_alone: a node that finds the swarm gone trains on alone
  // instead of stopping (gossip/swarm_end.h).
  bool train_alone = false;
};

// --algo=gossip's own settings.
struct GossipConfig {
  std::string peer_mode = "random";  // --gossip_peers, checked at start
  absl::Duration push_timeout = absl::Seconds(5);
  double momentum = 0;  // SlowMo β on the gossiped update
  double outer_lr = 1;  // and its α
  int snapshot_every = 0;
};

struct NodeConfig {
  TrainConfig train;
  std::string algo = "diloco";  // diloco | gossip | ddp
  int inner_steps = 50;         // H
  std::string compression = "fp32";
  PolicyOptions policy;  // --compression, --small_tensor_*
  std::string error_feedback = "auto";
  NetworkConfig net;
  DilocoConfig diloco;
  GossipConfig gossip;
};

// The codecs of a run, over the model's flat tensors.
struct NodeCodecs {
  // Per tensor: gossip's pushes, and DiLoCo's Δ under error feedback.
  std::unique_ptr<PolicyCodec> params;
  // The same plus the trailing fp32 weights and stop vote: the ring's.
  std::unique_ptr<PolicyCodec> ring;
  // What the ring compresses with: `ring`, or null for fp32.
  const PolicyCodec* ring_codec = nullptr;
  // The sparse codec: DiLoCo rounds gather every member's encoded pack
  // (AllGatherSum) instead of running the ring.
  bool sparse_gather = false;
  // The residual flush's (ef_in_model): the codec itself, or int8 after
  // top-k and sparse. Null without it.
  std::unique_ptr<PolicyCodec> flush;
  bool error_feedback = false;  // --error_feedback, resolved
  // DiLoCo with error feedback, not --overlap or --ef_decay: the residual
  // stays in the node's model (outer_opt/diloco_round.h).
  bool ef_in_model = false;
};

// Traffic of earlier sessions of a resumed run (the checkpoint's "comm").
struct PriorTraffic {
  int64_t sent = 0;
  int64_t received = 0;
  int64_t before_compression = 0;  // DiLoCo's pseudo-gradient bytes as fp32
  int64_t after_compression = 0;   // and as sent
};

// What the run carries from round to round; a checkpoint keeps it.
struct NodeState {
  int64_t round = 0;          // the next round (DiLoCo, ddp)
  int64_t member_rounds = 0;  // DiLoCo: θ_global's lineage weight
  PriorTraffic prior;
  RingStats pseudo_gradient_bytes;    // DiLoCo, this session: raw and wire
  std::vector<RoundRecord> rounds;    // for summary.json
  EvalResult eval;                    // the last evaluation
  int evaluated_step = -1;            // its step
  int64_t contributions_dropped = 0;  // --aggregate / --norm_bound
  double gossip_weight = 0;           // push-sum weight (0: not set)
  // Gossip with SlowMo: its momentum u as of the next checkpoint (empty:
  // none); a resume without it would restart u at zero.
  std::vector<float> gossip_momentum;
  // DiLoCo's outer optimizer; every algorithm checkpoints its state.
  std::unique_ptr<OuterOptimizer> outer;
  std::unique_ptr<ErrorFeedback> feedback;  // null without error feedback
};

struct NodeRun {
  const NodeConfig config;
  Trainer& trainer;
  NodeOps& ops;
  std::vector<torch::Tensor> params;  // the trainer's, in flat order
  // The model's buffers (BatchNorm's running statistics...), in flat
  // order: DiLoCo averages them in each round, ddp at each step
  // (docs/design.md); gossip leaves each node its own.
  std::vector<torch::Tensor> buffers;
  int64_t n_params = 0;
  std::string init_hash;  // every member starts from the same θ and buffers
  NodeCodecs codecs;
  NodeState state;

  const std::string& out() const { return config.train.out(); }
  std::string CheckpointPath() const;
};

}  // namespace starling

#endif  // STARLING_NODE_NODE_RUN_H_
