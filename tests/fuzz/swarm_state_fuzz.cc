// Fuzz target for the swarm-state decoder (gossip/state_transfer.h
// DecodeSwarmState), which a joiner runs on the state a donor sent.
// Input: the encoded state, as is.
// Invariants: errors are DataLoss or InvalidArgument; a decoded state is
// consistent (finite theta, NaN-free buffers, FlatHash(theta, buffers) is
// the lineage, round and step >= 0) and EncodeSwarmState gives back exactly the
// input bytes (the layout is canonical).
#include <cmath>
#include <cstdint>
#include <string>

#include "core/flat_params.h"
#include "gossip/state_transfer.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace starling;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<SwarmState> s = DecodeSwarmState(bytes);
  if (!s.ok()) {
    FUZZ_CHECK(
        absl::IsDataLoss(s.status()) || absl::IsInvalidArgument(s.status()),
        "%s", s.status().ToString().c_str());
    return 0;
  }
  FUZZ_CHECK(s->round >= 0 && s->step >= 0, "round or step < 0");
  for (float v : s->theta) FUZZ_CHECK(std::isfinite(v), "theta %f", v);
  for (float v : s->buffers) FUZZ_CHECK(!std::isnan(v), "buffer NaN");
  FUZZ_CHECK(s->lineage == FlatHash(s->theta, s->buffers),
             "lineage != FlatHash(theta, buffers)");
  FUZZ_CHECK(EncodeSwarmState(*s) == bytes,
             "decoded state does not re-encode to the same bytes");
  return 0;
}
