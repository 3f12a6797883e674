// The merge of a `starling sim`'s node outputs into the run's summary.json
// and report.html. Nodes may have joined late, left, or been killed (no
// summary.json of theirs, or one from an earlier life): rounds are merged by
// round number over every node that logged them, and the hashes the nodes
// logged for a round say whether they agreed.
//
// NodeRecordFrom and MergeRun are pure (parsed inputs in, summary and report
// data out); ReadNodeRecord and MergeOutputs read and write the files.
// Thread-compatible.
#ifndef STARLING_NODE_SIM_MERGE_H_
#define STARLING_NODE_SIM_MERGE_H_

#include <google/protobuf/struct.pb.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/json.h"
#include "core/trainer.h"
#include "node/consensus.h"
#include "node/report.h"
#include "node/sim_faults.h"

namespace starling {

// One node's record of one round.
struct RoundSeen {
  google::protobuf::Value members;
  std::string hash;
  double train_loss = 0;
  google::protobuf::Value val_loss;
  double bytes = 0;
  double seconds = 0;
  double unix_seconds = NAN;  // from the event's "time"; NaN: unknown
  double wall_seconds = NAN;  // the node's own clock
  bool residual_flush = false;
};

// What one node left behind: its summary.json (if any) and events.
struct NodeRecord {
  std::string id;
  bool has_summary = false;
  google::protobuf::Struct summary;
  std::map<int64_t, RoundSeen> rounds;  // by round; the last record wins
  struct Eval {
    int64_t step;
    double val_loss, unix_seconds, wall_seconds;
    double val_accuracy = -1;  // classifiers; < 0: none
  };
  std::vector<Eval> evals;
  // "drift" and "drift_detected" events, in the order logged.
  struct Mark {
    std::string event;
    int64_t step;
    double unix_seconds, wall_seconds;
  };
  std::vector<Mark> marks;

  // The summary's nodes[0] and final (empty without a summary).
  const google::protobuf::Struct& node() const;
  const google::protobuf::Struct& final_figures() const;
  // Inner steps it ran (the final figures', else its node entry's).
  double steps() const;
};

// Node `id`'s record from its summary.json (null: it wrote none) and the
// text of its events.jsonl. Rounds the summary holds that the events lost
// are taken from the summary.
NodeRecord NodeRecordFrom(const std::string& id,
                          const google::protobuf::Struct* summary,
                          absl::string_view events);
// The same from DIR/ID/summary.json and DIR/ID/events.jsonl; a file that is
// missing or unreadable counts as empty.
NodeRecord ReadNodeRecord(const std::string& dir, const std::string& id);

// What the merge needs besides the config and the nodes' records.
struct MergeInput {
  std::string dir;
  std::vector<std::string> ids;  // every node the sim started, in order
  int initial_nodes = 0;         // --nodes (the others joined)
  std::string algo;              // --algo
  absl::Time start;              // when the sim started its nodes
  double wall = 0;               // seconds the sim ran
  FaultLog faults;
};

struct MergedRun {
  JsonObject summary;  // the run's summary.json
  ReportData report;   // its report.html
};

// The run's summary and report from the nodes' records (in the order of
// `in.ids`) and, for gossip, the consensus distance from their snapshots.
// `config` and `sim_cfg` go into the summary as they are.
MergedRun MergeRun(const MergeInput& in, const std::vector<NodeRecord>& nodes,
                   const TrainConfig& config, const JsonObject& sim_cfg,
                   const std::vector<ConsensusPoint>& consensus);

// Reads the nodes' outputs (and for gossip their snapshots, then deletes
// them), merges them and writes DIR/summary.json and the report. An error
// writing the summary is returned; one from the report is logged.
absl::Status MergeOutputs(const MergeInput& in, const TrainConfig& config,
                          const JsonObject& sim_cfg);

// Whether the members' model hashes agreed, in words: "yes", or where they
// did not. `split`: the rounds whose nodes logged different hashes (sorted);
// `final_agree`: every node that ran to the end holds the same model (none
// when no node did). A partition's sides train apart (split rounds) and end
// on one model.
std::string AgreementText(const std::vector<int64_t>& split,
                          std::optional<bool> final_agree);

// The sim's last line from the merged summary.json: validation loss, bytes
// against per-step all-reduce, hash agreement, the nodes that ended apart
// from the swarm (final.nodes_apart), wall time and the report.
std::string DoneLine(const google::protobuf::Struct& summary,
                     const std::string& algo, double wall,
                     const std::string& dir);

}  // namespace starling

#endif  // STARLING_NODE_SIM_MERGE_H_
