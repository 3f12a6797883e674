#include "gossip/ring_allreduce.h"

#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "compression/tensor_policy.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

// Runs RingWeightedAverage on `world` ranks as threads over an in-process
// network and returns every rank's result.
std::vector<std::vector<float>> RunRanks(
    int world, const std::vector<std::vector<float>>& inputs,
    const std::vector<double>& weights, InProcessNetwork& net,
    std::vector<absl::Status>* statuses, int64_t round = 0,
    absl::Duration step_timeout = absl::Seconds(20)) {
  std::vector<std::vector<float>> out = inputs;
  statuses->assign(world, absl::OkStatus());
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RingOptions o;
      o.round = round;
      o.step_timeout = step_timeout;
      (*statuses)[r] =
          RingWeightedAverage(net.transport(r), out[r], weights[r], o);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

class RingTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(RingTest, WeightedAverageIsExactAndBitIdenticalOnEveryRank) {
  const auto [world, size] = GetParam();
  std::mt19937 rng(world * 1000 + size);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<std::vector<float>> inputs(world, std::vector<float>(size));
  std::vector<double> weights(world);
  for (int r = 0; r < world; ++r) {
    for (float& v : inputs[r]) v = normal(rng);
    weights[r] = 100 + 37 * r;  // unequal, like samples processed
  }
  MailboxOptions mo;
  mo.tensors = {{"pseudo_grad", size + 1}};
  InProcessNetwork net(world, mo);
  std::vector<absl::Status> st;
  auto out = RunRanks(world, inputs, weights, net, &st);
  double wsum = 0;
  for (double w : weights) wsum += w;
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
    ASSERT_EQ(out[r].size(), static_cast<size_t>(size));
    // Bit-identical on every member.
    EXPECT_EQ(std::memcmp(out[r].data(), out[0].data(), size * 4), 0) << r;
  }
  for (int i = 0; i < size; ++i) {
    double want = 0;
    for (int r = 0; r < world; ++r) want += weights[r] * inputs[r][i];
    want /= wsum;
    EXPECT_NEAR(out[0][i], want, 1e-5 * (1 + std::abs(want))) << i;
  }
  // Bandwidth-optimal: each rank sends 2(N-1) segments of about size/N.
  if (world > 1) {
    double per_rank = 2.0 * (world - 1) / world * (size + 1) * 4;
    for (int r = 0; r < world; ++r) {
      EXPECT_NEAR(net.transport(r).bytes_sent(), per_rank,
                  2.0 * (world - 1) * 4 + 1)
          << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RingTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 7),
                                            ::testing::Values(1, 2, 13, 1000,
                                                              4097)));

TEST(RingDeterminismTest, SameInputsSameBytes) {
  const int world = 5, size = 999;
  std::vector<std::vector<float>> inputs(world, std::vector<float>(size));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1e3f, 1e3f);
  for (auto& v : inputs) {
    for (float& x : v) x = u(rng);
  }
  std::vector<double> weights(world, 16.0);
  std::vector<absl::Status> st;
  MailboxOptions mo;
  mo.tensors = {{"pseudo_grad", size + 1}};
  InProcessNetwork a(world, mo), b(world, mo);
  auto x = RunRanks(world, inputs, weights, a, &st);
  auto y = RunRanks(world, inputs, weights, b, &st);
  EXPECT_EQ(std::memcmp(x[3].data(), y[3].data(), size * 4), 0);
}

// RingWeightedAverage with int8 segments (weight in fp32) on one rank per
// input vector, as threads; every rank's result, status and byte counts.
std::vector<std::vector<float>> RunInt8Ranks(
    const std::vector<std::vector<float>>& inputs, double weight,
    std::vector<absl::Status>* st, std::vector<RingStats>* stats,
    absl::Duration step_timeout = absl::Seconds(20)) {
  const int world = static_cast<int>(inputs.size());
  const int64_t size = static_cast<int64_t>(inputs[0].size());
  PolicyOptions po;
  po.main = "int8";
  po.trailing_fp32 = 1;
  auto codec = PolicyCodec::Create({size}, po);
  stats->assign(world, RingStats());
  st->assign(world, codec.status());
  if (!codec.ok()) return inputs;
  MailboxOptions mo;
  mo.tensors = {{"pseudo_grad", size + 1}};
  mo.compressed_bytes_per_element = {{"pseudo_grad", 8}};
  InProcessNetwork net(world, mo);
  std::vector<std::vector<float>> out = inputs;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RingOptions o;
      o.codec = codec->get();
      o.stats = &(*stats)[r];
      o.step_timeout = step_timeout;
      (*st)[r] = RingWeightedAverage(net.transport(r), out[r], weight, o);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// With a lossy codec the members still end bit-identical (owners quantize
// once, the all-gather forwards bytes unchanged) and close to the average.
TEST(RingCompressionTest, Int8RingIsBitIdenticalAndCloseToTheAverage) {
  const int world = 4, size = 10000;
  std::vector<std::vector<float>> v(world, std::vector<float>(size));
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& x : v) {
    for (float& f : x) f = normal(rng);
  }
  std::vector<RingStats> stats;
  std::vector<absl::Status> st;
  std::vector<std::vector<float>> out = RunInt8Ranks(v, 10.0, &st, &stats);
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    EXPECT_EQ(std::memcmp(out[r].data(), out[0].data(), size * 4), 0) << r;
    // About 4x fewer bytes than fp32.
    EXPECT_LT(stats[r].wire_bytes * 3, stats[r].raw_bytes);
  }
  double max_err = 0;
  for (int i = 0; i < size; ++i) {
    double avg = 0;
    for (int r = 0; r < world; ++r) avg += v[r][i] / world;
    max_err = std::max(max_err, std::abs(avg - out[0][i]));
  }
  EXPECT_LT(max_err, 0.1);
}

// A compressed partial sum that overflows to Inf is refused by the member
// that decodes it, blaming the sender, and leaves the values unchanged.
TEST(RingCompressionTest, ASumThatDecodesToInfIsRefusedAndBlamesTheSender) {
  const int world = 3, size = 3000;
  // Finite, but any two of them add up to Inf.
  const std::vector<float> big(size, 3e38f);
  std::vector<RingStats> stats;
  std::vector<absl::Status> st;
  std::vector<std::vector<float>> out = RunInt8Ranks(
      std::vector<std::vector<float>>(world, big), 1.0, &st, &stats);
  for (int r = 0; r < world; ++r) {
    // Every member adds its first incoming segment to its own: all fail.
    EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << r << ": " << st[r];
    EXPECT_NE(st[r].message().find("overflows fp32 to Inf"), std::string::npos)
        << st[r];
    EXPECT_EQ(BlamedRank(st[r]), (r + world - 1) % world) << st[r];
    EXPECT_EQ(out[r], big) << r;
  }
}

// The same with raw fp32: the member that adds a partial sum that overflows
// refuses it and blames the sender (not the next member, which would find
// the Inf in what it forwards).
TEST(RingFailureTest, ARawSumThatOverflowsIsRefusedAndBlamesTheSender) {
  const int world = 3, size = 3000;
  const std::vector<std::vector<float>> inputs(world,
                                               std::vector<float>(size, 3e38f));
  MailboxOptions mo;
  mo.tensors = {{"pseudo_grad", size + 1}};
  InProcessNetwork net(world, mo);
  std::vector<absl::Status> st;
  auto out = RunRanks(world, inputs, std::vector<double>(world, 1.0), net, &st);
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << r << ": " << st[r];
    EXPECT_NE(st[r].message().find("overflows fp32 to Inf"), std::string::npos)
        << st[r];
    EXPECT_EQ(BlamedRank(st[r]), (r + world - 1) % world) << st[r];
    EXPECT_EQ(out[r], inputs[r]) << r;
  }
}

// A member whose own values hold a NaN fails without blaming the member
// that sent it finite values, raw or compressed. (The others then wait for
// it until their step timeout.)
TEST(RingFailureTest, AMemberWithANaNOfItsOwnBlamesNobody) {
  const int world = 3, size = 3000;
  std::vector<std::vector<float>> inputs(world, std::vector<float>(size, 1));
  // Rank 1 adds what rank 0 sends into segment 0 at its first step.
  inputs[1][5] = std::numeric_limits<float>::quiet_NaN();
  MailboxOptions mo;
  mo.tensors = {{"pseudo_grad", size + 1}};
  InProcessNetwork net(world, mo);
  std::vector<absl::Status> st;
  RunRanks(world, inputs, std::vector<double>(world, 1.0), net, &st,
           /*round=*/0, absl::Milliseconds(500));
  EXPECT_TRUE(absl::IsInternal(st[1])) << st[1];
  EXPECT_NE(st[1].message().find("own value at element 5 is not finite"),
            std::string::npos)
      << st[1];
  EXPECT_EQ(BlamedRank(st[1]), -1) << st[1];

  std::vector<RingStats> stats;
  RunInt8Ranks(inputs, 1.0, &st, &stats, absl::Milliseconds(500));
  EXPECT_TRUE(absl::IsInternal(st[1])) << st[1];
  EXPECT_NE(st[1].message().find("own value at element 5 is not finite"),
            std::string::npos)
      << st[1];
  EXPECT_EQ(BlamedRank(st[1]), -1) << st[1];
}

TEST(RingFailureTest, MissingPeerTimesOutAndLeavesValuesUnchanged) {
  MailboxOptions mo;
  mo.tensors = {{"pseudo_grad", 11}};
  InProcessNetwork net(3, mo);
  std::vector<float> v(10, 1.5f);
  RingOptions o;
  o.step_timeout = absl::Milliseconds(200);
  // Only rank 0 runs: rank 2 never sends to it.
  absl::Status s = RingWeightedAverage(net.transport(0), v, 1.0, o);
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("rank 2"), std::string::npos) << s;
  EXPECT_EQ(v, std::vector<float>(10, 1.5f));
}

TEST(RingFailureTest, NonPositiveWeightIsRejected) {
  MailboxOptions mo;
  mo.tensors = {{"pseudo_grad", 3}};
  InProcessNetwork net(2, mo);
  std::vector<float> v(2, 1.0f);
  EXPECT_TRUE(absl::IsInvalidArgument(
      RingWeightedAverage(net.transport(0), v, 0.0, RingOptions())));
}

// Every rank ends with every rank's whole vector; a vector with a NaN is
// refused by every receiver alike (its slot empty, the reason given) while
// the others arrive intact; a whole tensor in segments is refused.
TEST(AllGatherWholeTest, EveryRankGetsEveryVectorAndNaNIsRefusedEverywhere) {
  constexpr int kWorld = 4;
  constexpr int64_t kSize = 1001;
  MailboxOptions mo;
  mo.run_id = "r";
  mo.tensors = {{"whole", kSize}};
  mo.whole_tensors = {"whole"};
  InProcessNetwork net(kWorld, mo);
  std::vector<std::vector<float>> inputs(kWorld, std::vector<float>(kSize));
  for (int r = 0; r < kWorld; ++r) {
    for (int64_t i = 0; i < kSize; ++i) inputs[r][i] = r * 1000.0f + i;
  }
  inputs[2][500] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<std::vector<float>>> packs(kWorld);
  std::vector<std::vector<std::string>> refused(kWorld);
  std::vector<absl::Status> st(kWorld);
  std::vector<RingStats> stats(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      RingOptions o;
      o.tensor = "whole";
      o.step_timeout = absl::Seconds(20);
      o.stats = &stats[r];
      st[r] = AllGatherWhole(net.transport(r), inputs[r], o, &packs[r],
                             &refused[r]);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(st[r].ok()) << r << ": " << st[r];
    ASSERT_EQ(packs[r].size(), kWorld);
    for (int from = 0; from < kWorld; ++from) {
      if (from == 2 && r != 2) {
        EXPECT_TRUE(packs[r][from].empty());
        EXPECT_NE(refused[r][from].find("non-finite"), std::string::npos)
            << refused[r][from];
        continue;
      }
      EXPECT_EQ(refused[r][from], "");
      EXPECT_EQ(packs[r][from].size(), kSize);
      if (from != 2) EXPECT_EQ(packs[r][from], inputs[from]);
    }
    EXPECT_EQ(stats[r].raw_bytes, (kWorld - 1) * kSize * 4);
  }
  Message m;
  m.from = 1;
  m.tensor = "whole";
  m.phase = RingPhase::kAllGather;
  m.segment = 1;
  m.total_elements = kSize;
  m.payload.assign(kSize * 4, '\0');
  MailboxOptions one = mo;
  one.world = kWorld;
  Mailbox box(one);
  absl::Status s = box.Deliver(m);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("travels whole"), std::string::npos) << s;
  m.segment = 0;
  EXPECT_TRUE(box.Deliver(m).ok());
}

// The sparse codec's all-gather: every rank ends with the same bits, the sum
// in rank order of every rank's decoded payload, and sends its encoded
// vector once to each other rank.
TEST(AllGatherSumTest, EveryRankEndsWithTheSumOfTheDecodedPayloads) {
  constexpr int kWorld = 4;
  constexpr int64_t kSize = 20001;  // the last element: a weight, in fp32
  PolicyOptions po;
  po.main = "sparse:0.01";
  po.small_elements = 0;
  po.trailing_fp32 = 1;
  auto codec = PolicyCodec::Create({kSize - 1}, po);
  ASSERT_TRUE(codec.ok()) << codec.status();
  MailboxOptions mo;
  mo.tensors = {{"sparse", kSize}};
  mo.whole_tensors = {"sparse"};
  mo.compressed_bytes_per_element = {{"sparse", 8}};
  InProcessNetwork net(kWorld, mo);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> v(kWorld, std::vector<float>(kSize));
  for (int r = 0; r < kWorld; ++r) {
    for (float& x : v[r]) x = normal(rng);
    v[r].back() = 16.0f * (r + 1);
  }
  // What every rank must end with: Σ_r D(E(v_r)), added in rank order.
  std::vector<float> want(kSize, 0.0f);
  std::vector<int64_t> encoded_bytes(kWorld);  // each rank's, variable
  for (int r = 0; r < kWorld; ++r) {
    auto e = (*codec)->EncodeSlice(0, v[r]);
    ASSERT_TRUE(e.ok());
    encoded_bytes[r] = static_cast<int64_t>(e->size());
    ASSERT_TRUE(
        (*codec)->DecodeSliceAccumulate(0, *e, absl::MakeSpan(want)).ok());
  }
  std::vector<std::vector<float>> out = v;
  std::vector<absl::Status> st(kWorld);
  std::vector<RingStats> stats(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      RingOptions o;
      o.tensor = "sparse";
      o.codec = codec->get();
      o.stats = &stats[r];
      o.step_timeout = absl::Seconds(20);
      st[r] = AllGatherSum(net.transport(r), absl::MakeSpan(out[r]), o);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(st[r].ok()) << r << ": " << st[r];
    EXPECT_EQ(std::memcmp(out[r].data(), want.data(), kSize * 4), 0) << r;
    EXPECT_EQ(out[r].back(), 160.0f);  // the weights travel exactly
    EXPECT_EQ(stats[r].wire_bytes, (kWorld - 1) * encoded_bytes[r]);
    // 1% of the values at 2 bits and a few bits of index each.
    EXPECT_LT(stats[r].wire_bytes * 100, stats[r].raw_bytes);
  }
}

// A payload that does not decode is refused by every receiver, blaming the
// rank that sent it, and a missing codec is refused before anything is sent.
TEST(AllGatherSumTest, ACorruptPayloadBlamesItsSender) {
  constexpr int kWorld = 3;
  constexpr int64_t kSize = 8192;
  PolicyOptions po;
  po.main = "sparse:0.01";
  po.small_elements = 0;
  auto codec = PolicyCodec::Create({kSize}, po);
  ASSERT_TRUE(codec.ok()) << codec.status();
  MailboxOptions mo;
  mo.tensors = {{"sparse", kSize}};
  mo.whole_tensors = {"sparse"};
  mo.compressed_bytes_per_element = {{"sparse", 8}};
  InProcessNetwork net(kWorld, mo);
  std::vector<float> x(kSize, 0.5f);
  {
    std::vector<float> y = x;
    absl::Status s =
        AllGatherSum(net.transport(0), absl::MakeSpan(y), RingOptions());
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  }
  // Rank 1's payload cut short by a byte, as rank 1 would send it.
  auto bad = (*codec)->EncodeSlice(0, x);
  ASSERT_TRUE(bad.ok());
  bad->pop_back();
  Message m;
  m.from = 1;
  m.tensor = "sparse";
  m.phase = RingPhase::kAllGather;
  m.total_elements = kSize;
  m.payload = *bad;
  std::vector<absl::Status> st(kWorld);
  std::vector<std::thread> threads;
  for (int r : {0, 2}) {
    threads.emplace_back([&, r] {
      RingOptions o;
      o.tensor = "sparse";
      o.codec = codec->get();
      o.step_timeout = absl::Seconds(20);
      std::vector<float> y = x;
      st[r] = AllGatherSum(net.transport(r), absl::MakeSpan(y), o);
    });
  }
  for (int to : {0, 2}) {
    ASSERT_TRUE(net.transport(1)
                    .SendPayload(to, m, m.payload, nullptr,
                                 absl::Now() + absl::Seconds(20))
                    .ok());
  }
  for (auto& t : threads) t.join();
  for (int r : {0, 2}) {
    EXPECT_FALSE(st[r].ok()) << r;
    EXPECT_EQ(BlamedRank(st[r]), 1) << r << ": " << st[r];
    EXPECT_NE(st[r].message().find("bad contribution from rank 1"),
              std::string::npos)
        << st[r];
  }
}

}  // namespace
}  // namespace starling
