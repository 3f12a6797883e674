// Exact top-k selection by magnitude for the top-k codec: a radix select on
// the bit patterns of |x| (a histogram pass and a collection pass over the
// input, then passes over the few candidates), no full sort. Stateless, so
// thread-safe.
#ifndef STARLING_COMPRESSION_TOPK_H_
#define STARLING_COMPRESSION_TOPK_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace starling {

// k = max(1, ceil(fraction * n)) clamped to n; 0 when n == 0.
uint64_t TopKCount(double fraction, uint64_t n);

// The indices, ascending, of the k elements with the largest |x|; among equal
// magnitudes the lower index wins, so the set is deterministic. +0 and -0 are
// equal. Requires no NaN in `x` (callers reject NaN/Inf first) and
// x.size() <= 2^32.
std::vector<uint32_t> TopKIndices(absl::Span<const float> x, uint64_t k);

}  // namespace starling

#endif  // STARLING_COMPRESSION_TOPK_H_
