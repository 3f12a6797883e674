#include "node/sim_run.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/logging.h"
#include "core/status.h"
#include "node/run_output.h"
#include "node/sim_progress.h"

namespace starling {
namespace {

class SimRunner {
 public:
  SimRunner(NodeLaunch launch, const FaultPlan& plan,
            const SimRunOptions& options)
      : group_(std::move(launch)),
        schedule_(plan.events),
        progress_(group_.launch().dir, group_.launch().ids, options.total_steps,
                  !plan.empty(), options.gossip),
        printer_(::isatty(STDERR_FILENO)),
        driver_(&group_, &progress_, &printer_, group_.launch().partition_file,
                group_.launch().elastic) {}

  absl::Status StartInitialNodes() {
    start_ = absl::Now();
    for (int i = 0; i < initial(); ++i) {
      STARLING_RETURN_IF_ERROR(group_.Start(i, false));
    }
    for (int i = 0; i < initial(); ++i) progress_.SetCounted(i, true);
    return absl::OkStatus();
  }

  // Until every node has stopped, and no restart or join is still to come
  // (unless the sim is stopping).
  void Supervise() {
    while (group_.running_count() > 0 ||
           (!stopping() && schedule_.StartsPending())) {
      if (std::optional<NodeExit> exit = group_.Reap()) {
        if (exit->index >= 0) OnExit(*exit);
        continue;
      }
      const double elapsed = Elapsed();
      while (!stopping()) {
        std::optional<FaultEvent> ev = schedule_.TakeDue(elapsed);
        if (!ev.has_value()) break;
        driver_.CarryOut(*ev, elapsed);
      }
      StopInStages();
      progress_.Poll();
      CountJoiners();
      printer_.Show(progress_.Line(elapsed, absl::Now()), absl::Now());
      absl::Duration nap = absl::Milliseconds(250);
      if (!stopping()) {
        nap = std::min(nap, schedule_.UntilNext(absl::Now() - start_));
      }
      absl::SleepFor(nap);
    }
  }

  SimRunResult Finish() {
    // The state the nodes ended in, which the last line (at most 5 s old,
    // or a poll before the last node's final events) may not show.
    progress_.Poll();
    printer_.ShowFinal(progress_.Line(Elapsed(), absl::Now()));
    // Events that never came due: every node had stopped before them.
    if (!stopping()) {
      for (const FaultEvent& ev : schedule_.TakeRest()) {
        driver_.log().Record(ev, -1, "every node had stopped");
      }
    }
    SimRunResult result;
    result.start = start_;
    result.started = group_.started();
    result.faults = std::move(driver_.log());
    result.failed = failed_;
    result.failed_code = failed_code_;
    return result;
  }

 private:
  int initial() const { return group_.launch().initial; }
  double Elapsed() const { return absl::ToDoubleSeconds(absl::Now() - start_); }
  bool stopping() const { return failed_ >= 0 || StopSignal() != 0; }

  // A node exited: a leave the sim asked for, or (unless the sim is
  // stopping anyway) a failure that stops the others.
  void OnExit(const NodeExit& exit) {
    if (exit.left) {
      printer_.Say(
          absl::StrCat("starling sim: ", group_.launch().ids[exit.index],
                       " left (exit ", exit.code, ")"));
    }
    if (!exit.ok() && failed_ < 0 && StopSignal() == 0) {
      failed_ = exit.index;
      failed_code_ = exit.code;
      group_.SignalAll(SIGTERM);
    }
  }

  void StopInStages() {
    for (StopStages::Action action : stages_.Step(
             absl::Now(), StopSignal(), StopSignalCount(), failed_ >= 0)) {
      switch (action) {
        case StopStages::Action::kStopAfterRound:
          WriteStderrLine(
              "\nstarling sim: stopping all nodes after their current round "
              "(Ctrl-C again: at once)");
          group_.SignalAll(SIGTERM);
          break;
        case StopStages::Action::kLeaveNow:
          WriteStderrLine("starling sim: telling the nodes to leave at once");
          group_.SignalAll(SIGTERM);
          break;
        case StopStages::Action::kKill:
          group_.SignalAll(SIGKILL);
          break;
      }
    }
  }

  // A joiner counts for the progress line once it has a round.
  void CountJoiners() {
    for (int i = initial(); i < static_cast<int>(group_.launch().ids.size());
         ++i) {
      if (group_.running(i) && !group_.leaving(i) && progress_.HasRound(i)) {
        progress_.SetCounted(i, true);
      }
    }
  }

  NodeProcessGroup group_;
  FaultSchedule schedule_;
  SimProgress progress_;
  ProgressPrinter printer_;
  FaultDriver driver_;
  StopStages stages_;
  absl::Time start_;
  int failed_ = -1;
  int failed_code_ = 0;
};

}  // namespace

absl::StatusOr<SimRunResult> RunSimNodes(NodeLaunch launch,
                                         const FaultPlan& plan,
                                         const SimRunOptions& options) {
  SimRunner runner(std::move(launch), plan, options);
  STARLING_RETURN_IF_ERROR(runner.StartInitialNodes());
  runner.Supervise();
  return runner.Finish();
}

}  // namespace starling
