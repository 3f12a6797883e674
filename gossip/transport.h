// The transport interface the collectives (ring_allreduce.h) are written
// against, as gloo's are against its transport: a rank among `world`
// members sends whole messages to another rank's mailbox and takes what
// arrives from its own. Also an in-process implementation for tests that
// run N ranks as threads. GrpcTransport (grpc_transport.h) is the real one.
// Ownership: a transport owns its mailbox; a caller of SendPayload keeps
// the payload unchanged until it returns (see `owner` for longer).
// Thread-safety: implementations are thread-safe; several threads may send
// at once (AllGatherWhole sends to every peer in parallel).
#ifndef STARLING_GOSSIP_TRANSPORT_H_
#define STARLING_GOSSIP_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gossip/mailbox.h"

namespace starling {

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int world() const = 0;

  // Delivers `m` (with m.from == rank()) into rank `to`'s mailbox before
  // `deadline`. Returns the receiver's rejection (InvalidArgument /
  // FailedPrecondition, naming what was wrong) or Unavailable /
  // DeadlineExceeded naming the peer.
  virtual absl::Status Send(int to, const Message& m, absl::Time deadline) = 0;

  // Send with the payload apart from `header` (whose own payload is
  // ignored), so that a transport can stream it without first copying it
  // into a Message. `payload` must stay unchanged until this returns.
  //
  // `owner`, when not null, owns the memory `payload` lies in. A transport
  // may then send straight from that memory, with no copy at all, and keep
  // a reference to `owner` after this returns: after an error, gRPC may
  // still hold bytes of the failed call queued for its socket (they go to
  // a cancelled stream, which the receiver never completes). So the memory
  // must live as long as `owner` does, and a caller that writes into it
  // again should first hold the only reference, or use fresh memory. When
  // `owner` is null, the bytes are copied before they leave. The default
  // copies and calls Send.
  virtual absl::Status SendPayload(int to, const Message& header,
                                   absl::string_view payload,
                                   const std::shared_ptr<const void>& owner,
                                   absl::Time deadline);

  // This rank's inbox.
  virtual Mailbox& mailbox() = 0;

  // Bytes put on / taken off the wire so far (payload plus framing).
  virtual int64_t bytes_sent() const = 0;
  virtual int64_t bytes_received() const = 0;
};

// N ranks in one process: Send delivers straight into the peer's mailbox.
// Byte counts are payload bytes.
class InProcessNetwork {
 public:
  InProcessNetwork(int world, const MailboxOptions& options);
  Transport& transport(int rank) { return *transports_[rank]; }

 private:
  class Endpoint;
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;
  std::vector<std::unique_ptr<Transport>> transports_;
};

}  // namespace starling

#endif  // STARLING_GOSSIP_TRANSPORT_H_
