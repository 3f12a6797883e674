#include "compression/sparse_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "compression/topk.h"

namespace starling {
namespace compression_internal {
namespace {

constexpr int kMaxRice = 24;

// Bits appended LSB first to a string.
class BitWriter {
 public:
  explicit BitWriter(std::string* out) : out_(out) {}
  void Put(uint32_t value, int width) {
    acc_ |= static_cast<uint64_t>(value) << used_;
    used_ += width;
    while (used_ >= 8) {
      out_->push_back(static_cast<char>(acc_ & 0xff));
      acc_ >>= 8;
      used_ -= 8;
    }
  }
  void PutOnes(uint64_t count) {
    for (; count >= 16; count -= 16) Put(0xffff, 16);
    Put((1u << count) - 1, static_cast<int>(count));
  }
  // Pads the last byte with zero bits.
  void Flush() {
    if (used_ > 0) out_->push_back(static_cast<char>(acc_ & 0xff));
    acc_ = 0;
    used_ = 0;
  }

 private:
  std::string* out_;
  uint64_t acc_ = 0;
  int used_ = 0;
};

// Bits read LSB first from [p, end); false once past the end.
class BitReader {
 public:
  BitReader(const unsigned char* p, const unsigned char* end)
      : p_(p), end_(end) {}
  bool Get(int width, uint32_t* value) {
    while (used_ < width) {
      if (p_ == end_) return false;
      acc_ |= static_cast<uint64_t>(*p_++) << used_;
      used_ += 8;
    }
    *value = static_cast<uint32_t>(acc_ & ((uint64_t{1} << width) - 1));
    acc_ >>= width;
    used_ -= width;
    return true;
  }
  // Ones up to the next zero, at most `limit` of them: false past the end or
  // the limit.
  bool Unary(uint64_t limit, uint64_t* count) {
    uint64_t q = 0;
    for (;;) {
      uint32_t bit;
      if (!Get(1, &bit)) return false;
      if (bit == 0) break;
      if (++q > limit) return false;
    }
    *count = q;
    return true;
  }
  // Only zero padding left in the current byte, and no byte after it.
  bool AtPaddedEnd() const { return p_ == end_ && acc_ == 0; }

 private:
  const unsigned char* p_;
  const unsigned char* end_;
  uint64_t acc_ = 0;
  int used_ = 0;
};

// Bits of the Rice code of gap g with parameter b.
uint64_t RiceBits(uint32_t g, int b) { return (g >> b) + 1 + b; }

// The chunk's levels (L of them, ascending) and each kept value's level,
// from the kept magnitudes `mags` (see the header).
void ChunkLevels(const std::vector<float>& mags, int levels_count,
                 float* levels, std::vector<uint8_t>* level_of) {
  const size_t k = mags.size();
  level_of->assign(k, 0);
  std::vector<uint32_t> order(k);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return mags[a] < mags[b]; });
  size_t distinct = 0;
  for (size_t i = 0; i < k; ++i) {
    if (i == 0 || mags[order[i]] != mags[order[i - 1]]) ++distinct;
  }
  if (distinct <= static_cast<size_t>(levels_count)) {
    int level = -1;
    for (size_t i = 0; i < k; ++i) {
      if (i == 0 || mags[order[i]] != mags[order[i - 1]]) {
        levels[++level] = mags[order[i]];
      }
      (*level_of)[order[i]] = static_cast<uint8_t>(level);
    }
    for (int l = level + 1; l < levels_count; ++l) {
      levels[l] = level < 0 ? 0.0f : levels[level];
    }
    return;
  }
  // Split [lo, hi) of the sorted magnitudes at their mean, `depth` times.
  std::vector<bool> empty(levels_count, false);
  auto mean = [&](size_t lo, size_t hi) {
    double sum = 0;
    for (size_t i = lo; i < hi; ++i) sum += mags[order[i]];
    return sum / static_cast<double>(hi - lo);
  };
  auto split = [&](auto&& self, size_t lo, size_t hi, int depth,
                   int first) -> void {
    if (depth == 0) {
      empty[first] = lo == hi;
      levels[first] = lo == hi ? 0.0f : static_cast<float>(mean(lo, hi));
      for (size_t i = lo; i < hi; ++i) {
        (*level_of)[order[i]] = static_cast<uint8_t>(first);
      }
      return;
    }
    size_t mid = hi;
    if (lo < hi) {
      const double m = mean(lo, hi);
      mid = lo;
      while (mid < hi && static_cast<double>(mags[order[mid]]) <= m) ++mid;
    }
    self(self, lo, mid, depth - 1, first);
    self(self, mid, hi, depth - 1, first + (1 << (depth - 1)));
  };
  int depth = 0;
  while ((1 << depth) < levels_count) ++depth;
  split(split, 0, k, depth, 0);
  for (int l = 0; l < levels_count; ++l) {
    if (empty[l]) levels[l] = l == 0 ? 0.0f : levels[l - 1];
  }
}

absl::Status Malformed(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("sparse payload: ", what));
}

}  // namespace

uint64_t SparseParam(const SparseShape& s) {
  return s.k | (static_cast<uint64_t>(s.bits) << 32);
}

bool ParseSparseParam(uint64_t param, uint32_t chunk, SparseShape* s) {
  const uint64_t k = param & 0xffffffffu;
  const uint64_t bits = param >> 32;
  if (chunk == 0 || chunk > kSparseMaxChunk || k == 0 || k > chunk ||
      bits < 2 || bits > 4) {
    return false;
  }
  s->chunk = chunk;
  s->k = k;
  s->bits = static_cast<int>(bits);
  return true;
}

uint64_t SparseChunkK(const SparseShape& s, uint64_t length) {
  if (length == 0) return 0;
  const uint64_t k = (s.k * length + s.chunk - 1) / s.chunk;
  return std::clamp<uint64_t>(k, 1, length);
}

void SparseEncode(const float* x, size_t n, const SparseShape& s,
                  std::string* out) {
  const int levels_count = 1 << (s.bits - 1);
  const size_t chunks = (n + s.chunk - 1) / s.chunk;
  std::vector<float> levels(chunks * levels_count, 0.0f);
  std::vector<uint8_t> codes;
  std::vector<uint32_t> gaps;
  std::vector<float> mags;
  std::vector<uint8_t> level_of;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = c * s.chunk;
    const size_t length = std::min<size_t>(s.chunk, n - begin);
    const std::vector<uint32_t> idx = TopKIndices(
        absl::MakeConstSpan(x + begin, length), SparseChunkK(s, length));
    mags.resize(idx.size());
    for (size_t j = 0; j < idx.size(); ++j)
      mags[j] = std::abs(x[begin + idx[j]]);
    ChunkLevels(mags, levels_count, &levels[c * levels_count], &level_of);
    int64_t prev = -1;
    for (size_t j = 0; j < idx.size(); ++j) {
      const bool negative = std::signbit(x[begin + idx[j]]);
      codes.push_back(
          static_cast<uint8_t>(level_of[j] | (negative ? levels_count : 0)));
      gaps.push_back(static_cast<uint32_t>(idx[j] - prev - 1));
      prev = idx[j];
    }
  }
  // The Rice parameter that makes the gaps shortest.
  int best = 0;
  uint64_t best_bits = UINT64_MAX;
  for (int b = 0; b <= kMaxRice; ++b) {
    uint64_t bits = 0;
    for (uint32_t g : gaps) bits += RiceBits(g, b);
    if (bits < best_bits) {
      best_bits = bits;
      best = b;
    }
  }
  out->push_back(static_cast<char>(best));
  out->append(reinterpret_cast<const char*>(levels.data()),
              levels.size() * sizeof(float));
  BitWriter w(out);
  for (uint8_t code : codes) w.Put(code, s.bits);
  w.Flush();
  for (uint32_t g : gaps) {
    w.PutOnes(g >> best);
    w.Put(0, 1);
    if (best > 0) w.Put(g & ((1u << best) - 1), best);
  }
  w.Flush();
}

absl::Status SparseDecode(absl::string_view raw, size_t n, const SparseShape& s,
                          float* out, bool accumulate, bool* overflow) {
  *overflow = false;
  const int levels_count = 1 << (s.bits - 1);
  const size_t chunks = (n + s.chunk - 1) / s.chunk;
  uint64_t kept = 0;
  for (size_t c = 0; c < chunks; ++c) {
    kept += SparseChunkK(s, std::min<size_t>(s.chunk, n - c * s.chunk));
  }
  const size_t levels_bytes = chunks * levels_count * sizeof(float);
  const size_t codes_bytes = (kept * s.bits + 7) / 8;
  if (raw.size() < 1 + levels_bytes + codes_bytes) {
    return Malformed(absl::StrCat("truncated: ", raw.size(), " bytes, ", kept,
                                  " values need at least ",
                                  1 + levels_bytes + codes_bytes));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(raw.data());
  const int rice = p[0];
  if (rice > kMaxRice) {
    return Malformed(
        absl::StrCat("Rice parameter ", rice, " is over ", kMaxRice));
  }
  std::vector<float> levels(chunks * levels_count);
  if (levels_bytes > 0) std::memcpy(levels.data(), p + 1, levels_bytes);
  for (size_t i = 0; i < levels.size(); ++i) {
    const bool first = i % levels_count == 0;
    if (!std::isfinite(levels[i]) || levels[i] < 0 ||
        (!first && levels[i] < levels[i - 1])) {
      return Malformed(absl::StrCat("bad level ", levels[i], " in chunk ",
                                    i / levels_count));
    }
  }
  const unsigned char* codes_at = p + 1 + levels_bytes;
  BitReader codes(codes_at, codes_at + codes_bytes);
  BitReader gaps(codes_at + codes_bytes, p + raw.size());
  std::vector<uint32_t> index(kept);
  std::vector<float> value(kept);
  size_t j = 0;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = c * s.chunk;
    const size_t length = std::min<size_t>(s.chunk, n - begin);
    const uint64_t k = SparseChunkK(s, length);
    int64_t prev = -1;
    for (uint64_t i = 0; i < k; ++i, ++j) {
      uint64_t q = 0;
      uint32_t low = 0;
      if (!gaps.Unary((length - 1) >> rice, &q) ||
          (rice > 0 && !gaps.Get(rice, &low))) {
        return Malformed(absl::StrCat("index ", i, " of chunk ", c,
                                      " is truncated or past the chunk"));
      }
      const uint64_t at = static_cast<uint64_t>(prev + 1) + ((q << rice) | low);
      if (at >= length) {
        return Malformed(absl::StrCat("index ", at, " out of range in chunk ",
                                      c, " of ", length, " values"));
      }
      prev = static_cast<int64_t>(at);
      uint32_t code = 0;
      codes.Get(s.bits, &code);  // sized above
      const float level =
          levels[c * levels_count + (code & (levels_count - 1))];
      index[j] = static_cast<uint32_t>(begin + at);
      value[j] = (code & levels_count) != 0 ? -level : level;
    }
  }
  if (!gaps.AtPaddedEnd() || !codes.AtPaddedEnd()) {
    return Malformed("more bits than the kept values need");
  }
  if (!accumulate) {
    std::fill(out, out + n, 0.0f);
    for (size_t i = 0; i < kept; ++i) out[index[i]] = value[i];
    return absl::OkStatus();
  }
  bool finite = true;
  for (size_t i = 0; i < kept; ++i) {
    out[index[i]] += value[i];
    finite &= std::isfinite(out[index[i]]);
  }
  *overflow = !finite;
  return absl::OkStatus();
}

}  // namespace compression_internal
}  // namespace starling
