#include "outer_opt/diloco_round.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/flat_params.h"

namespace starling {

std::vector<float> PseudoGradient(absl::Span<const float> start,
                                  absl::Span<const float> trained) {
  std::vector<float> delta(trained.begin(), trained.end());
  for (size_t i = 0; i < delta.size(); ++i) delta[i] = start[i] - delta[i];
  return delta;
}

std::vector<float> OwnModel(absl::Span<const float> theta_global,
                            const ErrorFeedback* feedback, bool ef_in_model) {
  std::vector<float> own(theta_global.begin(), theta_global.end());
  if (ef_in_model && feedback != nullptr) {
    absl::Span<const float> e = feedback->residual();
    for (size_t i = 0; i < own.size(); ++i) own[i] -= e[i];
  }
  return own;
}

bool FlushDue(const ErrorFeedback* feedback, bool ef_in_model) {
  if (!ef_in_model || feedback == nullptr) return false;
  for (float v : feedback->residual()) {
    if (v != 0) return true;
  }
  return false;
}

std::vector<float> MergeDelayedUpdate(absl::Span<const float> own,
                                      absl::Span<const float> launched,
                                      absl::Span<const float> trained) {
  std::vector<float> merged(own.begin(), own.end());
  for (size_t i = 0; i < merged.size(); ++i) {
    merged[i] += trained[i] - launched[i];
  }
  return merged;
}

absl::StatusOr<DilocoRound> DilocoRound::Begin(
    const DilocoRoundOptions& options, const RoundWork& work,
    std::vector<float> delta, const Codec* codec, ErrorFeedback* feedback,
    absl::Span<const float> buffer_delta) {
  DilocoRound round(options, work);
  if (feedback != nullptr) {
    round.residual_before_ = feedback->SaveState();
    absl::Status s = round.ApplyErrorFeedback(codec, *feedback, delta);
    if (!s.ok()) return s;
  }
  absl::Status s = round.Pack(delta, buffer_delta);
  if (!s.ok()) return s;
  return round;
}

absl::Status DilocoRound::ApplyErrorFeedback(const Codec* codec,
                                             ErrorFeedback& feedback,
                                             std::vector<float>& delta) {
  if (work_.flush) {
    // The residual is part of the model this node trained on: it is sent
    // whole, and none is left.
    delta.assign(feedback.residual().begin(), feedback.residual().end());
    return feedback.ScaleResidual(0.0f);
  }
  // Without the residual in the model it shrinks by β (SparseLoCo: the
  // residual re-sends what a round derives again, decayed like an outer
  // momentum), or else with the inner learning rate's decay over the
  // round's steps, so that what was held back stays in proportion to the
  // steps now taken: unscaled, late rounds of a decayed schedule send
  // mostly stale progress from early ones, and the model gets worse
  // (docs/compression.md).
  if (!options_.ef_in_model && options_.ef_decay > 0) {
    absl::Status s =
        feedback.ScaleResidual(static_cast<float>(options_.ef_decay));
    if (!s.ok()) return s;
  } else if (!options_.ef_in_model && work_.lr_start > 0 &&
             work_.lr_end < work_.lr_start) {
    absl::Status s = feedback.ScaleResidual(
        static_cast<float>(work_.lr_end / work_.lr_start));
    if (!s.ok()) return s;
  }
  if (codec == nullptr) {
    return absl::InvalidArgumentError("error feedback needs a codec");
  }
  std::vector<float> sent(delta.size());
  absl::StatusOr<std::string> encoded =
      feedback.Compress(*codec, delta, absl::MakeSpan(sent));
  if (!encoded.ok()) return encoded.status();
  delta = std::move(sent);
  return absl::OkStatus();
}

absl::Status DilocoRound::Pack(absl::Span<const float> delta,
                               absl::Span<const float> buffer_delta) {
  const size_t vote = delta.size() + kWeightingSlots;
  buffers_ = buffer_delta.size();
  contribution_.resize(vote + 1 + buffers_);
  Contribution c;
  c.delta = delta;
  c.steps = std::max(1, work_.steps);
  // FedNova weighs a member by its share of the data, the flush too; the
  // flush weighs every member alike under kSamples.
  c.weight = options_.weighting == Weighting::kFedNova ? work_.data_share
             : work_.flush                             ? 1.0
                           : static_cast<double>(work_.samples);
  absl::Status s = PackContribution(options_.weighting, c,
                                    absl::MakeSpan(contribution_.data(), vote));
  if (!s.ok()) return s;
  contribution_[vote] = work_.stop_vote ? 1.0f : 0.0f;
  // δb carries the weight that slot 0 holds for Δ, whatever the weighting.
  const float w = contribution_[delta.size()];
  for (size_t i = 0; i < buffers_; ++i) {
    contribution_[vote + 1 + i] = buffer_delta[i] * w;
  }
  return absl::OkStatus();
}

absl::StatusOr<RoundUpdate> DilocoRound::Commit(
    absl::Span<const float> sum, std::vector<float>* theta_global,
    OuterOptimizer& outer, std::vector<float>* buffers) const {
  const size_t n = contribution_.size() - kWeightingSlots - 1 - buffers_;
  const size_t vote = n + kWeightingSlots;
  const size_t n_buffers = buffers != nullptr ? buffers->size() : 0;
  if (sum.size() != contribution_.size() || theta_global->size() != n ||
      n_buffers != buffers_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round commit: the sum has ", sum.size(), " values, θ_global ",
        theta_global->size(), " and the buffers ", n_buffers, "; expected ",
        contribution_.size(), ", ", n, " and ", buffers_));
  }
  RoundUpdate update;
  update.stop_voted = sum[vote] > 0;
  std::vector<float> delta(n);
  absl::StatusOr<Averaged> avg = UnpackAverage(
      options_.weighting, sum.subspan(0, vote), absl::MakeSpan(delta));
  if (!avg.ok()) return avg.status();
  update.effective_steps = avg->effective_steps;
  double norm2 = 0;
  for (float d : delta) norm2 += static_cast<double>(d) * d;
  update.delta_norm = std::sqrt(norm2);
  if (work_.flush) {
    // θ_global − mean(e): the average of the members' models.
    std::vector<float>& theta = *theta_global;
    for (size_t i = 0; i < n; ++i) theta[i] -= delta[i];
  } else {
    // A round shorter or longer than H moves the outer momentum in
    // proportion (OuterOptimizer::Step's span).
    absl::Status s = outer.Step(
        absl::MakeSpan(*theta_global), delta,
        avg->effective_steps / static_cast<double>(options_.inner_steps));
    if (!s.ok()) return s;
  }
  if (buffers_ > 0) {
    ApplyBufferMean(sum.subspan(vote + 1), avg->total_weight,
                    absl::MakeSpan(*buffers));
  }
  return update;
}

absl::Status DilocoRound::Restore(ErrorFeedback* feedback) const {
  if (feedback == nullptr || residual_before_.empty()) {
    return absl::OkStatus();
  }
  return feedback->LoadState(residual_before_);
}

}  // namespace starling
