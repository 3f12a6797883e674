// Random inputs for the compression tests: seeded generators for the value
// distributions the codecs see (normal, uniform, with outliers, all negative).
// Header-only, no shared state.
#ifndef STARLING_TESTS_COMPRESSION_TEST_UTIL_H_
#define STARLING_TESTS_COMPRESSION_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace starling {
namespace testing {

enum class Dist { kNormal, kUniform, kOutliers, kNegative, kTies };

inline const char* DistName(Dist d) {
  switch (d) {
    case Dist::kNormal:
      return "normal";
    case Dist::kUniform:
      return "uniform";
    case Dist::kOutliers:
      return "outliers";
    case Dist::kNegative:
      return "negative";
    case Dist::kTies:
      return "ties";
  }
  return "?";
}

inline std::vector<float> RandomValues(size_t n, Dist dist, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    switch (dist) {
      case Dist::kNormal:
        v[i] = normal(rng) * 1e-3f;
        break;
      case Dist::kUniform:
        v[i] = uniform(rng);
        break;
      case Dist::kOutliers:
        v[i] = normal(rng) * (unit(rng) < 0.01f ? 1000.0f : 1.0f);
        break;
      case Dist::kNegative:
        v[i] = -std::abs(normal(rng)) - 1e-3f;
        break;
      case Dist::kTies: {
        // Few distinct magnitudes, both zeros.
        const int q = static_cast<int>(std::lround(normal(rng) * 2.0f));
        v[i] = q == 0 ? (unit(rng) < 0.5f ? 0.0f : -0.0f)
                      : static_cast<float>(q) * 0.25f;
        break;
      }
    }
  }
  return v;
}

inline bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}

}  // namespace testing
}  // namespace starling

#endif  // STARLING_TESTS_COMPRESSION_TEST_UTIL_H_
