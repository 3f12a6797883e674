// Decoding hostile bytes: every prefix of a valid payload, random byte flips
// and hand-made bad headers must give an error or finite values, never a
// crash or an out-of-bounds access (run under ASan/UBSan too).
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "gtest/gtest.h"
#include "tests/compression/test_util.h"

namespace starling {
namespace {

using ::starling::testing::Dist;
using ::starling::testing::RandomValues;

const char* const kSpecs[] = {"fp32",
                              "fp32+zstd",
                              "fp16",
                              "fp16+zstd",
                              "bf16+zstd",
                              "int8",
                              "int8:7+zstd",
                              "int8+zstd",
                              "int4",
                              "int4:5+zstd",
                              "topk:0.1",
                              "topk:0.2+int8",
                              "topk:0.1+int8+zstd",
                              "topk:0.3+zstd"};

CodecOptions SmallChunks() {
  CodecOptions options;
  options.zstd_chunk_bytes = 256;  // many chunks, to exercise the framing
  return options;
}

// Decodes `bytes` both ways into fresh heap copies so that ASan sees any
// read past the end of the input.
void DecodeAnything(const Codec& codec, const std::string& bytes, size_t n) {
  const std::string copy(bytes);
  std::vector<float> out(n, 1.0f);
  if (codec.Decode(copy, absl::MakeSpan(out)).ok()) {
    for (float v : out) ASSERT_TRUE(std::isfinite(v)) << codec.Name();
  }
  std::vector<float> acc(n, 0.5f);
  const std::vector<float> before = acc;
  if (!codec.DecodeAccumulate(copy, absl::MakeSpan(acc)).ok()) {
    ASSERT_EQ(acc, before) << codec.Name();
  }
}

TEST(RobustnessTest, EveryPrefixIsAnError) {
  for (const char* spec : kSpecs) {
    auto codec = MakeCodec(spec, SmallChunks());
    ASSERT_TRUE(codec.ok());
    for (size_t n : {0, 1, 37, 1000}) {
      const std::vector<float> x = RandomValues(n, Dist::kOutliers, n + 1);
      absl::StatusOr<std::string> bytes = (*codec)->Encode(x);
      ASSERT_TRUE(bytes.ok());
      for (size_t len = 0; len < bytes->size(); ++len) {
        // A right-sized heap buffer per prefix, so ASan catches overreads.
        std::unique_ptr<char[]> prefix(new char[len + 1]);
        std::memcpy(prefix.get(), bytes->data(), len);
        std::vector<float> out(n);
        absl::Status s = (*codec)->Decode(absl::string_view(prefix.get(), len),
                                          absl::MakeSpan(out));
        ASSERT_FALSE(s.ok()) << spec << " n=" << n << " len=" << len;
        std::vector<float> acc(n, 2.0f);
        s = (*codec)->DecodeAccumulate(absl::string_view(prefix.get(), len),
                                       absl::MakeSpan(acc));
        ASSERT_FALSE(s.ok());
        for (float v : acc) ASSERT_EQ(v, 2.0f);
      }
      // Trailing bytes are an error too.
      std::vector<float> out(n);
      EXPECT_FALSE((*codec)->Decode(*bytes + "x", absl::MakeSpan(out)).ok());
    }
  }
}

TEST(RobustnessTest, RandomCorruptionNeverCrashes) {
  std::mt19937_64 rng(42);
  for (const char* spec : kSpecs) {
    auto codec = MakeCodec(spec, SmallChunks());
    ASSERT_TRUE(codec.ok());
    for (size_t n : {1, 64, 1000, 5000}) {
      const std::vector<float> x = RandomValues(n, Dist::kNormal, n);
      absl::StatusOr<std::string> bytes = (*codec)->Encode(x);
      ASSERT_TRUE(bytes.ok());
      for (int trial = 0; trial < 300; ++trial) {
        std::string corrupt = *bytes;
        const int flips = 1 + static_cast<int>(rng() % 4);
        for (int f = 0; f < flips; ++f) {
          // Half the flips hit the header, where the sizes live.
          const size_t pos = (rng() % 2 == 0) ? rng() % 28 : rng();
          corrupt[pos % corrupt.size()] ^= static_cast<char>(1 + rng() % 255);
        }
        DecodeAnything(**codec, corrupt, n);
        if (HasFatalFailure()) return;
      }
    }
  }
}

void PutU32(std::string* s, size_t pos, uint32_t v) {
  std::memcpy(&(*s)[pos], &v, 4);
}
void PutU64(std::string* s, size_t pos, uint64_t v) {
  std::memcpy(&(*s)[pos], &v, 8);
}

TEST(RobustnessTest, HostileHeaderFields) {
  for (const char* spec : kSpecs) {
    auto codec = MakeCodec(spec, SmallChunks());
    ASSERT_TRUE(codec.ok());
    const std::vector<float> x = RandomValues(300, Dist::kNormal, 3);
    absl::StatusOr<std::string> bytes = (*codec)->Encode(x);
    ASSERT_TRUE(bytes.ok());
    const uint64_t big[] = {0,   1,          255,        299,   300,
                            301, 1ull << 31, 1ull << 32, ~0ull, ~0ull - 27};
    for (uint64_t v : big) {
      std::string b = *bytes;
      PutU32(&b, 4, static_cast<uint32_t>(v));  // block
      DecodeAnything(**codec, b, 300);
      b = *bytes;
      PutU64(&b, 16, v);  // param (k)
      DecodeAnything(**codec, b, 300);
      b = *bytes;
      PutU32(&b, 24, static_cast<uint32_t>(v));  // payload bytes
      DecodeAnything(**codec, b, 300);
      b = *bytes;
      PutU64(&b, 8, v);  // count
      std::vector<float> out(300);
      EXPECT_FALSE((*codec)->Decode(b, absl::MakeSpan(out)).ok() && v != 300);
      if (b.size() > 36) {
        b = *bytes;
        PutU32(&b, 28, static_cast<uint32_t>(v));  // zstd chunk size / data
        DecodeAnything(**codec, b, 300);
        b = *bytes;
        PutU32(&b, 32, static_cast<uint32_t>(v));  // zstd chunk count / data
        DecodeAnything(**codec, b, 300);
      }
    }
    for (int flags = 0; flags < 256; ++flags) {
      std::string b = *bytes;
      b[3] = static_cast<char>(flags);
      DecodeAnything(**codec, b, 300);
    }
    for (int id = 0; id < 256; ++id) {
      std::string b = *bytes;
      b[1] = static_cast<char>(id);
      DecodeAnything(**codec, b, 300);
    }
  }
}

}  // namespace
}  // namespace starling
