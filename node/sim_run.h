// One `starling sim` run, from its first node's start until every node has
// stopped: it starts the initial nodes, carries out the fault plan as it
// comes due, shows the live progress line, and stops the nodes in stages
// when the sim gets Ctrl-C (or SIGTERM) or a node fails.
//
// The sim's SIGINT/SIGTERM handlers (InstallStopSignals, node/run_output.h)
// must be installed first. Call from the main thread only (it forks).
#ifndef STARLING_NODE_SIM_RUN_H_
#define STARLING_NODE_SIM_RUN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "node/faults.h"
#include "node/sim_faults.h"
#include "node/sim_processes.h"

namespace starling {

struct SimRunOptions {
  int total_steps = 0;  // per node, for the progress line
  bool gossip = false;  // --algo=gossip
};

// How the run ended.
struct SimRunResult {
  absl::Time start;                  // when the first node started
  std::vector<std::string> started;  // node ids, in the order first started
  FaultLog faults;
  int failed = -1;  // the first node that failed on its own (-1: none)
  int failed_code = 0;
};

// Runs `launch`'s nodes with `plan`. An error starting an initial node is
// returned (the nodes already started die with the sim); otherwise the
// result, also after a signal (StopSignal() then says which) or a failure.
absl::StatusOr<SimRunResult> RunSimNodes(NodeLaunch launch,
                                         const FaultPlan& plan,
                                         const SimRunOptions& options);

}  // namespace starling

#endif  // STARLING_NODE_SIM_RUN_H_
