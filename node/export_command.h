// `starling export`: the trained model out of Starling, for PyTorch. Takes
// θ_global of the last committed round, with its buffers, from a run
// directory (`train`, `node`, or `sim`: any member's, checked equal across
// members) or a checkpoint file, and writes a TorchScript file (for a
// --model=torchscript:PATH run) or a PyTorch state_dict (for the built-in
// models, which python/starling_models.py rebuilds).
// Call from the main thread only.
#ifndef STARLING_NODE_EXPORT_COMMAND_H_
#define STARLING_NODE_EXPORT_COMMAND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "node/flags.h"

namespace starling {

const Subcommand& ExportSubcommand();

// Which checkpoint an export reads, and what its run said of it.
struct ExportSource {
  std::string checkpoint;  // the file
  std::string member;      // a sim's member, or empty
  // The final model hash the run's summary.json reports for it (empty
  // when there is none to check against), and its final val_loss (NaN
  // when it reported none).
  std::string summary_hash;
  double summary_val_loss;
};

// What --from names: a checkpoint file, a train or node run directory
// (its checkpoint.ckpt), or a sim's run directory (the checkpoint of a
// member that finished the run, after checking that every member that did
// reports the same final model). InvalidArgument naming --from when the
// path is missing or unreadable, holds no checkpoint, or its members
// disagree (naming the members on each model); FailedPrecondition when the
// node's summary says its model is not the swarm's final one
// ("model_is_swarms": false) and `allow_apart` is not set.
absl::StatusOr<ExportSource> ResolveExportSource(const std::string& from,
                                                 bool allow_apart);

// Runs `starling export` with the already-parsed flags. Returns the process
// exit code: 0 ok, 2 bad flags or input (named), 1 a failure to write.
int RunExportCommand();

}  // namespace starling

#endif  // STARLING_NODE_EXPORT_COMMAND_H_
