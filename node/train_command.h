// `starling train`: one node, no peers. Builds the TrainConfig from flags,
// runs the inner trainer with progress, evaluation and checkpoints, and writes
// the run directory (events.jsonl, summary.json, checkpoint.ckpt).
// Call from the main thread only (installs SIGINT/SIGTERM handlers).
#ifndef STARLING_NODE_TRAIN_COMMAND_H_
#define STARLING_NODE_TRAIN_COMMAND_H_

#include <string>
#include <vector>

#include "core/trainer.h"
#include "node/flags.h"

namespace starling {

const Subcommand& TrainSubcommand();

// The training flags (shared by train, node and sim) and the TrainConfig
// they hold now.
const std::vector<std::string>& TrainFlagNames();
TrainConfig ConfigFromFlags();

// Runs `starling train` with the already-parsed flags. Returns the process
// exit code: 0 ok, 2 bad flags/config/input, 1 runtime failure.
int RunTrainCommand();

}  // namespace starling

#endif  // STARLING_NODE_TRAIN_COMMAND_H_
