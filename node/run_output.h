// The run directory a node writes: events.jsonl (one JSON object per line)
// and summary.json (docs/design.md's contracts), shared by `starling train` and
// `starling node`. EventLog is thread-compatible (one writer thread).
#ifndef STARLING_NODE_RUN_OUTPUT_H_
#define STARLING_NODE_RUN_OUTPUT_H_

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/json.h"
#include "core/trainer.h"

namespace starling {

class EventLog {
 public:
  // `wall_offset` is the wall time already spent by earlier (resumed) runs.
  EventLog(std::string path, std::string node_id, double wall_offset);

  // Appends {"event": event, "node": id, "time": ..., "wall_seconds": ...,
  // fields...}. Write errors are logged once and otherwise ignored.
  void Write(absl::string_view event, const JsonObject& fields);

  double WallSeconds() const;

 private:
  std::string path_;
  std::string node_id_;
  std::chrono::steady_clock::time_point start_;
  double wall_offset_;
  bool warned_ = false;
};

// When the data switched to the drifted region at step `r` (r.drifted, see
// --drift), writes {"event":"drift","step":S,"region":1} with S the --drift
// step and logs a line; otherwise nothing.
// `starling train` and `starling node` call it after every step.
void LogDrift(EventLog& events, const Trainer& trainer, const StepResult& r);

// The config as JSON with proto field names and every field printed.
std::string ConfigJson(const TrainConfig& config);

// One round of a DiLoCo (or ddp) run as this node saw it.
struct RoundRecord {
  int64_t round = 0;
  int step = 0;  // inner steps completed by this node after the round
  std::vector<std::string> members;  // node ids, in ring order
  std::string model_hash;
  double train_loss = 0;
  double val_loss = -1;  // < 0: not evaluated this round
  int64_t bytes = 0;     // sent by this node during the round
  double seconds = 0;    // wall time of the round
  int inner_steps = 0;   // this node's inner steps in the round (0: unknown)
  bool early = false;    // ended early by a drift/divergence request
  double sync_seconds = -1;  // in the round protocol (< 0: unknown)
  // The rest of a DiLoCo round's time (< 0: unknown): its inner steps, the
  // device-to-host copy of the trained weights for the pseudo-gradient, and
  // the outer step with the new weights' way back into the model. With
  // sync_seconds (the exchange) they make docs/training.md's round split.
  double inner_seconds = -1;
  double copy_seconds = -1;
  double outer_seconds = -1;
  // --overlap: the exchange ran behind the next round's inner steps and
  // the update was applied one round late.
  bool overlapped = false;
  // The residual flush after a DiLoCo run's last round (error feedback):
  // no inner steps; θ_global became the average of the members' models.
  bool residual_flush = false;
};

JsonObject RoundJson(const RoundRecord& r);

// The mean split of the rounds that have one (DiLoCo's, the residual flush
// aside): {"rounds", "inner_seconds", "copy_seconds", "exchange_seconds",
// "outer_seconds"}; nullopt when none has.
std::optional<JsonObject> RoundTimeSplit(
    const std::vector<RoundRecord>& rounds);

// The "round" events in an events.jsonl with round < `before_round` (a
// resumed node's history; later ones were redone). Unreadable lines are
// skipped; a missing file gives none.
std::vector<RoundRecord> ReadRoundEvents(const std::string& path,
                                         int64_t before_round);

struct NodeTotals {
  std::string id = "n0";
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  double wall_seconds = 0;
  // Bytes per-step ring all-reduce of fp32 gradients would have sent.
  int64_t allreduce_equivalent_bytes = 0;
  // Pseudo-gradient payload as fp32 and as sent (empty codec: not recorded).
  std::string compression;
  int64_t bytes_before_compression = 0;
  int64_t bytes_after_compression = 0;
};

// summary.json for one node's run directory: `extra` goes at its top
// level, `final_extra` into its "final" object.
absl::Status WriteNodeSummary(const std::string& out_dir,
                              absl::string_view command, Trainer& trainer,
                              const EvalResult& eval, const NodeTotals& totals,
                              const std::vector<RoundRecord>& rounds,
                              bool interrupted, const JsonObject& extra,
                              const JsonObject& final_extra = JsonObject());

// SIGINT/SIGTERM set a flag that the training loops poll between steps.
void InstallStopSignals();
// The signal that asked to stop, or 0.
int StopSignal();
// How many SIGINT/SIGTERM arrived (a second one means: stop now).
int StopSignalCount();

// 2 for user errors (bad flag, config or input), 1 for runtime failures.
int ExitCodeFor(const absl::Status& s);
// The exit code of a DiLoCo node that ended apart from its swarm
// (gossip/swarm_end.h): the swarm finished without it, or it was cut off,
// so its model is not the swarm's final one. The others: 0 ok, 1 a runtime
// failure (or a run left on a signal), 2 bad flags, config or input.
constexpr int kExitEndedApart = 3;

// Makes the run directory `out` (mkdir -p) and writes and removes a probe
// file there: InvalidArgument naming --out when it cannot (a directory this
// user may not write, a read-only mount), before any data is loaded or model
// built.
absl::Status CheckOutWritable(const std::string& out);

// Fills an empty --out with runs/COMMAND-TIMESTAMP, checks --resume against
// the checkpoint there, creates the directory and checks that it is
// writable (CheckOutWritable). InvalidArgument naming the flag.
absl::Status PrepareRunDir(TrainConfig* config, absl::string_view command);

// PrepareRunDir, then --threads, then Trainer::Create: the start of every
// run, so that an unwritable --out fails before the data load. Errors as those
// give; ExitCodeFor maps them. When Trainer::Create fails, a run directory that
// this call created is removed again.
absl::StatusOr<std::unique_ptr<Trainer>> StartRun(TrainConfig* config,
                                                  absl::string_view command);

std::string FormatDuration(double seconds);  // "1m05s"

}  // namespace starling

#endif  // STARLING_NODE_RUN_OUTPUT_H_
