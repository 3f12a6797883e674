#include "core/flat_params.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>

#include "absl/strings/str_format.h"
#include "core/model.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

std::unique_ptr<Model> Gpt(uint64_t seed) {
  torch::manual_seed(seed);
  ModelOptions o;
  o.spec = "gpt";
  o.layers = 2;
  o.width = 64;
  o.heads = 4;
  o.context = 64;
  auto m = CreateModel(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(m).value();
}

TEST(FlatParamsTest, GptRecipeHas137216Parameters) {
  EXPECT_EQ(NumElements(Gpt(0)->Parameters()), 137216);
}

TEST(FlatParamsTest, RoundTripIsBitExact) {
  auto a = Gpt(1);
  auto b = Gpt(2);
  std::vector<float> flat = Flatten(a->Parameters());
  ASSERT_EQ(static_cast<int64_t>(flat.size()), NumElements(a->Parameters()));
  EXPECT_NE(ModelHash(a->Parameters()), ModelHash(b->Parameters()));
  ASSERT_TRUE(Unflatten(flat, b->Parameters()).ok());
  EXPECT_EQ(Flatten(b->Parameters()), flat);
  EXPECT_EQ(ModelHash(a->Parameters()), ModelHash(b->Parameters()));
  auto pa = a->Parameters(), pb = b->Parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].equal(pb[i])) << i;
}

TEST(FlatParamsTest, OrderIsFixedAndFollowsRegistration) {
  auto m = Gpt(3);
  std::vector<torch::Tensor> params = m->Parameters();
  std::vector<float> flat = Flatten(params);
  // The first tensor is the token embedding, the last the head bias.
  EXPECT_EQ(params.front().sizes(), (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(params.back().sizes(), (std::vector<int64_t>{256}));
  EXPECT_EQ(flat[0], params.front().flatten()[0].item<float>());
  EXPECT_EQ(flat.back(), params.back()[255].item<float>());
}

TEST(FlatParamsTest, SizeMismatchIsRejected) {
  auto m = Gpt(4);
  std::vector<float> flat(10, 0.0f);
  absl::Status s = Unflatten(flat, m->Parameters());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
}

TEST(FlatParamsTest, SameSeedSameHashOneBitChangesIt) {
  auto a = Gpt(7), b = Gpt(7);
  EXPECT_EQ(ModelHash(a->Parameters()), ModelHash(b->Parameters()));
  std::vector<float> flat = Flatten(b->Parameters());
  uint32_t bits;
  std::memcpy(&bits, &flat[1234], 4);
  bits ^= 1u;  // flip the lowest mantissa bit
  std::memcpy(&flat[1234], &bits, 4);
  ASSERT_TRUE(Unflatten(flat, b->Parameters()).ok());
  EXPECT_NE(ModelHash(a->Parameters()), ModelHash(b->Parameters()));
}

TEST(FlatParamsTest, HashBytesDependsOnEveryByteAndLength) {
  std::string s(37, 'x');
  uint64_t h = HashBytes(s.data(), s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    std::string t = s;
    t[i] ^= 0x40;
    EXPECT_NE(HashBytes(t.data(), t.size()), h) << i;
  }
  EXPECT_NE(HashBytes(s.data(), s.size() - 1), h);
  EXPECT_EQ(HashBytes(s.data(), s.size()), h);
}

// Checkpoints and model hashes written by earlier builds stay valid: the
// values are pinned (from an independent implementation of the algorithm).
TEST(FlatParamsTest, HashBytesIsPinned) {
  const std::string s =
      std::string("starlingstarlingstarlingstarlingstarling") +
      "xyz";  // 5 words and a 3-byte tail
  EXPECT_EQ(HashBytes(s.data(), s.size()), 0x99cb8f0c24af409cULL);
  EXPECT_EQ(HashBytes(s.data(), 0), 0xd8a310150df90781ULL);
}

// Bytes fed in pieces hash as they do whole, wherever the pieces split the
// 8-byte words (empty pieces included).
TEST(FlatParamsTest, BytesHasherMatchesHashBytesForAnySplit) {
  std::mt19937 rng(7);
  for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 4099}) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    const uint64_t whole = HashBytes(s.data(), s.size());
    for (int trial = 0; trial < 20; ++trial) {
      BytesHasher hasher(n);
      size_t at = 0;
      do {
        const size_t take = std::min<size_t>(rng() % 11, n - at);
        hasher.Update(s.data() + at, take);
        at += take;
      } while (at < n);
      EXPECT_EQ(hasher.Finish(), whole) << n << " bytes, trial " << trial;
    }
  }
}

// The model hash covers buffers: it is the hash of the parameters' and the
// buffers' bytes together, and a model without buffers hashes as before.
TEST(FlatParamsTest, HashCoversBuffersAndIsUnchangedWithout) {
  const std::vector<float> params = {1.0f, -2.5f, 3.25f};
  std::vector<float> buffers = {0.5f, 1.0f};
  EXPECT_EQ(FlatHash(params, {}), FlatHash(params));
  EXPECT_EQ(FlatHash(params, {}),
            absl::StrFormat("%016x", HashBytes(params.data(), 12)));
  std::vector<float> both = params;
  both.insert(both.end(), buffers.begin(), buffers.end());
  EXPECT_EQ(FlatHash(params, buffers), FlatHash(both));
  const std::string before = FlatHash(params, buffers);
  buffers[1] = 1.0625f;
  EXPECT_NE(FlatHash(params, buffers), before);
  auto t = torch::zeros({2});
  EXPECT_NE(ModelHash({torch::ones({3})}, {t}), ModelHash({torch::ones({3})}));
}

// δb is exactly 0 where the shared and own values agree, infinities
// included, and a zero sum leaves the shared value exact.
TEST(FlatParamsTest, BufferMeanKeepsWhatNobodyMoved) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> shared = {-inf, 0.1f, 1.0f, 3.0f};
  const std::vector<float> own = {-inf, 0.1f, 0.5f, 4.0f};
  const std::vector<float> d = BufferDelta(shared, own);
  EXPECT_EQ(d, (std::vector<float>{0.0f, 0.0f, 0.5f, -1.0f}));
  // Two members, weights 1 and 3: the other moved nothing.
  std::vector<float> sum = {0.0f, 0.0f, 0.5f * 1, -1.0f * 1};
  std::vector<float> out = shared;
  ApplyBufferMean(sum, 4.0, absl::MakeSpan(out));
  EXPECT_EQ(out[0], -inf);
  EXPECT_EQ(out[1], 0.1f);
  EXPECT_FLOAT_EQ(out[2], 1.0f - 0.125f);
  EXPECT_FLOAT_EQ(out[3], 3.25f);
}

// An integer buffer (BatchNorm's num_batches_tracked) takes the nearest
// integer of an average, not its truncation.
TEST(FlatParamsTest, UnflattenRoundsIntegerTensors) {
  auto count = torch::zeros({2}, torch::kLong);
  ASSERT_TRUE(Unflatten(std::vector<float>{6.5001f, 6.4999f}, {count}).ok());
  EXPECT_EQ(count[0].item<int64_t>(), 7);
  EXPECT_EQ(count[1].item<int64_t>(), 6);
  EXPECT_EQ(Flatten({count}), (std::vector<float>{7.0f, 6.0f}));
}

}  // namespace
}  // namespace starling
