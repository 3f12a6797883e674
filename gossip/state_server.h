// The state a member serves to joiners, and the donor's end of the
// FetchState stream. The training thread hands over its state after each
// commit (Serve); the state thread encodes, compresses and hashes it
// (StateBlob) and then serves it in place of the previous one. A request
// is answered from the state served at that moment, from the offset the
// joiner asks for when it names the same digest (a transfer resumed from
// another donor), and refused at once (FailedPrecondition) when the joiner
// asks for a round the served state has not reached, or for a lineage it
// is behind.
// Thread-safety: thread-safe. One mutex guards the state handed over and
// the one served; encoding runs with it released.
#ifndef STARLING_GOSSIP_STATE_SERVER_H_
#define STARLING_GOSSIP_STATE_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "gossip/peer_credentials.h"
#include "gossip/peer_limits.h"
#include "gossip/state_transfer.h"
#include "starling/peer/v1/swarm.pb.h"

namespace starling {

class StateServer {
 public:
  // `deadlines` watches the streams; the thread runs until `stopping`
  // turns true (then Wake it, and Join).
  StateServer(std::string run_id, int64_t chunk_bytes,
              PeerCredentials credentials,
              std::shared_ptr<StreamDeadlines> deadlines,
              const std::atomic<bool>* stopping);
  ~StateServer() { Join(); }

  void Start();
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);
  void Join();

  // Swarm::ServeState and Swarm::ServedRound.
  void Serve(SwarmState state) ABSL_LOCKS_EXCLUDED(mu_);
  int64_t ServedRound() const ABSL_LOCKS_EXCLUDED(mu_);

  // The FetchState handler: the reactor that streams the served state (or
  // refuses the request).
  grpc::ServerWriteReactor<peer::v1::StateChunk>* Open(
      grpc::CallbackServerContext* ctx, const peer::v1::StateRequest* req)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string run_id_;
  const int64_t chunk_bytes_;
  const PeerCredentials credentials_;
  const std::shared_ptr<StreamDeadlines> deadlines_;
  const std::atomic<bool>* const stopping_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  // Handed over by Serve, for the thread to encode.
  std::unique_ptr<SwarmState> to_serve_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const StateBlob> served_ ABSL_GUARDED_BY(mu_);
};

}  // namespace starling

#endif  // STARLING_GOSSIP_STATE_SERVER_H_
