// How this node dials a member: directly at its address, or, when the
// member is UNREACHABLE and names a relay in its row (MemberEntry.relay),
// through that relay. For a relayed member the route is a local tunnel: a
// loopback port whose every connection is carried to the member through
// the relay's Connect call (relay.proto), so the gRPC channels of the
// transport and the swarm client (grpc_transport.h, swarm_client.h) dial
// it like any address, and TLS runs end to end with the member (the
// channel checks the member's certificate against the host of its
// advertised address, or --tls_server_name).
// Thread-safety: thread-safe; one mutex guards the tunnels, and none is
// made or stopped holding it.
#ifndef STARLING_GOSSIP_RELAY_ROUTES_H_
#define STARLING_GOSSIP_RELAY_ROUTES_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gossip/grpc_transport.h"
#include "gossip/membership.h"
#include "gossip/peer_credentials.h"
#include "gossip/relay_pump.h"
#include "starling/peer/v1/relay.grpc.pb.h"

namespace starling {

// A loopback port that carries each connection to member `target` through
// the Relay service at `relay_address`.
class RelayTunnel {
 public:
  static absl::StatusOr<std::unique_ptr<RelayTunnel>> Start(
      std::string relay_address, std::string target, std::string run_id,
      const PeerCredentials& credentials, std::atomic<int64_t>* bytes);
  ~RelayTunnel();
  RelayTunnel(const RelayTunnel&) = delete;
  RelayTunnel& operator=(const RelayTunnel&) = delete;

  // "127.0.0.1:PORT".
  const std::string& local_address() const { return local_address_; }

 private:
  RelayTunnel() = default;
  void AcceptLoop();
  void Carry(Tunnel* tunnel);

  std::string relay_address_;
  std::string target_;
  std::string run_id_;
  PeerCredentials credentials_;
  std::atomic<int64_t>* bytes_ = nullptr;
  std::unique_ptr<peer::v1::Relay::Stub> stub_;
  int listen_fd_ = -1;
  std::string local_address_;
  std::atomic<bool> stopping_{false};
  TunnelSet tunnels_;
  std::thread acceptor_;
};

class RelayRoutes {
 public:
  RelayRoutes(std::string run_id, PeerCredentials credentials);
  ~RelayRoutes() { Shutdown(); }

  // The table to read members' reachability and relays from; until it is
  // set, every route is direct. Must outlive this object's use.
  void SetMembership(const Membership* membership) {
    membership_.store(membership);
  }
  // Where to dial the member at `address` (see the file comment). A relayed
  // member whose tunnel cannot be made (no loopback port) is dialed
  // directly, and fails as it would have.
  DialTarget Route(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes this node sent and received through relays.
  int64_t relayed_bytes() const { return bytes_.load(); }
  // Stops every tunnel.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string run_id_;
  const PeerCredentials credentials_;
  std::atomic<const Membership*> membership_{nullptr};
  std::atomic<int64_t> bytes_{0};
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // By "member id@relay address".
  std::map<std::string, std::unique_ptr<RelayTunnel>> tunnels_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace starling

#endif  // STARLING_GOSSIP_RELAY_ROUTES_H_
