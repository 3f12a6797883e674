// `starling sim`'s live progress line, from the events its nodes append to
// their events.jsonl:
//   sim | round 6 | step 300/800 | loss 2.2157 | val 2.3783 | sent 19.9 MB |
//   15s | eta 25s
// (a classifier adds its validation accuracy after val: "acc 84.10%";
// gossip: pushes instead of rounds; with a fault plan, the members of the
// latest round; and a round's exchange open for 5 s or more, named so that
// a line stuck on a round says why).
//
// SimProgress turns events into the line's figures (Observe and Figures are
// pure, time injected; Poll reads the files). FormatProgressLine and
// EtaSeconds are pure. ProgressPrinter writes the line to stderr. All
// thread-compatible: the sim's main thread owns them.
#ifndef STARLING_NODE_SIM_PROGRESS_H_
#define STARLING_NODE_SIM_PROGRESS_H_

#include <google/protobuf/struct.pb.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "node/sim_events.h"

namespace starling {

// What the progress line shows.
struct ProgressFigures {
  bool gossip = false;  // count pushes, not rounds
  int64_t count = 0;    // rounds committed (gossip: pushes of all nodes)
  int members = -1;     // members of the latest round; < 0: not shown
  int step = 0;         // the slowest counted node's step
  int total_steps = 0;  // per node
  double loss = 0;      // mean training loss of the counted nodes
  double val = NAN;     // validation loss; NaN: none yet
  double acc = NAN;     // validation accuracy (classifiers); NaN: none
  double sent = 0;      // bytes, all nodes
  double elapsed = 0;   // seconds since the sim started
  double eta = NAN;     // seconds; NaN: unknown
  // The oldest exchange open for 5 s or more (-1: none), and how long.
  int64_t exchanging_round = -1;
  double exchanging_seconds = 0;
};

// The line for `f`. Loss and ETA show "-" and "?" until a step is done.
std::string FormatProgressLine(const ProgressFigures& f);

// Seconds left when `step` of `total_steps` took `elapsed` seconds, at the
// same pace; NaN before the first step.
double EtaSeconds(double elapsed, int step, int total_steps);

class SimProgress {
 public:
  // `ids` are the sim's nodes (joiners included), whose events.jsonl are
  // DIR/ID/events.jsonl. `show_members`: add the members of the latest
  // round; `gossip`: count pushes, and show the mean of the nodes' latest
  // validation loss (each evaluates its own model).
  SimProgress(const std::string& dir, const std::vector<std::string>& ids,
              int total_steps, bool show_members, bool gossip);

  // Whether node `i` counts for the step, loss and ETA: from its start (a
  // joiner: from its first round) until the sim stops it.
  void SetCounted(size_t i, bool counted) { nodes_[i].counted = counted; }

  // Whether a node has started training: the swarm formed.
  bool formed() const { return formed_; }

  // Whether node `i` has logged a round (gossip: an exchange) since the sim
  // started.
  bool HasRound(size_t i) const { return nodes_[i].rounds > 0; }

  // Reads only what each node appended since the last poll, and observes
  // it at the current time.
  void Poll();

  // Applies node `i`'s event `ev`, read at `now`.
  void Observe(size_t i, const google::protobuf::Struct& ev, absl::Time now);

  // The figures after `elapsed` seconds of the sim, at `now`.
  ProgressFigures Figures(double elapsed, absl::Time now) const;

  std::string Line(double elapsed, absl::Time now) const {
    return FormatProgressLine(Figures(elapsed, now));
  }

 private:
  struct Node {
    int step = 0;
    double loss = 0, sent = 0;
    int rounds = 0;
    double val = NAN;  // its latest val_loss
    double acc = NAN;  // its latest val_accuracy (classifiers)
    // The round whose exchange it is in (-1: none), and since when.
    int64_t syncing = -1;
    absl::Time sync_since = absl::InfiniteFuture();
    bool counted = false;
  };

  EventTail tail_;
  std::vector<Node> nodes_;
  int total_steps_;
  bool show_members_;
  bool gossip_;
  int64_t round_ = 0;
  int64_t pushes_ = 0;  // all nodes' gossip pushes
  int members_ = 0;
  bool formed_ = false;
  double val_ = NAN;  // the latest val_loss of any node
  double acc_ = NAN;  // the latest val_accuracy of any node
};

// Writes the progress line to stderr: on a terminal redrawn in place;
// otherwise as a new line when it changed and 5 s have passed since the
// last one. Status lines (Say) stand clear of it.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool tty) : tty_(tty) {}

  void Show(const std::string& line, absl::Time now);
  // The last line, the state the nodes ended in: kept on a terminal, and
  // written off one unless it was the last line written.
  void ShowFinal(const std::string& line);
  // A line of its own, clear of the live progress line.
  void Say(const std::string& message);

 private:
  bool tty_;
  absl::Time last_print_ = absl::InfinitePast();
  std::string last_line_;
};

}  // namespace starling

#endif  // STARLING_NODE_SIM_PROGRESS_H_
