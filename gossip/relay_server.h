// The relay side of reverse connections (relay.proto): a reachable member
// serves the Relay service on its own port, next to Peer and Swarm. A
// member that nobody can dial holds Attach open here; a peer that wants to
// reach it opens Connect naming it; the relay asks the attached member for
// an Accept stream and splices Connect and Accept, frame for frame, without
// reading what they carry (the two members' TLS, or plaintext with
// --insecure). It counts the bytes it forwards, per relayed member.
//
// Checks, before anything is forwarded: the caller is admitted (join token,
// per-host rate limit) on every call; the run id of Attach, Connect and
// Accept is this swarm's; an Attach comes from a member of this node's
// table (and, with --tls_bind_node_ids, from the holder of its
// certificate); a Connect names a member attached here; an Accept names a
// connection this relay asked for (a 64-bit random id) and comes from the
// member it was asked of. A Connect whose member does not Accept within
// accept_timeout, or a stream that sends nothing within first_frame_timeout,
// is ended: a stranger holds no thread for long.
//
// Thread model: the service uses gRPC's synchronous API, so each call runs
// on a gRPC thread of its own for its life; a spliced pair of calls pumps
// one direction on each call's thread. One mutex guards the tables; no call
// is made holding it. Shutdown cancels every call in flight, so that the
// server's shutdown is not held up by long-lived streams. Thread-safe.
#ifndef STARLING_GOSSIP_RELAY_SERVER_H_
#define STARLING_GOSSIP_RELAY_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gossip/peer_credentials.h"
#include "starling/peer/v1/relay.grpc.pb.h"

namespace starling {

struct RelayServerOptions {
  std::string run_id;
  PeerCredentials credentials = InsecurePeerCredentials();
  // Whether `id` is a member this node knows (a joining one included).
  std::function<bool(const std::string& id)> is_member;
  absl::Duration accept_timeout = absl::Seconds(5);
  absl::Duration first_frame_timeout = absl::Seconds(10);
  absl::Duration keepalive = absl::Seconds(1);
  // Tests: end each spliced connection once it has forwarded this many
  // bytes, as a relay that drops what it carries would; 0: never.
  int64_t cut_after_bytes = 0;
  // Tests: hold each frame this long before forwarding it, as a slow or
  // malicious relay would.
  absl::Duration delay = absl::ZeroDuration();
};

class RelayServer final : public peer::v1::Relay::Service {
 public:
  explicit RelayServer(RelayServerOptions options);
  ~RelayServer() override;

  grpc::Status Attach(grpc::ServerContext* ctx,
                      const peer::v1::AttachRequest* request,
                      grpc::ServerWriter<peer::v1::RelayEvent>* events) override
      ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status Connect(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<peer::v1::RelayFrame, peer::v1::RelayFrame>*
          stream) override ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status Accept(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<peer::v1::RelayFrame, peer::v1::RelayFrame>*
          stream) override ABSL_LOCKS_EXCLUDED(mu_);

  // Cancels every call in flight and refuses new ones.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // Bytes forwarded so far (both directions, all relayed members), and by
  // relayed member id.
  int64_t forwarded_bytes() const { return forwarded_.load(); }
  std::map<std::string, int64_t> forwarded_by_member() const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Members attached now.
  std::set<std::string> attached() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Stream =
      grpc::ServerReaderWriter<peer::v1::RelayFrame, peer::v1::RelayFrame>;
  struct Pipe;
  struct Attachment {
    int64_t generation = 0;
    std::vector<uint64_t> pending;  // connections to announce
  };

  // A call of the service from its start to its end: registered to be
  // cancelled by Shutdown (not open when shutting down already).
  class CallScope {
   public:
    CallScope(RelayServer* server, grpc::ServerContext* ctx)
        ABSL_LOCKS_EXCLUDED(server->mu_);
    ~CallScope() ABSL_LOCKS_EXCLUDED(server_->mu_);
    bool open() const { return open_; }

   private:
    RelayServer* const server_;
    grpc::ServerContext* const ctx_;
    bool open_ = false;
  };

  // OK when `run_id` is this swarm's; else the refusal to end the call
  // with.
  grpc::Status CheckRun(grpc::ServerContextBase* ctx,
                        const std::string& run_id);
  // Admits a Connect or Accept call (`method`), reads its first frame
  // within first_frame_timeout and checks its run id.
  grpc::Status Open(grpc::ServerContext* ctx, Stream* stream,
                    absl::string_view method, peer::v1::RelayFrame* first)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Writes the data a first frame carried to the other end.
  void ForwardFirst(const peer::v1::RelayFrame& first, Stream* to);
  // Copies frames from `from` into the other end of `pipe` until either
  // end stops, then ends both and waits for the other direction.
  void Pump(const std::shared_ptr<Pipe>& pipe, bool connect_side);
  // Cancels calls that sent no first frame in time (the reaper thread).
  void Reap() ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const RelayServerOptions options_;

  std::atomic<int64_t> forwarded_{0};
  mutable absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, Attachment> attachments_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<Pipe>> pipes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> forwarded_by_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ServerContext*> calls_ ABSL_GUARDED_BY(mu_);
  // Calls still owing their first frame, with their deadline.
  std::map<grpc::ServerContext*, absl::Time> first_due_ ABSL_GUARDED_BY(mu_);
  absl::CondVar changed_;
  std::thread reaper_;
};

}  // namespace starling

#endif  // STARLING_GOSSIP_RELAY_SERVER_H_
