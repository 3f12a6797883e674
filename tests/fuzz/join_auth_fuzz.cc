// Fuzz target for join-token admission (gossip/join_auth.h): JoinAuth::Verify
// on x-starling-auth header values from the input, at clock readings from
// the input, with a small nonce memory so that expiry and eviction are
// reached; also PeerHost on arbitrary peer strings.
// Input: operations, each a u8 opcode and its fields. Opcodes: 0 a raw
// header, 1 a header signed here with the right token ("v1.MS.NONCE.MAC"
// from the input's MS and NONCE, so the fuzzer gets past the HMAC), 2 a
// fresh Stamp, 3 PeerHost, 4 the clock moves.
// Invariants: every refusal is UNAUTHENTICATED; a header that was admitted
// is refused when replayed; a fresh stamp is admitted unless its time is at
// or below the eviction floor (then refused as too old).
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gossip/join_auth.h"
#include "tests/fuzz/fuzz_util.h"

namespace starling {
namespace {

void CheckVerify(JoinAuth& auth, const std::string& header,
                 absl::string_view method, absl::Time now, bool replay) {
  const absl::Status s = auth.Verify(header, method, now);
  FUZZ_CHECK(s.ok() || absl::IsUnauthenticated(s), "Verify: %s",
             s.ToString().c_str());
  if (s.ok() && replay) {
    const absl::Status again = auth.Verify(header, method, now);
    FUZZ_CHECK(absl::IsUnauthenticated(again), "a replay was admitted: %s",
               header.c_str());
  }
}

}  // namespace
}  // namespace starling

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace starling;
  fuzz::Reader in(data, size);
  JoinAuthOptions o;
  o.window = absl::Milliseconds(1 + in.Get<uint16_t>());
  o.max_nonces = 1 + in.Get<uint8_t>() % 8;
  std::shared_ptr<JoinAuth> auth =
      std::move(JoinAuth::FromToken(fuzz::kJoinToken, o)).value();
  absl::Time now = absl::FromUnixMillis(fuzz::kStartMs);
  for (int ops = 0; !in.empty() && ops < 256; ++ops) {
    const uint8_t op = in.Get<uint8_t>();
    const absl::string_view method = fuzz::kJoinMethods[(op >> 4) % 4];
    switch (op % 5) {
      case 0: {
        const std::string header(in.LenBytes(256));
        CheckVerify(*auth, header, method, now, in.Get<uint8_t>() & 1);
        break;
      }
      case 1: {
        int64_t ms = absl::ToUnixMillis(now) + in.Get<int32_t>();
        if (in.Get<uint8_t>() == 0xFF) ms = in.Get<int64_t>();
        const std::string nonce(in.Bytes(32));
        const std::string header =
            absl::StrCat("v1.", ms, ".", nonce, ".",
                         fuzz::JoinMac(fuzz::kJoinToken, method, ms, nonce));
        CheckVerify(*auth, header, method, now, /*replay=*/true);
        break;
      }
      case 2: {
        const std::string header = auth->Stamp(method, now);
        const absl::Status s = auth->Verify(header, method, now);
        FUZZ_CHECK(s.ok() || absl::StrContains(s.message(), "older than"),
                   "a fresh stamp was refused: %s", s.ToString().c_str());
        break;
      }
      case 3:
        (void)PeerHost(in.LenBytes(128));
        break;
      case 4:
        now += absl::Milliseconds(in.Get<int16_t>());
        break;
    }
  }
  return 0;
}
