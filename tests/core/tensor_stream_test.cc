#include "core/tensor_stream.h"

#include <torch/torch.h>

#include <cstring>
#include <string>

#include "core/byte_stream.h"
#include "core/optimizer_state.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

// The bytes of `t` (CPU, contiguous), for bit-exact comparisons.
std::string Bits(const torch::Tensor& t) {
  torch::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

std::string Stream(const NamedTensors& tensors) {
  std::string out;
  StringSink sink(&out);
  EXPECT_TRUE(WriteTensors(tensors, sink).ok());
  return out;
}

NamedTensors Sample() {
  torch::manual_seed(3);
  return {{"w", torch::randn({3, 4})},
          {"b", torch::randn({4}, torch::kFloat64)},
          {"steps", torch::scalar_tensor(7, torch::kInt64)},
          {"empty", torch::empty({0, 5})},
          {"mask", torch::tensor({true, false, true})}};
}

TEST(TensorStreamTest, RoundTripsBitsDtypesAndShapes) {
  NamedTensors in = Sample();
  const std::string bytes = Stream(in);
  EXPECT_EQ(bytes.size(), *TensorsSize(in));
  NamedTensors out;
  StringSource source(bytes);
  ASSERT_TRUE(ReadTensors(source, [&](const TensorHeader& h) {
                torch::Tensor t =
                    torch::full(h.shape, 9, torch::dtype(h.dtype));
                out.emplace_back(h.name, t);
                return t;
              }).ok());
  EXPECT_EQ(source.remaining(), 0u);
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].first, in[i].first);
    EXPECT_EQ(out[i].second.scalar_type(), in[i].second.scalar_type());
    EXPECT_EQ(out[i].second.sizes(), in[i].second.sizes());
    EXPECT_EQ(Bits(out[i].second), Bits(in[i].second)) << in[i].first;
  }
}

// A strided tensor goes out as its logical (row-major) values, and comes
// back into a strided destination in place.
TEST(TensorStreamTest, StridedTensorsGoOutAndComeBackInOrder) {
  torch::Tensor base = torch::arange(12, torch::kFloat32).reshape({3, 4});
  const std::string bytes = Stream({{"t", base.t()}});
  torch::Tensor dst_base = torch::zeros({3, 4});
  torch::Tensor dst = dst_base.t();  // strided view, [4, 3]
  StringSource source(bytes);
  ASSERT_TRUE(
      ReadTensors(source, [&](const TensorHeader&) { return dst; }).ok());
  EXPECT_TRUE(torch::equal(dst_base, base));
}

// Every header is matched before any destination is written: a stream
// whose last tensor does not fit leaves the earlier destinations as they
// were.
TEST(TensorStreamTest, AMismatchWritesNothing) {
  const std::string bytes =
      Stream({{"a", torch::ones({4})}, {"b", torch::ones({2, 2})}});
  torch::Tensor a = torch::zeros({4});
  torch::Tensor b = torch::zeros({4});  // wrong shape
  StringSource source(bytes);
  absl::Status s = ReadTensors(
      source, [&](const TensorHeader& h) { return h.name == "a" ? a : b; });
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("tensor b is Float[2,2]"), std::string::npos) << s;
  EXPECT_TRUE(torch::equal(a, torch::zeros({4})));
  // A destination's own error comes back as it is, also before any write.
  StringSource again(bytes);
  s = ReadTensors(again,
                  [&](const TensorHeader& h) -> absl::StatusOr<torch::Tensor> {
                    if (h.name == "b") return absl::NotFoundError("no b here");
                    return a;
                  });
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_TRUE(torch::equal(a, torch::zeros({4})));
}

// Damaged framing is DataLoss, and no size is believed past the stream's
// end: a header claiming 2^40 elements allocates nothing.
TEST(TensorStreamTest, MalformedStreamsAreDataLoss) {
  const std::string good = Stream({{"w", torch::ones({2, 3})}});
  // Offsets: magic 0, version 8, count 12, name_len 16, name 20, dtype 21,
  // ndim 22, dims 23 and 31, bytes 39.
  auto with = [&](size_t offset, std::string bytes) {
    std::string s = good;
    s.replace(offset, bytes.size(), bytes);
    return s;
  };
  auto i64 = [](int64_t v) {
    return std::string(reinterpret_cast<const char*>(&v), 8);
  };
  int calls = 0;
  auto any = [&](const TensorHeader& h) {
    ++calls;
    return torch::empty(h.shape, torch::dtype(h.dtype));
  };
  for (const auto& [bytes, why] :
       std::vector<std::pair<std::string, std::string>>{
           {with(0, "X"), "bad magic"},
           {with(8, std::string("\x02", 1)), "unsupported version 2"},
           {with(12, std::string("\xff\xff", 2)), "cannot fit"},
           {with(21, std::string("\x63", 1)), "dtype code 99"},
           {with(22, std::string("\x40", 1)), "64 dimensions"},
           {with(23, i64(int64_t{1} << 40)), "larger than the stream"},
           {with(23, i64(-1)), "larger than the stream"},
           {good.substr(0, good.size() - 1), "larger than the stream"},
           {good + "x", "the tensors hold 24 bytes"},
           {good.substr(0, 10), "bad magic"},
       }) {
    SCOPED_TRACE(why);
    StringSource source(bytes);
    absl::Status s = ReadTensors(source, any);
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    EXPECT_NE(s.message().find(why), std::string::npos) << s;
  }
  EXPECT_EQ(calls, 0);
}

TEST(TensorStreamTest, RefusesWhatItCannotCarry) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      TensorsSize({{"z", torch::zeros({2}, torch::kComplexFloat)}}).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(TensorsSize({{"u", torch::Tensor()}}).status()));
}

// The optimizer's state goes through a stream into a fresh optimizer bit
// for bit, and both then take the same next step.
template <typename Opt, typename Options>
void ExpectStateRoundTrip(Options options) {
  torch::manual_seed(1);
  torch::nn::Linear a_model(5, 3), b_model(5, 3);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < a_model->parameters().size(); ++i) {
      b_model->parameters()[i].copy_(a_model->parameters()[i]);
    }
  }
  Opt a(a_model->parameters(), options), b(b_model->parameters(), options);
  torch::Tensor x = torch::randn({8, 5});
  auto step = [&](torch::nn::Linear& m, Opt& opt) {
    opt.zero_grad();
    m(x).pow(2).sum().backward();
    opt.step();
  };
  step(a_model, a);
  step(a_model, a);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < a_model->parameters().size(); ++i) {
      b_model->parameters()[i].copy_(a_model->parameters()[i]);
    }
  }
  absl::StatusOr<NamedTensors> state = OptimizerStateTensors(a);
  ASSERT_TRUE(state.ok()) << state.status();
  const std::string bytes = Stream(*state);
  StringSource source(bytes);
  ASSERT_TRUE(ReadOptimizerState(source, b).ok());
  step(a_model, a);
  step(b_model, b);
  for (size_t i = 0; i < a_model->parameters().size(); ++i) {
    EXPECT_EQ(Bits(a_model->parameters()[i]), Bits(b_model->parameters()[i]));
  }
}

TEST(OptimizerStateTest, AdamWAdamAndSgdRoundTripExactly) {
  ExpectStateRoundTrip<torch::optim::AdamW>(
      torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  ExpectStateRoundTrip<torch::optim::Adam>(
      torch::optim::AdamOptions(0.01).amsgrad(true));
  ExpectStateRoundTrip<torch::optim::SGD>(
      torch::optim::SGDOptions(0.01).momentum(0.9));
}

TEST(OptimizerStateTest, ABadStreamLeavesTheStateAlone) {
  torch::nn::Linear model(4, 2);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions());
  opt.zero_grad();
  model(torch::ones({1, 4})).sum().backward();
  opt.step();
  const size_t held = opt.state().size();
  auto refused = [&](const NamedTensors& entries, absl::string_view why) {
    const std::string bytes = Stream(entries);
    StringSource source(bytes);
    absl::Status s = ReadOptimizerState(source, opt);
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    EXPECT_NE(s.message().find(why), std::string::npos) << s;
    EXPECT_EQ(opt.state().size(), held);
  };
  const torch::Tensor step = torch::scalar_tensor(1, torch::kInt64);
  refused({{"9.step", step}}, "names no parameter");
  refused({{"0.momentum_buffer", torch::zeros({2, 4})}}, "names no field");
  refused({{"0.step", step}, {"0.exp_avg", torch::zeros({2, 4})}},
          "parameter 0 is incomplete");
  refused({{"0.step", step}, {"0.step", step}}, "appears twice");
  refused({{"0.step", step},
           {"0.exp_avg", torch::zeros({4, 2})},
           {"0.exp_avg_sq", torch::zeros({2, 4})}},
          "tensor 0.exp_avg is Float[4,2]");
}

}  // namespace
}  // namespace starling
