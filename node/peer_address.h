// Peer addresses as the node's flags give them: host:port checks, the host
// of an address, and a hosts(5)-style file (--hosts) that maps names to
// addresses before DNS. Pure functions (ReadHosts reads its file);
// thread-safe.
#ifndef STARLING_NODE_PEER_ADDRESS_H_
#define STARLING_NODE_PEER_ADDRESS_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gossip/reachability.h"  // HostOf

namespace starling {

// True for "host:port" with a port in [0, 65535] and a non-empty host.
bool ValidHostPort(absl::string_view address);

// The port of "host:port" (ValidHostPort), or -1 when it has none.
int PortOf(absl::string_view address);

// Reads a hosts(5)-style file into name -> address. InvalidArgument naming
// --hosts, the file and the line when it cannot be read or a line has an
// address without a name.
absl::StatusOr<std::map<std::string, std::string>> ReadHosts(
    const std::string& path);

}  // namespace starling

#endif  // STARLING_NODE_PEER_ADDRESS_H_
