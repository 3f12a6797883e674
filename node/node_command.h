// `starling node`: one member of a swarm. RunNodeCommand (node_command.cc)
// reads the flags into a NodeConfig (node_flags.h), builds the trainer and
// codecs into a NodeRun (node_run.h) and runs one of three loops: elastic
// DiLoCo rounds (diloco_loop.h: H inner steps, an exchange of the weighted
// pseudo-gradients through the swarm's round protocol, the outer Nesterov
// step), asynchronous push-sum gossip (gossip_loop.h), or the ddp baseline
// over a static member list (ddp_loop.h: a ring all-reduce of gradients
// every step). Call from the main thread only (installs SIGINT/SIGTERM
// handlers).
#ifndef STARLING_NODE_NODE_COMMAND_H_
#define STARLING_NODE_NODE_COMMAND_H_

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/memory.h"
#include "gossip/peer_credentials.h"
#include "node/flags.h"
#include "node/node_run.h"

// Node flags that `starling sim` reads too.
ABSL_DECLARE_FLAG(std::string, algo);
ABSL_DECLARE_FLAG(std::string, run_id);
ABSL_DECLARE_FLAG(int, inner_steps);
ABSL_DECLARE_FLAG(std::string, outer);
ABSL_DECLARE_FLAG(double, outer_lr);
ABSL_DECLARE_FLAG(double, outer_momentum);
ABSL_DECLARE_FLAG(std::string, link_bandwidth_mbps);
ABSL_DECLARE_FLAG(std::string, link_latency_ms);

namespace starling {

struct NodeConfig;

const Subcommand& NodeSubcommand();

// The node-only flags (sim passes them through to its children).
const std::vector<std::string>& NodeFlagNames();

// Checks the node flags that need no model, data, file or peer (--algo,
// --inner_steps and the adaptive-sync flags, --overlap, --aggregate,
// --norm_bound, --chunk_bytes, the stream limits, the outer optimizer,
// --compression, --small_tensor_codec, --error_feedback): InvalidArgument
// naming the flag. `starling sim` calls it before it makes its run
// directory or starts a node; RunNodeCommand runs the same checks first.
absl::Status CheckNodeFlags();

// What a node of `config` holds besides its trainer's part, for the memory
// check (core/memory.h EstimateMemory): its algorithm, compression, error
// feedback, --overlap, outer and gossip momentum, and checkpoints.
MemoryPlanOptions NodeMemoryPlan(const NodeConfig& config);

// Pseudo-gradient compression: a per-tensor policy over the flat view
// (params) and the same plus the fp32 averaging weights, stop vote and
// `n_buffers` buffer values (the ring's tensor). InvalidArgument from the
// policy.
absl::StatusOr<NodeCodecs> MakeCodecs(const NodeConfig& config,
                                      const std::vector<torch::Tensor>& params,
                                      int64_t n_buffers);

// --resume_if_exists: sets --resume when --out holds a checkpoint, and
// says so. The node and the Python module (embedded_diloco.h) call it.
void ApplyResumeIfExists(TrainConfig* train);

// The peer-security flags (--tls_*, --insecure, --join_token_file,
// --peer_rate_limit) as the node reads them.
PeerSecurityOptions PeerSecurityFromFlags();

// Exit code: 0 ok, 2 bad flags/config/input or a refused handshake,
// 1 runtime failure (unreachable peer, failed round).
int RunNodeCommand();

}  // namespace starling

#endif  // STARLING_NODE_NODE_COMMAND_H_
