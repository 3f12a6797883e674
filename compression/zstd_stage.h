// The lossless zstd stage of the codecs: a payload compressed as independent
// chunks so that decoding is bounded per chunk. Layout: u32 chunk bytes,
// u32 chunk count, then per chunk u32 frame bytes and one zstd frame.
// Stateless apart from per-thread zstd contexts, so thread-safe.
#ifndef STARLING_COMPRESSION_ZSTD_STAGE_H_
#define STARLING_COMPRESSION_ZSTD_STAGE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace starling {
namespace compression_internal {

// The largest chunk a decoder accepts.
inline constexpr uint32_t kMaxZstdChunkBytes = 64u << 20;

// Appends the chunked zstd encoding of `raw` to `out` and returns true, or
// returns false with `out` unchanged when zstd does not pay: `raw` is empty,
// or the first chunk shrinks by under 3%. `chunk_bytes` is clamped to
// [1, kMaxZstdChunkBytes].
bool ZstdCompressChunks(absl::string_view raw, int level, uint32_t chunk_bytes,
                        std::string* out);

// Decodes `in` (exactly the bytes written by ZstdCompressChunks) into `out`,
// which must be exactly `raw_size` bytes long. DataLoss when the layout,
// a frame or a decoded size is wrong; never writes past `raw_size` bytes.
absl::Status ZstdDecompressChunks(absl::string_view in, size_t raw_size,
                                  char* out);

}  // namespace compression_internal
}  // namespace starling

#endif  // STARLING_COMPRESSION_ZSTD_STAGE_H_
