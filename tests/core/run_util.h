// The process harness under its older names, for tests/node/cli_test.cc
// until that test includes tests/harness/ itself; new tests include
// tests/harness/process.h, run_files.h and wait.h.
#ifndef STARLING_TESTS_CORE_RUN_UTIL_H_
#define STARLING_TESTS_CORE_RUN_UTIL_H_

#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <sys/wait.h>

#include <string>

#include "tests/core/test_util.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"
#include "tests/harness/wait.h"

namespace starling::testing {

// Process::Start, the caller reaping the process (InterruptAndWait).
inline pid_t SpawnStarling(const std::string& args,
                           const std::string& err_path) {
  return Process::Start(args, err_path).Release();
}

// SIGINT to a process from SpawnStarling; its exit code (-1 for a signal).
inline int InterruptAndWait(pid_t pid) {
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace starling::testing

#endif  // STARLING_TESTS_CORE_RUN_UTIL_H_
