// The client side of the SendChunks stream: one mailbox message cut into
// serialized TensorChunks (ChunkSerializer) and written to a peer in one
// call under a deadline (WriteChunks), through the emulated link when there
// is one (its latency once before the call, its rate before each chunk).
// Raw payloads with an owner go out from the memory they lie in, with no
// copy; others are copied once into slices gRPC owns.
// Ownership: the caller keeps the payload unchanged until WriteChunks
// returns; gRPC may hold `owner` longer (see Transport::SendPayload).
// Thread-safety: ChunkSerializer is not thread-safe; WriteChunks may run on
// many threads at once and blocks its own until the call is over.
#ifndef STARLING_GOSSIP_CHUNK_WRITER_H_
#define STARLING_GOSSIP_CHUNK_WRITER_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gossip/link_shaper.h"
#include "gossip/mailbox.h"
#include "gossip/peer_credentials.h"
#include "starling/peer/v1/peer.pb.h"

namespace grpc {
class Channel;
namespace internal {
class RpcMethod;
}  // namespace internal
}  // namespace grpc

namespace starling {

// The header fields of every chunk of message `m` (all but the offset), for
// a payload of `payload_bytes`, sent in run `run_id` by an attempt whose
// plan digest is `plan` (0 outside elastic rounds).
peer::v1::TensorChunk ChunkHeaderFor(const Message& m,
                                     const std::string& run_id, uint64_t plan,
                                     int64_t payload_bytes);

// Cuts a message's payload into serialized TensorChunks: the header fields,
// then field `data`'s key and length, then the bytes (the wire format
// protobuf writes, with `data` last: see kChunkDataTag). With an `owner` of
// the payload's memory, a chunk's bytes go out from where they lie, in a
// slice that holds a reference to `owner` for as long as gRPC keeps it;
// without one, they are copied once into a slice that gRPC owns.
class ChunkSerializer {
 public:
  // `payload` and `owner` (may be null) must outlive the serializer.
  ChunkSerializer(peer::v1::TensorChunk header, absl::string_view payload,
                  const std::shared_ptr<const void>& owner, size_t step);

  // The next chunk into *out; returns its size in bytes on the wire.
  int64_t Next(grpc::ByteBuffer* out);
  // Whether every chunk has been cut (a message has at least one).
  bool done() const { return written_ > 0 && offset_ >= payload_.size(); }
  int written() const { return written_; }

 private:
  peer::v1::TensorChunk header_;
  const absl::string_view payload_;
  const std::shared_ptr<const void>& owner_;
  const size_t step_;
  size_t offset_ = 0;
  int written_ = 0;
};

// One message's SendChunks call to a peer.
struct ChunkStream {
  grpc::Channel* channel = nullptr;
  // SendChunks as a raw (ByteBuffer) client-streaming method on `channel`.
  const grpc::internal::RpcMethod* method = nullptr;
  const PeerCredentials* credentials = nullptr;  // signs the call
  int64_t chunk_bytes = 1 << 20;                 // payload bytes per chunk
  absl::Time deadline = absl::InfinitePast();
  // The emulated link to the peer, or null.
  LinkShaper* link = nullptr;
  // The attempt the message belongs to, or null: calling it off ends the
  // call in flight and the link's waits, rather than leaving them to the
  // deadline on a peer that hangs with its connection open.
  std::shared_ptr<Mailbox> attempt;
  // CrashPoint("send") once the first chunk is written (test faults).
  bool crash_after_first = false;
  std::atomic<int64_t>* bytes_sent = nullptr;  // adds bytes put on the wire
};

struct ChunkStreamStatus {
  // Not OK when the emulated link could not carry the message by the
  // deadline (DeadlineExceeded) or its waits were called off (Cancelled);
  // the call was then not made, or cancelled.
  absl::Status link;
  // The call's status, when `link` is OK: OK once the receiver acked.
  grpc::Status call;
};

// Streams `payload` (with `owner`, see ChunkSerializer) in chunks carrying
// `header`'s fields, over one SendChunks call.
ChunkStreamStatus WriteChunks(const ChunkStream& stream,
                              peer::v1::TensorChunk header,
                              absl::string_view payload,
                              const std::shared_ptr<const void>& owner);

}  // namespace starling

#endif  // STARLING_GOSSIP_CHUNK_WRITER_H_
