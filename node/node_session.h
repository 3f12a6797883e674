// One session of a node's run: this process, from the start of its loop to
// its exit. What the three loops (diloco_loop.h, gossip_loop.h,
// ddp_loop.h) share instead of each keeping a copy:
//  - the events log (events.jsonl) and the start event, after which
//    SIGINT/SIGTERM ask the loop to stop (StopSignal, run_output.h);
//  - the traffic: earlier sessions' bytes (PriorTraffic) plus this one's;
//  - a metrics poller thread that refreshes traffic, peers and RPC errors
//    every second (with --metrics_port);
//  - member changes, reported on the swarm's gossip thread (MemberChanges)
//    and logged on the training thread;
//  - each inner step's bookkeeping, evaluations, round records and
//    checkpoints (of the model all members share: see SetSharedModelScope);
//  - the end: checkpoint, totals, end event, summary.json, the last stderr
//    line and the exit code (Finish).
//
// Exit codes of `starling node`: 0 ok, 1 a runtime failure, 2 bad flags,
// config or input, or a refused handshake, 3 (kExitEndedApart, DiLoCo) a
// node that ended apart from its swarm. The loops' steps return
// absl::Status; one that must end the process with 2 carries that code
// (WithExitCode), any other failure ends it with 1.
//
// Thread-safety: a NodeSession belongs to the training thread. The poller
// thread it starts reads only the traffic sources, the swarm (thread-safe)
// and atomics; MemberChanges is thread-safe.
#ifndef STARLING_NODE_NODE_SESSION_H_
#define STARLING_NODE_NODE_SESSION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "core/json.h"
#include "core/trainer.h"
#include "gossip/membership.h"
#include "gossip/swarm.h"
#include "node/node_run.h"
#include "node/run_output.h"

namespace starling {

// `s` (not OK) with the exit code the process ends with when it fails.
absl::Status WithExitCode(absl::Status s, int code);
// The exit code `s` carries: 1 unless WithExitCode set another.
int ExitCodeOf(const absl::Status& s);
// Logs "starling node: error: ..." and returns ExitCodeOf(s), or `code`.
int Fail(const absl::Status& s);
int Fail(const absl::Status& s, int code);

// Membership changes arrive on the gossip thread; the training thread logs
// them (EventLog has one writer). Thread-safe.
class MemberChanges {
 public:
  explicit MemberChanges(std::string self) : self_(std::move(self)) {}
  void Add(const MembershipChange& c) ABSL_LOCKS_EXCLUDED(mu_);
  // When this node last refuted a member's word that it was suspected or
  // dead: a sign that a partition just healed (or that this node was
  // paused), and that the views of the members take a few gossip exchanges
  // to agree again.
  absl::Time LastRefuted() const ABSL_LOCKS_EXCLUDED(mu_);
  // Writes the pending changes as "member" events and log lines.
  void Log(EventLog& events) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string self_;
  mutable absl::Mutex mu_;
  std::vector<MembershipChange> pending_ ABSL_GUARDED_BY(mu_);
  absl::Time last_refuted_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// How a loop ends its session (NodeSession::Finish).
struct SessionEnd {
  bool stopped = false;    // left on a signal, not done
  int64_t next_round = 0;  // where the checkpoint resumes
  int world = 1;           // members, for the all-reduce equivalent
  NodeTotals totals;       // its compression fields; Finish fills the rest
  JsonObject end_fields;   // the end event's, after "step"
  JsonObject summary;      // summary.json's own fields for the algorithm
  std::string done;        // "ID done: N steps<done>, sent BYTES"
  // "starling node: <stopped_by> signal S at step N<stopped_at>;
  // checkpoint in PATH"
  std::string stopped_by;
  std::string stopped_at;
  std::function<void()> shutdown;  // after summary.json (may be empty)
  // summary.json's "final" fields for the algorithm.
  JsonObject final_fields;
  // Not empty: the node ended apart from its swarm (gossip/swarm_end.h);
  // the last stderr line, and the exit code is kExitEndedApart.
  std::string apart;
};

class NodeSession {
 public:
  // Opens OUT/events.jsonl for `node_id`.
  NodeSession(NodeRun& run, std::string node_id);
  ~NodeSession();  // stops the poller, then destroys the swarm
  NodeSession(const NodeSession&) = delete;
  NodeSession& operator=(const NodeSession&) = delete;

  const std::string& node_id() const { return node_id_; }
  EventLog& events() { return events_; }
  MemberChanges& changes() { return changes_; }

  // Where this session's bytes are counted (a transport's counters, which
  // must be thread-safe); before StartMetricsPoller.
  void SetTraffic(std::function<int64_t()> sent,
                  std::function<int64_t()> received);
  // Takes the elastic loops' swarm: its counters, its peers in the metrics,
  // a goodbye to it when an inner step fails. The session outlives it
  // (it takes member changes until it stops) and destroys it after its
  // poller stops.
  Swarm& AttachSwarm(std::unique_ptr<Swarm> swarm);
  // The run's bytes so far: earlier sessions' and this one's.
  int64_t BytesSent() const;
  int64_t BytesReceived() const;
  // Pseudo-gradient (or push) bytes as fp32 and as sent, for the metrics.
  void SetCompressionTraffic(int64_t before, int64_t after);
  // With --metrics_port: refreshes the traffic, peers and RPC errors now
  // and every second, on a thread of its own, until Finish or destruction.
  void StartMetricsPoller();

  // Logs "<who>, ARCHITECTURE, N parameters, data DATASET".
  void LogModel(const std::string& who) const;
  // Writes the "start" event ("resume" on --resume) with `fields`, then
  // installs the SIGINT/SIGTERM handlers.
  void Start(const JsonObject& fields);
  void LogMemberChanges() { changes_.Log(events_); }

  // One inner step (with the gradient `hook`, when set), then the data
  // drift event (when `log_data_drift`), the log position (`log_round`),
  // the watchdog, the metrics and the test stall. On a failure (e.g. a
  // non-finite loss) it writes an "error" event and says goodbye to the
  // swarm, so that nobody waits for this node; the caller then fails.
  absl::StatusOr<StepResult> Step(int64_t log_round, bool log_data_drift,
                                  const Trainer::GradientHook& hook = nullptr);

  // Runs a function with the model that checkpoints and evaluations must
  // see in the trainer (DiLoCo with the residual in the node's model:
  // θ_global, which all members share), then restores the node's own.
  using ModelScope =
      std::function<absl::Status(const std::function<absl::Status()>&)>;
  void SetSharedModelScope(ModelScope scope) {
    shared_model_ = std::move(scope);
  }

  // Evaluates when an --eval_every boundary was crossed since `prev_step`
  // or when forced, once per step. `at_step` (>= 0) labels a model that the
  // trainer's step has passed (--overlap applies a round's update one round
  // late). A second signal cuts the evaluation short, without a val_loss.
  absl::Status MaybeEvaluate(bool force, int prev_step, int at_step = -1);
  // Evaluates (when `evaluator`, and a boundary was crossed or this is the
  // last step), then writes the "round" event and keeps `rec` for
  // summary.json.
  absl::Status RecordRound(RoundRecord& rec, bool evaluator, int prev_step);
  // Whether a --checkpoint_every boundary was crossed before the last step.
  bool CheckpointDue(int prev_step, int step) const;
  // Writes the checkpoint; `next_round` is where a resumed run goes on.
  absl::Status Checkpoint(int64_t next_round);
  // Checkpoint() at a --checkpoint_every boundary: a failed write (a full
  // disk, a directory gone read-only) is logged as a warning naming the
  // previous checkpoint, which the atomic write left whole, and the run goes
  // on.
  void PeriodicCheckpoint(int64_t next_round);
  // "keeping the previous checkpoint (step S) in PATH", or that none exists.
  std::string KeptCheckpoint() const;
  // On the way out after an error: checkpoints the model as restored for
  // it (`restored`: how that went) so nothing is lost, or says why not.
  void CheckpointBeforeFailing(absl::Status restored, int64_t next_round);
  // The remaining time at this pace, e.g. "1m05s".
  std::string Eta(int step) const;

  // Checkpoints, writes the end event and summary.json, calls
  // end.shutdown and the last stderr line: the exit code (1 when stopped
  // by a signal or when the checkpoint or summary cannot be written;
  // kExitEndedApart with end.apart).
  int Finish(SessionEnd end);

 private:
  void StopPoller();
  void RefreshMetrics() const;

  NodeRun& run_;
  const std::string node_id_;
  EventLog events_;
  MemberChanges changes_;  // declared before swarm_, which reports to it
  ModelScope shared_model_;
  std::unique_ptr<Swarm> swarm_;
  std::function<int64_t()> sent_, received_;
  std::atomic<int64_t> before_compression_{0};
  std::atomic<int64_t> after_compression_{0};
  absl::Notification stop_poller_;
  std::thread poller_;
  // The step of the last checkpoint written (or resumed from); -1: none.
  int checkpoint_step_ = -1;
};

}  // namespace starling

#endif  // STARLING_NODE_NODE_SESSION_H_
