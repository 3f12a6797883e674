// Elastic DiLoCo on one node (--algo=diloco): the loop that runs its rounds
// over a Swarm (gossip/swarm.h describes the protocol). Each round:
//   1. CatchUp when the swarm is ahead (a joiner, a restarted node, a
//      member that missed a round, the losing side of a partition);
//   2. RunInnerSteps: H steps, or as many as fit in --round_seconds, fewer
//      when a drift trigger here or any member asks for an early sync;
//   3. BuildRound: the contribution (outer_opt/diloco_round.h), which a
//      RoundExchange (round_exchange.h) takes through Swarm::SyncRound;
//   4. FinishRound: on commit the outer step (DilocoRound::Commit), the
//      round's record and checkpoint; otherwise back to the round's start.
// With --overlap, step 4 of a round runs after step 2 of the next (the
// delayed outer update) while the membership is steady; with
// --overlap_steps=N, after the next round's first N inner steps, whose
// progress the model keeps (MergeDelayedUpdate). After the last
// round the node stays, serving its state, until stragglers have caught
// up and, up to --linger_seconds, while a member declared dead may come
// back (StayUntilCaughtUp), then says goodbye, checkpoints and exits (End).
// A node that finds the swarm gone before its last round (it went on and
// left without this node, or this node was paused and nobody answers
// since: gossip/swarm_end.h) runs no round alone: it stops with exit code
// 3 (kExitEndedApart), unless --train_alone.
//
// Thread-safety: the loop runs on the training thread; only an overlapped
// RoundExchange runs on a thread of its own (see round_exchange.h).
#ifndef STARLING_NODE_DILOCO_LOOP_H_
#define STARLING_NODE_DILOCO_LOOP_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/device.h"
#include "gossip/swarm.h"
#include "node/node_run.h"
#include "node/node_session.h"
#include "node/round_exchange.h"
#include "outer_opt/diloco_round.h"

namespace starling {

// Runs `run` with DiLoCo: the process exit code (node_session.h).
int RunDiloco(NodeRun& run);

// What a round needs from the run's settings, for DilocoLoop and for
// EmbeddedDiloco (embedded_diloco.h), whose model a Python loop trains:
// the exchange's settings (`watchdog` may be null), the round unit's, and
// the swarm's codec identity and mailbox for a model of `n_params`
// parameters and `n_buffers` buffer values.
ExchangeSettings DilocoExchangeSettings(const NodeConfig& config,
                                        const NodeCodecs& codecs,
                                        int64_t n_params, int64_t n_buffers,
                                        Watchdog* watchdog);
DilocoRoundOptions DilocoRoundOptionsOf(const NodeConfig& config,
                                        const NodeCodecs& codecs);
SwarmOptions DilocoRoundSwarmOptions(SwarmOptions so, const NodeConfig& config,
                                     const NodeCodecs& codecs, int64_t n_params,
                                     int64_t n_buffers);

class DilocoLoop {
 public:
  explicit DilocoLoop(NodeRun& run);
  // Abandons a round still in flight (after an error) and waits for it.
  ~DilocoLoop();
  DilocoLoop(const DilocoLoop&) = delete;
  DilocoLoop& operator=(const DilocoLoop&) = delete;

  int Run();

 private:
  enum class RoundAction { kNext, kRetry, kLeave };
  // What one round's inner steps did.
  struct InnerSteps {
    absl::Time round_start;
    int64_t sent_before = 0;  // BytesSent() as they began
    int prev_step = 0;        // the trainer's step as they began
    int steps = 0;
    double loss_sum = 0;
    int64_t samples = 0;
    bool early = false;       // a drift trigger or a member's request
    bool abandoned = false;   // a second signal: leave now
    bool flush = false;       // none: the residual flush
    double seconds = 0;       // the steps' wall time
    double copy_seconds = 0;  // the trained weights' copy to the host
  };
  // A round from its inner steps to its outcome.
  struct RoundInFlight {
    InnerSteps inner;
    std::unique_ptr<RoundExchange> exchange;
  };

  // Starts and joins the swarm; the "start" event.
  absl::Status Start();
  SwarmOptions DilocoSwarmOptions(SwarmOptions so);
  // Rounds until the run is done or this node leaves (true), then stays
  // for stragglers; back to the rounds when a catch-up leaves steps to do.
  absl::StatusOr<bool> Train();
  absl::StatusOr<bool> RunRounds();
  // One pass of the round loop: false when this node leaves.
  absl::StatusOr<bool> RunRound();

  // Catch-up: fetches the best lineage's state and adopts it.
  absl::Status CatchUp(const Swarm::Lineage& best);
  // CatchUp; false, after a warning and a pause, when it failed.
  bool CatchUpOrPause(const Swarm::Lineage& best);

  // A new round's inner steps, none run yet.
  InnerSteps NewInnerSteps() const;
  // One inner step of round `round`, counted in `in`.
  absl::StatusOr<StepResult> InnerStep(InnerSteps& in, int64_t round);
  // The round's inner steps (after those run behind the last exchange).
  absl::StatusOr<InnerSteps> RunInnerSteps();
  // Drift: the loss shifted up (Page-Hinkley), or θ strayed too far from
  // where the round started (dynamic averaging). Asks every member to sync
  // now and says so.
  bool DriftTriggered(const StepResult& r, const std::vector<float>& own_start);

  // Δ of the inner steps just run, from where they started; the trained
  // weights come to the host through staging_ (inner->copy_seconds).
  std::vector<float> RoundPseudoGradient(InnerSteps* inner);
  // The contribution (error feedback, weights, stop vote, the buffers'
  // δb, --test_poison) and the exchange that carries it.
  absl::StatusOr<std::unique_ptr<RoundInFlight>> BuildRound(
      const InnerSteps& inner, std::vector<float> delta,
      const std::vector<float>& buffer_delta);
  // --overlap: whether this round's exchange may run behind the next
  // round's inner steps.
  bool OverlapNow(int prev_step) const;
  // --overlap: the next round starts from θ_global minus this node's own
  // progress (its Δ before compression), and from its own buffers.
  absl::Status StartEagerly(std::vector<float> eager_start,
                            const std::vector<float>& own_buffers);
  // --overlap_steps: runs the next round's first steps while `round`'s
  // exchange runs, then settles it and merges its update under them.
  // False when this node leaves.
  absl::StatusOr<bool> SettleBehindHead(std::unique_ptr<RoundInFlight> round);

  // Waits for the round's outcome and applies it.
  absl::StatusOr<RoundAction> FinishRound(RoundInFlight& c, bool overlapped);
  // Back to the last commit: the residual, the step and the model.
  absl::Status BackToCommit(const RoundInFlight& c);
  void ReportRoundMetrics(const RoundInFlight& c,
                          const Swarm::RoundResult& res) const;
  // Not committed: stopped (kLeave), or stale (catch up: kRetry).
  absl::StatusOr<RoundAction> MissedRound(const RoundInFlight& c,
                                          const Swarm::RoundResult& res);
  absl::StatusOr<RoundAction> CommitRound(RoundInFlight& c,
                                          const Swarm::RoundResult& res,
                                          bool overlapped);
  // The outer step (or flush) and what follows from it: the model, the
  // lineage, the LR position, the sync controllers.
  absl::StatusOr<RoundUpdate> ApplyCommit(const RoundInFlight& c,
                                          const Swarm::RoundResult& res,
                                          bool overlapped);
  // The round's record, evaluation, served state and log line.
  absl::StatusOr<RoundRecord> RecordCommit(const RoundInFlight& c,
                                           const Swarm::RoundResult& res,
                                           bool overlapped);

  // Done: stays while a live member is behind, then lingers for members
  // that may come back. True when a fetched state has steps left to train.
  bool StayUntilCaughtUp();
  // The live members behind this node, as "id (round R[, model H])".
  std::vector<std::string> BehindMembers() const;
  // --linger_seconds: how long this node stays, and for whom.
  struct Linger {
    absl::Time end;
    absl::Time next_probe = absl::InfinitePast();
    std::vector<std::string> waiting_for;  // as last probed
    bool said = false;                     // the "linger" event written
  };
  // Whether to stay on, serving, for a member declared dead that may come
  // back (Swarm::MayComeBack), until `l.end`.
  bool LingerOn(Linger& l);
  // Goodbye, checkpoint, summary: the exit code (kExitEndedApart when this
  // node ended apart from the swarm).
  int End(bool left);
  // Whether this node is apart from the swarm (gossip/swarm_end.h) and must
  // stop: then it keeps the verdict in apart_. With --train_alone it says
  // so once, and goes on.
  bool ApartFromSwarm();

  // Where this node is: the next round, on θ_global (hash and weight).
  Swarm::Lineage Here() const;
  // Serves θ_global; `step` < 0: the trainer's (--overlap serves a θ_global
  // that its trainer has already trained past: the step its round ended at).
  void Serve(int step = -1);
  std::vector<float> OwnModel() const;
  bool FlushDue() const;
  // The node's own model and the shared buffers into the trainer.
  absl::Status LoadNodeModel();
  // fn() with θ_global in the model, then the node's own model back:
  // checkpoints and evaluations are of θ_global, which all members share.
  absl::Status WithGlobalModel(const std::function<absl::Status()>& fn);

  // Constant after construction.
  NodeRun& run_;
  Trainer& trainer_;
  const NodeConfig& config_;
  const int total_;         // the run's steps
  const int64_t n_rounds_;  // for the log line, the flush included
  const DilocoRoundOptions round_options_;
  const ExchangeSettings exchange_settings_;

  NodeSession session_;
  Swarm* swarm_ = nullptr;  // the session's
  AdaptiveSync sync_;       // the controllers, as this node's rounds move them
  std::vector<float> theta_global_;
  // The model's buffers as the last round averaged them (empty without).
  std::vector<float> buffers_global_;
  std::string lineage_;            // FlatHash(theta_global_, buffers_global_)
  Swarm::FetchStats fetch_stats_;  // of a transfer under way
  // When the last round committed here (see --round_seconds).
  absl::Time committed_at_ = absl::InfiniteFuture();
  int last_rank_ = 0;
  int last_world_ = 1;
  double last_train_loss_ = 0;             // of the last round recorded
  int64_t recorded_sent_ = -1;             // BytesSent() as it was recorded
  std::vector<std::string> last_members_;  // of the last committed round
  std::vector<float> eager_start_;  // where the round behind `pending_` began
  // The trained weights on their way to the host, once per round (pinned
  // memory when the model is on a GPU).
  HostStaging staging_;
  double outer_seconds_ = 0;  // of the last ApplyCommit
  // --overlap_steps: the next round's steps already run behind an exchange.
  std::optional<InnerSteps> head_;
  // The verdict that stopped this node apart from the swarm (End then exits
  // with kExitEndedApart).
  std::optional<SwarmView> apart_;
  // --train_alone: the swarm was gone and this node trained on by itself.
  bool trained_alone_ = false;
  // Set when the loop ends with a round in flight (an error): the round
  // gives up at its next wait instead of holding the exit up.
  std::atomic<bool> abandon_{false};
  // --overlap: the round in flight. Declared after session_, which owns the
  // swarm whose protocol it runs, so that it is destroyed first.
  std::unique_ptr<RoundInFlight> pending_;
};

}  // namespace starling

#endif  // STARLING_NODE_DILOCO_LOOP_H_
