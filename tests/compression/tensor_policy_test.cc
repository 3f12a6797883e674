#include "compression/tensor_policy.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace starling {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(PolicyCodecTest, SmallTensorsAndTheTrailingWeightKeepTheirCodec) {
  // Tensors: 5000 (main), 64 (small), 6000 (main), then 1 trailing fp32.
  PolicyOptions o;
  o.main = "int8";
  o.small = "fp32";
  o.small_elements = 100;
  o.trailing_fp32 = 1;
  auto p = PolicyCodec::Create({5000, 64, 6000}, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->size(), 11065);
  EXPECT_FALSE((*p)->lossless());
  std::vector<float> v = Random(11065, 1);
  v.back() = 123.456f;  // the weight
  std::vector<float> out(v.size());
  auto enc = (*p)->Encode(v);
  ASSERT_TRUE(enc.ok()) << enc.status();
  ASSERT_TRUE((*p)->Decode(*enc, absl::MakeSpan(out)).ok());
  for (int i = 5000; i < 5064; ++i) EXPECT_EQ(out[i], v[i]) << i;  // fp32
  EXPECT_EQ(out.back(), 123.456f);
  for (int i = 0; i < 5000; ++i) EXPECT_NEAR(out[i], v[i], 0.05) << i;
  EXPECT_LT(enc->size(), v.size() * 4 / 3);
}

TEST(PolicyCodecTest, SlicesAcrossRangesRoundTripLikeTheWhole) {
  PolicyOptions o;
  o.main = "int8";
  o.small_elements = 100;
  o.trailing_fp32 = 1;
  auto p = PolicyCodec::Create({300, 50, 700, 20, 400}, o);
  ASSERT_TRUE(p.ok());
  std::vector<float> v = Random((*p)->size(), 2);
  for (int64_t off : {0, 1, 299, 300, 345, 1000, 1400}) {
    for (int64_t len : {0, 1, 7, 400}) {
      if (off + len > (*p)->size()) continue;
      absl::Span<const float> slice(v.data() + off, len);
      auto enc = (*p)->EncodeSlice(off, slice);
      ASSERT_TRUE(enc.ok()) << enc.status();
      std::vector<float> out(len), acc(len, 1.0f);
      ASSERT_TRUE((*p)->DecodeSlice(off, *enc, absl::MakeSpan(out)).ok());
      ASSERT_TRUE(
          (*p)->DecodeSliceAccumulate(off, *enc, absl::MakeSpan(acc)).ok());
      for (int64_t i = 0; i < len; ++i) {
        EXPECT_NEAR(out[i], slice[i], 0.05) << off << "+" << i;
        EXPECT_EQ(acc[i], 1.0f + out[i]);
      }
    }
  }
}

// A slice over several codecs' ranges (decoded first, then added) refuses
// a sum that overflows, as one codec's DecodeAccumulate does.
TEST(PolicyCodecTest, SliceAccumulateRefusesASumThatOverflows) {
  PolicyOptions o;
  o.main = "int8";
  o.small_elements = 100;
  auto p = PolicyCodec::Create({300, 50, 700}, o);
  ASSERT_TRUE(p.ok());
  const std::vector<float> v((*p)->size(), 3e38f);
  for (int64_t off : {0, 250}) {
    absl::Span<const float> slice(v.data() + off, 200);
    auto enc = (*p)->EncodeSlice(off, slice);
    ASSERT_TRUE(enc.ok()) << enc.status();
    std::vector<float> acc(200, 1.0f);
    EXPECT_TRUE(
        (*p)->DecodeSliceAccumulate(off, *enc, absl::MakeSpan(acc)).ok());
    acc[77] = 3e38f;
    absl::Status s =
        (*p)->DecodeSliceAccumulate(off, *enc, absl::MakeSpan(acc));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << off << ": " << s;
    EXPECT_NE(s.message().find("overflows"), std::string::npos) << s;
  }
}

TEST(PolicyCodecTest, CorruptSlicesAreErrors) {
  PolicyOptions o;
  o.main = "int8";
  o.small_elements = 10;
  auto p = PolicyCodec::Create({100, 5, 100}, o);
  ASSERT_TRUE(p.ok());
  std::vector<float> v = Random(205, 3);
  auto enc = (*p)->Encode(v);
  ASSERT_TRUE(enc.ok());
  std::vector<float> out(205);
  for (size_t keep = 0; keep < enc->size(); keep += 7) {
    EXPECT_FALSE((*p)->Decode(enc->substr(0, keep), absl::MakeSpan(out)).ok());
  }
  EXPECT_FALSE((*p)->Decode(*enc + "x", absl::MakeSpan(out)).ok());
  std::vector<float> short_out(204);
  EXPECT_FALSE((*p)->Decode(*enc, absl::MakeSpan(short_out)).ok());
  EXPECT_FALSE((*p)->EncodeSlice(200, absl::MakeConstSpan(v.data(), 10)).ok());
}

TEST(PolicyCodecTest, LosslessMainUsesItEverywhere) {
  PolicyOptions o;
  o.main = "fp32";
  o.small = "bf16";
  auto p = PolicyCodec::Create({10, 10000}, o);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE((*p)->lossless());
  EXPECT_EQ((*p)->Name(), "fp32");
  std::vector<float> v = Random(10010, 4), out(10010);
  ASSERT_TRUE((*p)->Decode(*(*p)->Encode(v), absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, v);
}

TEST(PolicyCodecTest, BadSpecsNameTheFlag) {
  PolicyOptions o;
  o.main = "int8";
  o.small = "int3";
  auto p = PolicyCodec::Create({10}, o);
  EXPECT_TRUE(absl::IsInvalidArgument(p.status()));
  EXPECT_NE(p.status().message().find("--small_tensor_codec=int3"),
            std::string::npos);
  // Only the flag that is wrong is named.
  EXPECT_EQ(p.status().message().find("--compression"), std::string::npos)
      << p.status().message();
  o.main = "fp32";  // lossless: the small codec goes unused, but is checked
  p = PolicyCodec::Create({10}, o);
  EXPECT_TRUE(absl::IsInvalidArgument(p.status()));
  o.main = "nope";
  p = PolicyCodec::Create({10}, o);
  EXPECT_NE(p.status().message().find("--compression=nope: invalid codec"),
            std::string::npos)
      << p.status().message();
  PolicyOptions negative;
  negative.main = "int8";
  negative.small_elements = -5;
  p = PolicyCodec::Create({10}, negative);
  EXPECT_TRUE(absl::IsInvalidArgument(p.status()));
  EXPECT_NE(p.status().message().find("--small_tensor_elems=-5: must be >= 0"),
            std::string::npos)
      << p.status().message();
}

}  // namespace
}  // namespace starling
