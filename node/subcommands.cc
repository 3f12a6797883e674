#include "node/subcommands.h"

#include "node/bench_command.h"
#include "node/export_command.h"
#include "node/node_command.h"
#include "node/sim_command.h"
#include "node/tokenize_command.h"
#include "node/train_command.h"

namespace starling {

const std::vector<SubcommandEntry>& Subcommands() {
  static const auto* entries = new std::vector<SubcommandEntry>{
      {SimSubcommand(), &RunSimCommand},
      {NodeSubcommand(), &RunNodeCommand},
      {TrainSubcommand(), &RunTrainCommand},
      {ExportSubcommand(), &RunExportCommand},
      {TokenizeSubcommand(), &RunTokenizeCommand},
      {BenchSubcommand(), &RunBenchCommand},
  };
  return *entries;
}

}  // namespace starling
