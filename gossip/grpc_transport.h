// The Transport over gRPC. Its server (the Peer service, callback API)
// admits peers through a handshake (protocol.h) and reads each incoming
// chunk stream with a reactor of chunk_reader.h, which assembles it into
// the installed attempt's mailbox; Send streams a message to a peer with
// chunk_writer.h, in chunks of `chunk_bytes` under a deadline, through the
// link emulator when one is set (latency once per message, bandwidth per
// chunk; handshakes are not shaped). TLS or plaintext per
// GrpcTransportOptions::credentials, which also sign every call and admit
// only signed ones when there is a join token.
// Ownership: the transport owns its server, its channels to peers and the
// current mailbox (shared with the streams that began under it).
// Thread-safety: Send, SendPayload and the counters may be called from any
// thread; Connect and InstallRound by the one thread that runs the
// collectives, while no send of this transport is in flight. The server's
// reactors never block: they validate, copy into the mailbox and finish.
#ifndef STARLING_GOSSIP_GRPC_TRANSPORT_H_
#define STARLING_GOSSIP_GRPC_TRANSPORT_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gossip/link_shaper.h"
#include "gossip/peer_credentials.h"
#include "gossip/peer_limits.h"
#include "gossip/protocol.h"
#include "gossip/transport.h"
#include "starling/peer/v1/peer.pb.h"

namespace grpc {
class ChannelArguments;
class Server;
class Service;
}  // namespace grpc

namespace starling {

// Where a channel to a member's address goes: `target` to dial (the
// address itself, or a relay tunnel's loopback port: relay_routes.h) and,
// when not empty, the name to check the member's TLS certificate against.
struct DialTarget {
  std::string target;
  std::string ssl_name;
};
// Applies `to`'s TLS name (when it has one and `credentials` set none).
void ApplyDialTarget(const DialTarget& to, const PeerCredentials& credentials,
                     grpc::ChannelArguments* args);

struct GrpcTransportOptions {
  std::string listen = "127.0.0.1:0";  // host:port; port 0 picks a free one
  int64_t chunk_bytes = 1 << 20;       // 1 MiB chunks
  absl::Duration rpc_timeout = absl::Seconds(60);
  // More services to serve on the same port (not owned; must outlive the
  // transport), e.g. the elastic swarm's.
  std::vector<grpc::Service*> extra_services;
  // When set and true for a peer's address, Send refuses to reach it
  // (Unavailable): an emulated network partition.
  std::function<bool(const std::string& address)> blocked;
  // When set, where to dial each peer address (a member behind a relay);
  // unset: the address itself.
  std::function<DialTarget(const std::string& address)> route;
  // When set, shapes the messages Send streams to each peer address (an
  // emulated slow link). Shared with the Swarm's pushes.
  std::shared_ptr<LinkEmulator> links;
  // TLS or plaintext, for the server and every channel to a peer.
  PeerCredentials credentials = InsecurePeerCredentials();
  // Deadlines of the server's streams (shared with extra_services; made
  // with stream_idle_timeout when null): an incoming chunk stream is
  // cancelled when it carries no chunk for the idle time, or when it runs
  // longer than chunk_stream_deadline, so a slow-loris peer holds no slot.
  std::shared_ptr<StreamDeadlines> stream_deadlines;
  absl::Duration stream_idle_timeout = absl::Seconds(60);
  // With stream_deadlines null: how many incoming streams one peer host may
  // have open at once (--peer_max_streams); 0: no cap.
  int peer_max_streams = 0;
  absl::Duration chunk_stream_deadline = absl::Minutes(5);
  // The flag behind chunk_stream_deadline, for errors: "--round_deadline".
  std::string chunk_stream_deadline_flag = "--round_timeout";
};

// Failed client RPCs by gRPC status code name ("UNAVAILABLE", ...), for the
// node's metrics. Thread-safe.
class RpcErrorCounter {
 public:
  // Counts `code` (a grpc::StatusCode value) unless it is OK.
  void Record(int code) ABSL_LOCKS_EXCLUDED(mu_);
  std::map<std::string, int64_t> Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, int64_t> counts_ ABSL_GUARDED_BY(mu_);
};

class GrpcTransport : public Transport {
 public:
  // Starts the Peer server. Unavailable naming the address if it cannot bind.
  static absl::StatusOr<std::unique_ptr<GrpcTransport>> Start(
      const GrpcTransportOptions& options, const PeerIdentity& identity);
  ~GrpcTransport() override;

  // The bound "host:port".
  const std::string& address() const { return address_; }

  // Fixes the members (addresses by rank; members[rank] is this node) and
  // handshakes with every other member, retrying with backoff until
  // `deadline`. FailedPrecondition saying what differs when a peer refuses;
  // Unavailable naming the address when a peer stays unreachable. Ranks
  // have no ids here: with ids bound, every chunk is refused.
  absl::Status Connect(const std::vector<std::string>& members, int rank,
                       const MailboxOptions& mailbox, absl::Time deadline);

  // Elastic rounds: replaces the members and the mailbox for one attempt of
  // a round (mailbox.first_round is the attempt's sequence number). From
  // then on the server takes chunks of exactly that sequence: older ones are
  // refused as stale; newer ones up to kEarlyRounds rounds ahead, of an
  // attempt announced by ExpectAttempt, are checked as the installed
  // attempt's are, held (up to EarlyBytesPerSender per sender, 1 GiB in
  // all) and delivered when their attempt is installed; the others are
  // refused with Unavailable so that their sender retries. Send retries
  // Unavailable until its deadline or until this mailbox is cancelled. `ids`:
  // the members' node ids by rank; with ids bound (credentials.bind_node_ids) a
  // chunk from rank r is taken only from a caller whose certificate names
  // ids[r], and every chunk is refused when `ids` is empty. Called by the one
  // thread that runs collectives.
  void InstallRound(const std::vector<std::string>& members, int rank,
                    const MailboxOptions& mailbox,
                    const std::vector<std::string>& ids);
  // Elastic rounds: this node was sent the plan of an attempt (arguments as
  // InstallRound's) that it has not installed yet; its members' chunks that
  // come before it is are checked against it and held. Thread-safe.
  void ExpectAttempt(const std::vector<std::string>& members, int rank,
                     const MailboxOptions& mailbox,
                     std::vector<std::string> ids);

  int rank() const override { return rank_; }
  int world() const override { return static_cast<int>(members_.size()); }
  absl::Status Send(int to, const Message& m, absl::Time deadline) override;
  absl::Status SendPayload(int to, const Message& header,
                           absl::string_view payload,
                           const std::shared_ptr<const void>& owner,
                           absl::Time deadline) override;
  Mailbox& mailbox() override { return *mailbox_; }
  int64_t bytes_sent() const override { return sent_.load(); }
  int64_t bytes_received() const override;
  // Early tensor messages refused so far (AttemptRouter::early_refused),
  // and the payload bytes of those held now.
  int64_t early_refused() const;
  int64_t early_bytes() const;
  // Failed client calls of this transport (and of services that share it).
  RpcErrorCounter& rpc_errors() { return rpc_errors_; }
  // The deadlines of the server's streams.
  const StreamDeadlines& stream_deadlines() const { return *deadlines_; }

  // Stops the server (waits for in-flight calls up to a short deadline).
  void Shutdown();

 private:
  class Service;
  class Peer;
  GrpcTransport(const GrpcTransportOptions& options,
                const PeerIdentity& identity);
  void SetPeers(const std::vector<std::string>& members, int rank);
  // Connect's handshake with rank `r`, retried until `deadline`.
  absl::Status HandshakeWith(int r, const peer::v1::HandshakeRequest& req,
                             absl::Time deadline);
  absl::Status SendOnce(int to, const Message& header,
                        absl::string_view payload,
                        const std::shared_ptr<const void>& owner,
                        absl::Time deadline);
  // The chunk size for a message of `payload_bytes` to `address` over the
  // emulated `link`, or FailedPrecondition (kept by options_.links) when
  // the link cannot carry it within the receiver's stream limits.
  absl::StatusOr<int64_t> ChunkBytesFor(const LinkShaper& link,
                                        const std::string& address,
                                        int64_t payload_bytes)
      ABSL_LOCKS_EXCLUDED(slow_mu_);

  // Constant after Start.
  const GrpcTransportOptions options_;
  const PeerIdentity identity_;
  std::string address_;
  std::shared_ptr<StreamDeadlines> deadlines_;  // outlives server_
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;

  // Set by Connect and InstallRound (the collectives' thread), read by
  // sends.
  std::vector<std::string> members_;
  // By "address target" (DialTarget).
  std::map<std::string, std::unique_ptr<Peer>> stubs_;
  std::vector<Peer*> peers_;  // by rank; null for self
  int rank_ = 0;
  bool elastic_ = false;
  std::shared_ptr<Mailbox> mailbox_;

  std::atomic<int64_t> sent_{0};
  RpcErrorCounter rpc_errors_;
  absl::Mutex slow_mu_;
  // The links whose slowness ChunkBytesFor has logged.
  std::set<std::string> slow_links_logged_ ABSL_GUARDED_BY(slow_mu_);
};

// Peers come and go: reconnect after 100 ms, backing off to
// kMaxReconnectBackoff at most (gRPC's default starts at 1 s and grows to
// 2 min). Until its backoff ends, a channel whose last connection attempt
// failed fails calls at once (without wait_for_ready), even when the peer
// is up again by then.
inline constexpr absl::Duration kMaxReconnectBackoff = absl::Seconds(1);
void SetReconnectBackoff(grpc::ChannelArguments& args);

}  // namespace starling

#endif  // STARLING_GOSSIP_GRPC_TRANSPORT_H_
