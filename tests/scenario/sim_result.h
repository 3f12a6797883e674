// What the scenario tests compare between `starling sim` runs: the final
// figures of a run's summary.json. Stateless, so thread-safe.
#ifndef STARLING_TESTS_SCENARIO_SIM_RESULT_H_
#define STARLING_TESTS_SCENARIO_SIM_RESULT_H_

#include <algorithm>
#include <string>

#include "tests/harness/process.h"
#include "tests/harness/run_files.h"

namespace starling::testing {

struct SimResult {
  double val_loss = 0;
  double total_bytes = 0;    // all nodes, on the wire (gossip and control too)
  double payload_bytes = 0;  // pseudo-gradient bytes after compression
  bool agree = false;        // every node ended on one model
  double best_val_loss = 0;  // the lowest of the rounds' evaluations
};

// Runs `starling sim FLAGS --out=OUT`, expecting it to succeed.
inline SimResult RunSim(const std::string& flags, const std::string& out) {
  const google::protobuf::Struct summary = RunToSummary("sim " + flags, out);
  const google::protobuf::Struct& fin = Field(summary, "final").struct_value();
  SimResult r;
  r.val_loss = Field(fin, "val_loss").number_value();
  r.total_bytes = Field(fin, "total_bytes").number_value();
  r.payload_bytes = Field(fin, "bytes_after_compression").number_value();
  r.agree = Field(fin, "all_hashes_agree").bool_value();
  r.best_val_loss = r.val_loss;
  for (const auto& v : Field(summary, "rounds").list_value().values()) {
    const auto& val = Field(v.struct_value(), "val_loss");
    if (val.kind_case() == google::protobuf::Value::kNumberValue) {
      r.best_val_loss = std::min(r.best_val_loss, val.number_value());
    }
  }
  return r;
}

}  // namespace starling::testing

#endif  // STARLING_TESTS_SCENARIO_SIM_RESULT_H_
