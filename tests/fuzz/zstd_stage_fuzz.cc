// Fuzz target for the chunked zstd stage decoder (compression/zstd_stage.h),
// which the codecs and the state transfer run on received bytes.
// Input: u32 raw size (taken modulo 1 MiB), then the chunked zstd bytes.
// Invariants: the decoder writes only the raw size it is given (the buffer
// is exactly that long, so ASan sees any write past it), and what it decodes
// compresses and decodes back to the same bytes.
#include <cstdint>
#include <memory>
#include <string>

#include "compression/zstd_stage.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace starling;
  namespace ci = compression_internal;
  fuzz::Reader in(data, size);
  const size_t raw_size = in.Get<uint32_t>() % (1u << 20);
  const absl::string_view bytes = in.Rest();
  // Heap-allocated at exactly raw_size so that ASan catches an overflow.
  std::unique_ptr<char[]> out(new char[raw_size == 0 ? 1 : raw_size]);
  const absl::Status s = ci::ZstdDecompressChunks(bytes, raw_size, out.get());
  if (!s.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(s) || absl::IsInternal(s), "%s",
               s.ToString().c_str());
    return 0;
  }
  const absl::string_view raw(out.get(), raw_size);
  std::string again;
  if (!ci::ZstdCompressChunks(raw, 1, 4096, &again)) return 0;
  std::unique_ptr<char[]> back(new char[raw_size == 0 ? 1 : raw_size]);
  const absl::Status sb = ci::ZstdDecompressChunks(again, raw_size, back.get());
  FUZZ_CHECK(sb.ok(), "round trip: %s", sb.ToString().c_str());
  FUZZ_CHECK(absl::string_view(back.get(), raw_size) == raw,
             "round trip changed the bytes");
  return 0;
}
