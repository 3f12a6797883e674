// The synchronous data-parallel baseline on one node (--algo=ddp), over a
// fixed member list (--listen and --peers; ranks follow the sorted list):
// gradients are all-reduced every step, and every member votes in every
// all-reduce, so that a SIGINT/SIGTERM stops all of them after the same
// step. The model's buffers (BatchNorm's running statistics) travel in the
// same all-reduce: after each step every member holds their mean, as
// PyTorch's DDP keeps its members' buffers equal. Thread-safety: the loop runs
// on the training thread.
#ifndef STARLING_NODE_DDP_LOOP_H_
#define STARLING_NODE_DDP_LOOP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gossip/grpc_transport.h"
#include "gossip/ring_allreduce.h"
#include "node/node_run.h"
#include "node/node_session.h"

namespace starling {

// A ddp run's members: every address, sorted; a member's rank is its index.
struct StaticMembers {
  std::vector<std::string> members;
  int rank = 0;  // this node's
};

// --listen and --peers as a member list. InvalidArgument naming the flag
// for an address that is not host:port, an address listed twice, or a
// --listen without a fixed port while there are peers.
absl::StatusOr<StaticMembers> ParseMembers(const std::string& listen,
                                           const std::string& peers);

// Runs `run` with ddp: the process exit code (node_session.h).
int RunDdp(NodeRun& run);

class DdpLoop {
 public:
  DdpLoop(NodeRun& run, StaticMembers members);
  DdpLoop(const DdpLoop&) = delete;
  DdpLoop& operator=(const DdpLoop&) = delete;

  int Run();

 private:
  // Connects to every other member (with more than one); the "start" event.
  absl::Status Start();
  // Steps until the run is done or the members voted to stop (true).
  absl::StatusOr<bool> Train();
  // One step with its all-reduce and its record: false when the members
  // voted to stop before the last step.
  absl::StatusOr<bool> RunStep();
  // The gradient hook: gradients ← the members' batch-weighted average,
  // with this node's stop vote; the buffers ← the members' mean.
  absl::Status AverageGradients(const std::vector<torch::Tensor>& params);
  int End(bool interrupted);

  // Constant after construction.
  NodeRun& run_;
  Trainer& trainer_;
  const NodeConfig& config_;
  const StaticMembers members_;
  const int world_;
  const int total_;
  const std::vector<std::string> ids_;  // "n0", "n1", ... by rank

  // Declared before session_, whose poller counts its bytes.
  std::unique_ptr<GrpcTransport> transport_;  // null when alone
  NodeSession session_;
  bool stop_voted_ = false;
  // The buffers as the last all-reduce left them, the same on every member.
  std::vector<float> buffers_synced_;
};

}  // namespace starling

#endif  // STARLING_NODE_DDP_LOOP_H_
