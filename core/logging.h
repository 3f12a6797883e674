// A small leveled logger to stderr (Abseil 20220623 has none), in text or
// JSON lines (--log_format). Every line carries the node's context (node id,
// round, step) once the node runtime sets it; events may add a peer and
// other fields.
//   STARLING_LOG(INFO) << "step " << step;
//   LogEvent(LogLevel::kInfo, "member", "n2 is dead", {{"peer", "n2"}});
// Thread-safe: each line is written with one locked write; the context is
// held in atomics and a mutex-guarded string.
#ifndef STARLING_CORE_LOGGING_H_
#define STARLING_CORE_LOGGING_H_

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace starling {

enum class LogLevel { kInfo = 0, kWarning = 1, kError = 2 };
enum class LogFormat { kText = 0, kJson = 1 };

// Messages below this level are dropped. Default kInfo.
void SetMinLogLevel(LogLevel level);

// text (default): human lines. json: one JSON object per line with time,
// level, node, round, step, event, msg and the event's fields.
void SetLogFormat(LogFormat format);
LogFormat GetLogFormat();
// Parses "text" or "json"; InvalidArgument naming --log_format otherwise.
absl::Status ParseLogFormat(absl::string_view text, LogFormat* format);

// The context every line carries. Empty node: none is printed.
void SetLogNode(const std::string& node);
void SetLogPosition(int64_t round, int64_t step);

// Extra key/value fields of an event ("peer" names the other node).
using LogFields = std::vector<std::pair<std::string, std::string>>;

// One event line. Text: "<level> <time> node=N round=R step=S [peer=P]
// <message>"; JSON: {"time","level","node","round","step","event","msg",
// k: v...}. Text lines (these and STARLING_LOG's) escape the message's
// control characters (\n, \r, \t, \xNN): a message that carries a peer's
// words stays one line.
void LogEvent(LogLevel level, absl::string_view event,
              absl::string_view message, const LogFields& fields = {});

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;

  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::string source_;
  std::ostringstream stream_;
};

// `text` (a peer's string, say) quoted for a log line or an error message:
// C-escaped and cut to `max_bytes`, so that it cannot forge log lines or
// flood them. "abc" -> "\"abc\""; longer -> "\"abc...\"... (N bytes)".
std::string QuoteForLog(absl::string_view text, size_t max_bytes = 64);

// Decimal units with one decimal: "512 B", "12.3 MB", "30.5 GB".
std::string FormatBytes(double bytes);

// Writes one progress or status line to stderr under the logger's lock, so
// that lines never interleave. Text: the line as it is; JSON: wrapped as an
// info event "progress" with the context.
void WriteStderrLine(const std::string& line);

}  // namespace starling

#define STARLING_LOG_LEVEL_INFO ::starling::LogLevel::kInfo
#define STARLING_LOG_LEVEL_WARNING ::starling::LogLevel::kWarning
#define STARLING_LOG_LEVEL_ERROR ::starling::LogLevel::kError
#define STARLING_LOG(level)                                              \
  ::starling::LogMessage(STARLING_LOG_LEVEL_##level, __FILE__, __LINE__) \
      .stream()

#endif  // STARLING_CORE_LOGGING_H_
