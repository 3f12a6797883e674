#include "outer_opt/diloco_round.h"

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/flat_params.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

constexpr int kN = 256;

std::vector<float> Random(int n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::unique_ptr<Codec> Int4() {
  absl::StatusOr<std::unique_ptr<Codec>> c = MakeCodec("int4");
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

std::unique_ptr<OuterOptimizer> Outer(const std::string& kind) {
  OuterOptions o;
  o.kind = kind;
  if (kind == "average") {
    o.lr = 1;
    o.momentum = 0;
  }
  absl::StatusOr<std::unique_ptr<OuterOptimizer>> outer =
      OuterOptimizer::Create(o, kN);
  EXPECT_TRUE(outer.ok()) << outer.status();
  return std::move(outer).value();
}

RoundWork Work(int steps, int64_t samples) {
  RoundWork w;
  w.steps = steps;
  w.samples = samples;
  w.data_share = 0.25;
  return w;
}

TEST(DilocoRoundTest, PseudoGradientIsStartMinusTrained) {
  std::vector<float> start = {1, 2, 3}, trained = {0.5f, 2.5f, 3};
  EXPECT_EQ(PseudoGradient(start, trained),
            (std::vector<float>{0.5f, -0.5f, 0}));
}

TEST(DilocoRoundTest, ContributionWithoutErrorFeedbackIsTheWeightedDelta) {
  const std::vector<float> delta = Random(kN, 1);
  RoundWork work = Work(10, 640);
  work.stop_vote = true;
  absl::StatusOr<DilocoRound> round =
      DilocoRound::Begin({}, work, delta, nullptr, nullptr);
  ASSERT_TRUE(round.ok()) << round.status();
  const std::vector<float>& c = round->contribution();
  ASSERT_EQ(c.size(), kN + kWeightingSlots + 1);
  for (int i = 0; i < kN; ++i) EXPECT_EQ(c[i], delta[i] * 640.0f) << i;
  EXPECT_EQ(c[kN], 640.0f);
  EXPECT_EQ(c[kN + 1], 640.0f * 10);
  EXPECT_EQ(c.back(), 1.0f);
}

TEST(DilocoRoundTest, FedNovaPacksTheDataShareOverTheSteps) {
  const std::vector<float> delta = Random(kN, 2);
  DilocoRoundOptions o;
  o.weighting = Weighting::kFedNova;
  absl::StatusOr<DilocoRound> round =
      DilocoRound::Begin(o, Work(8, 640), delta, nullptr, nullptr);
  ASSERT_TRUE(round.ok()) << round.status();
  const std::vector<float>& c = round->contribution();
  const float coef = static_cast<float>(0.25 / 8);
  for (int i = 0; i < kN; ++i) EXPECT_EQ(c[i], delta[i] * coef) << i;
  EXPECT_EQ(c[kN], 0.25f);
  EXPECT_EQ(c[kN + 1], 2.0f);
  EXPECT_EQ(c.back(), 0.0f);
}

TEST(DilocoRoundTest, ErrorFeedbackSendsTheCodedSumAndKeepsTheRest) {
  std::unique_ptr<Codec> codec = Int4();
  ErrorFeedback feedback(kN);
  const std::vector<float> first = Random(kN, 3), second = Random(kN, 4);
  // The first round leaves a residual e; the second sends C(Δ + e).
  ASSERT_TRUE(
      DilocoRound::Begin({}, Work(5, 1), first, codec.get(), &feedback).ok());
  const std::vector<float> e(feedback.residual().begin(),
                             feedback.residual().end());
  std::vector<float> x(kN);
  for (int i = 0; i < kN; ++i) x[i] = second[i] + e[i];
  absl::StatusOr<std::string> bytes = codec->Encode(x);
  ASSERT_TRUE(bytes.ok());
  std::vector<float> want(kN);
  ASSERT_TRUE(codec->Decode(*bytes, absl::MakeSpan(want)).ok());

  absl::StatusOr<DilocoRound> round =
      DilocoRound::Begin({}, Work(5, 1), second, codec.get(), &feedback);
  ASSERT_TRUE(round.ok()) << round.status();
  bool lossy = false;
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(round->contribution()[i], want[i]) << i;
    EXPECT_EQ(feedback.residual()[i], x[i] - want[i]) << i;
    lossy = lossy || want[i] != x[i];
  }
  EXPECT_TRUE(lossy);
}

TEST(DilocoRoundTest, ResidualShrinksWithTheLearningRateOnlyOutsideTheModel) {
  std::unique_ptr<Codec> codec = Int4();
  for (bool in_model : {false, true}) {
    ErrorFeedback feedback(kN);
    ASSERT_TRUE(DilocoRound::Begin({}, Work(5, 1), Random(kN, 5), codec.get(),
                                   &feedback)
                    .ok());
    const std::vector<float> e(feedback.residual().begin(),
                               feedback.residual().end());
    ErrorFeedback expected(kN);
    ASSERT_TRUE(expected.LoadState(feedback.SaveState()).ok());
    if (!in_model) ASSERT_TRUE(expected.ScaleResidual(0.5f).ok());
    const std::vector<float> delta = Random(kN, 6);
    std::vector<float> want(kN);
    ASSERT_TRUE(expected.Compress(*codec, delta, absl::MakeSpan(want)).ok());

    DilocoRoundOptions o;
    o.ef_in_model = in_model;
    RoundWork work = Work(5, 1);
    work.lr_start = 0.2;
    work.lr_end = 0.1;
    absl::StatusOr<DilocoRound> round =
        DilocoRound::Begin(o, work, delta, codec.get(), &feedback);
    ASSERT_TRUE(round.ok()) << round.status();
    for (int i = 0; i < kN; ++i) {
      ASSERT_EQ(round->contribution()[i], want[i]) << in_model << " " << i;
      ASSERT_EQ(feedback.residual()[i], expected.residual()[i]) << i;
    }
  }
}

TEST(DilocoRoundTest, RestorePutsTheResidualBack) {
  std::unique_ptr<Codec> codec = Int4();
  ErrorFeedback feedback(kN);
  ASSERT_TRUE(
      DilocoRound::Begin({}, Work(5, 1), Random(kN, 7), codec.get(), &feedback)
          .ok());
  const std::string before = feedback.SaveState();
  absl::StatusOr<DilocoRound> round =
      DilocoRound::Begin({}, Work(5, 1), Random(kN, 8), codec.get(), &feedback);
  ASSERT_TRUE(round.ok()) << round.status();
  ASSERT_NE(feedback.SaveState(), before);
  ASSERT_TRUE(round->Restore(&feedback).ok());
  EXPECT_EQ(feedback.SaveState(), before);
}

TEST(DilocoRoundTest, CommitIsTheOuterStepOnTheAverage) {
  const std::vector<float> a = Random(kN, 9), b = Random(kN, 10);
  DilocoRoundOptions o;
  o.inner_steps = 10;
  RoundWork wa = Work(10, 300), wb = Work(10, 100);
  wb.stop_vote = true;
  absl::StatusOr<DilocoRound> ra =
      DilocoRound::Begin(o, wa, a, nullptr, nullptr);
  absl::StatusOr<DilocoRound> rb =
      DilocoRound::Begin(o, wb, b, nullptr, nullptr);
  ASSERT_TRUE(ra.ok() && rb.ok());
  std::vector<float> sum(ra->contribution());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += rb->contribution()[i];

  std::vector<float> theta = Random(kN, 11);
  std::vector<float> want = theta;
  std::unique_ptr<OuterOptimizer> outer = Outer("nesterov");
  std::unique_ptr<OuterOptimizer> reference = Outer("nesterov");
  std::vector<float> avg(kN);
  ASSERT_TRUE(UnpackAverage(Weighting::kSamples,
                            absl::MakeConstSpan(sum).subspan(0, kN + 2),
                            absl::MakeSpan(avg))
                  .ok());
  ASSERT_TRUE(reference->Step(absl::MakeSpan(want), avg, 1.0).ok());

  absl::StatusOr<RoundUpdate> u = ra->Commit(sum, &theta, *outer);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(theta, want);
  EXPECT_TRUE(u->stop_voted);
  EXPECT_EQ(u->effective_steps, 10);
  EXPECT_EQ(outer->SaveState(), reference->SaveState());
  double norm2 = 0;
  for (float d : avg) norm2 += static_cast<double>(d) * d;
  EXPECT_EQ(u->delta_norm, std::sqrt(norm2));
}

// After a round of H = 10 inner steps, a round of 5 moves the momentum
// carried over by half (OuterOptimizer::Step's span τ_eff / H).
TEST(DilocoRoundTest, CommitSpansTheOuterStepByTheRoundsLength) {
  DilocoRoundOptions o;
  o.weighting = Weighting::kFedNova;
  o.inner_steps = 10;
  std::vector<float> theta = Random(kN, 15), want = theta;
  std::unique_ptr<OuterOptimizer> outer = Outer("nesterov");
  std::unique_ptr<OuterOptimizer> reference = Outer("nesterov");
  for (int steps : {10, 5}) {
    absl::StatusOr<DilocoRound> r = DilocoRound::Begin(
        o, Work(steps, 1), Random(kN, 16 + steps), nullptr, nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    const std::vector<float>& sum = r->contribution();
    std::vector<float> avg(kN);
    ASSERT_TRUE(UnpackAverage(o.weighting,
                              absl::MakeConstSpan(sum).subspan(0, kN + 2),
                              absl::MakeSpan(avg))
                    .ok());
    absl::StatusOr<RoundUpdate> u = r->Commit(sum, &theta, *outer);
    ASSERT_TRUE(u.ok()) << u.status();
    EXPECT_EQ(u->effective_steps, steps);
    ASSERT_TRUE(reference->Step(absl::MakeSpan(want), avg, steps / 10.0).ok());
    EXPECT_EQ(theta, want) << steps << " steps";
  }
}

// Buffers ride after the stop vote, weighted like Δ: the commit sets the
// shared buffers to the members' weighted mean, the same bytes on every
// member, while θ_global's outer step is what it would be without them. A
// buffer nobody moved (here an infinity, a mask's) stays exact.
TEST(DilocoRoundTest, CommitAveragesTheBuffersWithTheMembersWeights) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> shared = {1.0f, 0.0f, -inf};
  const std::vector<float> own_a = {0.5f, 0.2f, -inf},
                           own_b = {1.5f, 0.6f, -inf};
  const std::vector<float> a = Random(kN, 21), b = Random(kN, 22);
  DilocoRoundOptions o;
  o.inner_steps = 10;
  RoundWork wa = Work(10, 300), wb = Work(10, 100);
  wb.stop_vote = true;
  const std::vector<float> da = BufferDelta(shared, own_a),
                           db = BufferDelta(shared, own_b);
  absl::StatusOr<DilocoRound> ra =
      DilocoRound::Begin(o, wa, a, nullptr, nullptr, da);
  absl::StatusOr<DilocoRound> rb =
      DilocoRound::Begin(o, wb, b, nullptr, nullptr, db);
  ASSERT_TRUE(ra.ok() && rb.ok());
  ASSERT_EQ(ra->contribution().size(), kN + kWeightingSlots + 1 + 3);
  EXPECT_EQ(ra->contribution()[kN + kWeightingSlots], 0.0f);  // the vote
  EXPECT_EQ(ra->contribution()[kN + kWeightingSlots + 1], 0.5f * 300);
  std::vector<float> sum(ra->contribution());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += rb->contribution()[i];

  std::vector<float> theta = Random(kN, 23), plain = theta;
  std::vector<float> buffers = shared;
  std::unique_ptr<OuterOptimizer> outer = Outer("nesterov");
  std::unique_ptr<OuterOptimizer> reference = Outer("nesterov");
  absl::StatusOr<RoundUpdate> u = ra->Commit(sum, &theta, *outer, &buffers);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_TRUE(u->stop_voted);
  EXPECT_FLOAT_EQ(buffers[0], (0.5f * 300 + 1.5f * 100) / 400);
  EXPECT_FLOAT_EQ(buffers[1], (0.2f * 300 + 0.6f * 100) / 400);
  EXPECT_EQ(buffers[2], -inf);
  // The same round without buffers moves θ_global the same way.
  absl::StatusOr<DilocoRound> pa =
      DilocoRound::Begin(o, wa, a, nullptr, nullptr);
  absl::StatusOr<DilocoRound> pb =
      DilocoRound::Begin(o, wb, b, nullptr, nullptr);
  ASSERT_TRUE(pa.ok() && pb.ok());
  std::vector<float> psum(pa->contribution());
  for (size_t i = 0; i < psum.size(); ++i) psum[i] += pb->contribution()[i];
  ASSERT_TRUE(pa->Commit(psum, &plain, *reference).ok());
  EXPECT_EQ(theta, plain);
  // Buffers of the wrong size (or none) for this round are refused.
  std::vector<float> two = {1, 2};
  EXPECT_TRUE(
      absl::IsInvalidArgument(ra->Commit(sum, &theta, *outer, &two).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(ra->Commit(sum, &theta, *outer).status()));
}

TEST(DilocoRoundTest, CommitRefusesASumOfTheWrongSize) {
  absl::StatusOr<DilocoRound> r =
      DilocoRound::Begin({}, Work(1, 1), Random(kN, 12), nullptr, nullptr);
  ASSERT_TRUE(r.ok());
  std::vector<float> theta(kN), sum(kN);
  std::unique_ptr<OuterOptimizer> outer = Outer("nesterov");
  EXPECT_TRUE(absl::IsInvalidArgument(r->Commit(sum, &theta, *outer).status()));
}

// Two members with the residual in their models flush: θ_global becomes
// θ_global − mean(e) (the average of their models), the residuals are
// empty and the outer momentum is untouched.
TEST(DilocoRoundTest, FlushAveragesTheResidualsAndEmptiesThem) {
  std::unique_ptr<Codec> codec = Int4();
  DilocoRoundOptions o;
  o.ef_in_model = true;
  std::vector<ErrorFeedback> feedback(2, ErrorFeedback(kN));
  for (int m = 0; m < 2; ++m) {
    ASSERT_TRUE(DilocoRound::Begin(o, Work(5, 1), Random(kN, 20 + m),
                                   codec.get(), &feedback[m])
                    .ok());
    EXPECT_TRUE(FlushDue(&feedback[m], true));
    EXPECT_FALSE(FlushDue(&feedback[m], false));
  }
  const std::vector<float> theta0 = Random(kN, 13);
  std::vector<std::vector<float>> models;
  std::vector<DilocoRound> rounds;
  RoundWork flush;
  flush.flush = true;
  for (int m = 0; m < 2; ++m) {
    models.push_back(OwnModel(theta0, &feedback[m], true));
    absl::StatusOr<DilocoRound> r = DilocoRound::Begin(
        o, flush, std::vector<float>(kN), codec.get(), &feedback[m]);
    ASSERT_TRUE(r.ok()) << r.status();
    rounds.push_back(*std::move(r));
    EXPECT_FALSE(FlushDue(&feedback[m], true));
  }
  std::vector<float> sum(rounds[0].contribution());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += rounds[1].contribution()[i];
  EXPECT_EQ(sum[kN], 2.0f);  // each member weighs 1

  std::unique_ptr<OuterOptimizer> outer = Outer("nesterov");
  const std::string momentum = outer->SaveState();
  std::vector<float> theta = theta0;
  ASSERT_TRUE(rounds[0].Commit(sum, &theta, *outer).ok());
  EXPECT_EQ(outer->SaveState(), momentum);
  for (int i = 0; i < kN; ++i) {
    const float mean = 0.5f * (models[0][i] + models[1][i]);
    EXPECT_NEAR(theta[i], mean, 1e-6f * (1 + std::fabs(mean))) << i;
  }
  EXPECT_EQ(OwnModel(theta, &feedback[0], true), theta);
}

// A lone member with the residual in its model and plain averaging: what
// it sends, C(θ_global − θ_local), and what it keeps telescope, so after
// every commit its own model is the model it trained (to fp32 rounding),
// and after the flush θ_global is too.
TEST(DilocoRoundTest, ResidualInTheModelTelescopes) {
  std::unique_ptr<Codec> codec = Int4();
  DilocoRoundOptions o;
  o.ef_in_model = true;
  o.inner_steps = 5;
  ErrorFeedback feedback(kN);
  std::unique_ptr<OuterOptimizer> outer = Outer("average");
  std::vector<float> theta = Random(kN, 14);
  std::vector<float> trained;
  for (int r = 0; r < 4; ++r) {
    const std::vector<float> own = OwnModel(theta, &feedback, true);
    trained = own;
    const std::vector<float> step = Random(kN, 30 + r, 0.1f);
    for (int i = 0; i < kN; ++i) trained[i] -= step[i];
    absl::StatusOr<DilocoRound> round = DilocoRound::Begin(
        o, Work(5, 1), PseudoGradient(own, trained), codec.get(), &feedback);
    ASSERT_TRUE(round.ok()) << round.status();
    ASSERT_TRUE(round->Commit(round->contribution(), &theta, *outer).ok());
    const std::vector<float> next = OwnModel(theta, &feedback, true);
    for (int i = 0; i < kN; ++i) {
      ASSERT_NEAR(next[i], trained[i], 1e-5f) << "round " << r << " " << i;
    }
  }
  RoundWork flush;
  flush.flush = true;
  absl::StatusOr<DilocoRound> round = DilocoRound::Begin(
      o, flush, std::vector<float>(kN), codec.get(), &feedback);
  ASSERT_TRUE(round.ok()) << round.status();
  ASSERT_TRUE(round->Commit(round->contribution(), &theta, *outer).ok());
  for (int i = 0; i < kN; ++i) EXPECT_NEAR(theta[i], trained[i], 1e-5f) << i;
}

// SparseLoCo's error feedback: outside the model the residual shrinks by β
// before the round's Δ is added, whatever the learning rate did.
TEST(DilocoRoundTest, EfDecayScalesTheResidualByBetaInsteadOfTheLearningRate) {
  std::unique_ptr<Codec> codec = Int4();
  ErrorFeedback feedback(kN);
  ASSERT_TRUE(
      DilocoRound::Begin({}, Work(5, 1), Random(kN, 5), codec.get(), &feedback)
          .ok());
  ErrorFeedback expected(kN);
  ASSERT_TRUE(expected.LoadState(feedback.SaveState()).ok());
  ASSERT_TRUE(expected.ScaleResidual(0.9f).ok());
  const std::vector<float> delta = Random(kN, 6);
  std::vector<float> want(kN);
  ASSERT_TRUE(expected.Compress(*codec, delta, absl::MakeSpan(want)).ok());

  DilocoRoundOptions o;
  o.ef_decay = 0.9;
  RoundWork work = Work(5, 1);
  work.lr_start = 0.2;
  work.lr_end = 0.1;  // ignored under ef_decay
  absl::StatusOr<DilocoRound> round =
      DilocoRound::Begin(o, work, delta, codec.get(), &feedback);
  ASSERT_TRUE(round.ok()) << round.status();
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(round->contribution()[i], want[i]) << i;
    ASSERT_EQ(feedback.residual()[i], expected.residual()[i]) << i;
  }
}

// The τ-delayed update keeps what the steps behind the exchange learned on
// top of the node's model at the new θ_global.
TEST(DilocoRoundTest, MergeDelayedUpdateAddsTheStepsBehindTheExchange) {
  const std::vector<float> own = Random(kN, 40);
  const std::vector<float> launched = Random(kN, 41);
  std::vector<float> trained = launched;
  const std::vector<float> step = Random(kN, 42, 0.1f);
  for (int i = 0; i < kN; ++i) trained[i] -= step[i];
  const std::vector<float> merged = MergeDelayedUpdate(own, launched, trained);
  ASSERT_EQ(merged.size(), own.size());
  for (int i = 0; i < kN; ++i) {
    EXPECT_NEAR(merged[i], own[i] - step[i], 1e-6f) << i;
  }
  // No steps behind the exchange: the node's model as the round left it.
  EXPECT_EQ(MergeDelayedUpdate(own, launched, launched), own);
}

}  // namespace
}  // namespace starling
