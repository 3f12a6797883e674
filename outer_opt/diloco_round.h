// One member's DiLoCo round as a pure computation, in two halves around the
// exchange (the ring all-reduce or the all-gather, which the node runs):
//
//   Δ      = PseudoGradient(start, trained)    what the inner steps moved
//   round  = DilocoRound::Begin(Δ, work, ...)  error feedback, weights, vote
//   sum    = Σ over members of round.contribution()        (the exchange)
//   round.Commit(sum, &θ_global, outer)        outer step, or the flush
//   model  = OwnModel(θ_global, feedback)      what the node trains on next
//
// or, when the round does not commit, round.Restore(feedback).
//
// A model's buffers (BatchNorm's running statistics and the like) are not
// trained by gradients, so they take no outer step: each member sends
// δb = BufferDelta(b_shared, b_own) (core/flat_params.h) weighted like its Δ,
// and Commit sets the shared buffers to b_shared − Σ w δb / Σ w, the members'
// weighted mean (integer buffers, such as BatchNorm's num_batches_tracked, then
// round to the nearest integer as they are written back: core/flat_params.h).
// All members commit the same sum, so their buffers stay identical; a buffer
// that no member changed (a fixed mask, infinities included) stays exact.
//
// Error feedback keeps what the codec dropped (the residual e) and sends it
// in a later round. With `ef_in_model` the residual also stays in the
// node's own model, which trains from θ_global − e: its inner steps do not
// derive again what it holds back, and what it sends, C(Δ + e) =
// C(θ_global − θ_local), telescopes over the rounds. After the last round
// the members average their residuals in one more round, the flush (no
// inner steps, no outer momentum): θ_global becomes the average of their
// models. Without it (--overlap) the residual instead shrinks with the
// inner learning rate's decay over each round before it is added, or, with
// an ef_decay β (SparseLoCo), by β: e ← β·e + Δ, the residual standing in
// for the outer momentum.
//
// No I/O, no threads, no logging. Not thread-safe: one node thread owns a
// round and the state it changes (θ_global, the outer optimizer, the
// residual). Deterministic: members that commit the same sum compute the
// same θ_global bytes.
#ifndef STARLING_OUTER_OPT_DILOCO_ROUND_H_
#define STARLING_OUTER_OPT_DILOCO_ROUND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "compression/codec.h"
#include "outer_opt/outer_optimizer.h"
#include "outer_opt/weighting.h"

namespace starling {

// Settings that hold for every round of a run.
struct DilocoRoundOptions {
  Weighting weighting = Weighting::kSamples;
  // H, the inner steps the outer lr and momentum are tuned for: a round
  // that stands for τ_eff steps moves the momentum by τ_eff / H of one.
  int inner_steps = 50;
  // The residual stays in the node's own model (error feedback without
  // --overlap or --ef_decay).
  bool ef_in_model = false;
  // β in (0, 1], or 0: without ef_in_model, the residual shrinks by β each
  // round (--ef_decay) instead of by the learning rate's decay.
  double ef_decay = 0;
};

// What this member did in the round, besides its Δ.
struct RoundWork {
  int steps = 0;           // inner steps run (0 for the flush)
  int64_t samples = 0;     // samples they processed: the kSamples weight
  double data_share = 0;   // FedNova's p_i, this node's share of the data
  bool flush = false;      // the residual flush after the last round
  bool stop_vote = false;  // this member has a pending stop signal
  // The inner learning rate at the round's first step and after its last:
  // without ef_in_model the residual first shrinks by their ratio.
  double lr_start = 0;
  double lr_end = 0;
};

// What Commit applied.
struct RoundUpdate {
  bool stop_voted = false;     // some member of the round voted to stop
  double effective_steps = 0;  // τ_eff: the inner steps the average stands for
  double delta_norm = 0;       // ‖averaged Δ‖₂
};

// Δ = start − trained, elementwise: the pseudo-gradient of inner steps that
// began at `start` and ended at `trained` (same sizes).
std::vector<float> PseudoGradient(absl::Span<const float> start,
                                  absl::Span<const float> trained);

// The node's own model, where its next round starts: θ_global − e with
// ef_in_model (and a residual), θ_global otherwise. `feedback` may be null.
std::vector<float> OwnModel(absl::Span<const float> theta_global,
                            const ErrorFeedback* feedback, bool ef_in_model);

// With ef_in_model, whether this node still holds a residual: after the
// last round one more, the flush, runs while it does.
bool FlushDue(const ErrorFeedback* feedback, bool ef_in_model);

// The τ-delayed update (--overlap_steps): a round's exchange ran while the
// node trained on from `launched` (where the round's inner steps ended) to
// `trained`; once the round commits, the node continues from its own model
// at the new θ_global (`own`, from OwnModel) plus what those steps learned:
// own + (trained − launched). The node's own progress that it sent is thus
// replaced by the swarm's update, and nothing is learned twice or lost: the
// next round's Δ, measured from `own`, holds those steps. Same sizes.
std::vector<float> MergeDelayedUpdate(absl::Span<const float> own,
                                      absl::Span<const float> launched,
                                      absl::Span<const float> trained);

class DilocoRound {
 public:
  // Makes this member's contribution from its Δ (`delta`, from
  // PseudoGradient). With error feedback (`feedback` not null) it sends
  // C(Δ + e) in `codec` and keeps the rest; the flush sends the residual
  // whole and empties it; without ef_in_model the residual first shrinks by
  // options.ef_decay when set, else by work.lr_end / work.lr_start when the
  // learning rate fell. The
  // contribution is PackContribution's layout for the weighting (weight:
  // FedNova's data share, else the samples, 1 for the flush; steps at least
  // 1) followed by the stop vote (1 or 0), then `buffer_delta` (δb, from
  // BufferDelta; empty for a model without buffers) times the weight.
  // InvalidArgument from the codec or the packing (the residual is then as
  // Begin found it, save for a failed pack after compression: Restore puts
  // it back).
  static absl::StatusOr<DilocoRound> Begin(
      const DilocoRoundOptions& options, const RoundWork& work,
      std::vector<float> delta, const Codec* codec, ErrorFeedback* feedback,
      absl::Span<const float> buffer_delta = {});

  // What the exchange sums: Δ.size() + kWeightingSlots + 1 + δb.size()
  // values.
  const std::vector<float>& contribution() const { return contribution_; }
  // The same, for a test that sends a hostile contribution (--test_poison).
  std::vector<float>& mutable_contribution() { return contribution_; }
  const RoundWork& work() const { return work_; }

  // Applies `sum`, the members' contributions summed (or robustly combined
  // in that layout), to θ_global: θ_global − mean(e) for the flush (the
  // outer momentum is left as it was), else the outer step with span
  // τ_eff / H; and to the shared `buffers` (ApplyBufferMean; may be null
  // when the model has none). InvalidArgument when sizes differ,
  // FailedPrecondition when the weights sum to zero; θ_global and the
  // buffers are then unchanged.
  absl::StatusOr<RoundUpdate> Commit(
      absl::Span<const float> sum, std::vector<float>* theta_global,
      OuterOptimizer& outer, std::vector<float>* buffers = nullptr) const;

  // The round did not commit: the residual goes back to what Begin found.
  absl::Status Restore(ErrorFeedback* feedback) const;

 private:
  DilocoRound(const DilocoRoundOptions& options, const RoundWork& work)
      : options_(options), work_(work) {}

  // Error feedback on Δ, in place: what is sent instead of Δ.
  absl::Status ApplyErrorFeedback(const Codec* codec, ErrorFeedback& feedback,
                                  std::vector<float>& delta);
  // Δ weighted, the weights, the stop vote and δb weighted, into
  // contribution_.
  absl::Status Pack(absl::Span<const float> delta,
                    absl::Span<const float> buffer_delta);

  DilocoRoundOptions options_;
  RoundWork work_;
  std::string residual_before_;  // empty without error feedback
  std::vector<float> contribution_;
  size_t buffers_ = 0;  // δb's size, at the contribution's end
};

}  // namespace starling

#endif  // STARLING_OUTER_OPT_DILOCO_ROUND_H_
