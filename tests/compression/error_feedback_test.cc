#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "gtest/gtest.h"
#include "tests/compression/test_util.h"

namespace starling {
namespace {

using ::starling::testing::Dist;
using ::starling::testing::RandomValues;

float MaxAbs(absl::Span<const float> v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

// Over many rounds, sum(sent_t) + e_T == sum(delta_t): nothing is lost, only
// delayed. Checked in double against a double reference.
void CheckTelescoping(const std::string& spec, float residual_bound) {
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec(spec);
  ASSERT_TRUE(codec.ok());
  constexpr size_t kSize = 1000;
  constexpr int kRounds = 1000;
  ErrorFeedback ef(kSize);
  std::vector<double> sum_delta(kSize, 0), sum_sent(kSize, 0),
      sum_abs(kSize, 0);
  std::vector<float> sent(kSize);
  float max_delta = 0, max_residual = 0;
  for (int t = 0; t < kRounds; ++t) {
    const std::vector<float> delta =
        RandomValues(kSize, t % 2 ? Dist::kNormal : Dist::kOutliers, 1000 + t);
    absl::StatusOr<std::string> bytes =
        ef.Compress(**codec, delta, absl::MakeSpan(sent));
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    for (size_t i = 0; i < kSize; ++i) {
      sum_delta[i] += delta[i];
      sum_abs[i] += std::abs(delta[i]);
      sum_sent[i] += sent[i];
    }
    max_delta = std::max(max_delta, MaxAbs(delta));
    max_residual = std::max(max_residual, MaxAbs(ef.residual()));
  }
  for (size_t i = 0; i < kSize; ++i) {
    const double got = sum_sent[i] + ef.residual()[i];
    ASSERT_NEAR(got, sum_delta[i], 1e-5 * sum_abs[i] + 1e-6)
        << spec << " i=" << i;
  }
  EXPECT_LE(max_residual, residual_bound * max_delta) << spec;
}

TEST(ErrorFeedbackTest, TelescopesForInt4) { CheckTelescoping("int4", 1.0f); }

TEST(ErrorFeedbackTest, TelescopesForTopK) {
  CheckTelescoping("topk:0.01", 50.0f);
}

TEST(ErrorFeedbackTest, ResidualStaysBoundedOverTime) {
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec("topk:0.01+int8");
  ASSERT_TRUE(codec.ok());
  constexpr size_t kSize = 2000;
  ErrorFeedback ef(kSize);
  std::vector<float> sent(kSize);
  float early = 0, late = 0;
  for (int t = 0; t < 2000; ++t) {
    const std::vector<float> delta = RandomValues(kSize, Dist::kNormal, t);
    ASSERT_TRUE(ef.Compress(**codec, delta, absl::MakeSpan(sent)).ok());
    if (t < 1000) {
      early = std::max(early, MaxAbs(ef.residual()));
    } else {
      late = std::max(late, MaxAbs(ef.residual()));
    }
  }
  EXPECT_LE(late, 1.5f * early);
}

TEST(ErrorFeedbackTest, LosslessCodecLeavesNoResidual) {
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec("fp32");
  ASSERT_TRUE(codec.ok());
  ErrorFeedback ef(100);
  const std::vector<float> delta = RandomValues(100, Dist::kNormal, 1);
  std::vector<float> sent(100);
  ASSERT_TRUE(ef.Compress(**codec, delta, absl::MakeSpan(sent)).ok());
  EXPECT_EQ(sent, delta);
  for (float e : ef.residual()) EXPECT_EQ(e, 0.0f);
}

TEST(ErrorFeedbackTest, ErrorsLeaveResidualUnchanged) {
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec("int4");
  ASSERT_TRUE(codec.ok());
  ErrorFeedback ef(10);
  std::vector<float> sent(10);
  std::vector<float> delta = RandomValues(10, Dist::kNormal, 2);
  ASSERT_TRUE(ef.Compress(**codec, delta, absl::MakeSpan(sent)).ok());
  const std::vector<float> before(ef.residual().begin(), ef.residual().end());
  delta[3] = std::nanf("");
  absl::StatusOr<std::string> bytes =
      ef.Compress(**codec, delta, absl::MakeSpan(sent));
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> short_sent(9);
  EXPECT_EQ(
      ef.Compress(**codec, delta, absl::MakeSpan(short_sent)).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::vector<float>(ef.residual().begin(), ef.residual().end()),
            before);
}

TEST(ErrorFeedbackTest, ScaleResidualShrinksWhatIsHeldBack) {
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec("topk:0.1");
  ASSERT_TRUE(codec.ok());
  ErrorFeedback ef(500);
  std::vector<float> sent(500);
  ASSERT_TRUE(ef.Compress(**codec, RandomValues(500, Dist::kNormal, 7),
                          absl::MakeSpan(sent))
                  .ok());
  const std::vector<float> before(ef.residual().begin(), ef.residual().end());
  ASSERT_GT(MaxAbs(before), 0.0f);
  // Out of [0, 1] (or NaN): refused, nothing changed.
  for (float bad : {-0.25f, 1.5f, std::nanf("")}) {
    EXPECT_EQ(ef.ScaleResidual(bad).code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(std::vector<float>(ef.residual().begin(), ef.residual().end()),
            before);
  ASSERT_TRUE(ef.ScaleResidual(0.25f).ok());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(ef.residual()[i], 0.25f * before[i]) << i;
  }
  // The next round sends C(delta + 0.25 e) and keeps the rest.
  const std::vector<float> delta = RandomValues(500, Dist::kNormal, 8);
  ASSERT_TRUE(ef.Compress(**codec, delta, absl::MakeSpan(sent)).ok());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_NEAR(sent[i] + ef.residual()[i], delta[i] + 0.25f * before[i], 1e-6f)
        << i;
  }
  ASSERT_TRUE(ef.ScaleResidual(0.0f).ok());
  EXPECT_EQ(MaxAbs(ef.residual()), 0.0f);
}

TEST(ErrorFeedbackTest, SaveLoadRoundTrip) {
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec("topk:0.1");
  ASSERT_TRUE(codec.ok());
  ErrorFeedback ef(777);
  std::vector<float> sent(777);
  for (int t = 0; t < 5; ++t) {
    ASSERT_TRUE(ef.Compress(**codec, RandomValues(777, Dist::kNormal, t),
                            absl::MakeSpan(sent))
                    .ok());
  }
  const std::string state = ef.SaveState();
  ErrorFeedback loaded(777);
  ASSERT_TRUE(loaded.LoadState(state).ok());
  EXPECT_EQ(
      std::vector<float>(loaded.residual().begin(), loaded.residual().end()),
      std::vector<float>(ef.residual().begin(), ef.residual().end()));

  ErrorFeedback wrong_size(776);
  EXPECT_EQ(wrong_size.LoadState(state).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(loaded.LoadState(state.substr(0, state.size() - 1)).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(loaded.LoadState("").code(), absl::StatusCode::kDataLoss);
  for (size_t pos : {size_t{0}, size_t{5}, size_t{100}, state.size() - 1}) {
    std::string corrupt = state;
    corrupt[pos] ^= 0x10;
    EXPECT_EQ(loaded.LoadState(corrupt).code(), absl::StatusCode::kDataLoss)
        << pos;
  }
  // Failed loads left the good state in place.
  EXPECT_EQ(
      std::vector<float>(loaded.residual().begin(), loaded.residual().end()),
      std::vector<float>(ef.residual().begin(), ef.residual().end()));
  ErrorFeedback empty(0);
  EXPECT_TRUE(ErrorFeedback(0).LoadState(empty.SaveState()).ok());
}

}  // namespace
}  // namespace starling
