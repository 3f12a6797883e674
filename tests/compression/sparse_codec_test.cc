// The sparse codec (compression/sparse_codec.h through MakeCodec): which
// values it keeps, how exactly it keeps them, that a scaled decode
// re-encodes exactly, its size, and that malformed or hostile payloads are
// refused before anything is written.
#include "compression/sparse_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "compression/topk.h"
#include "gtest/gtest.h"
#include "tests/compression/test_util.h"

namespace starling {
namespace {

using ::starling::testing::BitEqual;
using ::starling::testing::Dist;
using ::starling::testing::DistName;
using ::starling::testing::RandomValues;

std::unique_ptr<Codec> Make(const std::string& spec) {
  absl::StatusOr<std::unique_ptr<Codec>> c = MakeCodec(spec);
  EXPECT_TRUE(c.ok()) << spec << ": " << c.status();
  return std::move(c).value();
}

std::vector<float> RoundTrip(const Codec& c, const std::vector<float>& x) {
  absl::StatusOr<std::string> bytes = c.Encode(x);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  std::vector<float> out(x.size(), 7.0f);
  const absl::Status s = c.Decode(*bytes, absl::MakeSpan(out));
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// A payload with this header and raw body, for hostile inputs.
std::string Payload(uint64_t count, uint32_t chunk, uint64_t k, int bits,
                    const std::string& raw, uint8_t flags = 0) {
  std::string p(28, '\0');
  p[0] = static_cast<char>(0xC5);
  p[1] = 7;
  p[2] = 1;
  p[3] = static_cast<char>(flags);
  std::memcpy(&p[4], &chunk, 4);
  std::memcpy(&p[8], &count, 8);
  const uint64_t param = k | (static_cast<uint64_t>(bits) << 32);
  std::memcpy(&p[16], &param, 8);
  const uint32_t size = static_cast<uint32_t>(raw.size());
  std::memcpy(&p[24], &size, 4);
  return p + raw;
}

// The raw body of one chunk at 2 bits with Rice parameter 0: levels, one
// code byte, then the gap bits given as a string of '0'/'1' (LSB first).
std::string Raw2Bit(float lo, float hi, uint8_t codes, const std::string& gap) {
  std::string raw(1, '\0');
  raw.append(reinterpret_cast<const char*>(&lo), 4);
  raw.append(reinterpret_cast<const char*>(&hi), 4);
  raw.push_back(static_cast<char>(codes));
  std::string bytes((gap.size() + 7) / 8, '\0');
  for (size_t i = 0; i < gap.size(); ++i) {
    if (gap[i] == '1') bytes[i / 8] |= static_cast<char>(1 << (i % 8));
  }
  return raw + bytes;
}

TEST(SparseCodecTest, SpecsAndNames) {
  EXPECT_EQ(Make("sparse:0.01")->Name(), "sparse:0.01");
  EXPECT_EQ(Make("sparse:0.01:4096+int2")->Name(), "sparse:0.01");
  EXPECT_EQ(Make("sparse:0.02:1024+int3")->Name(), "sparse:0.02:1024+int3");
  EXPECT_FALSE(Make("sparse:0.01")->lossless());
  for (const char* bad :
       {"sparse", "sparse:", "sparse:0", "sparse:1.5", "sparse:0.01:0",
        "sparse:0.01:65537", "sparse:0.01:x", "sparse:0.01+int8",
        "sparse:0.01+zstd", "sparse:0.01+int2+int3", "sparse:0.01+int2+zstd"}) {
    absl::StatusOr<std::unique_ptr<Codec>> c = MakeCodec(bad);
    EXPECT_FALSE(c.ok()) << bad;
    if (!c.ok()) {
      EXPECT_NE(c.status().message().find(bad), std::string::npos)
          << c.status();
    }
  }
  EXPECT_TRUE(ErrorFeedbackByDefault("sparse:0.01"));
  EXPECT_TRUE(IsSparseSpec("sparse:0.01+int3"));
  EXPECT_FALSE(IsSparseSpec("topk:0.01+int8"));
}

TEST(SparseCodecTest, KeepsEachChunksLargestValuesWithTheirSigns) {
  uint64_t seed = 3;
  for (const char* spec : {"sparse:0.01", "sparse:0.05:256+int3",
                           "sparse:0.1:100+int4", "sparse:1:64"}) {
    for (size_t n : {1, 5, 100, 4096, 10000, 40000}) {
      for (Dist dist :
           {Dist::kNormal, Dist::kOutliers, Dist::kNegative, Dist::kTies}) {
        const std::vector<float> x = RandomValues(n, dist, seed++);
        const std::unique_ptr<Codec> c = Make(spec);
        const std::vector<float> out = RoundTrip(*c, x);
        // The kept set of each chunk is exactly its top-k.
        absl::StatusOr<std::string> bytes = c->Encode(x);
        ASSERT_TRUE(bytes.ok());
        uint32_t chunk;
        uint64_t param;
        std::memcpy(&chunk, bytes->data() + 4, 4);
        std::memcpy(&param, bytes->data() + 16, 8);
        compression_internal::SparseShape shape;
        ASSERT_TRUE(
            compression_internal::ParseSparseParam(param, chunk, &shape));
        for (size_t begin = 0; begin < n; begin += chunk) {
          const size_t len = std::min<size_t>(chunk, n - begin);
          const uint64_t k = compression_internal::SparseChunkK(shape, len);
          const std::vector<uint32_t> want =
              TopKIndices(absl::MakeConstSpan(x.data() + begin, len), k);
          std::vector<bool> kept(len, false);
          for (uint32_t i : want) kept[i] = true;
          for (size_t i = 0; i < len; ++i) {
            const float v = out[begin + i], xv = x[begin + i];
            if (!kept[i]) {
              ASSERT_EQ(v, 0.0f) << spec << " n=" << n << " " << DistName(dist)
                                 << " i=" << begin + i;
              continue;
            }
            ASSERT_TRUE(std::isfinite(v));
            if (v != 0.0f) {
              ASSERT_EQ(std::signbit(v), std::signbit(xv))
                  << spec << " " << DistName(dist) << " i=" << begin + i;
            }
            // A level lies within the chunk's kept magnitudes.
            float lo = INFINITY, hi = 0;
            for (uint32_t j : want) {
              lo = std::min(lo, std::abs(x[begin + j]));
              hi = std::max(hi, std::abs(x[begin + j]));
            }
            ASSERT_GE(std::abs(v), lo);
            ASSERT_LE(std::abs(v), hi);
          }
        }
      }
    }
  }
}

TEST(SparseCodecTest, FewDistinctMagnitudesAreExact) {
  // Two magnitudes in every chunk: 2 bits keep them exactly.
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = (i % 3 == 0 ? -1.0f : 1.0f) * (i % 7 == 0 ? 0.5f : 2.25f);
  }
  EXPECT_TRUE(BitEqual(RoundTrip(*Make("sparse:1:100"), x), x));
}

// What lets a member encode its weighted pack once for everyone: a decoded
// payload scaled by a positive weight encodes back to itself.
TEST(SparseCodecTest, ScaledDecodeReencodesExactly) {
  uint64_t seed = 11;
  for (const char* spec : {"sparse:0.01", "sparse:0.03:512+int3",
                           "sparse:0.2:128+int4", "sparse:0.01:4096+int2"}) {
    for (Dist dist : {Dist::kNormal, Dist::kOutliers, Dist::kTies}) {
      for (float w : {1.0f, 800.0f, 0.37f, 3.0e-4f, 12345.678f}) {
        const std::unique_ptr<Codec> c = Make(spec);
        std::vector<float> sent =
            RoundTrip(*c, RandomValues(30000, dist, seed++));
        for (float& v : sent) v *= w;
        EXPECT_TRUE(BitEqual(RoundTrip(*c, sent), sent))
            << spec << " " << DistName(dist) << " w=" << w;
      }
    }
  }
}

TEST(SparseCodecTest, AccumulateAddsTheDecodedValues) {
  const std::unique_ptr<Codec> c = Make("sparse:0.05:256+int3");
  const std::vector<float> x = RandomValues(5000, Dist::kNormal, 5);
  absl::StatusOr<std::string> bytes = c->Encode(x);
  ASSERT_TRUE(bytes.ok());
  std::vector<float> decoded(x.size());
  ASSERT_TRUE(c->Decode(*bytes, absl::MakeSpan(decoded)).ok());
  std::vector<float> acc = RandomValues(5000, Dist::kUniform, 6);
  std::vector<float> want = acc;
  for (size_t i = 0; i < want.size(); ++i) want[i] += decoded[i];
  ASSERT_TRUE(c->DecodeAccumulate(*bytes, absl::MakeSpan(acc)).ok());
  EXPECT_TRUE(BitEqual(acc, want));
  // A sum that overflows is refused.
  std::vector<float> big(5000, 3.0e38f);
  std::vector<float> huge(5000, 2.0e38f);
  absl::StatusOr<std::string> hb = c->Encode(huge);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(c->DecodeAccumulate(*hb, absl::MakeSpan(big)),
            AccumulateOverflowError());
}

TEST(SparseCodecTest, PayloadIsSmall) {
  // The default sim's model at 1%: about 1.4k values kept of 137k, each a
  // 2-bit code and a Rice-coded gap (about 8.5 bits), and 8 bytes of levels
  // per chunk of 4096.
  const std::vector<float> x = RandomValues(137216, Dist::kNormal, 9);
  absl::StatusOr<std::string> bytes = Make("sparse:0.01")->Encode(x);
  ASSERT_TRUE(bytes.ok());
  EXPECT_LT(bytes->size(), 2400u);
  EXPECT_GT(bytes->size(), 1400u);
  absl::StatusOr<std::string> topk = Make("topk:0.01+int8")->Encode(x);
  EXPECT_LT(3 * bytes->size(), topk->size());
}

TEST(SparseCodecTest, RefusesMalformedAndHostilePayloads) {
  const std::unique_ptr<Codec> c = Make("sparse:0.1:10");
  std::vector<float> out(10, 7.0f);
  auto refused = [&](const std::string& p, const std::string& why) {
    std::vector<float> before = out;
    const absl::Status s = c->Decode(p, absl::MakeSpan(out));
    EXPECT_FALSE(s.ok()) << why;
    EXPECT_NE(s.message().find(why), std::string::npos) << s;
    EXPECT_TRUE(BitEqual(out, before)) << "written before refusing: " << why;
    const absl::Status sa = c->DecodeAccumulate(p, absl::MakeSpan(out));
    EXPECT_FALSE(sa.ok()) << why;
    EXPECT_TRUE(BitEqual(out, before)) << "added before refusing: " << why;
  };
  // A valid payload: one kept value at index 3 (gap 3: "1110"), code 1.
  const std::string ok = Payload(10, 10, 1, 2, Raw2Bit(0.5f, 0.5f, 1, "1110"));
  ASSERT_TRUE(c->Decode(ok, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out[3], 0.5f);
  out.assign(10, 7.0f);
  // Index out of range: gap 12 in a chunk of 10 (a unary run past it).
  refused(Payload(10, 10, 1, 2, Raw2Bit(0.5f, 0.5f, 1, "1111111111110")),
          "past the chunk");
  // Index 9 is the last one; with 2 kept per chunk, a gap to 10 is refused.
  refused(Payload(10, 10, 2, 2,
                  Raw2Bit(0.5f, 0.5f, 5,
                          "1111111110"
                          "0")),
          "out of range");
  // Too many entries: bits left over after the kept values.
  refused(Payload(10, 10, 1, 2,
                  Raw2Bit(0.5f, 0.5f, 1,
                          "1110"
                          "0000"
                          "1")),
          "more bits than");
  refused(ok + "x", "payload bytes");
  // K above the chunk, or bits the encoder never writes.
  refused(Payload(10, 10, 11, 2, Raw2Bit(0.5f, 0.5f, 1, "1110")),
          "sparse chunk, count or bits");
  refused(Payload(10, 10, 1, 5, Raw2Bit(0.5f, 0.5f, 1, "1110")),
          "sparse chunk, count or bits");
  refused(Payload(10, 0, 1, 2, Raw2Bit(0.5f, 0.5f, 1, "1110")),
          "sparse chunk, count or bits");
  // A zstd flag (the codec has no zstd stage).
  refused(Payload(10, 10, 1, 2, Raw2Bit(0.5f, 0.5f, 1, "1110"), 1), "flags");
  // Levels: NaN, negative, descending.
  refused(Payload(10, 10, 1, 2, Raw2Bit(NAN, 0.5f, 1, "1110")), "bad level");
  refused(Payload(10, 10, 1, 2, Raw2Bit(-1.0f, 0.5f, 1, "1110")), "bad level");
  refused(Payload(10, 10, 1, 2, Raw2Bit(1.0f, 0.5f, 1, "1110")), "bad level");
  // Truncated: no gap bits, or not even the levels.
  refused(Payload(10, 10, 1, 2, Raw2Bit(0.5f, 0.5f, 1, "")), "truncated");
  refused(Payload(10, 10, 1, 2, std::string(5, '\0')), "truncated");
  // A Rice parameter no encoder writes.
  std::string raw = Raw2Bit(0.5f, 0.5f, 1, "1110");
  raw[0] = 30;
  refused(Payload(10, 10, 1, 2, raw), "Rice parameter");
  // Another element count than the destination's.
  refused(Payload(11, 10, 1, 2, Raw2Bit(0.5f, 0.5f, 1, "1110")), "holds 11");
}

TEST(SparseCodecTest, RefusesNonFiniteInput) {
  std::vector<float> x(100, 1.0f);
  x[42] = NAN;
  absl::StatusOr<std::string> bytes = Make("sparse:0.01")->Encode(x);
  ASSERT_FALSE(bytes.ok());
  EXPECT_NE(bytes.status().message().find("index 42"), std::string::npos);
}

}  // namespace
}  // namespace starling
