// `starling sim`'s fault injection over time: the plan that node/faults.h
// parses from --kill, --restart, --join, --leave and --partition, carried
// out while the nodes run.
//
// FaultSchedule says which events are due at a time (pure). FaultLog
// records what was done, or skipped and why, for summary.json's "faults",
// the report's marks, and the nodes' statuses (pure). FaultDriver carries an
// event out on the node processes and the partition file, and says so on
// stderr. Thread-compatible: the sim's main thread owns them.
#ifndef STARLING_NODE_SIM_FAULTS_H_
#define STARLING_NODE_SIM_FAULTS_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/json.h"
#include "node/faults.h"
#include "node/report.h"
#include "node/sim_processes.h"
#include "node/sim_progress.h"

namespace starling {

// The plan's events in time order, taken as they come due.
class FaultSchedule {
 public:
  explicit FaultSchedule(std::vector<FaultEvent> events)
      : events_(std::move(events)) {}

  // The next event if it is due `elapsed` seconds after the start (its
  // time <= elapsed), taken; nullopt when none is due.
  std::optional<FaultEvent> TakeDue(double elapsed);
  // How long from `elapsed` until the next event (zero when it is due
  // already); InfiniteDuration when none is left.
  absl::Duration UntilNext(absl::Duration elapsed) const;
  // Whether a restart or a join is still to come (the sim waits for it).
  bool StartsPending() const;
  // The events not taken, taken.
  std::vector<FaultEvent> TakeRest();

 private:
  std::vector<FaultEvent> events_;
  size_t next_ = 0;
};

// What the sim's faults did.
struct FaultLog {
  JsonArray json;                        // summary.json's "faults"
  std::vector<ReportData::Fault> marks;  // seconds since the sim started
  std::vector<std::string> left;         // ids that left via --leave
  std::vector<std::string> killed;       // killed and not restarted since

  // Records `ev`: carried out at `t` seconds after the start, or skipped
  // for the reason `skipped` (then `t` is when, or < 0 when it never came
  // due because every node had stopped).
  void Record(const FaultEvent& ev, double t, const std::string& skipped);
};

// What a fault event acts on, in words: its node, or a partition's groups.
std::string FaultTarget(const FaultEvent& ev);

class FaultDriver {
 public:
  // `group`, `progress` and `printer` must outlive the driver. The nodes
  // take partitions from `partition_file`; `elastic`: they have elastic
  // membership (the note on a fault before the swarm formed).
  FaultDriver(NodeProcessGroup* group, SimProgress* progress,
              ProgressPrinter* printer, std::string partition_file,
              bool elastic);

  // Carries out `ev` at `t` seconds after the start (or skips it: a node
  // that is not running, or one still running for a restart), records it
  // and says so.
  void CarryOut(const FaultEvent& ev, double t);

  FaultLog& log() { return log_; }

 private:
  // Carries out `ev` on node `i` (-1 for a partition); what made it
  // skip, or empty.
  std::string Apply(const FaultEvent& ev, int i);
  std::string StartAgain(const FaultEvent& ev, int i);
  // Why a kill or leave of a starting node before the swarm formed will
  // stop the sim, or empty.
  std::string NoteBeforeFormed();

  NodeProcessGroup* const group_;
  SimProgress* const progress_;
  ProgressPrinter* const printer_;
  const std::string partition_file_;
  const bool elastic_;
  FaultLog log_;
};

}  // namespace starling

#endif  // STARLING_NODE_SIM_FAULTS_H_
