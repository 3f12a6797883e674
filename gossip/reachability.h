// Whether anything still listens at a member's address: one TCP
// connection attempt, nothing more (no TLS, no gRPC call). A process that
// has exited leaves its port closed, and its host refuses the connection at
// once; one that is stopped (SIGSTOP, a laptop asleep, a paused VM) still
// has its listening socket, and its kernel completes the handshake, or
// (the whole host asleep, or cut off) nothing answers. A finished DiLoCo
// member lingers for the second and third kinds only (DilocoLoop).
// Also the verdicts of the dial-back at join (MembershipGossip::OnJoin): the
// member that admits a joiner probes the address the joiner advertises and
// answers what it found; the joiner records it in its own row.
// Thread-safe: no state.
#ifndef STARLING_GOSSIP_REACHABILITY_H_
#define STARLING_GOSSIP_REACHABILITY_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "starling/peer/v1/swarm.pb.h"

namespace starling {

// "host" of "host:port" ("[::1]:7070" -> "::1"); empty for ":port".
std::string HostOf(const std::string& address);

enum class Reachability {
  kListening,  // a connection was accepted
  kRefused,    // every address of the host refused it: nothing listens
  kNoAnswer,   // no answer within the timeout, or the name did not resolve
};

// Tries to connect to `address` ("host:port", "[v6]:port"), each of the
// host's addresses for at most `timeout`, and closes the connection.
Reachability ProbeAddress(const std::string& address, absl::Duration timeout);

// The dial-back verdict of one probe: REACHABLE when a connection was
// accepted; UNREACHABLE when refused or unanswered (NAT drops or refuses
// inbound connections, a firewall drops them, a private address routes
// nowhere).
peer::v1::Reachability DialBackVerdict(Reachability probe);

// "reachable", "unreachable" or "unknown": for logs, summary.json, metrics.
const char* ReachabilityName(peer::v1::Reachability r);

// How many live members (ALIVE or SUSPECT) of `table` have each verdict.
struct ReachabilityCounts {
  int reachable = 0;
  int unreachable = 0;
  int unknown = 0;
};
ReachabilityCounts CountReachability(
    const std::vector<peer::v1::MemberEntry>& table);

}  // namespace starling

#endif  // STARLING_GOSSIP_REACHABILITY_H_
