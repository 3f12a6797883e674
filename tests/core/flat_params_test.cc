#include "core/flat_params.h"

#include <torch/torch.h>

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

}  // namespace
}  // namespace starling
