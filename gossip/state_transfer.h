// What a joiner fetches from an up-to-date member, and the pieces of the
// transfer that need no network: the state's byte layout, the donor's
// compressed blob served in checksummed chunks, and the joiner's assembler,
// which verifies every chunk, can resume at a byte offset (from another donor
// serving the same digest) and checks the whole blob before decoding it.
// The gRPC stream lives in gossip/state_server.h (the donor's end) and
// gossip/state_fetch.h (the joiner's).
// Thread-compatible: StateBlob is immutable after Make (safe to share);
// StateAssembler is used by one thread.
#ifndef STARLING_GOSSIP_STATE_TRANSFER_H_
#define STARLING_GOSSIP_STATE_TRANSFER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace starling {

// The swarm's state at the start of a round.
struct SwarmState {
  int64_t round = 0;          // the next round to run
  int64_t step = 0;           // inner steps done per member (LR position)
  std::string lineage;        // FlatHash of theta and buffers
  int64_t member_rounds = 0;  // the lineage's weight (Swarm::Lineage)
  std::vector<float> theta;   // θ_global
  // The model's buffers (BatchNorm's running statistics...) as the round
  // left them, flat (core/flat_params.h); empty for a model without.
  std::vector<float> buffers;
  std::string outer_state;  // OuterOptimizer::SaveState()
};

// Self-describing little-endian layout with a magic and version.
std::string EncodeSwarmState(const SwarmState& s);
// DataLoss naming the field when `bytes` is truncated, has a bad magic or
// version, or sizes that do not add up; InvalidArgument when `lineage` does
// not match FlatHash(theta, buffers), theta holds NaN/Inf, buffers hold NaN
// (an infinity is a mask's), the round is outside
// [0, kMaxRound] (gossip/membership.h), member_rounds outside [0,
// kMaxMemberRounds] or the step outside [0, INT_MAX].
absl::StatusOr<SwarmState> DecodeSwarmState(absl::string_view bytes);

// The donor side: the encoded state, zstd-compressed once.
class StateBlob {
 public:
  static std::shared_ptr<const StateBlob> Make(const SwarmState& s);

  int64_t round() const { return round_; }
  const std::string& lineage() const { return lineage_; }
  int64_t member_rounds() const { return member_rounds_; }
  // 16 hex digits of HashBytes over the compressed bytes.
  const std::string& digest() const { return digest_; }
  const std::string& bytes() const { return bytes_; }  // compressed
  int64_t raw_bytes() const { return raw_bytes_; }     // before compression

 private:
  int64_t round_ = 0;
  std::string lineage_;
  int64_t member_rounds_ = 0;
  std::string digest_;
  std::string bytes_;
  int64_t raw_bytes_ = 0;
};

// HashBytes of a chunk's data, as carried in StateChunk.checksum.
uint64_t ChunkChecksum(absl::string_view data);

// The joiner side.
class StateAssembler {
 public:
  // `max_raw_bytes`: the most the decompressed state may claim; a blob
  // announcing more is refused before anything that size is allocated.
  explicit StateAssembler(int64_t max_raw_bytes = int64_t{4} << 30)
      : max_raw_bytes_(max_raw_bytes) {}

  // Offers one chunk. The first chunk (or one with a different digest, from
  // a donor that moved on) fixes the digest and total and restarts at offset
  // 0 (FailedPrecondition if its offset is not 0). DataLoss when the checksum
  // does not match (the caller fetches again from next_offset()),
  // InvalidArgument when the offset is not next_offset() or the chunk runs
  // past total_bytes, which must be in (0, 4 GiB].
  absl::Status Add(const std::string& digest, int64_t total_bytes,
                   int64_t offset, absl::string_view data, uint64_t checksum);

  const std::string& digest() const { return digest_; }
  int64_t next_offset() const { return static_cast<int64_t>(bytes_.size()); }
  bool complete() const {
    return total_ > 0 && static_cast<int64_t>(bytes_.size()) == total_;
  }

  // Verifies the digest of the whole blob, decompresses and decodes it.
  // DataLoss when incomplete or corrupt (and the assembler resets);
  // DecodeSwarmState's InvalidArgument passes through. The assembler is empty
  // again after every Finish, successful or not.
  absl::StatusOr<SwarmState> Finish();

 private:
  const int64_t max_raw_bytes_;
  std::string digest_;
  int64_t total_ = 0;
  std::string bytes_;
};

// A bound on the encoded state of a model with `parameters` values (θ, its
// buffers and the outer optimizer's state, with room to spare), for
// StateAssembler.
int64_t MaxStateBytesFor(int64_t parameters);

}  // namespace starling

#endif  // STARLING_GOSSIP_STATE_TRANSFER_H_
