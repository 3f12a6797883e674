#include "compression/kernels.h"

#include <algorithm>
#include <cstring>

// The hot loops are also compiled for AVX2 and picked at load time (ifunc).
// Every operation is elementwise IEEE arithmetic without FMA contraction, so
// both versions give identical bits.
// Build with -DSTARLING_VECTOR_CLONES= to test the baseline version alone.
#if !defined(STARLING_VECTOR_CLONES) && defined(__x86_64__) && \
    defined(__GNUC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define STARLING_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef STARLING_VECTOR_CLONES
#define STARLING_VECTOR_CLONES
#endif

namespace starling {
namespace compression_internal {
namespace {

static_assert(sizeof(float) == 4, "fp32 must be 4 bytes");

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kExpMask = 0x7f800000u;

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t LoadU16(const char* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t LoadU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Half -> float for finite halves (normal, subnormal or zero).
inline float HalfToFloat(uint16_t h) {
  const uint32_t shifted = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t normal = shifted + ((127u - 15u) << 23);
  // Subnormal: reinterpret the mantissa with exponent 2^-14 and subtract it.
  const float sub = BitsFloat(normal + (1u << 23)) - BitsFloat(113u << 23);
  const uint32_t mag = (shifted & (0x1fu << 23)) == 0 ? FloatBits(sub) : normal;
  return BitsFloat(mag | (static_cast<uint32_t>(h & 0x8000u) << 16));
}

// Software prefetch distance in elements for the streaming quantizer loops
// (16 KiB of fp32 ahead); helps single-thread bandwidth measurably.
constexpr size_t kPrefetchAhead = 4096;

// Round half to even of |v| < 2^22 with the 1.5 * 2^23 magic number.
inline float RoundHalfEven(float v) {
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

// Quantizes one block whose absmax is tiny (levels / absmax would overflow
// float) in double precision. Rare, scalar.
void QuantizeTinyBlock(const float* x, size_t m, float absmax, int levels,
                       int8_t* codes) {
  const double inv = levels / static_cast<double>(absmax);
  constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52
  for (size_t j = 0; j < m; ++j) {
    double v = x[j] * inv;
    v = std::min<double>(std::max<double>(v, -levels), levels);
    const double r = (v + kMagic) - kMagic;
    codes[j] = static_cast<int8_t>(static_cast<int>(r));
  }
}

}  // namespace

// NaN and ±Inf are the values whose 8 exponent bits are all set. Each
// block ORs a flag per value with no early exit, a loop that vectorizes;
// only a block with a hit is searched for its first.
STARLING_VECTOR_CLONES
int64_t Fp32FirstNonFinite(const char* bytes, size_t n) {
  constexpr size_t kChunk = 1024;
  for (size_t start = 0; start < n; start += kChunk) {
    const size_t m = std::min(kChunk, n - start);
    const char* p = bytes + 4 * start;
    uint32_t bad = 0;
    for (size_t j = 0; j < m; ++j) {
      bad |= ((LoadU32(p + 4 * j) & kExpMask) == kExpMask) ? 1u : 0u;
    }
    if (bad != 0) {
      for (size_t j = 0; j < m; ++j) {
        if ((LoadU32(p + 4 * j) & kExpMask) == kExpMask) {
          return static_cast<int64_t>(start + j);
        }
      }
    }
  }
  return -1;
}

STARLING_VECTOR_CLONES
bool Fp16AllFinite(const char* bytes, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    bad |= ((LoadU16(bytes + 2 * i) & 0x7c00u) == 0x7c00u) ? 1u : 0u;
  }
  return bad == 0;
}

STARLING_VECTOR_CLONES
bool Bf16AllFinite(const char* bytes, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    bad |= ((LoadU16(bytes + 2 * i) & 0x7f80u) == 0x7f80u) ? 1u : 0u;
  }
  return bad == 0;
}

STARLING_VECTOR_CLONES
void FloatToFp16(const float* x, size_t n, char* out) {
  for (size_t i = 0; i < n; ++i) {
    float v = x[i];
    v = v > 65504.0f ? 65504.0f : v;
    v = v < -65504.0f ? -65504.0f : v;
    uint32_t f = FloatBits(v);
    const uint32_t sign = f & 0x80000000u;
    f ^= sign;
    // Normal halves: rebias the exponent and round the 13 dropped bits to
    // nearest even.
    const uint32_t mant_odd = (f >> 13) & 1u;
    const uint32_t normal = (f + 0xc8000fffu + mant_odd) >> 13;
    // Subnormal halves (|v| < 2^-14): let the FPU round by adding 0.5.
    const uint32_t sub = FloatBits(BitsFloat(f) + 0.5f) - FloatBits(0.5f);
    const uint16_t h =
        static_cast<uint16_t>((f < (113u << 23) ? sub : normal) | (sign >> 16));
    std::memcpy(out + 2 * i, &h, 2);
  }
}

STARLING_VECTOR_CLONES
void FloatToBf16(const float* x, size_t n, char* out) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = FloatBits(x[i]);
    const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
    uint32_t h = rounded >> 16;
    // Rounding up past the largest finite value gives Inf: saturate instead.
    h = (h & 0x7f80u) == 0x7f80u ? ((h & 0x8000u) | 0x7f7fu) : h;
    const uint16_t h16 = static_cast<uint16_t>(h);
    std::memcpy(out + 2 * i, &h16, 2);
  }
}

// `v`'s exponent bits. A loop keeps the largest over its results (one
// vector max per element, in registers); NaN and ±Inf, and only they, have
// all 8 set: max == kExpMask.
inline uint32_t ExpBits(float v) { return FloatBits(v) & kExpMask; }

STARLING_VECTOR_CLONES
bool Fp16ToFloat(const char* bytes, size_t n, float* out, bool accumulate) {
  uint32_t exp = 0;
  if (accumulate) {
    for (size_t i = 0; i < n; ++i) {
      out[i] += HalfToFloat(LoadU16(bytes + 2 * i));
      exp = std::max(exp, ExpBits(out[i]));
    }
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = HalfToFloat(LoadU16(bytes + 2 * i));
  }
  return exp != kExpMask;
}

STARLING_VECTOR_CLONES
bool Bf16ToFloat(const char* bytes, size_t n, float* out, bool accumulate) {
  uint32_t exp = 0;
  if (accumulate) {
    for (size_t i = 0; i < n; ++i) {
      out[i] += BitsFloat(static_cast<uint32_t>(LoadU16(bytes + 2 * i)) << 16);
      exp = std::max(exp, ExpBits(out[i]));
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      out[i] = BitsFloat(static_cast<uint32_t>(LoadU16(bytes + 2 * i)) << 16);
    }
  }
  return exp != kExpMask;
}

STARLING_VECTOR_CLONES
bool Fp32ToFloat(const char* bytes, size_t n, float* out, bool accumulate) {
  uint32_t exp = 0;
  if (accumulate) {
    for (size_t i = 0; i < n; ++i) {
      out[i] += BitsFloat(LoadU32(bytes + 4 * i));
      exp = std::max(exp, ExpBits(out[i]));
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      out[i] = BitsFloat(LoadU32(bytes + 4 * i));
      exp = std::max(exp, ExpBits(out[i]));
    }
  }
  return exp != kExpMask;
}

STARLING_VECTOR_CLONES
int64_t QuantizeAbsmax(const float* x, size_t n, uint32_t block, int levels,
                       char* absmax_bytes, int8_t* codes) {
  const float flevels = static_cast<float>(levels);
  size_t b = 0;
  for (size_t start = 0; start < n; start += block, ++b) {
    const size_t m = std::min<size_t>(block, n - start);
    const float* xb = x + start;
    int8_t* qb = codes + start;
    for (size_t o = 0; o < m; o += 16) {
      __builtin_prefetch(xb + kPrefetchAhead + o);
    }
    // Max of |x| on the bit patterns: NaN/Inf sort above every finite value.
    uint32_t max_bits = 0;
    for (size_t j = 0; j < m; ++j) {
      const uint32_t a = FloatBits(xb[j]) & kAbsMask;
      max_bits = a > max_bits ? a : max_bits;
    }
    if (max_bits >= kExpMask) {
      return static_cast<int64_t>(start) + FirstNonFinite(xb, m);
    }
    const float absmax = BitsFloat(max_bits);
    std::memcpy(absmax_bytes + 4 * b, &absmax, 4);
    if (max_bits == 0) {
      std::memset(qb, 0, m);
      continue;
    }
    if (absmax < 1e-30f) {
      QuantizeTinyBlock(xb, m, absmax, levels, qb);
      continue;
    }
    const float inv = flevels / absmax;
    for (size_t j = 0; j < m; ++j) {
      float v = xb[j] * inv;
      v = v > flevels ? flevels : v;
      v = v < -flevels ? -flevels : v;
      qb[j] = static_cast<int8_t>(static_cast<int32_t>(RoundHalfEven(v)));
    }
  }
  return -1;
}

bool AbsmaxValid(const char* absmax_bytes, size_t num_blocks) {
  uint32_t bad = 0;
  for (size_t b = 0; b < num_blocks; ++b) {
    // Negative, NaN or Inf: sign bit set or exponent all ones.
    const uint32_t u = LoadU32(absmax_bytes + 4 * b);
    bad |= ((u & 0x80000000u) != 0 || (u & kExpMask) == kExpMask) ? 1u : 0u;
  }
  return bad == 0;
}

STARLING_VECTOR_CLONES
bool DequantizeAbsmax(const char* absmax_bytes, const int8_t* codes, size_t n,
                      uint32_t block, int levels, float* out, bool accumulate) {
  const float flevels = static_cast<float>(levels);
  uint32_t exp = 0;
  size_t b = 0;
  for (size_t start = 0; start < n; start += block, ++b) {
    const size_t m = std::min<size_t>(block, n - start);
    float absmax;
    std::memcpy(&absmax, absmax_bytes + 4 * b, 4);
    const float scale = absmax / flevels;
    const uint32_t pos_bits = FloatBits(absmax);
    const uint32_t neg_bits = pos_bits | 0x80000000u;
    const int8_t* qb = codes + start;
    float* ob = out + start;
    for (size_t o = 0; o < m; o += 64) {
      __builtin_prefetch(qb + kPrefetchAhead + o);
    }
    for (size_t o = 0; o < m; o += 16) {
      __builtin_prefetch(ob + kPrefetchAhead + o, 1);
    }
    // q * scale, except that +-levels decodes to exactly +-absmax so that the
    // block's largest element reconstructs exactly (selected with bit masks,
    // so that it vectorizes and an overflowing levels * scale cannot leak).
    // Corrupt codes below -levels are clamped, so |value| <= absmax.
    for (size_t j = 0; j < m; ++j) {
      int32_t q = qb[j];
      q = q < -levels ? -levels : q;
      const uint32_t is_pos = q == levels ? ~0u : 0u;
      const uint32_t is_neg = q == -levels ? ~0u : 0u;
      const uint32_t bits = FloatBits(static_cast<float>(q) * scale);
      const float v = BitsFloat((bits & ~(is_pos | is_neg)) |
                                (pos_bits & is_pos) | (neg_bits & is_neg));
      if (accumulate) {
        ob[j] += v;
        exp = std::max(exp, ExpBits(ob[j]));
      } else {
        ob[j] = v;
      }
    }
  }
  return exp != kExpMask;
}

void PackNibbles(const int8_t* codes, size_t n, uint8_t* out) {
  const size_t pairs = n / 2;
  for (size_t i = 0; i < pairs; ++i) {
    const uint32_t lo = static_cast<uint32_t>(codes[2 * i] + 8) & 0xfu;
    const uint32_t hi = static_cast<uint32_t>(codes[2 * i + 1] + 8) & 0xfu;
    out[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
  if (n % 2 == 1) {
    out[pairs] =
        static_cast<uint8_t>(static_cast<uint32_t>(codes[n - 1] + 8) & 0xfu);
  }
}

void UnpackNibbles(const uint8_t* packed, size_t n, int8_t* codes) {
  const size_t pairs = n / 2;
  for (size_t i = 0; i < pairs; ++i) {
    codes[2 * i] = static_cast<int8_t>((packed[i] & 0xf) - 8);
    codes[2 * i + 1] = static_cast<int8_t>((packed[i] >> 4) - 8);
  }
  if (n % 2 == 1) codes[n - 1] = static_cast<int8_t>((packed[pairs] & 0xf) - 8);
}

void ShuffleBytes(const char* in, size_t n, int elem_size, char* out) {
  for (int b = 0; b < elem_size; ++b) {
    char* dst = out + static_cast<size_t>(b) * n;
    for (size_t i = 0; i < n; ++i) dst[i] = in[i * elem_size + b];
  }
}

void UnshuffleBytes(const char* in, size_t n, int elem_size, char* out) {
  for (int b = 0; b < elem_size; ++b) {
    const char* src = in + static_cast<size_t>(b) * n;
    for (size_t i = 0; i < n; ++i) out[i * elem_size + b] = src[i];
  }
}

}  // namespace compression_internal
}  // namespace starling
