#include "node/swarm_metrics.h"

#include <vector>

#include "absl/time/clock.h"
#include "gossip/reachability.h"

namespace starling {

void RefreshSwarmMetrics(const Swarm& swarm, const std::string& self,
                         NodeMetrics& metrics) {
  const std::vector<peer::v1::MemberEntry> table = swarm.Members();
  int known = 0, connected = 0;
  peer::v1::Reachability own = peer::v1::REACHABILITY_UNKNOWN;
  for (const peer::v1::MemberEntry& e : table) {
    if (e.id() == self) {
      own = e.reachability();
      continue;
    }
    if (e.state() == peer::v1::MEMBER_ALIVE) ++connected;
    if (e.state() == peer::v1::MEMBER_ALIVE ||
        e.state() == peer::v1::MEMBER_SUSPECT) {
      ++known;
    }
  }
  metrics.SetPeers(known, connected);
  const ReachabilityCounts counts = CountReachability(table);
  metrics.SetReachability(
      own == peer::v1::REACHABILITY_UNKNOWN
          ? -1
          : (own == peer::v1::REACHABILITY_REACHABLE ? 1 : 0),
      counts.reachable, counts.unreachable, counts.unknown);
  metrics.SetRpcErrors(swarm.rpc_errors());
  metrics.SetRefusals(swarm.refusals());
  metrics.SetEarlyBytes(swarm.early_bytes());
  metrics.SetRelay(swarm.relay_forwarded_by_member(), !swarm.relay().empty());
}

void ReportRoundMetrics(NodeMetrics* metrics, const RoundExchange& exchange,
                        Swarm::Outcome outcome, absl::Time round_start) {
  if (metrics == nullptr) return;
  const bool committed = outcome == Swarm::Outcome::kCommitted;
  for (int i = 0; i < exchange.attempts() - (committed ? 1 : 0); ++i) {
    metrics->Round(kRoundAborted, 0, 0);
  }
  metrics->Round(committed                             ? kRoundCommitted
                 : outcome == Swarm::Outcome::kStopped ? kRoundStopped
                                                       : kRoundStale,
                 absl::ToDoubleSeconds(absl::Now() - round_start),
                 exchange.sync_seconds());
}

}  // namespace starling
