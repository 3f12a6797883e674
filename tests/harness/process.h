// The `starling` binary as real processes in tests: one run to its end
// (RunStarling), or a background Process that a test waits on, signals,
// stops and reads the log of. A Process owns its process: destroyed while
// the process still runs, it SIGKILLs and reaps it, so a failed assertion
// leaves nothing running. Also the address a node logs, a free port and the
// flags of a tiny run. Not thread-safe: one thread drives a Process.
#ifndef STARLING_TESTS_HARNESS_PROCESS_H_
#define STARLING_TESTS_HARNESS_PROCESS_H_

#include <google/protobuf/struct.pb.h>
#include <sys/types.h>

#include <cstddef>
#include <string>

#include "absl/time/time.h"

namespace starling::testing {

// The path of the `starling` binary under test.
const char* StarlingBinary();

// How a run ended: its exit code (from RunStarling -1 when a signal ended
// it, from NodeGroup::Run 128 + the signal) and what it wrote.
struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `starling ARGS` (a shell word list) to its end, capturing its output.
RunResult RunStarling(const std::string& args);

// Runs a shell command line to its end, capturing its output (e.g. a
// Python script a test checks Starling's results with).
RunResult RunCommand(const std::string& command);

// Runs `starling ARGS --out=OUT` to its end, expecting exit 0 (a failure
// shows ARGS and stderr), and returns OUT/summary.json.
google::protobuf::Struct RunToSummary(const std::string& args,
                                      const std::string& out);

// Runs `starling ARGS`, expecting it to refuse them at start-up: exit 2 with
// `mention` (the flag, or what is wrong with it) on stderr. Its result.
RunResult ExpectRefused(const std::string& args, const std::string& mention);

// ExpectRefused for `starling sim ARGS --out=OUT`, which must refuse before
// it makes its run directory or starts a node (so no node failed).
void ExpectSimRefused(const std::string& args, const std::string& out,
                      const std::string& mention);

class Process {
 public:
  struct Options {
    // A command the binary runs under (e.g. "ip netns exec NS"); none when
    // empty.
    std::string wrapper;
    // Whether stdout goes to the log as well (else it is the test's own).
    bool stdout_to_log = false;
  };

  // Starts `starling ARGS` through /bin/sh (so ARGS may quote), stderr to
  // `log_path`. A failed fork fails the test, and the Process is not
  // started().
  static Process Start(const std::string& args, const std::string& log_path,
                       const Options& options);
  static Process Start(const std::string& args, const std::string& log_path) {
    return Start(args, log_path, Options());
  }

  Process() = default;
  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process();

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  std::string LogText() const;

  // Waits for the process to end: its exit code, or 128 + the signal that
  // ended it. After `timeout` (a hung process) it SIGKILLs it and returns
  // -1, as for a Process that was never started. Once ended, the same code
  // every time.
  int Wait(absl::Duration timeout = absl::Minutes(2));
  // Whether it stopped (SIGSTOP, --test_crash_at=freeze:...) within
  // `timeout`; false when it ended instead.
  bool WaitStopped(absl::Duration timeout);
  // Whether it is still running (or stopped), not ended.
  bool Running();

  // Sends `sig` (nothing once it ended).
  void Signal(int sig);
  // Sends `sig` and returns once the process has taken it (it is no longer
  // pending), so that a second signal of the same kind counts as a second;
  // false when it was still pending after `timeout`.
  bool Deliver(int sig, absl::Duration timeout = absl::Seconds(30));
  // SIGINT, then Wait().
  int Interrupt(absl::Duration timeout = absl::Minutes(2));

 private:
  // Reaps the process if it changed state (`options` for waitpid); true when
  // it has ended.
  bool Poll(int options);
  // SIGKILLs and reaps the process unless it has ended.
  void Kill();

  pid_t pid_ = -1;
  std::string log_path_;
  bool ended_ = false;
  int exit_code_ = -1;
};

// The address a node serves peers on, from the "listening on HOST:PORT" line
// it logs to `log_path` once its server is up (text or JSON logs); empty when
// that line did not appear within `timeout`. Start nodes with
// --listen=127.0.0.1:0 and read their address here instead of picking a port
// with FreePort(): the kernel then gives every node its own port.
std::string ListenAddress(const std::string& log_path, absl::Duration timeout);

// A free loopback TCP port (bound once and released). Racy: another process
// (a concurrent test) may take it before the caller binds it, so prefer
// listening on port 0 and ListenAddress(). Only for addresses that must be
// known before the node starts (e.g. a node listed among its own seeds).
int FreePort();

// Flags for a tiny gpt on a generated corpus of `bytes` bytes (written once
// per call): fast enough for integration tests of real processes.
std::string TinyTextFlags(size_t bytes);

}  // namespace starling::testing

#endif  // STARLING_TESTS_HARNESS_PROCESS_H_
