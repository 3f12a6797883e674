// The raw payload of the sparse codec ("sparse:FRACTION[:CHUNK][+int2|+int3|
// +int4]", compression/codec.h), in the SparseLoCo family: the vector is cut
// into chunks of CHUNK values (4096 by default) and each chunk keeps its
// k = ceil(K · length / CHUNK) values of largest magnitude (K for a full
// chunk, K = max(1, ceil(FRACTION · CHUNK))), exactly, by the radix select
// of topk.h. Each kept value travels as a sign and a magnitude level of
// BITS − 1 bits (2 bits by default), the chunk's 2^(BITS−1) levels as fp32;
// the indices as Rice-coded gaps. Layout, little-endian:
//
//   u8  Rice parameter b (0..24)
//   f32 levels[chunks][L]           L = 2^(BITS−1), ascending, finite, >= 0
//   codes: Σ k_c codes of BITS bits, LSB first: bit BITS−1 the sign, the
//          low bits the level; padded with zero bits to a byte
//   gaps: per chunk, per kept value, g = index − previous index − 1 (the
//         first: the index within the chunk), as g >> b ones, a zero, then
//         the b low bits of g, LSB first; padded with zero bits to a byte
//
// Levels: a chunk whose kept magnitudes take at most L distinct values
// keeps exactly those values; otherwise its sorted magnitudes are split at
// their mean, each half again at its own mean, down to L bins, and a bin's
// level is the mean of its magnitudes (in double). Either way re-encoding
// a decoded chunk scaled by any positive factor gives back the scaled
// values bit for bit (the same indices, the same levels), which is what
// lets a DiLoCo member encode its weighted pack once for every member
// (node/round_exchange.h) after error feedback chose what to send.
//
// Indices are strictly increasing by construction (a gap is >= 0 past the
// previous index), so a payload cannot repeat an index; a decoder refuses an
// index past its chunk, more bits than the kept values need (trailing
// bytes), a unary run longer than the chunk, a bad parameter, and a
// non-finite, negative or unordered level. Pure functions, thread-safe.
#ifndef STARLING_COMPRESSION_SPARSE_CODEC_H_
#define STARLING_COMPRESSION_SPARSE_CODEC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace starling {
namespace compression_internal {

inline constexpr uint32_t kSparseDefaultChunk = 4096;
inline constexpr uint32_t kSparseMaxChunk = 1u << 16;
inline constexpr int kSparseDefaultBits = 2;

// What a sparse payload's header records: the chunk, K for a full chunk and
// the bits per value.
struct SparseShape {
  uint32_t chunk = kSparseDefaultChunk;
  uint64_t k = 1;
  int bits = kSparseDefaultBits;
};

// The header's u64 param for `s` (K in the low 32 bits, the bits above),
// and back; InvalidArgument-free: ParseSparseParam returns false for a
// param no encoder writes (K of 0 or above the chunk, bits not 2, 3 or 4).
uint64_t SparseParam(const SparseShape& s);
bool ParseSparseParam(uint64_t param, uint32_t chunk, SparseShape* s);

// Kept values in a chunk of `length` values: ceil(K · length / chunk),
// at least 1 and at most `length` (0 for an empty chunk).
uint64_t SparseChunkK(const SparseShape& s, uint64_t length);

// Appends the raw payload of x[0, n) to *out. The caller has checked that
// every value is finite.
void SparseEncode(const float* x, size_t n, const SparseShape& s,
                  std::string* out);

// Decodes `raw` (the whole raw payload) into out[0, n): written (zeros off
// the kept indices), or added with `accumulate`. DataLoss naming what is
// wrong with a malformed payload, before anything is written;
// *overflow is set (and OK returned) when an added value became non-finite.
absl::Status SparseDecode(absl::string_view raw, size_t n, const SparseShape& s,
                          float* out, bool accumulate, bool* overflow);

}  // namespace compression_internal
}  // namespace starling

#endif  // STARLING_COMPRESSION_SPARSE_CODEC_H_
