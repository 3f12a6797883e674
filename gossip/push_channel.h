// Push-sum gossip's transfers (--algo=gossip), both ends: Push streams a
// share (y, w) to one live member in chunks, through the emulated link
// when one shapes it; the Push handler checks each chunk as it arrives
// (PushAssembler), takes pushes only from other members it knows, turns a
// relative push into the sender's model (PublicCopies) and deposits it in
// the bounded inbox (push_inbox.h), which the training thread drains. A
// push stream that stalls past push_timeout is cancelled, so no inbox
// place is held forever.
// Thread-safety: thread-safe. The inbox and the copies guard themselves;
// the counters are atomics; no lock is held across a call.
#ifndef STARLING_GOSSIP_PUSH_CHANNEL_H_
#define STARLING_GOSSIP_PUSH_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "compression/tensor_policy.h"
#include "gossip/link_shaper.h"
#include "gossip/membership.h"
#include "gossip/peer_limits.h"
#include "gossip/push_inbox.h"
#include "gossip/push_sum.h"
#include "gossip/swarm_client.h"
#include "starling/peer/v1/swarm.pb.h"

namespace starling {

class PushChannel {
 public:
  struct Options {
    std::string node_id;
    std::string run_id;
    std::string algo;
    // As in SwarmOptions.
    int64_t push_elements = 0;
    const PolicyCodec* push_codec = nullptr;
    int push_inbox = 8;
    absl::Duration push_timeout = absl::Seconds(30);
    int64_t chunk_bytes = 1 << 20;
    std::shared_ptr<LinkEmulator> links;
  };
  // `membership` and `client` must outlive it; `deadlines` watches the
  // incoming streams.
  PushChannel(Options options, const Membership* membership,
              SwarmClient* client, std::shared_ptr<StreamDeadlines> deadlines);

  // Swarm::Push.
  absl::Status Push(const std::string& peer_id, const PushShare& share,
                    absl::Duration timeout, int64_t* sequence);
  // The Push handler: the reactor that receives one push.
  grpc::ServerReadReactor<peer::v1::PushChunk>* Receive(
      grpc::CallbackServerContext* ctx, peer::v1::PushAck* ack);

  // The pushes received since the last call, in arrival order.
  std::vector<ReceivedPush> Take() { return inbox_.Take(); }
  // Drops the copy of a member that died or left.
  void Forget(const std::string& id) { copies_.Forget(id); }

  int64_t refused() const { return refused_.load(); }
  int64_t bytes_sent() const { return sent_.load(); }
  int64_t bytes_received() const { return received_.load(); }

 private:
  class Reader;
  // The chunk size of a push of `share` to `peer_id` at `address` over the
  // emulated `link`, or why the link cannot carry it.
  absl::StatusOr<int64_t> ChunkBytes(const std::string& peer_id,
                                     const std::string& address,
                                     const LinkShaper& link,
                                     const PushShare& share,
                                     absl::Duration timeout);
  // Streams `chunks` to `peer_id` at `address` by `deadline`.
  absl::Status Stream(const std::string& peer_id, const std::string& address,
                      LinkShaper* link,
                      const std::vector<peer::v1::PushChunk>& chunks,
                      absl::Time deadline);

  const Options options_;
  const Membership* const membership_;
  SwarmClient* const client_;
  const std::shared_ptr<StreamDeadlines> deadlines_;
  PushInbox inbox_;
  PublicCopies copies_;  // the senders' models, for relative pushes
  std::atomic<int64_t> sequence_{0};
  std::atomic<int64_t> sent_{0};
  std::atomic<int64_t> received_{0};
  std::atomic<int64_t> refused_{0};
};

}  // namespace starling

#endif  // STARLING_GOSSIP_PUSH_CHANNEL_H_
