// What a DiLoCo node says about the swarm's end (gossip/swarm_end.h has the
// judgement): the last stderr line of a node that ended apart from its
// swarm, and the fields summary.json's "final" gets, so that an operator
// (or `starling export`) can tell whether a node's model is the swarm's;
// and summary.json's reachability fields (each member's dial-back verdict).
// Pure functions of their inputs; thread-safe.
#ifndef STARLING_NODE_SWARM_END_REPORT_H_
#define STARLING_NODE_SWARM_END_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/json.h"
#include "gossip/swarm.h"
#include "gossip/swarm_end.h"

namespace starling {

// Where the node stopped.
struct ApartAt {
  std::string node_id;
  int64_t round = 0;  // its next round
  int64_t step = 0;
  absl::Duration pause;  // its last noticed pause (for kCutOff)
};

// "starling node: ID ended apart from the swarm: ...": the round it
// reached, the swarm's final (or last seen) round and model, who holds it,
// and, cut off, how long it was paused and who has not answered since.
std::string EndedApartMessage(const SwarmView& v, const ApartAt& at);

// summary.json's "final" fields: swarm_final_round, swarm_final_hash,
// swarm_final_holders, swarm_standing, model_is_swarms (this node's
// θ_global is the furthest the swarm reached, it did not end apart and did
// not train alone) and trained_alone.
JsonObject SwarmFinalFields(const SwarmView& v, bool apart, bool trained_alone);

// summary.json's reachability fields, from the member table at the end:
// "reachability" (this node's own dial-back verdict: "reachable",
// "unreachable" or "unknown") and "members_reachability" (id -> verdict,
// every member in the table).
JsonObject ReachabilityFields(const std::vector<peer::v1::MemberEntry>& table,
                              const std::string& self);

// summary.json's relay fields (gossip/relay_server.h): "relay" (the
// address of the relay this node was attached to at the end, "" for none),
// "relays_lost", "relayed_bytes" (through its relay, to and from this
// node), "relay_forwarded_bytes" (what it forwarded as a relay for others)
// with "relay_forwarded_by_member" (relayed member id -> bytes), and
// "bytes_via_relays" (what it sent and received through others' relays).
JsonObject RelayFields(const Swarm& swarm);

}  // namespace starling

#endif  // STARLING_NODE_SWARM_END_REPORT_H_
