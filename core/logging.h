// A minimal leveled logger to stderr (Abseil 20220623 has none).
// Thread-safe: each message is written with one locked write.
//   STARLING_LOG(INFO) << "step " << step;
#ifndef STARLING_CORE_LOGGING_H_
#define STARLING_CORE_LOGGING_H_

#include <sstream>

namespace starling {

enum class LogLevel { kInfo = 0, kWarning = 1, kError = 2 };

// Messages below this level are dropped. Default kInfo.
void SetMinLogLevel(LogLevel level);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;

  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Writes one already-formatted line to stderr under the logger's lock, so that
// progress lines and log messages never interleave mid-line.
void WriteStderrLine(const std::string& line);

}  // namespace starling

#define STARLING_LOG_LEVEL_INFO ::starling::LogLevel::kInfo
#define STARLING_LOG_LEVEL_WARNING ::starling::LogLevel::kWarning
#define STARLING_LOG_LEVEL_ERROR ::starling::LogLevel::kError
#define STARLING_LOG(level)                                              \
  ::starling::LogMessage(STARLING_LOG_LEVEL_##level, __FILE__, __LINE__) \
      .stream()

#endif  // STARLING_CORE_LOGGING_H_
