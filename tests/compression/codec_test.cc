#include "compression/codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "compression/zstd_stage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/compression/test_util.h"

namespace starling {
namespace {

using ::starling::testing::BitEqual;
using ::starling::testing::Dist;
using ::starling::testing::DistName;
using ::starling::testing::RandomValues;
using ::testing::HasSubstr;

std::unique_ptr<Codec> Make(const std::string& spec,
                            const CodecOptions& options = CodecOptions()) {
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec(spec, options);
  EXPECT_TRUE(codec.ok()) << spec << ": " << codec.status();
  return std::move(codec).value();
}

std::vector<float> RoundTrip(const Codec& codec, const std::vector<float>& x) {
  absl::StatusOr<std::string> bytes = codec.Encode(x);
  EXPECT_TRUE(bytes.ok()) << codec.Name() << ": " << bytes.status();
  std::vector<float> out(x.size(), 12345.0f);
  absl::Status status = codec.Decode(*bytes, absl::MakeSpan(out));
  EXPECT_TRUE(status.ok()) << codec.Name() << ": " << status;
  return out;
}

std::vector<size_t> Sizes(size_t block) {
  return {0,         1,    2,    block - 1, block, block + 1,
          3 * block, 1001, 4097, 65537,     99999};
}

const Dist kDists[] = {Dist::kNormal, Dist::kUniform, Dist::kOutliers,
                       Dist::kNegative, Dist::kTies};

// Checks the absmax quantizer bounds block by block.
void CheckAbsmax(const std::vector<float>& x, const std::vector<float>& y,
                 size_t block, int levels, const std::string& what) {
  ASSERT_EQ(x.size(), y.size());
  for (size_t start = 0; start < x.size(); start += block) {
    const size_t end = std::min(x.size(), start + block);
    float absmax = 0;
    for (size_t i = start; i < end; ++i)
      absmax = std::max(absmax, std::abs(x[i]));
    const float scale = absmax / levels;
    // scale/2 plus a few ulps of absmax for the float arithmetic.
    const double tol = 0.5 * scale + 4.0 * absmax * std::ldexp(1.0, -23);
    for (size_t i = start; i < end; ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << what << " i=" << i;
      ASSERT_LE(std::abs(static_cast<double>(x[i]) - y[i]), tol)
          << what << " i=" << i << " x=" << x[i] << " y=" << y[i]
          << " absmax=" << absmax;
      if (std::abs(x[i]) == absmax) {
        ASSERT_EQ(x[i], y[i]) << what << ": block max must be exact, i=" << i;
      }
    }
  }
}

TEST(CodecTest, Int8ErrorBoundAndExactMax) {
  for (uint32_t block : {256u, 64u, 7u}) {
    const std::string spec =
        block == 256 ? "int8" : "int8:" + std::to_string(block);
    auto codec = Make(spec);
    uint64_t seed = 1;
    for (size_t n : Sizes(block)) {
      for (Dist dist : kDists) {
        const std::vector<float> x = RandomValues(n, dist, seed++);
        CheckAbsmax(x, RoundTrip(*codec, x), block, 127,
                    spec + " n=" + std::to_string(n) + " " + DistName(dist));
      }
    }
  }
}

TEST(CodecTest, Int4ErrorBoundAndExactMax) {
  for (uint32_t block : {64u, 32u, 5u}) {
    const std::string spec =
        block == 64 ? "int4" : "int4:" + std::to_string(block);
    auto codec = Make(spec);
    uint64_t seed = 100;
    for (size_t n : Sizes(block)) {
      for (Dist dist : kDists) {
        const std::vector<float> x = RandomValues(n, dist, seed++);
        CheckAbsmax(x, RoundTrip(*codec, x), block, 7,
                    spec + " n=" + std::to_string(n) + " " + DistName(dist));
      }
    }
  }
}

TEST(CodecTest, Int8RoundsHalfToEven) {
  // absmax 127 gives scale 1: x = k + 0.5 must round to the even neighbour.
  auto codec = Make("int8:8");
  const std::vector<float> x = {127.0f, 0.5f,  1.5f,  2.5f,
                                -0.5f,  -1.5f, -2.5f, 3.5f};
  const std::vector<float> y = RoundTrip(*codec, x);
  EXPECT_EQ(y, (std::vector<float>{127, 0, 2, 2, 0, -2, -2, 4}));
}

TEST(CodecTest, Int8PayloadSize) {
  auto codec = Make("int8");
  const std::vector<float> x = RandomValues(1000, Dist::kNormal, 3);
  absl::StatusOr<std::string> bytes = codec->Encode(x);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), 28u + 4u * 4u + 1000u);
  auto int4 = Make("int4");
  bytes = int4->Encode(x);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), 28u + 4u * 16u + 500u);
}

TEST(CodecTest, AllZerosAndTinyBlocksDecodeWithoutNaN) {
  for (const char* spec : {"int8", "int4", "int8:3", "topk:0.5+int8"}) {
    auto codec = Make(spec);
    std::vector<float> zeros(1000, 0.0f);
    zeros[5] = -0.0f;
    for (float v : RoundTrip(*codec, zeros)) ASSERT_EQ(v, 0.0f) << spec;
    // Subnormal and tiny blocks: no NaN/Inf, max still exact.
    std::vector<float> tiny = {1e-45f, -3e-42f, 1e-38f, 5e-39f, 0.0f, 2e-44f};
    const std::vector<float> y = RoundTrip(*codec, tiny);
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << spec;
      ASSERT_LE(std::abs(y[i]), 1e-38f) << spec;
    }
  }
}

TEST(CodecTest, AllNegativeBlock) {
  auto codec = Make("int8");
  std::vector<float> x(256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = -1.0f - 0.01f * i;
  const std::vector<float> y = RoundTrip(*codec, x);
  CheckAbsmax(x, y, 256, 127, "negative");
  EXPECT_EQ(y[255], x[255]);
  for (float v : y) EXPECT_LT(v, 0.0f);
}

TEST(CodecTest, Fp16RelativeErrorAndSaturation) {
  auto codec = Make("fp16");
  std::vector<float> x = RandomValues(50000, Dist::kOutliers, 7);
  for (float& v : x) v *= 10.0f;
  const std::vector<float> y = RoundTrip(*codec, x);
  for (size_t i = 0; i < x.size(); ++i) {
    const float a = std::abs(x[i]);
    if (a >= 6.104e-5f && a <= 65504.0f) {
      ASSERT_LE(std::abs(x[i] - y[i]), a * std::ldexp(1.0f, -11)) << x[i];
    }
  }
  const std::vector<float> big = {1e6f,     -1e6f,   65504.0f, 65519.0f,
                                  65520.0f, 3.4e38f, -3.4e38f};
  const std::vector<float> yb = RoundTrip(*codec, big);
  EXPECT_EQ(yb, (std::vector<float>{65504, -65504, 65504, 65504, 65504, 65504,
                                    -65504}));
}

TEST(CodecTest, Bf16RelativeErrorAndSaturation) {
  auto codec = Make("bf16");
  const std::vector<float> x = RandomValues(50000, Dist::kOutliers, 8);
  const std::vector<float> y = RoundTrip(*codec, x);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_LE(std::abs(x[i] - y[i]), std::abs(x[i]) * std::ldexp(1.0f, -8));
  }
  const std::vector<float> yb =
      RoundTrip(*codec, {std::numeric_limits<float>::max(), -3.4e38f});
  for (float v : yb) EXPECT_TRUE(std::isfinite(v));
  EXPECT_GT(yb[0], 3.3e38f);
}

float FloatFromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Every finite half / bf16 round-trips exactly, midpoints between neighbours
// round to the even one and anything past a midpoint to the far one.
void CheckRoundToNearestEven(const std::string& spec,
                             float (*to_float)(uint16_t), uint16_t max_bits) {
  auto codec = Make(spec);
  std::vector<float> values;
  std::vector<float> want;
  for (uint32_t sign : {0u, 0x8000u}) {
    for (uint32_t h = 0; h <= max_bits; ++h) {
      const float v = to_float(static_cast<uint16_t>(h | sign));
      values.push_back(v);
      want.push_back(v);
      if (h == max_bits) break;
      const float next = to_float(static_cast<uint16_t>((h + 1) | sign));
      const float mid = v + (next - v) / 2;  // exact in float
      values.push_back(mid);
      want.push_back(h % 2 == 0 ? v : next);
      values.push_back(std::nextafter(mid, next));
      want.push_back(next);
      values.push_back(std::nextafter(mid, v));
      want.push_back(v);
    }
  }
  const std::vector<float> got = RoundTrip(*codec, values);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << spec << " value " << values[i];
  }
}

float HalfRef(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double mag =
      exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return static_cast<float>((h & 0x8000) ? -mag : mag);
}
float Bf16Ref(uint16_t h) {
  return FloatFromBits(static_cast<uint32_t>(h) << 16);
}

TEST(CodecTest, Fp16RoundsToNearestEven) {
  CheckRoundToNearestEven("fp16", HalfRef, 0x7bff);
}

TEST(CodecTest, Bf16RoundsToNearestEven) {
  CheckRoundToNearestEven("bf16", Bf16Ref, 0x7f7f);
}

TEST(CodecTest, LosslessStagesAreBitExact) {
  for (bool shuffle : {true, false}) {
    for (uint32_t chunk : {1u << 20, 4096u}) {
      CodecOptions options;
      options.shuffle = shuffle;
      options.zstd_chunk_bytes = chunk;
      for (const char* base : {"fp32", "fp16", "bf16", "int8", "int8:32",
                               "int4", "topk:0.1", "topk:0.05+int8"}) {
        auto plain = Make(base);
        auto zstd = Make(std::string(base) + "+zstd", options);
        uint64_t seed = 11;
        for (size_t n : {0, 1, 2, 255, 256, 257, 5000, 99999}) {
          for (Dist dist : kDists) {
            const std::vector<float> x = RandomValues(n, dist, seed++);
            const std::vector<float> a = RoundTrip(*plain, x);
            const std::vector<float> b = RoundTrip(*zstd, x);
            ASSERT_TRUE(BitEqual(a, b)) << zstd->Name() << " n=" << n;
            if (plain->lossless()) {
              ASSERT_TRUE(BitEqual(a, x)) << base << " n=" << n;
            }
          }
        }
      }
    }
  }
}

TEST(CodecTest, ZstdStageIsAppliedOrSkipped) {
  const std::vector<float> x = RandomValues(100000, Dist::kNormal, 5);
  for (bool shuffle : {true, false}) {
    CodecOptions options;
    options.shuffle = shuffle;
    auto codec = Make("int8+zstd", options);
    absl::StatusOr<std::string> bytes = codec->Encode(x);
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ((*bytes)[3] & 1, 1) << "int8 codes of normal data compress";
    EXPECT_EQ((*bytes)[3] & 2, 0) << "int8 codes are never shuffled";
    EXPECT_LT(bytes->size(), 28u + 100000u);
    auto fp32 = Make("fp32+zstd", options);
    bytes = fp32->Encode(x);
    ASSERT_TRUE(bytes.ok());
    if ((*bytes)[3] & 1) {
      EXPECT_EQ(((*bytes)[3] & 2) != 0, shuffle);
    }
  }
  // Incompressible bytes: the stage skips itself.
  std::mt19937 rng(1);
  std::string noise(1 << 16, '\0');
  for (char& c : noise) c = static_cast<char>(rng());
  std::string out = "keep";
  EXPECT_FALSE(
      compression_internal::ZstdCompressChunks(noise, 1, 1 << 20, &out));
  EXPECT_EQ(out, "keep");
  EXPECT_FALSE(compression_internal::ZstdCompressChunks("", 1, 1 << 20, &out));
}

TEST(CodecTest, EmptyAndSingle) {
  for (const char* spec : {"fp32", "fp16", "bf16", "int8", "int4", "topk:0.01",
                           "topk:0.01+int8", "int8+zstd", "fp32+zstd"}) {
    auto codec = Make(spec);
    EXPECT_TRUE(RoundTrip(*codec, {}).empty());
    const std::vector<float> one = RoundTrip(*codec, {-0.75f});
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(one[0], -0.75f) << spec;  // exactly representable everywhere
  }
}

TEST(CodecTest, NonFiniteInputIsRejectedWithItsIndex) {
  for (const char* spec : {"fp32", "fp16", "bf16", "int8", "int4", "topk:0.01",
                           "topk:0.5+int8", "int8+zstd"}) {
    auto codec = Make(spec);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      for (size_t where : {0, 5, 299, 1500}) {
        std::vector<float> x = RandomValues(1501, Dist::kNormal, where);
        x[where] = bad;
        absl::StatusOr<std::string> bytes = codec->Encode(x);
        ASSERT_FALSE(bytes.ok()) << spec;
        EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(bytes.status().message(),
                    HasSubstr("index " + std::to_string(where)))
            << spec << ": " << bytes.status();
      }
    }
  }
}

TEST(FirstNonFiniteTest, FindsTheFirstNaNOrInfAtAnyPositionAndSize) {
  // Sizes around the scan's 16-value vectors and 1024-value blocks, with
  // the bad value in the bulk, the tail, or at a block's edges.
  const float kBad[] = {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::quiet_NaN()};
  // The extremes of the finite range, and the bit patterns next to Inf.
  const float kFinite[] = {std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::lowest(),
                           std::numeric_limits<float>::denorm_min(),
                           -0.0f,
                           0.0f,
                           1.5f};
  for (size_t n : {0, 1, 15, 16, 17, 1023, 1024, 1025, 2048, 3001}) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = kFinite[i % 6];
    auto scan = [&] { return FirstNonFinite(absl::MakeConstSpan(v)); };
    EXPECT_EQ(scan(), -1) << n;
    for (size_t pos : {size_t{0}, n / 2, n - 1, size_t{1023}, size_t{1024},
                       size_t{1040}, n - n % 16}) {
      if (pos >= n) continue;
      for (float bad : kBad) {
        const float keep = v[pos];
        v[pos] = bad;
        EXPECT_EQ(scan(), static_cast<int64_t>(pos)) << n << " " << pos;
        if (pos + 1 < n) {  // a later one does not hide the first
          v[n - 1] = bad;
          EXPECT_EQ(scan(), static_cast<int64_t>(pos)) << n << " " << pos;
          v[n - 1] = kFinite[(n - 1) % 6];
        }
        v[pos] = keep;
      }
    }
  }
  // Not whole values: the trailing bytes are ignored.
  const std::string partial("\x00\x00\x80\x7f\x00\x00\x80", 7);
  EXPECT_EQ(FirstNonFinite(partial), 0);
  EXPECT_EQ(FirstNonFinite(partial.substr(4)), -1);
}

// ApplyFp32 adds (or copies) exactly as a plain loop does, and reports a
// NaN/Inf it wrote, whether it came in or a sum overflowed, at any position.
TEST(ApplyFp32Test, AddsOrCopiesExactlyAndReportsWhatIsNotFinite) {
  for (size_t n : {0, 1, 15, 16, 17, 1023, 3001}) {
    std::vector<float> x = RandomValues(n, Dist::kNormal, 3);
    std::vector<float> base = RandomValues(n, Dist::kNormal, 4);
    const std::string bytes(reinterpret_cast<const char*>(x.data()), 4 * n);
    std::vector<float> sum = base, copy(n, 7.0f);
    ASSERT_TRUE(ApplyFp32(bytes, absl::MakeSpan(sum), true)) << n;
    ASSERT_TRUE(ApplyFp32(bytes, absl::MakeSpan(copy), false)) << n;
    for (size_t i = 0; i < n; ++i) {
      const float want = base[i] + x[i];
      ASSERT_EQ(std::memcmp(&sum[i], &want, 4), 0) << n << " " << i;
    }
    EXPECT_EQ(copy, x) << n;
    for (size_t pos : {size_t{0}, n / 2, n - 1}) {
      if (pos >= n) continue;
      std::string bad = bytes;
      const float inf = -std::numeric_limits<float>::infinity();
      std::memcpy(&bad[4 * pos], &inf, 4);
      std::vector<float> acc = base;
      EXPECT_FALSE(ApplyFp32(bad, absl::MakeSpan(acc), true)) << n << pos;
      EXPECT_FALSE(ApplyFp32(bad, absl::MakeSpan(acc), false)) << n << pos;
      EXPECT_EQ(FirstNonFinite(bad), static_cast<int64_t>(pos));
      // Finite values whose sum overflows.
      acc = base;
      acc[pos] = std::numeric_limits<float>::max();
      std::string big = bytes;
      std::memcpy(&big[4 * pos], &acc[pos], 4);
      EXPECT_FALSE(ApplyFp32(big, absl::MakeSpan(acc), true)) << n << pos;
      EXPECT_EQ(FirstNonFinite(big), -1);
    }
  }
}

TEST(CodecTest, DecodeRejectsWrongCodecAndSize) {
  const std::vector<float> x = RandomValues(100, Dist::kNormal, 1);
  auto int8 = Make("int8");
  auto fp16 = Make("fp16");
  absl::StatusOr<std::string> bytes = int8->Encode(x);
  ASSERT_TRUE(bytes.ok());
  std::vector<float> out(100);
  absl::Status s = fp16->Decode(*bytes, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  std::vector<float> wrong(99);
  s = int8->Decode(*bytes, absl::MakeSpan(wrong));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = int8->Decode(bytes->substr(0, bytes->size() - 1), absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  // A decoder with another block size still reads the self-describing header.
  EXPECT_TRUE(Make("int8:16")->Decode(*bytes, absl::MakeSpan(out)).ok());
}

TEST(CodecTest, DecodeAccumulateAddsExactlyAndKeepsAccOnError) {
  for (const char* spec : {"fp32", "fp16", "bf16", "int8", "int4:9", "topk:0.1",
                           "topk:0.1+int8+zstd", "fp16+zstd"}) {
    auto codec = Make(spec);
    const std::vector<float> x = RandomValues(3001, Dist::kOutliers, 4);
    const std::vector<float> decoded = RoundTrip(*codec, x);
    std::vector<float> acc = RandomValues(3001, Dist::kUniform, 5);
    std::vector<float> want = acc;
    for (size_t i = 0; i < want.size(); ++i) want[i] += decoded[i];
    absl::StatusOr<std::string> bytes = codec->Encode(x);
    ASSERT_TRUE(bytes.ok());
    ASSERT_TRUE(codec->DecodeAccumulate(*bytes, absl::MakeSpan(acc)).ok());
    ASSERT_TRUE(BitEqual(acc, want)) << spec;
    // Errors leave acc alone: truncated, wrong size, corrupt body.
    const std::vector<float> before = acc;
    EXPECT_FALSE(codec
                     ->DecodeAccumulate(bytes->substr(0, bytes->size() - 3),
                                        absl::MakeSpan(acc))
                     .ok());
    ASSERT_TRUE(BitEqual(acc, before)) << spec;
    std::vector<float> wrong_size(3000);
    EXPECT_FALSE(
        codec->DecodeAccumulate(*bytes, absl::MakeSpan(wrong_size)).ok());
    std::string bad_scale = *bytes;
    if (std::string(spec).rfind("int", 0) == 0) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(&bad_scale[28], &nan, 4);
      EXPECT_EQ(codec->DecodeAccumulate(bad_scale, absl::MakeSpan(acc)).code(),
                absl::StatusCode::kDataLoss);
      ASSERT_TRUE(BitEqual(acc, before)) << spec;
    }
  }
}

// A payload of finite values whose sum with the accumulator overflows is
// refused: no Inf gets into the sum unnoticed (the ring relies on this
// instead of scanning each decoded segment again).
TEST(CodecTest, DecodeAccumulateRefusesASumThatOverflows) {
  // (fp16 values, top-k's by default, are at most 65504: added to a finite
  // fp32 they cannot overflow.)
  for (const char* spec : {"fp32", "bf16", "int8", "int4:9", "topk:0.1+int8",
                           "topk:0.1+int8+zstd", "int8+zstd", "bf16+zstd"}) {
    auto codec = Make(spec);
    std::vector<float> x(3001, 1.0f);
    x[0] = 3e38f;
    x[1234] = -3e38f;
    x[3000] = 3e38f;
    absl::StatusOr<std::string> bytes = codec->Encode(x);
    ASSERT_TRUE(bytes.ok()) << spec << ": " << bytes.status();
    // Sums that stay finite still add.
    std::vector<float> acc(x.size(), 1.0f);
    EXPECT_TRUE(codec->DecodeAccumulate(*bytes, absl::MakeSpan(acc)).ok())
        << spec;
    // One element of the accumulator overflows when added to.
    for (size_t at : {size_t{0}, size_t{1234}, size_t{3000}}) {
      std::vector<float> acc2(x.size(), 0.0f);
      acc2[at] = x[at];
      absl::Status s = codec->DecodeAccumulate(*bytes, absl::MakeSpan(acc2));
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
          << spec << " at " << at << ": " << s;
      EXPECT_NE(s.message().find("overflows"), std::string::npos) << s;
    }
    // Decode alone writes finite values only.
    std::vector<float> out(x.size());
    ASSERT_TRUE(codec->Decode(*bytes, absl::MakeSpan(out)).ok()) << spec;
    for (float v : out) ASSERT_TRUE(std::isfinite(v)) << spec;
  }
}

TEST(CodecTest, TopKKeepsLargestAndZeroesTheRest) {
  auto codec = Make("topk:0.01");
  std::vector<float> x = RandomValues(10000, Dist::kNormal, 9);
  const std::vector<float> y = RoundTrip(*codec, x);
  size_t nonzero = 0;
  float smallest_kept = 1e30f;
  for (size_t i = 0; i < x.size(); ++i) {
    if (y[i] != 0) {
      ++nonzero;
      EXPECT_LE(std::abs(x[i] - y[i]), std::abs(x[i]) * std::ldexp(1.0f, -11));
      smallest_kept = std::min(smallest_kept, std::abs(x[i]));
    }
  }
  EXPECT_EQ(nonzero, 100u);
  for (size_t i = 0; i < x.size(); ++i) {
    if (y[i] == 0) EXPECT_LE(std::abs(x[i]), smallest_kept);
  }
}

TEST(MakeCodecTest, ValidSpecsHaveCanonicalNames) {
  const std::pair<const char*, const char*> cases[] = {
      {"fp32", "fp32"},
      {"fp32+zstd", "fp32+zstd"},
      {"fp16", "fp16"},
      {"fp16+zstd", "fp16+zstd"},
      {"bf16", "bf16"},
      {"int8", "int8"},
      {"int8:256", "int8"},
      {"int8:128", "int8:128"},
      {"int8+zstd", "int8+zstd"},
      {"int4", "int4"},
      {"int4:64", "int4"},
      {"int4:32+zstd", "int4:32+zstd"},
      {"topk:0.01", "topk:0.01"},
      {"topk:0.01+fp16", "topk:0.01"},
      {"topk:0.01+int8", "topk:0.01+int8"},
      {"topk:0.01+int8+zstd", "topk:0.01+int8+zstd"},
      {"topk:1", "topk:1"},
      {"topk:1e-3", "topk:0.001"},
  };
  for (const auto& [spec, name] : cases) {
    absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec(spec);
    ASSERT_TRUE(codec.ok()) << spec << ": " << codec.status();
    EXPECT_EQ((*codec)->Name(), name);
    EXPECT_TRUE(MakeCodec((*codec)->Name()).ok()) << name;
    EXPECT_EQ((*codec)->lossless(), std::string(spec).rfind("fp32", 0) == 0);
  }
}

TEST(MakeCodecTest, InvalidSpecsNameTheFlag) {
  for (const char* spec : {"int9",         "topk:2",
                           "topk:0",       "int8:0",
                           "zstd+int8",    "",
                           "zstd",         "int8+zstd+zstd",
                           "fp16:3",       "topk:0.1+int4",
                           "topk:",        "topk",
                           "topk:nan",     "topk:inf",
                           "topk:-0.1",    "int8:",
                           "int8:abc",     "int8:-4",
                           "int8+fp16",    "INT8",
                           "int8:2000000", " int8",
                           "int8 ",        "fp32+",
                           "+zstd",        "topk:0.1+int8+fp16"}) {
    absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec(spec);
    ASSERT_FALSE(codec.ok()) << "'" << spec << "'";
    EXPECT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(codec.status().message(),
                HasSubstr("invalid codec '" + std::string(spec) + "'"));
    EXPECT_THAT(codec.status().message(), HasSubstr("Valid:"));
  }
}

TEST(MakeCodecTest, ErrorFeedbackDefaultsAndHelp) {
  EXPECT_TRUE(ErrorFeedbackByDefault("int4"));
  EXPECT_TRUE(ErrorFeedbackByDefault("int4:32+zstd"));
  EXPECT_TRUE(ErrorFeedbackByDefault("topk:0.01"));
  EXPECT_TRUE(ErrorFeedbackByDefault("topk:0.01+int8+zstd"));
  EXPECT_FALSE(ErrorFeedbackByDefault("int8"));
  EXPECT_FALSE(ErrorFeedbackByDefault("fp16+zstd"));
  EXPECT_FALSE(ErrorFeedbackByDefault("fp32"));
  EXPECT_FALSE(ErrorFeedbackByDefault("bogus"));
  const std::string help = CompressionSpecHelp();
  for (const char* word : {"fp32", "fp16", "bf16", "int8", "int4", "topk",
                           "+zstd", "--compression="}) {
    EXPECT_THAT(help, HasSubstr(word));
  }
}

}  // namespace
}  // namespace starling
