// The state a member serves to joiners, and the donor's end of the
// FetchState stream. The training thread hands over its state after each
// commit (Serve). Encoding it (StateBlob: encoded, compressed, hashed)
// costs about three more copies of θ_global and the outer state at once,
// so it is done only when a joiner asks: the first request for a state
// waits while the state thread encodes it, and later requests for the
// same state share the blob. A request is answered from the newest state
// handed over, from the offset the joiner asks for when it names the same
// digest (a transfer resumed from another donor), and refused at once
// (FailedPrecondition) when the joiner asks for a round the state has not
// reached, or for a lineage it is behind.
// Thread-safety: thread-safe. One mutex guards the state handed over, its
// blob and the requests waiting for one; encoding, and starting or
// refusing the waiting streams, run with it released.
#ifndef STARLING_GOSSIP_STATE_SERVER_H_
#define STARLING_GOSSIP_STATE_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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

  // Swarm::ServeState and Swarm::ServedRound (the round of the state
  // handed over, -1 before the first).
  void Serve(SwarmState state) ABSL_LOCKS_EXCLUDED(mu_);
  int64_t ServedRound() const ABSL_LOCKS_EXCLUDED(mu_);

  // The FetchState handler: the reactor that streams the served state (or
  // refuses the request).
  grpc::ServerWriteReactor<peer::v1::StateChunk>* Open(
      grpc::CallbackServerContext* ctx, const peer::v1::StateRequest* req)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Writer;

  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Hands `blob` (null: the server is closing) to every waiting request.
  void StartWaiting(const std::shared_ptr<const StateBlob>& blob)
      ABSL_LOCKS_EXCLUDED(mu_);

  const std::string run_id_;
  const int64_t chunk_bytes_;
  const PeerCredentials credentials_;
  const std::shared_ptr<StreamDeadlines> deadlines_;
  const std::atomic<bool>* const stopping_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  // The newest state handed over by Serve.
  std::shared_ptr<const SwarmState> latest_ ABSL_GUARDED_BY(mu_);
  // latest_'s blob, once a request has asked for it.
  std::shared_ptr<const StateBlob> served_ ABSL_GUARDED_BY(mu_);
  // Requests waiting for served_. Only the state thread ends them (a
  // reactor lives until it finishes), so the pointers stay valid.
  std::vector<Writer*> waiting_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;  // the state thread has ended
};

}  // namespace starling

#endif  // STARLING_GOSSIP_STATE_SERVER_H_
