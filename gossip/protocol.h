// The peer protocol's constants and the identity two nodes compare at the
// handshake: what members must agree on before they exchange tensors. The
// messages are protos/starling/peer/v1/peer.proto; a message's TensorChunk
// stream is cut by gossip/chunk_writer.h and read by gossip/chunk_reader.h.
// Constants and pure functions: thread-safe.
#ifndef STARLING_GOSSIP_PROTOCOL_H_
#define STARLING_GOSSIP_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "starling/peer/v1/peer.pb.h"

namespace starling {

// 2: lineages carry a weight (member_rounds) that orders them at one round,
// and the swarm state holds it; a node of version 1 would order them apart.
// 3: a model's buffers travel in DiLoCo's round contributions, ddp's
// gradient all-reduce and the swarm state, and TorchScript models are
// identified by content.
// 4: round messages carry round tokens and plans a secret (round_protocol.h);
// a node of version 3 sends neither, and its READYs would be refused.
inline constexpr uint32_t kProtocolVersion = 4;

// Elastic rounds (gossip/swarm.h) number the mailbox sequence of a round's
// attempt as round * kAttemptsPerRound + attempt. A receiver holds a
// message that arrives before its attempt is installed when it is at most
// kEarlyRounds rounds ahead.
inline constexpr int kAttemptsPerRound = 1 << 20;
inline constexpr int64_t kEarlyRounds = 4;
// kEarlyRounds in sequence numbers. A whole round at least: a sender one
// round ahead that were refused would send again (4% more ring bytes in the
// default sim).
inline constexpr int64_t kEarlyWindow = kEarlyRounds * kAttemptsPerRound;

// Every chunk of a message but the last carries at least this many bytes
// (senders cut chunks of --chunk_bytes >= 1 KiB): a receiver refuses a
// message in more than segment_bytes / kMinChunkBytes + 2 chunks, so a flood
// of tiny or empty chunks cannot pin it.
inline constexpr int64_t kMinChunkBytes = 256;

// The key of TensorChunk's `data` field on the wire (length-delimited).
// Senders write `data` after every other field, so a receiver parses the
// header and then takes the bytes where they lie; nothing may follow them.
inline constexpr uint32_t kChunkDataTag =
    (static_cast<uint32_t>(peer::v1::TensorChunk::kDataFieldNumber) << 3) | 2;

// What a node tells its peers about itself; peers must match it exactly.
struct PeerIdentity {
  std::string run_id;
  std::string algo;  // "diloco" or "ddp"
  int world = 1;
  std::string compression = "fp32";  // members must use the same codec
  std::string aggregate = "mean";    // and the same --aggregate/--norm_bound
  peer::v1::ModelFingerprint model;
};

// Fingerprint fields for a flat fp32 model; `tensors` its TensorSignature
// (core/model.h).
peer::v1::ModelFingerprint MakeFingerprint(
    const std::string& architecture, int64_t parameters,
    const std::string& init_hash, const std::vector<std::string>& tensors = {});

// The handshake of a node with `identity` that listens on `address`.
peer::v1::HandshakeRequest MakeHandshakeRequest(const PeerIdentity& identity,
                                                const std::string& address);

// Why `theirs` may not join a run with `mine`: empty when compatible,
// otherwise a message naming every field that differs, and for a model
// the first tensor that differs. The message is read on both ends (this
// node logs it and returns it to the peer), so with `my_address` (this
// node's --listen) each value is labelled with the address of the node
// that holds it, not as "peer" and "this node".
std::string HandshakeMismatch(const peer::v1::HandshakeRequest& theirs,
                              const PeerIdentity& mine,
                              const std::string& my_address = "");

}  // namespace starling

#endif  // STARLING_GOSSIP_PROTOCOL_H_
