// Fuzz target for the state-transfer reassembler (gossip/state_transfer.h):
// StateChunk protos fed to StateAssembler::Add as Swarm::FetchState does,
// and Finish (digest check, blob decoding, zstd stage, DecodeSwarmState)
// whenever the assembler is complete, and once more at the end.
// Input: u8 fix-ups, then records of a u32 length and a serialized
// StateChunk. Fix-ups let the fuzzer past the hashes a random input never
// matches: bit0 sets each chunk's checksum to ChunkChecksum(data), bit1
// sets every digest to that of all chunks' data joined, bit2 sets every
// total_bytes to the joined size, bit3 sets each offset to the bytes before
// the chunk.
// Invariants: errors have the documented codes; a decoded state is
// consistent (finite theta whose FlatHash is the lineage, round and step
// >= 0) and survives StateBlob::Make and reassembly unchanged; the
// assembler is empty after every Finish.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/flat_params.h"
#include "gossip/state_transfer.h"
#include "starling/peer/v1/swarm.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace starling {
namespace {

void CheckEmpty(const StateAssembler& a) {
  FUZZ_CHECK(a.next_offset() == 0 && a.digest().empty() && !a.complete(),
             "assembler not empty after Finish");
}

void CheckState(const SwarmState& s) {
  FUZZ_CHECK(s.round >= 0 && s.step >= 0, "round %lld step %lld",
             static_cast<long long>(s.round), static_cast<long long>(s.step));
  for (float v : s.theta) FUZZ_CHECK(std::isfinite(v), "theta %f", v);
  FUZZ_CHECK(s.lineage == FlatHash(s.theta), "lineage does not match theta");
  // What a donor would serve for it reassembles to the same state.
  std::shared_ptr<const StateBlob> blob = StateBlob::Make(s);
  StateAssembler again;
  const std::string& b = blob->bytes();
  const absl::Status add = again.Add(
      blob->digest(), static_cast<int64_t>(b.size()), 0, b, ChunkChecksum(b));
  FUZZ_CHECK(add.ok(), "re-add: %s", add.ToString().c_str());
  absl::StatusOr<SwarmState> back = again.Finish();
  FUZZ_CHECK(back.ok(), "re-finish: %s", back.status().ToString().c_str());
  FUZZ_CHECK(
      back->round == s.round && back->step == s.step &&
          back->lineage == s.lineage && back->outer_state == s.outer_state &&
          back->theta.size() == s.theta.size() &&
          (s.theta.empty() || std::memcmp(back->theta.data(), s.theta.data(),
                                          4 * s.theta.size()) == 0),
      "state changed through StateBlob::Make and reassembly");
}

void Finish(StateAssembler& a) {
  absl::StatusOr<SwarmState> s = a.Finish();
  CheckEmpty(a);
  if (!s.ok()) {
    FUZZ_CHECK(
        absl::IsDataLoss(s.status()) || absl::IsInvalidArgument(s.status()),
        "Finish: %s", s.status().ToString().c_str());
    return;
  }
  CheckState(*s);
}

}  // namespace
}  // namespace starling

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace starling;
  fuzz::Reader in(data, size);
  const uint8_t fix = in.Get<uint8_t>();
  std::vector<peer::v1::StateChunk> chunks;
  while (!in.empty() && chunks.size() < 64) {
    const absl::string_view bytes = in.LenBytes();
    peer::v1::StateChunk c;
    if (c.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      chunks.push_back(std::move(c));
    }
  }
  std::string joined;
  for (const auto& c : chunks) joined += c.data();
  int64_t offset = 0;
  for (auto& c : chunks) {
    if (fix & 1) c.set_checksum(ChunkChecksum(c.data()));
    if (fix & 2) {
      c.set_digest(
          absl::StrFormat("%016x", HashBytes(joined.data(), joined.size())));
    }
    if (fix & 4) c.set_total_bytes(static_cast<int64_t>(joined.size()));
    if (fix & 8) c.set_offset(offset);
    offset += static_cast<int64_t>(c.data().size());
  }

  // Bounded as a joiner of a model of up to 2^20 parameters bounds it
  // (Swarm::FetchState): a blob may not make it allocate more.
  StateAssembler a(MaxStateBytesFor(1 << 20));
  for (const auto& c : chunks) {
    const absl::Status s =
        a.Add(c.digest(), c.total_bytes(), c.offset(), c.data(), c.checksum());
    if (!s.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s) ||
                     absl::IsDataLoss(s),
                 "Add: %s", s.ToString().c_str());
    }
    FUZZ_CHECK(a.next_offset() >= 0, "next_offset %lld",
               static_cast<long long>(a.next_offset()));
    if (a.complete()) Finish(a);
  }
  Finish(a);
  return 0;
}
