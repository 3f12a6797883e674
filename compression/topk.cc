#include "compression/topk.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <iterator>

namespace starling {
namespace {

inline uint32_t AbsKey(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u & 0x7fffffffu;
}

// Keys are 31 bits: level 0 looks at bits 30..20, level 1 at 19..10, level 2
// at 9..0.
constexpr int kShift[3] = {20, 10, 0};
constexpr uint32_t kMask[3] = {0x7ffu, 0x3ffu, 0x3ffu};

// Given a histogram, the bin holding the `need`-th largest key (need >= 1),
// and how many keys lie in higher bins.
void FindBin(const uint32_t* hist, int bins, uint64_t need, uint32_t* bin,
             uint64_t* greater) {
  uint64_t above = 0;
  for (int b = bins - 1; b >= 0; --b) {
    if (above + hist[b] >= need) {
      *bin = static_cast<uint32_t>(b);
      *greater = above;
      return;
    }
    above += hist[b];
  }
  // Unreachable when need <= total.
  *bin = 0;
  *greater = above;
}

}  // namespace

uint64_t TopKCount(double fraction, uint64_t n) {
  if (n == 0) return 0;
  if (!(fraction > 0)) return 1;
  // The tiny shrink keeps e.g. 0.07 * 100 = 7.000000000000001 at 7.
  const double p = std::ceil(fraction * static_cast<double>(n) * (1 - 1e-12));
  if (p >= static_cast<double>(n)) return n;
  return std::max<uint64_t>(1, static_cast<uint64_t>(p));
}

std::vector<uint32_t> TopKIndices(absl::Span<const float> x, uint64_t k) {
  const size_t n = x.size();
  std::vector<uint32_t> result;
  if (k == 0 || n == 0) return result;
  if (k >= n) {
    result.resize(n);
    for (size_t i = 0; i < n; ++i) result[i] = static_cast<uint32_t>(i);
    return result;
  }
  const float* data = x.data();

  // Level 0 histogram over the whole input; four interleaved tables keep
  // repeated bins from serializing on one counter.
  std::vector<uint32_t> hists(4 * 2048, 0);
  uint32_t* h0 = hists.data();
  uint32_t* h1 = h0 + 2048;
  uint32_t* h2 = h1 + 2048;
  uint32_t* h3 = h2 + 2048;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    ++h0[AbsKey(data[i]) >> 20];
    ++h1[AbsKey(data[i + 1]) >> 20];
    ++h2[AbsKey(data[i + 2]) >> 20];
    ++h3[AbsKey(data[i + 3]) >> 20];
  }
  for (; i < n; ++i) ++h0[AbsKey(data[i]) >> 20];
  for (int b = 0; b < 2048; ++b) h0[b] += h1[b] + h2[b] + h3[b];
  uint32_t bin0;
  uint64_t greater0;
  FindBin(h0, 2048, k, &bin0, &greater0);

  // Collect the indices above the bin (all selected) and inside it (the
  // candidates), both ascending. Sizes are known, so writes are branchless
  // into buffers with one spare slot.
  std::vector<uint32_t> above(greater0 + 1);
  std::vector<uint32_t> cand(static_cast<size_t>(h0[bin0]) + 1);
  {
    uint32_t* ap = above.data();
    uint32_t* cp = cand.data();
    size_t na = 0, nc = 0;
    auto collect = [&](size_t j) {
      const uint32_t top = AbsKey(data[j]) >> 20;
      ap[na] = static_cast<uint32_t>(j);
      na += top > bin0 ? 1 : 0;
      cp[nc] = static_cast<uint32_t>(j);
      nc += top == bin0 ? 1 : 0;
    };
    // Most groups of 16 hold no key at or above the bin: test them with a
    // vectorized OR and skip them.
    const uint32_t low = bin0 << 20;
    constexpr size_t kGroup = 16;
    size_t j = 0;
    for (; j + kGroup <= n; j += kGroup) {
      uint32_t hit = 0;
      for (size_t g = 0; g < kGroup; ++g) {
        hit |= AbsKey(data[j + g]) >= low ? 1u : 0u;
      }
      if (hit != 0) {
        for (size_t g = 0; g < kGroup; ++g) collect(j + g);
      }
    }
    for (; j < n; ++j) collect(j);
    above.resize(na);
    cand.resize(nc);
  }

  // Narrow the threshold key inside the candidates, 10 bits at a time.
  uint64_t need = k - greater0;  // >= 1
  uint32_t threshold = bin0 << 20;
  std::vector<uint32_t> level = cand;
  std::vector<uint32_t> next;
  for (int lv = 1; lv < 3; ++lv) {
    std::array<uint32_t, 1024> hist{};
    for (uint32_t idx : level) {
      ++hist[(AbsKey(data[idx]) >> kShift[lv]) & kMask[lv]];
    }
    uint32_t bin;
    uint64_t greater;
    FindBin(hist.data(), 1024, need, &bin, &greater);
    need -= greater;
    threshold |= bin << kShift[lv];
    next.clear();
    for (uint32_t idx : level) {
      if (((AbsKey(data[idx]) >> kShift[lv]) & kMask[lv]) == bin) {
        next.push_back(idx);
      }
    }
    level.swap(next);
  }
  // Now `need` elements equal to the threshold are taken, lowest index first;
  // every candidate above the threshold is taken.
  std::vector<uint32_t> chosen;
  chosen.reserve(k - greater0);
  uint64_t eq_taken = 0;
  for (uint32_t idx : cand) {
    const uint32_t key = AbsKey(data[idx]);
    if (key > threshold) {
      chosen.push_back(idx);
    } else if (key == threshold && eq_taken < need) {
      chosen.push_back(idx);
      ++eq_taken;
    }
  }
  result.reserve(k);
  std::merge(above.begin(), above.end(), chosen.begin(), chosen.end(),
             std::back_inserter(result));
  return result;
}

}  // namespace starling
