// The relayed member's side of reverse connections (relay.proto): while the
// dial-back at its join found this node UNREACHABLE, it keeps an Attach
// stream open to a relay (--relay: one it names, or with "auto" the
// reachable member that the fewest members relay through, relay_plan.h),
// records the relay in its own membership row (MemberEntry.relay), and for
// each connection the relay announces, dials its own server on this host
// and opens an Accept stream to carry it. A relay that ends the stream or
// sends no keepalive for keepalive_timeout is dropped: the row's relay is
// cleared and, with "auto", another reachable member is chosen (the dead
// one is avoided until none is left), so a member moves to a new relay
// within a gossip interval or two of losing one.
// Thread-safety: Start and Join by one thread; relay() and the counters
// from any.
#ifndef STARLING_GOSSIP_RELAY_ATTACHMENT_H_
#define STARLING_GOSSIP_RELAY_ATTACHMENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gossip/membership.h"
#include "gossip/peer_credentials.h"
#include "gossip/relay_pump.h"

namespace starling {

struct RelayAttachmentOptions {
  std::string node_id;
  std::string run_id;
  // "auto", "off" or the HOST:PORT of the member to relay through.
  std::string mode = "auto";
  // Where this node's own server accepts connections on this host.
  std::string local;
  PeerCredentials credentials = InsecurePeerCredentials();
  absl::Duration keepalive_timeout = absl::Seconds(5);
};

class RelayAttachment {
 public:
  RelayAttachment(RelayAttachmentOptions options, Membership* membership,
                  const std::atomic<bool>* stopping);
  ~RelayAttachment() { Join(); }

  void Start();
  // Ends the attach stream and every tunnel (once *stopping is true).
  void Join();

  // The relay attached to now; "" when none.
  std::string relay() const ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes carried through the relay to and from this node's server.
  int64_t relayed_bytes() const { return bytes_.load(); }
  // Relays lost so far (each a move to another, or a retry).
  int64_t relays_lost() const { return lost_.load(); }

 private:
  void Loop();
  // The relay to try next, avoiding the ids in `avoid` ("" when none).
  std::string Choose(const std::set<std::string>& avoid) const;
  // Holds one Attach stream to `relay` until it ends; why it ended.
  // `*attached`: whether the relay took this node at all.
  absl::Status AttachOnce(const std::string& relay, bool* attached);
  void SetRelay(const std::string& relay) ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const RelayAttachmentOptions options_;
  Membership* const membership_;
  const std::atomic<bool>* const stopping_;

  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> lost_{0};
  TunnelSet tunnels_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  std::string relay_ ABSL_GUARDED_BY(mu_);
};

}  // namespace starling

#endif  // STARLING_GOSSIP_RELAY_ATTACHMENT_H_
