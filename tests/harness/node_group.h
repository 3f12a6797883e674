// `starling node` processes of one run, in one temporary directory: node ID
// writes its run directory to DIR/ID and its log (stderr) to DIR/ID.log,
// listens on a port the kernel picks (--listen=127.0.0.1:0), and joins
// through the address another member logged. The group owns its processes
// (see Process): destroyed, it kills those still running and, when the test
// failed while it lived, prints every node's log. Not thread-safe.
#ifndef STARLING_TESTS_HARNESS_NODE_GROUP_H_
#define STARLING_TESTS_HARNESS_NODE_GROUP_H_

#include <google/protobuf/struct.pb.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/harness/process.h"

namespace starling::testing {

class NodeGroup {
 public:
  // `name` names the directory; `common` holds the flags of every node.
  NodeGroup(const std::string& name, std::string common);
  ~NodeGroup();
  NodeGroup(const NodeGroup&) = delete;
  NodeGroup& operator=(const NodeGroup&) = delete;

  // Starts node `id`: `starling node COMMON --node_id=ID
  // --listen=127.0.0.1:0 [--peers=<via's address>] --out=DIR/ID FLAGS`.
  // FLAGS come last, so they override the rest (e.g. --listen). A node
  // started again gets a fresh log and a new port.
  void Start(const std::string& id, const std::string& flags,
             const std::string& via = "");
  // The same, run to its end: its exit code, and its log as `err`.
  RunResult Run(const std::string& id, const std::string& flags,
                const std::string& via = "");

  // The address node `id` listens on, once it has logged it (empty, with a
  // test failure, when it did not within a minute).
  std::string Address(const std::string& id);
  // See Process::Wait, WaitStopped, Signal and Deliver.
  int Wait(const std::string& id, absl::Duration timeout = absl::Seconds(120));
  bool WaitStopped(const std::string& id, absl::Duration timeout);
  void Signal(const std::string& id, int sig);
  bool Deliver(const std::string& id, int sig);
  bool Running(const std::string& id);
  // Waits until node `id`'s events.jsonl contains `needle`.
  bool WaitForEvent(const std::string& id, const std::string& needle,
                    absl::Duration timeout = absl::Seconds(60)) const;

  const std::string& dir() const { return dir_; }
  // Node `id`'s run directory, log and events file.
  std::string Out(const std::string& id) const;
  std::string Log(const std::string& id) const;
  std::string LogText(const std::string& id) const;
  std::string EventsPath(const std::string& id) const;
  // Its events of one kind (see ReadEvents).
  std::vector<google::protobuf::Struct> Events(const std::string& id,
                                               const std::string& kind) const;
  // round -> model hash, from its round events.
  std::map<int, std::string> RoundHashes(const std::string& id) const;
  // final.model_hash of its summary.json.
  std::string FinalHash(const std::string& id) const;
  // Its model's size, from the "N parameters" line it logs; 0 (with a test
  // failure) when there is none.
  int64_t Parameters(const std::string& id) const;

 private:
  const bool failed_before_;
  const std::string dir_;
  const std::string common_;
  std::map<std::string, std::string> addresses_;
  std::map<std::string, Process> nodes_;  // every node started, by id
};

}  // namespace starling::testing

#endif  // STARLING_TESTS_HARNESS_NODE_GROUP_H_
