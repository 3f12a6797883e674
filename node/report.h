// report.html for a `starling sim` run: gnuplot charts (PNG) rendered from
// CSV files, a table of the final figures and, when the sim injected faults,
// a table of them (also marked on the membership chart), and data drift
// marks on the loss-vs-time chart. The page is self-contained: each chart is
// inlined as a data: URI, so report.html can be mailed or attached alone
// (the CSV files beside it are the data, for other tools).
// Thread-compatible.
#ifndef STARLING_NODE_REPORT_H_
#define STARLING_NODE_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace starling {

struct ReportData {
  std::string title;
  // (wall seconds, validation loss) from the nodes' evaluations. Wall
  // seconds count from the start of the sim.
  std::vector<std::pair<double, double>> val_vs_time;
  // (wall seconds, validation accuracy as a fraction) for a classifier; a
  // chart when not empty.
  std::vector<std::pair<double, double>> accuracy_vs_time;
  // Per round: cumulative bytes sent by all nodes, mean train loss, wall
  // seconds at its end, whether all members' model hashes agreed, members.
  struct Round {
    int64_t round;
    double cumulative_bytes;
    double train_loss;
    double wall_seconds;
    bool hashes_agree;
    int members;
  };
  std::vector<Round> rounds;
  struct Node {
    std::string id;
    double bytes_sent;
    double bytes_received;
    double utilization;
  };
  std::vector<Node> nodes;
  // Rows of the summary table: (label, value).
  std::vector<std::pair<std::string, std::string>> facts;
  // Fault events the sim carried out or skipped, in time order. Carried-out
  // ones are marked on the membership-over-time chart.
  struct Fault {
    double wall_seconds;  // when it was carried out (or skipped)
    std::string kind;     // "kill", "restart", "join", "leave", ...
    std::string node;     // node id, or the groups of a partition
    std::string skipped;  // why it was skipped; empty when carried out
  };
  std::vector<Fault> faults;
  // Marked on the loss-vs-time chart as vertical lines with a label: data
  // drift switches (--drift) and drift detections, in time order.
  struct LossMark {
    double wall_seconds;  // seconds since the start of the sim
    std::string label;    // e.g. "drift n0", "drift detected n1"
    bool drift;           // true: a drift switch; false: a detection
  };
  std::vector<LossMark> loss_marks;
  // Gossip: consensus distance (1/n)·Σ‖θ_i − θ̄‖² per snapshot step; a
  // chart (and consensus.csv) when not empty.
  struct Consensus {
    int64_t step;
    double distance;
    int nodes;
  };
  std::vector<Consensus> consensus;
};

// Writes DIR/report.html and DIR/report/*.{csv,png}. Without gnuplot the
// page is written without charts and the returned status says why
// (FailedPrecondition); the CSV files are always written.
absl::Status WriteReport(const std::string& dir, const ReportData& data);

}  // namespace starling

#endif  // STARLING_NODE_REPORT_H_
