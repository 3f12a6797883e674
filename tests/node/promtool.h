// `promtool check metrics` on scraped Prometheus text, for the tests of the
// metrics endpoint. promtool comes from the STARLING_PROMTOOL compile
// definition (scripts/setup.sh extracts Debian's into .tools/prometheus).
// Stateless, so thread-safe.
#ifndef STARLING_TESTS_NODE_PROMTOOL_H_
#define STARLING_TESTS_NODE_PROMTOOL_H_

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "tests/core/test_util.h"

namespace starling::testing {

// The promtool path; "" when absent.
inline std::string PromtoolPath() {
#ifdef STARLING_PROMTOOL
  const std::string path = STARLING_PROMTOOL;
  if (!path.empty() && access(path.c_str(), X_OK) == 0) return path;
#endif
  return "";
}

// True when a missing promtool must fail the test instead of skipping it
// (STARLING_REQUIRE_PROMTOOL=1, as .ci/run sets).
inline bool PromtoolRequired() {
  const char* require = std::getenv("STARLING_REQUIRE_PROMTOOL");
  return require != nullptr && std::string(require) == "1";
}

struct PromtoolResult {
  bool ok = false;     // exited 0
  std::string output;  // stdout and stderr; empty when the text is clean
};

// Runs `promtool check metrics` on `text`. NotFound without promtool,
// Internal when it cannot be run.
inline absl::StatusOr<PromtoolResult> PromtoolCheckMetrics(
    const std::string& text) {
  const std::string promtool = PromtoolPath();
  if (promtool.empty()) {
    return absl::NotFoundError(
        "promtool not found: run scripts/setup.sh (extracts Debian's "
        "prometheus package into .tools/prometheus) and re-run cmake");
  }
  const std::string file = absl::StrCat(TempDir(), "/scraped_metrics.txt");
  if (absl::Status s = WriteFileAtomic(file, text); !s.ok()) return s;
  const std::string command =
      absl::StrCat("'", promtool, "' check metrics < '", file, "' 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("cannot run " + command);
  PromtoolResult r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) r.output.append(buf, n);
  const int status = pclose(pipe);
  r.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return r;
}

}  // namespace starling::testing

#endif  // STARLING_TESTS_NODE_PROMTOOL_H_
