// Waiting on conditions in tests: a predicate (a file's text, an event, a
// process's state) polled until it holds or a deadline passes. The deadline
// only keeps a hung test from hanging the suite; callers fail with a message
// that says what did not happen, never assert on how long it took.
// Header-only, so that unit tests use it without the process harness.
// Stateless, so thread-safe.
#ifndef STARLING_TESTS_HARNESS_WAIT_H_
#define STARLING_TESTS_HARNESS_WAIT_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/file_util.h"

namespace starling::testing {

// Polls `condition` every `every` until it returns true (then true) or
// `timeout` has passed (then false, after one last try).
inline bool WaitFor(const std::function<bool()>& condition,
                    absl::Duration timeout,
                    absl::Duration every = absl::Milliseconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(every);
  }
  return condition();
}

// Waits until the file at `path` contains `needle`.
inline bool WaitForText(const std::string& path, const std::string& needle,
                        absl::Duration timeout) {
  return WaitFor(
      [&] {
        absl::StatusOr<std::string> text = ReadFile(path);
        return text.ok() && text->find(needle) != std::string::npos;
      },
      timeout);
}

}  // namespace starling::testing

#endif  // STARLING_TESTS_HARNESS_WAIT_H_
