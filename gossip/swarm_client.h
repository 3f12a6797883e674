// The client side of the Swarm service, as this node reaches its peers: a
// channel per peer address, kept for the node's life; the emulated network
// partition that calls ask about first (Blocked); and round messages, to one
// member (SendControl) or to several at once (SendControls, one thread per
// member but the last). Every other part of the swarm (gossip and join,
// the coordinator, the round member, state transfer, pushes) calls its
// peers through it.
// Thread-safe: one mutex guards the channels (and the partition its own);
// no call is made holding either.
#ifndef STARLING_GOSSIP_SWARM_CLIENT_H_
#define STARLING_GOSSIP_SWARM_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "gossip/grpc_transport.h"
#include "gossip/membership.h"
#include "gossip/partition.h"
#include "gossip/peer_credentials.h"
#include "gossip/round_protocol.h"
#include "starling/peer/v1/swarm.grpc.pb.h"

namespace starling {

class SwarmClient {
 public:
  // Takes the round messages this node sends to itself.
  using Local =
      std::function<peer::v1::ControlAck(const peer::v1::ControlMessage&)>;
  // `membership` (ids to addresses) and `errors` (failed calls by code)
  // must outlive the client; `partition_file` as in SwarmOptions.
  // `route`: where to dial each address (unset: the address itself).
  SwarmClient(std::string node_id, PeerCredentials credentials,
              std::string partition_file, const Membership* membership,
              RpcErrorCounter* errors, Local local,
              std::function<DialTarget(const std::string&)> route = nullptr);

  const PeerCredentials& credentials() const { return credentials_; }
  RpcErrorCounter& rpc_errors() { return *errors_; }

  // The stub for `address`, made on first use.
  std::shared_ptr<peer::v1::Swarm::Stub> StubFor(const std::string& address)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Rereads the partition file (each gossip tick).
  void ReadPartitionFile() { partition_.Reload(); }
  // Whether an emulated partition separates this node from the member at
  // `address`.
  bool Blocked(const std::string& address) const;

  // Sends round message `m` to member `to_id` (to this node itself through
  // `local`): the member's ack, or Unavailable naming it and why.
  absl::StatusOr<peer::v1::ControlAck> SendControl(
      const std::string& to_id, const peer::v1::ControlMessage& m);
  // Sends each member's messages in order and the members at once, so that
  // a member that hangs (stopped, or behind a black hole) costs one call
  // timeout, not one for every member after it. Acks in `msgs` order.
  std::vector<absl::StatusOr<peer::v1::ControlAck>> SendControls(
      absl::Span<const Outgoing> msgs);

  // Bytes of control RPCs (gossip and round messages) sent so far.
  void CountControlBytes(int64_t bytes) { control_bytes_ += bytes; }
  int64_t control_bytes() const { return control_bytes_.load(); }

 private:
  const std::string node_id_;
  const PeerCredentials credentials_;
  const Membership* const membership_;
  RpcErrorCounter* const errors_;
  const Local local_;
  const std::function<DialTarget(const std::string&)> route_;
  Partition partition_;
  std::atomic<int64_t> control_bytes_{0};

  absl::Mutex mu_;
  // By dial target (DialTarget.target).
  std::map<std::string, std::shared_ptr<peer::v1::Swarm::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace starling

#endif  // STARLING_GOSSIP_SWARM_CLIENT_H_
