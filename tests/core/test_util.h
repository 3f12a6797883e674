// Helpers shared by the tests: temporary directories and small data files.
#ifndef STARLING_TESTS_CORE_TEST_UTIL_H_
#define STARLING_TESTS_CORE_TEST_UTIL_H_

#include <stdlib.h>
#include <zlib.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "gtest/gtest.h"

namespace starling::testing {

// A fresh directory under $TEST_TMPDIR (scripts/test.sh sets one per run and
// removes it when every test passed) or /tmp.
inline std::string TempDir() {
  const char* base = getenv("TEST_TMPDIR");
  std::string tmpl =
      absl::StrCat(base && *base ? base : "/tmp", "/starling_test.XXXXXX");
  char* made = mkdtemp(tmpl.data());
  EXPECT_NE(made, nullptr);
  return tmpl;
}

// Deterministic English-like text of about `bytes` bytes.
inline std::string SampleText(size_t bytes) {
  static const char* kWords[] = {"the ",   "lord ", "said ",   "unto ",
                                 "moses ", "and ",  "behold ", "light ",
                                 "was ",   "good. "};
  std::string out;
  uint64_t x = 12345;
  while (out.size() < bytes) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    out += kWords[(x >> 33) % 10];
  }
  out.resize(bytes);
  return out;
}

inline void WriteGzip(const std::string& path, const std::string& data) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, data.data(), static_cast<unsigned>(data.size())),
            static_cast<int>(data.size()));
  gzclose(f);
}

inline std::string BigEndian32(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}

// An idx file of unsigned bytes with the given dims and payload.
inline std::string IdxBytes(const std::vector<uint32_t>& dims,
                            const std::string& payload) {
  std::string out = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (uint32_t d : dims) out += BigEndian32(d);
  return out + payload;
}

// Writes a tiny Fashion-MNIST-shaped directory: n_train/n_test images whose
// pixels encode their label, so a model can learn it quickly.
inline void WriteTinyFmnist(const std::string& dir, uint32_t n_train,
                            uint32_t n_test) {
  for (auto [prefix, n] :
       {std::pair<std::string, uint32_t>{"train", n_train}, {"t10k", n_test}}) {
    std::string images, labels;
    for (uint32_t i = 0; i < n; ++i) {
      uint8_t label = static_cast<uint8_t>(i % 10);
      labels += static_cast<char>(label);
      for (int p = 0; p < 28 * 28; ++p) {
        char pixel =
            static_cast<char>((p / 28 == label * 2) ? 255 : (p * 7) % 50);
        if (p == 0) pixel = static_cast<char>(i & 0xff);  // unique per image
        if (p == 1) pixel = static_cast<char>(i >> 8);
        images += pixel;
      }
    }
    WriteGzip(absl::StrCat(dir, "/", prefix, "-images-idx3-ubyte.gz"),
              IdxBytes({n, 28, 28}, images));
    WriteGzip(absl::StrCat(dir, "/", prefix, "-labels-idx1-ubyte.gz"),
              IdxBytes({n}, labels));
  }
}

}  // namespace starling::testing

#endif  // STARLING_TESTS_CORE_TEST_UTIL_H_
