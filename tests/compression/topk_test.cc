#include "compression/topk.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "tests/compression/test_util.h"

namespace starling {
namespace {

using ::starling::testing::Dist;
using ::starling::testing::DistName;
using ::starling::testing::RandomValues;

// Reference: stable sort by |x| descending (ties keep the lower index), take
// k, sort the indices.
std::vector<uint32_t> SortReference(const std::vector<float>& x, uint64_t k) {
  std::vector<uint32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return std::abs(x[a]) > std::abs(x[b]);
  });
  order.resize(std::min<uint64_t>(k, x.size()));
  std::sort(order.begin(), order.end());
  return order;
}

TEST(TopKTest, CountRule) {
  EXPECT_EQ(TopKCount(0.01, 0), 0u);
  EXPECT_EQ(TopKCount(0.01, 1), 1u);
  EXPECT_EQ(TopKCount(0.01, 10), 1u);
  EXPECT_EQ(TopKCount(0.01, 100), 1u);
  EXPECT_EQ(TopKCount(0.01, 101), 2u);
  EXPECT_EQ(TopKCount(0.07, 100), 7u);
  EXPECT_EQ(TopKCount(0.01, 10000000), 100000u);
  EXPECT_EQ(TopKCount(1.0, 12345), 12345u);
  EXPECT_EQ(TopKCount(0.5, 3), 2u);
}

TEST(TopKTest, MatchesSortReference) {
  uint64_t seed = 1;
  for (size_t n : {1, 2, 3, 17, 100, 1000, 4099, 65536, 100003}) {
    for (Dist dist : {Dist::kNormal, Dist::kUniform, Dist::kOutliers,
                      Dist::kNegative, Dist::kTies}) {
      const std::vector<float> x = RandomValues(n, dist, seed++);
      for (double fraction : {0.0001, 0.01, 0.1, 0.5, 0.999, 1.0}) {
        const uint64_t k = TopKCount(fraction, n);
        ASSERT_EQ(TopKIndices(x, k), SortReference(x, k))
            << "n=" << n << " " << DistName(dist) << " k=" << k;
      }
    }
  }
}

TEST(TopKTest, TiesPreferLowerIndex) {
  std::vector<float> x(1000, 1.0f);
  x[500] = -1.0f;
  x[7] = 0.0f;
  EXPECT_EQ(TopKIndices(x, 10),
            (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 8, 9, 10}));
  const std::vector<float> zeros = {0.0f, -0.0f, 0.0f, -0.0f};
  EXPECT_EQ(TopKIndices(zeros, 2), (std::vector<uint32_t>{0, 1}));
  // Values that differ only in their low bits.
  std::vector<float> close(100);
  for (size_t i = 0; i < close.size(); ++i) {
    close[i] = std::nextafter(1.0f, 2.0f) * ((i % 3) == 0 ? 1.0f : -1.0f);
    if (i % 5 == 0) close[i] = std::nextafter(close[i], 0.0f);
  }
  EXPECT_EQ(TopKIndices(close, 30), SortReference(close, 30));
}

TEST(TopKTest, ExtremesAndEmpty) {
  EXPECT_TRUE(TopKIndices({}, 0).empty());
  EXPECT_TRUE(TopKIndices(std::vector<float>{1.0f}, 0).empty());
  const std::vector<float> x = {3e38f, -1e-45f, 0.0f, -3.4e38f, 1e-40f};
  EXPECT_EQ(TopKIndices(x, 2), (std::vector<uint32_t>{0, 3}));
  EXPECT_EQ(TopKIndices(x, 4), (std::vector<uint32_t>{0, 1, 3, 4}));
  EXPECT_EQ(TopKIndices(x, 9), (std::vector<uint32_t>{0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace starling
