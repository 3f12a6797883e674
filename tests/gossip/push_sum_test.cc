// Push-sum gossip without networking: mass conservation and preservation of
// the weighted average over random exchanges (with failed sends and lossy
// codecs), and the bounds checks of push reassembly.
#include "gossip/push_sum.h"

#include <cmath>
#include <limits>
#include <random>

#include "compression/codec.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

constexpr int kN = 6;
constexpr int kDim = 300;

struct Node {
  PushSum ps;
  std::vector<float> y;
};

double TotalWeight(const std::vector<Node>& nodes, double in_flight) {
  double w = in_flight;
  for (const Node& n : nodes) w += n.ps.weight();
  return w;
}

// Σ w·y / Σ w, per coordinate.
std::vector<double> WeightedAverage(const std::vector<Node>& nodes) {
  std::vector<double> num(kDim, 0.0);
  double den = 0;
  for (const Node& n : nodes) {
    for (int i = 0; i < kDim; ++i) num[i] += n.ps.weight() * n.y[i];
    den += n.ps.weight();
  }
  for (double& v : num) v /= den;
  return num;
}

std::vector<Node> MakeNodes(std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<Node> nodes(kN);
  for (Node& n : nodes) {
    n.y.resize(kDim);
    for (float& v : n.y) v = normal(rng);
  }
  return nodes;
}

double ConsensusDistance(const std::vector<Node>& nodes) {
  std::vector<double> mean(kDim, 0.0);
  for (const Node& n : nodes) {
    for (int i = 0; i < kDim; ++i) mean[i] += n.y[i] / kN;
  }
  double d = 0;
  for (const Node& n : nodes) {
    for (int i = 0; i < kDim; ++i) d += std::pow(n.y[i] - mean[i], 2);
  }
  return d / kN;
}

class PushSumExchangeTest : public ::testing::TestWithParam<const char*> {};

// Random pushes among N nodes; one in four fails and is restored. After every
// exchange Σw = N and the weighted average is what it was at the start.
TEST_P(PushSumExchangeTest, MassAndAverageConserved) {
  std::unique_ptr<Codec> codec;
  if (std::string(GetParam()) != "raw") {
    auto c = MakeCodec(GetParam());
    ASSERT_TRUE(c.ok()) << c.status();
    codec = std::move(c).value();
  }
  std::mt19937 rng(7);
  std::vector<Node> nodes = MakeNodes(rng);
  const std::vector<double> start = WeightedAverage(nodes);
  const double start_distance = ConsensusDistance(nodes);
  std::uniform_int_distribution<int> pick(0, kN - 1);
  std::uniform_int_distribution<int> coin(0, 3);
  int failed = 0;
  for (int e = 0; e < 600; ++e) {
    const int s = pick(rng);
    int r = pick(rng);
    if (r == s) r = (r + 1) % kN;
    absl::StatusOr<PushShare> share =
        nodes[s].ps.Share(absl::MakeSpan(nodes[s].y), codec.get());
    ASSERT_TRUE(share.ok()) << share.status();
    // In flight: the sender kept half.
    EXPECT_NEAR(TotalWeight(nodes, share->weight), kN, 1e-6);
    if (coin(rng) == 0) {
      nodes[s].ps.Restore(*share, absl::MakeSpan(nodes[s].y));
      ++failed;
    } else {
      ASSERT_TRUE(
          nodes[r]
              .ps.Absorb(absl::MakeSpan(nodes[r].y), share->sent, share->weight)
              .ok());
    }
    ASSERT_NEAR(TotalWeight(nodes, 0), kN, 1e-6) << "exchange " << e;
    const std::vector<double> now = WeightedAverage(nodes);
    for (int i = 0; i < kDim; ++i) {
      ASSERT_NEAR(now[i], start[i], 1e-4) << "exchange " << e << " coord " << i;
    }
  }
  EXPECT_GT(failed, 0);
  // Gossip mixes: the nodes got closer together. With a lossy codec the
  // kept error stops exact consensus, but the spread still shrinks.
  EXPECT_LT(ConsensusDistance(nodes), 0.1 * start_distance);
}

INSTANTIATE_TEST_SUITE_P(Codecs, PushSumExchangeTest,
                         ::testing::Values("raw", "fp32", "fp16", "int8"));

TEST(PushSumTest, ShareHalvesWeightAndRestoreUndoes) {
  PushSum ps(1.0);
  std::vector<float> y = {1.0f, -2.5f, 3.25f};
  const std::vector<float> orig = y;
  auto codec = MakeCodec("int8");
  ASSERT_TRUE(codec.ok());
  absl::StatusOr<PushShare> share = ps.Share(absl::MakeSpan(y), codec->get());
  ASSERT_TRUE(share.ok());
  EXPECT_DOUBLE_EQ(ps.weight(), 0.5);
  EXPECT_DOUBLE_EQ(share->weight, 0.5);
  ps.Restore(*share, absl::MakeSpan(y));
  EXPECT_DOUBLE_EQ(ps.weight(), 1.0);
  EXPECT_EQ(y, orig);
}

TEST(PushSumTest, AbsorbIsWeightedAverageAndReturnsDistance) {
  PushSum ps(1.0);
  std::vector<float> y = {0.0f, 4.0f};
  std::vector<float> ys = {3.0f, 0.0f};
  absl::StatusOr<double> d = ps.Absorb(absl::MakeSpan(y), ys, 0.5);
  ASSERT_TRUE(d.ok());
  EXPECT_DOUBLE_EQ(*d, 9.0 + 16.0);
  EXPECT_FLOAT_EQ(y[0], 1.0f);  // (1·0 + 0.5·3) / 1.5
  EXPECT_FLOAT_EQ(y[1], 4.0f / 1.5f);
  EXPECT_DOUBLE_EQ(ps.weight(), 1.5);
}

TEST(PushSumTest, AbsorbRejectsBadInputAndChangesNothing) {
  PushSum ps(1.0);
  std::vector<float> y = {1.0f, 2.0f};
  const std::vector<float> orig = y;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(absl::IsInvalidArgument(
      ps.Absorb(absl::MakeSpan(y), std::vector<float>{1.0f}, 1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      ps.Absorb(absl::MakeSpan(y), std::vector<float>{1.0f, nan}, 1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      ps.Absorb(absl::MakeSpan(y), std::vector<float>{1.0f, 1.0f}, 0)
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      ps.Absorb(absl::MakeSpan(y), std::vector<float>{1.0f, 1.0f},
                std::numeric_limits<double>::infinity())
          .status()));
  EXPECT_EQ(y, orig);
  EXPECT_DOUBLE_EQ(ps.weight(), 1.0);

  // A finite weight past kMaxPushWeight is refused too: a second push of
  // 1e308 used to take this node's weight to Inf and y to 0 (1e308 / Inf),
  // and the next one, Inf / Inf, made every value of y NaN.
  auto huge =
      ps.Absorb(absl::MakeSpan(y), std::vector<float>{1.0f, 1.0f}, 1e308);
  EXPECT_TRUE(absl::IsInvalidArgument(huge.status()));
  EXPECT_EQ(huge.status().message(),
            "push-sum absorb: weight 1e+308 is not in (0, 1.04858e+06]");
  EXPECT_EQ(y, orig);
  ps.set_weight(std::numeric_limits<double>::infinity());
  auto overflow = ps.Absorb(absl::MakeSpan(y), std::vector<float>{1.0f, 1.0f},
                            kMaxPushWeight);
  ps.set_weight(1.0);
  EXPECT_TRUE(absl::IsInvalidArgument(overflow.status()));
  EXPECT_NE(overflow.status().message().find("is not finite"),
            std::string::npos)
      << overflow.status();
  EXPECT_EQ(y, orig);
  // The largest weight allowed is taken, and many of them keep y finite.
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(ps.Absorb(absl::MakeSpan(y), std::vector<float>{3.0f, 3.0f},
                          kMaxPushWeight)
                    .ok());
  }
  EXPECT_NEAR(y[0], 3.0f, 1e-5);
  EXPECT_NEAR(y[1], 3.0f, 1e-5);
}

// ---- Reassembly.

PushShare RawShare(std::vector<float> v, double w) {
  PushSum ps(2 * w);
  PushShare s = *ps.Share(absl::MakeSpan(v), nullptr);
  return s;
}

absl::StatusOr<ReceivedPush> Assemble(
    const std::vector<peer::v1::PushChunk>& chunks, int64_t elements,
    const Codec* codec = nullptr) {
  PushAssembler a("run", elements, codec, 1 << 20);
  for (const auto& c : chunks) {
    if (absl::Status s = a.Add(c); !s.ok()) return s;
  }
  return a.Finish();
}

TEST(PushAssemblerTest, RoundTripsRawAndCodecInSmallChunks) {
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * i - 3;
  PushShare s = RawShare(v, 0.25);
  auto chunks = MakePushChunks("run", "n1", 7, s, 1000, 333);
  EXPECT_GT(chunks.size(), 10u);
  absl::StatusOr<ReceivedPush> r = Assemble(chunks, 1000);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->values, v);
  EXPECT_EQ(r->from, "n1");
  EXPECT_EQ(r->sequence, 7);
  EXPECT_DOUBLE_EQ(r->weight, 0.25);

  auto codec = MakeCodec("int8");
  ASSERT_TRUE(codec.ok());
  PushSum ps(1.0);
  std::vector<float> y = v;
  PushShare cs = *ps.Share(absl::MakeSpan(y), codec->get());
  r = Assemble(MakePushChunks("run", "n1", 8, cs, 1000, 100), 1000,
               codec->get());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->values, cs.sent);
}

TEST(PushAssemblerTest, RejectsTruncatedOversizedAndMalformed) {
  std::vector<float> v(100, 1.0f);
  PushShare s = RawShare(v, 0.5);
  auto chunks = MakePushChunks("run", "n1", 1, s, 100, 64);
  // Truncated: the last chunk never came.
  auto cut = chunks;
  cut.pop_back();
  auto r = Assemble(cut, 100);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos);
  // Wrong element count for this model.
  EXPECT_TRUE(absl::IsInvalidArgument(Assemble(chunks, 99).status()));
  // Oversized: total_bytes claims more than the model, or a chunk runs past.
  auto big = chunks;
  for (auto& c : big) c.set_total_bytes(1 << 30);
  EXPECT_TRUE(absl::IsInvalidArgument(Assemble(big, 100).status()));
  auto overrun = chunks;
  overrun.back().mutable_data()->append(16, 'x');
  EXPECT_TRUE(absl::IsInvalidArgument(Assemble(overrun, 100).status()));
  // Out of order.
  auto swapped = chunks;
  std::swap(swapped[1], swapped[2]);
  EXPECT_TRUE(absl::IsInvalidArgument(Assemble(swapped, 100).status()));
  // Wrong run, a codec this node does not decode, nothing at all.
  auto other = chunks;
  other[0].set_run_id("other");
  EXPECT_TRUE(absl::IsInvalidArgument(Assemble(other, 100).status()));
  auto coded = chunks;
  for (auto& c : coded) c.set_codec("int8");
  EXPECT_TRUE(absl::IsInvalidArgument(Assemble(coded, 100).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(Assemble({}, 100).status()));
}

TEST(PushAssemblerTest, RejectsNaNValuesAndBadWeights) {
  std::vector<float> v(100, 1.0f);
  PushShare s = RawShare(v, 0.5);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(s.payload.data() + 40 * sizeof(float), &nan, sizeof(float));
  auto r = Assemble(MakePushChunks("run", "n1", 1, s, 100, 64), 100);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_NE(r.status().message().find("value 40"), std::string::npos)
      << r.status();
  for (double w : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::quiet_NaN(),
                   kMaxPushWeight * 1.0001, 1e308}) {
    PushShare ok = RawShare(v, 0.5);
    ok.weight = w;
    auto chunks = MakePushChunks("run", "n1", 1, ok, 100, 64);
    EXPECT_TRUE(absl::IsInvalidArgument(Assemble(chunks, 100).status())) << w;
  }
  // A weight on a later chunk.
  PushShare ok = RawShare(v, 0.5);
  auto chunks = MakePushChunks("run", "n1", 1, ok, 100, 64);
  chunks[1].set_weight(1.0);
  EXPECT_TRUE(absl::IsInvalidArgument(Assemble(chunks, 100).status()));
}

// A corrupt lossy payload decodes to an error, never out of bounds.
TEST(PushAssemblerTest, CorruptCodecPayloadIsRejected) {
  auto codec = MakeCodec("int8");
  ASSERT_TRUE(codec.ok());
  std::vector<float> y(500, 0.5f);
  PushSum ps(1.0);
  PushShare s = *ps.Share(absl::MakeSpan(y), codec->get());
  s.payload.resize(s.payload.size() / 2);
  auto r =
      Assemble(MakePushChunks("run", "n1", 1, s, 500, 64), 500, codec->get());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
}

// ---- Public copies (CHOCO-style relative pushes).

// A sender pushes a slowly moving model to a receiver again and again over
// the wire format, with int8: relative pushes rebuild exactly what the sender
// sent, keep the mass and Σw·y exact, and lose far less than absolute ones.
TEST(PublicCopiesTest, RelativePushesRebuildTheSentModelAndLoseLess) {
  auto codec = MakeCodec("int8");
  ASSERT_TRUE(codec.ok());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> start(kDim);
  for (float& v : start) v = normal(rng);
  double error[2] = {0, 0};  // absolute, relative
  for (int relative = 0; relative < 2; ++relative) {
    PushSum sender(1.0), receiver(1.0);
    std::vector<float> y = start, z(kDim, 0.0f);
    PublicCopies copies;
    PublicCopy copy;  // the sender's, of what the receiver holds
    for (int push = 1; push <= 30; ++push) {
      for (float& v : y) v += 0.01f * normal(rng);  // local steps
      const double mass_before = sender.weight() + receiver.weight();
      std::vector<double> num(kDim);
      for (int i = 0; i < kDim; ++i) {
        num[i] = sender.weight() * y[i] + receiver.weight() * z[i];
      }
      const std::vector<float> exact = y;
      absl::StatusOr<PushShare> share = sender.Share(
          absl::MakeSpan(y), codec->get(), relative ? &copy : nullptr);
      ASSERT_TRUE(share.ok()) << share.status();
      EXPECT_EQ(share->base_sequence, relative && push > 1 ? push - 1 : 0);
      absl::StatusOr<ReceivedPush> r =
          Assemble(MakePushChunks("run", "n1", push, *share, kDim, 100), kDim,
                   codec->get());
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_TRUE(copies.Resolve(*r).ok());
      EXPECT_EQ(r->values, share->sent);  // bit for bit
      copy = PublicCopy{push, share->sent};
      if (push > 5) {
        for (int i = 0; i < kDim; ++i) {
          error[relative] += std::pow(share->sent[i] - exact[i], 2);
        }
      }
      ASSERT_TRUE(
          receiver.Absorb(absl::MakeSpan(z), r->values, r->weight).ok());
      EXPECT_NEAR(sender.weight() + receiver.weight(), mass_before, 1e-12);
      for (int i = 0; i < kDim; ++i) {
        EXPECT_NEAR(sender.weight() * y[i] + receiver.weight() * z[i], num[i],
                    1e-5);
      }
      sender.set_weight(1.0);  // keep the scale fixed between pushes
      receiver.set_weight(1.0);
    }
  }
  EXPECT_LT(error[1], 0.05 * error[0]) << error[0] << " " << error[1];
}

TEST(PublicCopiesTest, RelativePushWithoutTheNamedCopyIsRefused) {
  auto codec = MakeCodec("int8");
  ASSERT_TRUE(codec.ok());
  std::vector<float> y(kDim, 0.5f);
  PushSum ps(1.0);
  PublicCopies copies;
  // A relative push to a receiver that holds no copy (it restarted).
  PublicCopy stale{4, std::vector<float>(kDim, 0.25f)};
  PushShare share = *ps.Share(absl::MakeSpan(y), codec->get(), &stale);
  absl::StatusOr<ReceivedPush> r = Assemble(
      MakePushChunks("run", "n1", 5, share, kDim, 1 << 20), kDim, codec->get());
  ASSERT_TRUE(r.ok()) << r.status();
  absl::Status s = copies.Resolve(*r);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("n1"), std::string::npos) << s;
  EXPECT_EQ(copies.size(), 0);
  // An absolute push sets the copy; a relative one naming another push is
  // still refused, and the copy stays.
  ps.Restore(share, absl::MakeSpan(y));
  share = *ps.Share(absl::MakeSpan(y), codec->get());
  r = Assemble(MakePushChunks("run", "n1", 6, share, kDim, 1 << 20), kDim,
               codec->get());
  ASSERT_TRUE(r.ok() && copies.Resolve(*r).ok());
  const std::vector<float> held = r->values;
  share = *ps.Share(absl::MakeSpan(y), codec->get(), &stale);
  r = Assemble(MakePushChunks("run", "n1", 7, share, kDim, 1 << 20), kDim,
               codec->get());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(copies.Resolve(*r)));
  PublicCopy right{6, held};
  share = *ps.Share(absl::MakeSpan(y), codec->get(), &right);
  r = Assemble(MakePushChunks("run", "n1", 8, share, kDim, 1 << 20), kDim,
               codec->get());
  ASSERT_TRUE(r.ok() && copies.Resolve(*r).ok());
  EXPECT_EQ(r->values, share.sent);
  // Forgotten (n1 left or died): the copy is gone, so a push relative to it
  // is refused again, and the sender then pushes in full.
  EXPECT_EQ(copies.size(), 1);
  copies.Forget("n0");  // no copy: nothing happens
  EXPECT_EQ(copies.size(), 1);
  copies.Forget("n1");
  EXPECT_EQ(copies.size(), 0);
  PublicCopy last{8, share.sent};
  share = *ps.Share(absl::MakeSpan(y), codec->get(), &last);
  r = Assemble(MakePushChunks("run", "n1", 9, share, kDim, 1 << 20), kDim,
               codec->get());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(copies.Resolve(*r)));
  // A relative raw fp32 push is malformed.
  auto raw = MakePushChunks("run", "n1", 10, RawShare(y, 0.5), kDim, 1 << 20);
  for (auto& c : raw) c.set_base_sequence(8);
  EXPECT_TRUE(absl::IsInvalidArgument(Assemble(raw, kDim).status()));
}

}  // namespace
}  // namespace starling
