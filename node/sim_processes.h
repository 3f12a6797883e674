// The node processes of a `starling sim`: each a `starling node` child of
// the sim (the same binary), with its own flags, run directory and log.
//
// NodeArgs is the pure part: a node's command line. NodeProcessGroup starts,
// signals, kills and reaps the children; StopStages decides, with time
// injected, when to signal them as the sim stops; FailedNodeMessage names a
// failed node with its error or signal and its log.
//
// The children are in process groups of their own, so that a terminal's
// Ctrl-C reaches only the sim, which stops them in stages; and they die with
// the sim (PR_SET_PDEATHSIG), so that a sim killed outright leaves none
// behind. Call from the sim's main thread only (it forks; a child's death
// signal follows the thread that forked it). Thread-compatible.
#ifndef STARLING_NODE_SIM_PROCESSES_H_
#define STARLING_NODE_SIM_PROCESSES_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "node/faults.h"
#include "node/run_output.h"

namespace starling {

// What the sim gives each node on its command line.
struct NodeLaunch {
  std::string dir;               // the sim's run directory; node K's is DIR/K
  std::vector<std::string> ids;  // every node, joiners after the initial ones
  int initial = 0;               // how many start at once (--nodes)
  // Each node's host:port, by index. Sorted, so that node K ranks K.
  std::vector<std::string> addresses;
  // Elastic membership: --node_id, --min_members and --partition_file.
  bool elastic = false;
  std::string partition_file;
  std::map<std::string, double> slow;         // --slowdown, by id
  std::map<std::string, std::string> poison;  // --test_poison, by id
  // --drift, by id; when not empty every other node gets --drift=never.
  std::map<std::string, int64_t> drift;
  SimLinks links;  // per-address --link_* flags when shaped
  // Nodes behind emulated NAT (--nat), with the address each advertises,
  // where nothing listens. They list only the others as --peers, and
  // nobody lists them.
  std::map<std::string, std::string> nat_advertise;
  // Flags every node gets, after its own (--NAME=VALUE).
  std::vector<std::string> common;
  int snapshot_every = 0;  // > 0: --snapshot_every=N last (gossip's default)
  // The sim's --metrics_port and --health_port: node K (its index in ids)
  // serves on BASE + K, so that nodes on one host do not collide; 0 gives
  // every node 0 (any free port, logged), -1 none.
  int metrics_port = -1;
  int health_port = -1;
};

// `n` distinct free ports on 127.0.0.1 (each held open until all are
// chosen). Unavailable when there are not enough.
absl::StatusOr<std::vector<int>> PickLoopbackPorts(int n);

// `n` loopback ports, each bound by this process and not listening, for
// the process's life: a connection to one is refused, and no other process
// can take it. Unavailable when there are not enough.
absl::StatusOr<std::vector<int>> HoldClosedLoopbackPorts(size_t n);

// Where node `id` of the sim in `dir` logs: DIR/ID/node.log.
std::string NodeLogPath(const std::string& dir, const std::string& id);

// Node `i`'s argv: "starling node" and its flags. A late node (a restart,
// or a joiner) joins a running swarm, so it waits for no quorum
// (--min_members=1), and resumes when `has_checkpoint`.
std::vector<std::string> NodeArgs(const NodeLaunch& launch, int i, bool restart,
                                  bool has_checkpoint);

// How a node process ended.
struct NodeExit {
  int index = -1;  // into the launch's ids; -1: not a node of the group
  int code = 0;    // its exit code, or 128 + the signal that killed it
  // A node the sim told to leave exits 1 (interrupted), or dies of SIGTERM.
  bool left = false;
  // One that ended apart from the swarm (kExitEndedApart) ran to its end
  // too: the merge flags it, and the others go on.
  bool ok() const { return code == 0 || code == kExitEndedApart || left; }
};

class NodeProcessGroup {
 public:
  explicit NodeProcessGroup(NodeLaunch launch);

  NodeProcessGroup(const NodeProcessGroup&) = delete;
  NodeProcessGroup& operator=(const NodeProcessGroup&) = delete;

  const NodeLaunch& launch() const { return launch_; }
  // The index of node `id` in the launch's ids (ids().size() if none).
  int IndexOf(const std::string& id) const;
  // Node ids in the order they first started.
  const std::vector<std::string>& started() const { return started_; }
  // Starts node `i` with NodeArgs, its output going to its node.log
  // (appended to, after a marker line, on a restart).
  absl::Status Start(int i, bool restart);

  bool running(int i) const { return pids_[i] > 0; }
  int running_count() const;
  // Whether node `i` was told to leave since it last started.
  bool leaving(int i) const { return leaving_[i]; }

  // SIGKILL (a crash), reaped at once so that a restart can follow. False
  // when it is not running.
  bool Kill(int i);
  // SIGTERM: a graceful leave (it says goodbye, checkpoints, exits 1).
  // False when it is not running.
  bool Leave(int i);
  // Sends `sig` to every running node.
  void SignalAll(int sig);

  // A child that has exited, reaped; nullopt when none has (no waiting).
  std::optional<NodeExit> Reap();

 private:
  const NodeLaunch launch_;
  std::vector<pid_t> pids_;  // -1: not running
  std::vector<bool> leaving_;
  std::vector<std::string> started_;
};

// The exit code of a child from waitpid's `status`: its exit code, or 128
// plus the signal that killed it.
int ChildExitCode(int wait_status);

// When the sim signals its nodes as it stops (pure; time injected). At the
// first Ctrl-C (or SIGTERM) every node gets SIGTERM and finishes its round;
// at a second one or after 45 s, SIGTERM again tells them to leave at once
// (abandoning a round, or an evaluation, in progress) and checkpoint what
// they committed, rather than be killed unsaved; after 75 s, SIGKILL for
// whatever still runs (a node blocked on a dead peer). When a node failed
// (the others got SIGTERM then), SIGKILL after 10 s: their round cannot
// finish.
class StopStages {
 public:
  enum class Action {
    kStopAfterRound,  // SIGTERM every node, saying so
    kLeaveNow,        // SIGTERM every node again, saying so
    kKill,            // SIGKILL every node
  };

  // What to do at `now`, in order, given the signals the sim has had (the
  // first's number, 0 for none, and how many) and whether a node failed.
  std::vector<Action> Step(absl::Time now, int signal, int signal_count,
                           bool failed);

 private:
  absl::Time kill_at_ = absl::InfiniteFuture();
  absl::Time leave_now_at_ = absl::InfiniteFuture();
};

// The line that names failed node `id` (exit `code`, or 128 + a signal):
// its error from `log_text` (the last "starling node: error:" line, else
// its last line, since the swarm's threads may log after the error) or,
// killed by a signal, which one; and the path of its log.
std::string FailedNodeMessage(const std::string& id, int code,
                              absl::string_view log_text,
                              const std::string& log_path);

}  // namespace starling

#endif  // STARLING_NODE_SIM_PROCESSES_H_
