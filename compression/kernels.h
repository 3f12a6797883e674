// Internal element kernels behind the codecs: NaN/Inf scan, fp16/bf16
// conversion, blockwise absmax quantization, nibble packing and byte shuffle.
// Plain loops written to auto-vectorize (round half to even via the magic
// number trick, no lrintf). Stateless, so thread-safe. Byte inputs may be
// unaligned; they are read with memcpy.
#ifndef STARLING_COMPRESSION_KERNELS_H_
#define STARLING_COMPRESSION_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace starling {
namespace compression_internal {

// Levels each side of zero for the absmax quantizers.
inline constexpr int kInt8Levels = 127;
inline constexpr int kInt4Levels = 7;

// Index of the first NaN or Inf among the n little-endian fp32 values at
// `bytes`, or -1 when all are finite.
int64_t Fp32FirstNonFinite(const char* bytes, size_t n);
inline int64_t FirstNonFinite(const float* x, size_t n) {
  return Fp32FirstNonFinite(reinterpret_cast<const char*>(x), n);
}

// Whether no fp32 / fp16 / bf16 value in the n little-endian elements at
// `bytes` is NaN or Inf.
inline bool Fp32AllFinite(const char* bytes, size_t n) {
  return Fp32FirstNonFinite(bytes, n) < 0;
}
bool Fp16AllFinite(const char* bytes, size_t n);
bool Bf16AllFinite(const char* bytes, size_t n);

// fp32 -> IEEE half, round to nearest even, saturating at +-65504 (never Inf).
// Inputs must be finite. Writes 2n little-endian bytes.
void FloatToFp16(const float* x, size_t n, char* out);
// fp32 -> bfloat16, round to nearest even, saturating at the largest finite
// bf16 (never Inf). Inputs must be finite. Writes 2n little-endian bytes.
void FloatToBf16(const float* x, size_t n, char* out);

// fp16 / bf16 / fp32 bytes -> float: out[i] = v (or out[i] += v when
// `accumulate`). fp16/bf16 inputs must hold no NaN/Inf (check with
// *AllFinite). Returns false when a sum overflowed to ±Inf, or for fp32 when
// a value written is NaN/Inf (a non-finite input too), checked in the same
// pass; every element is still written.
bool Fp16ToFloat(const char* bytes, size_t n, float* out, bool accumulate);
bool Bf16ToFloat(const char* bytes, size_t n, float* out, bool accumulate);
bool Fp32ToFloat(const char* bytes, size_t n, float* out, bool accumulate);

// Blockwise absmax quantization with `levels` steps each side of zero:
// absmax[b] = max |x| over block b, q = round_half_even(x * levels / absmax)
// in [-levels, levels]. Writes ceil(n / block) absmax values (little-endian
// fp32) to `absmax_bytes` and n codes. Returns the index of the first NaN/Inf
// (outputs are then partial), or -1.
int64_t QuantizeAbsmax(const float* x, size_t n, uint32_t block, int levels,
                       char* absmax_bytes, int8_t* codes);

// Inverse of QuantizeAbsmax: x = q * absmax / levels, and exactly +-absmax
// for q = +-levels. The absmax values must be finite and >= 0 (check with
// AbsmaxValid). Returns false when `accumulate` and a sum overflowed to
// ±Inf (every element is still written).
bool DequantizeAbsmax(const char* absmax_bytes, const int8_t* codes, size_t n,
                      uint32_t block, int levels, float* out, bool accumulate);
bool AbsmaxValid(const char* absmax_bytes, size_t num_blocks);

// Packs int4 codes in [-8, 7] two per byte (element 2i in the low nibble,
// stored as q + 8); an odd count leaves the last high nibble 0.
void PackNibbles(const int8_t* codes, size_t n, uint8_t* out);
void UnpackNibbles(const uint8_t* packed, size_t n, int8_t* codes);

// Byte shuffle of n elements of `elem_size` bytes: byte b of element i goes
// to out[b * n + i]. Unshuffle is the inverse.
void ShuffleBytes(const char* in, size_t n, int elem_size, char* out);
void UnshuffleBytes(const char* in, size_t n, int elem_size, char* out);

}  // namespace compression_internal
}  // namespace starling

#endif  // STARLING_COMPRESSION_KERNELS_H_
