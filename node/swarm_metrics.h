// The metrics that the swarm and a DiLoCo round's exchange feed
// (node/metrics.h), computed once for the node's loops (node_session.h's
// poller, diloco_loop.h) and the Python module's driver
// (embedded_diloco.h). Free functions over thread-safe objects.
#ifndef STARLING_NODE_SWARM_METRICS_H_
#define STARLING_NODE_SWARM_METRICS_H_

#include <string>

#include "absl/time/time.h"
#include "gossip/swarm.h"
#include "node/metrics.h"
#include "node/round_exchange.h"

namespace starling {

// The swarm's side of the metrics as `self` sees it now: peers known and
// connected, reachability, RPC errors, refusals, early bytes.
void RefreshSwarmMetrics(const Swarm& swarm, const std::string& self,
                         NodeMetrics& metrics);

// A round's starling_rounds_total{result} (its aborted attempts too) and,
// committed, its durations since `round_start`. No-op without metrics.
void ReportRoundMetrics(NodeMetrics* metrics, const RoundExchange& exchange,
                        Swarm::Outcome outcome, absl::Time round_start);

}  // namespace starling

#endif  // STARLING_NODE_SWARM_METRICS_H_
