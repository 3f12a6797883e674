// Consensus distance of a gossip run, (1/n)·Σ‖θ_i − θ̄‖², from the model
// snapshots the nodes write (NODE_DIR/snapshots/step_<S>.bin, flat fp32; see
// `starling node --snapshot_every`). Used by `starling sim` after its nodes
// finish. Pure functions over files; thread-compatible.
#ifndef STARLING_NODE_CONSENSUS_H_
#define STARLING_NODE_CONSENSUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace starling {

// (1/n)·Σ‖θ_i − θ̄‖² over `models` (0 for fewer than two). InvalidArgument
// when the models differ in size.
absl::StatusOr<double> ConsensusDistance(
    const std::vector<std::vector<float>>& models);

struct ConsensusPoint {
  int64_t step = 0;
  double distance = 0;
  int nodes = 0;  // how many nodes had a snapshot at this step
};

// Per snapshot step (ascending), the distance over the nodes in `node_dirs`
// that wrote that step; steps only one node wrote are skipped. Files that
// cannot be read or whose size differs from the others are left out (and
// named in `skipped` when not null). Deletes the snapshot files and their
// folders when `remove` is true.
std::vector<ConsensusPoint> ConsensusFromSnapshots(
    const std::vector<std::string>& node_dirs, bool remove,
    std::vector<std::string>* skipped = nullptr);

}  // namespace starling

#endif  // STARLING_NODE_CONSENSUS_H_
