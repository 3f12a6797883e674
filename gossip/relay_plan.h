// Planning for members behind NAT (issue 52), as pure functions: which
// reachable member a member that nobody can dial relays through, and a
// ring order that keeps relayed traffic off the relays. Nothing calls
// these yet: the relay itself (a long-lived stream from the NATed member
// that carries the traffic meant for it) is not built. They take the
// membership table and who relays through whom, and decide; no I/O.
// Thread-safe: no state.
#ifndef STARLING_GOSSIP_RELAY_PLAN_H_
#define STARLING_GOSSIP_RELAY_PLAN_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "starling/peer/v1/swarm.pb.h"

namespace starling {

// The relay member `self` should use: among ALIVE members of `table` other
// than `self` whose dial-back found them REACHABLE and that are not in
// `avoid` (a relay that just failed), the one fewest members relay through
// now (`relay_of`: member id -> its relay's id), so the load spreads; a
// tie goes to the one a hash of `self` picks, so that members choosing at
// the same moment spread too. Empty when there is none.
std::string PickRelay(const std::vector<peer::v1::MemberEntry>& table,
                      const std::string& self,
                      const std::map<std::string, std::string>& relay_of,
                      const std::set<std::string>& avoid = {});

// A ring order of `ids` (each rank sends to the next) that puts every
// relayed member right after its relay. In a ring a member receives only
// from its predecessor, and a relayed member's only inbound path is its
// relay's stream: after its own relay, the relay sends to it directly and
// forwards nobody's bytes. The rest keep their sorted order; a second
// member relayed by the same relay goes after the first (its predecessor
// is then that NATed member, whose bytes the relay must forward), and one
// whose relay is not in `ids` keeps its sorted place.
std::vector<std::string> RelayRingOrder(
    std::vector<std::string> ids,
    const std::map<std::string, std::string>& relay_of);

}  // namespace starling

#endif  // STARLING_GOSSIP_RELAY_PLAN_H_
