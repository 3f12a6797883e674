// Whether anything still listens at a member's address: one TCP
// connection attempt, nothing more (no TLS, no gRPC call). A process that
// has exited leaves its port closed, and its host refuses the connection at
// once; one that is stopped (SIGSTOP, a laptop asleep, a paused VM) still
// has its listening socket, and its kernel completes the handshake, or
// (the whole host asleep, or cut off) nothing answers. A finished DiLoCo
// member lingers for the second and third kinds only (DilocoLoop).
// Thread-safe: no state.
#ifndef STARLING_GOSSIP_REACHABILITY_H_
#define STARLING_GOSSIP_REACHABILITY_H_

#include <string>

#include "absl/time/time.h"

namespace starling {

enum class Reachability {
  kListening,  // a connection was accepted
  kRefused,    // every address of the host refused it: nothing listens
  kNoAnswer,   // no answer within the timeout, or the name did not resolve
};

// Tries to connect to `address` ("host:port", "[v6]:port"), each of the
// host's addresses for at most `timeout`, and closes the connection.
Reachability ProbeAddress(const std::string& address, absl::Duration timeout);

}  // namespace starling

#endif  // STARLING_GOSSIP_REACHABILITY_H_
