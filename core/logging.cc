#include "core/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace starling {
namespace {

std::atomic<int> min_level{0};

absl::Mutex& StderrMutex() {
  static absl::Mutex* mu = new absl::Mutex();
  return *mu;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "I";
    case LogLevel::kWarning:
      return "W";
    case LogLevel::kError:
      return "E";
  }
  return "?";
}

}  // namespace

void SetMinLogLevel(LogLevel level) {
  min_level.store(static_cast<int>(level));
}

void WriteStderrLine(const std::string& line) {
  absl::MutexLock lock(&StderrMutex());
  std::string out = line;
  if (out.empty() || out.back() != '\n') out.push_back('\n');
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::write(STDERR_FILENO, out.data() + done, out.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
}

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level) {
  const char* base = std::strrchr(file, '/');
  stream_ << LevelName(level) << " "
          << absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::LocalTimeZone())
          << " " << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  if (static_cast<int>(level_) < min_level.load()) return;
  WriteStderrLine(stream_.str());
}

}  // namespace starling
