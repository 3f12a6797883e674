// One DiLoCo round's exchange on this node: the contribution that the round
// unit made (outer_opt/diloco_round.h) goes through the swarm's round
// protocol (Swarm::SyncRound), summed by a ring all-reduce, by an
// all-gather of every member's encoded contribution under the sparse codec
// (AllGatherSum), or, with --aggregate or --norm_bound, gathered whole from
// every member, checked and combined by the same rule everywhere
// (outer_opt/robust_aggregate.h).
// With --overlap the protocol runs on a thread of its own while the next
// round's inner steps run; otherwise it runs inside Wait.
//
// Thread-safety: until Wait returns, the thread that runs the protocol
// writes what the attempts did (sum(), traffic(), verdicts(), ...); the
// training thread reads them only after Wait. Destroying a launched
// exchange waits for its protocol to end: set the `abandon` flag that
// Launch was given first, so that it gives up at its next wait.
#ifndef STARLING_NODE_ROUND_EXCHANGE_H_
#define STARLING_NODE_ROUND_EXCHANGE_H_

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "compression/tensor_policy.h"
#include "gossip/ring_allreduce.h"
#include "gossip/swarm.h"
#include "node/health.h"
#include "outer_opt/diloco_round.h"
#include "outer_opt/robust_aggregate.h"

namespace starling {

// The tensors of a DiLoCo round in the mailbox: the ring's pseudo-gradient,
// each member's whole pack (--aggregate / --norm_bound), each member's
// encoded pack under the sparse codec, and the members' residuals, averaged
// once after the last round (the flush).
inline constexpr char kPseudoGrad[] = "pseudo_grad";
inline constexpr char kPseudoGradWhole[] = "pseudo_grad_whole";
inline constexpr char kPseudoGradSparse[] = "pseudo_grad_sparse";
inline constexpr char kResidualFlush[] = "residual_flush";

// What an exchange reads; constant for the run, and it must outlive every
// exchange.
struct ExchangeSettings {
  absl::Duration rpc_timeout;                // one ring step
  absl::Duration round_deadline;             // the coordinator's wait for READY
  const PolicyCodec* ring_codec = nullptr;   // null: fp32
  const PolicyCodec* flush_codec = nullptr;  // the residual flush's
  bool robust = false;                       // the all-gather path
  bool sparse_gather = false;  // the sparse codec's path (AllGatherSum)
  AggregateSpec aggregate;
  double norm_bound = 0;
  int64_t n_params = 0;
  int64_t n_buffers = 0;         // the buffers' δb, after the stop vote
  Watchdog* watchdog = nullptr;  // fed while the training thread waits
  // Give the round up once the swarm judges this node cut off from it
  // (gossip/swarm_end.h): it was paused, and none of the members it was
  // with answers since; alone, it would commit the round by itself.
  // False with --train_alone. (While that is undecided, SwarmView::waking,
  // the round is given up either way, and run again.)
  bool leave_when_cut_off = true;
};

class RoundExchange {
 public:
  // `number` is the round's number, for log lines.
  RoundExchange(const ExchangeSettings& settings, DilocoRound round,
                int64_t number)
      : settings_(settings), round_(std::move(round)), number_(number) {}
  RoundExchange(const RoundExchange&) = delete;
  RoundExchange& operator=(const RoundExchange&) = delete;

  // Starts the protocol for round `at.round` of lineage `at` on `swarm`
  // (which must outlive this exchange): on a thread of its own (`async`), or
  // deferred to Wait. The protocol gives up at its next wait once a second
  // SIGINT/SIGTERM arrived, `abandon` turns true, this node woke from a
  // pause and nobody has answered it yet, or it is cut off from the swarm
  // (ExchangeSettings::leave_when_cut_off).
  void Launch(Swarm& swarm, const Swarm::Lineage& at, bool async,
              const std::atomic<bool>& abandon);
  // The outcome; once only. While an async protocol runs, the watchdog is
  // told that the loop waits for it.
  absl::StatusOr<Swarm::RoundResult> Wait();

  const DilocoRound& round() const { return round_; }
  bool async() const { return async_; }

  // What the attempts did, valid after Wait. sum(): the last attempt's
  // result in the layout of the contribution (null when none ran here).
  const std::vector<float>* sum() const { return work_.get(); }
  const RingStats& traffic() const { return attempt_stats_; }
  int attempts() const { return attempts_run_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  // --aggregate / --norm_bound: the last attempt's verdict on each
  // member's contribution, by rank, and the members' ids.
  const std::vector<PackVerdict>& verdicts() const { return verdicts_; }
  const std::vector<std::string>& members() const { return members_; }
  double sync_seconds() const {
    return absl::ToDoubleSeconds(sync_end_ - sync_start_);
  }

 private:
  // One attempt of the round over `t`.
  absl::Status Reduce(Transport& t, int64_t sequence,
                      const std::vector<std::string>& members);
  // The all-gather path: every member checks every pack and combines the
  // accepted ones into *work_.
  absl::Status GatherAndCombine(Transport& t, RingOptions o,
                                const std::vector<std::string>& members);
  void FeedWatchdog(absl::Duration bound) const;

  const ExchangeSettings& settings_;
  const DilocoRound round_;
  const int64_t number_;
  bool async_ = false;

  // Written by the protocol's thread until the result is ready.
  // Fresh memory per attempt, shared because the ring sends from it with
  // no copy and gRPC may hold it after a failed send.
  std::shared_ptr<std::vector<float>> work_;
  RingStats attempt_stats_;
  int attempts_run_ = 0;
  int rank_ = 0;
  int world_ = 1;
  std::vector<PackVerdict> verdicts_;
  std::vector<std::string> members_;
  absl::Time sync_start_, sync_end_;
  // Last, so that it is destroyed first: its destructor waits for an
  // async protocol, which uses the members above.
  std::future<absl::StatusOr<Swarm::RoundResult>> result_;
};

}  // namespace starling

#endif  // STARLING_NODE_ROUND_EXCHANGE_H_
