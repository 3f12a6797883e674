// `starling sim`: N `starling node` processes on 127.0.0.1, each with its
// shard of the data. Shows one live progress line, stops every child on
// Ctrl-C or when one fails (naming it and its log), and merges the nodes'
// outputs into the run directory's summary.json and report.html. With
// --kill/--restart/--join/--leave/--partition it also carries out a fault
// plan (node/faults.h) while the nodes run.
// Call from the main thread only (installs signal handlers, forks).
#ifndef STARLING_NODE_SIM_COMMAND_H_
#define STARLING_NODE_SIM_COMMAND_H_

#include "node/flags.h"

namespace starling {

const Subcommand& SimSubcommand();
int RunSimCommand();

}  // namespace starling

#endif  // STARLING_NODE_SIM_COMMAND_H_
