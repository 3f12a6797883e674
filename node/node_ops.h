// The node's operational side: the liveness watchdog, the gRPC health
// endpoint and the Prometheus endpoint (each off when its port flag is -1),
// and the test-only stall (--test_stall). RunNodeCommand starts them before
// the data load, so that a probe sees "not ready" rather than a refused
// connection; the loops report each inner step and whether they are ready.
// Thread-safety: the training thread calls Step and SetReady; the watchdog,
// health server and metrics are thread-safe themselves.
#ifndef STARLING_NODE_NODE_OPS_H_
#define STARLING_NODE_NODE_OPS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "core/trainer.h"
#include "node/health.h"
#include "node/metrics.h"

namespace starling {

struct NodeOps {
  std::unique_ptr<Watchdog> watchdog;
  std::unique_ptr<HealthServer> health;  // null: --health_port=-1
  std::unique_ptr<NodeMetrics> metrics;  // null: --metrics_port=-1
  int stall_step = -1;                   // --test_stall
  double stall_seconds = 0;

  // One inner step done: the test stall (at its step), the watchdog and the
  // step metrics.
  void Step(const StepResult& r, int step);
  void SetReady(bool ready) {
    if (health) health->SetReady(ready);
  }
};

// One inner step of a loop outside Starling (the Python module's): the
// watchdog and the step metrics, each when there is one.
void RecordInnerStep(const NodeOps& ops, const StepResult& r);

// Starts the watchdog, health and metrics servers from the flags
// (--watchdog_*, --test_stall, --health_port, --metrics_port, on the host
// of --listen). InvalidArgument naming a bad flag; what the servers return
// when they cannot start.
absl::Status StartOps(const std::string& node_id, const std::string& algo,
                      const std::string& device, NodeOps* ops);

}  // namespace starling

#endif  // STARLING_NODE_NODE_OPS_H_
