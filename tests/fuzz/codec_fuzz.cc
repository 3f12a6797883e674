// Fuzz target for the codec decoders (compression/codec.h): Decode and
// DecodeAccumulate of every codec kind on arbitrary bytes.
// Input: u8 codec selector (fp32, fp16, bf16, int8, int4, top-k), then the
// encoded payload. The destination gets the element count the payload's
// header claims (when it is small), so that decoding gets past the size check.
// Invariants: a successful decode is finite; DecodeAccumulate adds exactly
// the decoded values, fails exactly when a sum overflows (some accumulator
// elements are 3e38), and leaves the accumulator untouched on any other
// error; the decoded values re-encode,
// and the half-precision and fp32 codecs round-trip them bit for bit.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "tests/fuzz/fuzz_util.h"

namespace starling {
namespace {

constexpr int kNumSpecs = fuzz::Count(fuzz::kCodecSpecs);
constexpr uint64_t kMaxElements = 1 << 16;

struct Codecs {
  std::unique_ptr<Codec> plain[kNumSpecs];
  std::unique_ptr<Codec> zstd[kNumSpecs];
};

const Codecs& GetCodecs() {
  static const Codecs* codecs = [] {
    auto* c = new Codecs;
    for (int i = 0; i < kNumSpecs; ++i) {
      c->plain[i] = std::move(MakeCodec(fuzz::kCodecSpecs[i])).value();
      c->zstd[i] =
          std::move(MakeCodec(std::string(fuzz::kCodecSpecs[i]) + "+zstd"))
              .value();
    }
    return c;
  }();
  return *codecs;
}

// The element count to decode into: the header's when it is small, else a
// small count (which exercises the size check).
size_t ElementCount(absl::string_view payload) {
  if (payload.size() >= 28) {
    uint64_t count;
    std::memcpy(&count, payload.data() + 8, 8);
    return count <= kMaxElements ? count : count % 97;
  }
  return payload.size() % 13;
}

}  // namespace
}  // namespace starling

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace starling;
  fuzz::Reader in(data, size);
  const int which = in.Get<uint8_t>() % kNumSpecs;
  const absl::string_view payload = in.Rest();
  const Codec& codec = *GetCodecs().plain[which];
  const size_t n = ElementCount(payload);

  std::vector<float> out(n, 7.0f);
  const absl::Status s = codec.Decode(payload, absl::MakeSpan(out));

  std::vector<float> acc(n);
  for (size_t i = 0; i < n; ++i) acc[i] = fuzz::AccumulatorBase(i);
  const std::vector<float> base = acc;
  const absl::Status sa = codec.DecodeAccumulate(payload, absl::MakeSpan(acc));
  if (!s.ok()) {
    FUZZ_CHECK(!sa.ok(), "Decode: %s; DecodeAccumulate: OK",
               s.ToString().c_str());
    FUZZ_CHECK(fuzz::SameBits(acc, base),
               "DecodeAccumulate changed acc on error");
    return 0;
  }
  fuzz::CheckAccumulated(out, base, acc, sa);

  // The decoded values re-encode, with and without the zstd stage.
  for (const Codec* enc :
       {GetCodecs().plain[which].get(), GetCodecs().zstd[which].get()}) {
    absl::StatusOr<std::string> again = enc->Encode(out);
    FUZZ_CHECK(again.ok(), "re-encode with %s: %s", enc->Name().c_str(),
               again.status().ToString().c_str());
    std::vector<float> back(n, 7.0f);
    const absl::Status sb = codec.Decode(*again, absl::MakeSpan(back));
    FUZZ_CHECK(sb.ok(), "decode of re-encoded %s: %s", enc->Name().c_str(),
               sb.ToString().c_str());
    if (which <= 2) {  // fp32, fp16, bf16: decoded values are representable
      FUZZ_CHECK(fuzz::SameBits(back, out),
                 "%s does not round-trip its own values", enc->Name().c_str());
    }
  }
  return 0;
}
