#include "core/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/json.h"

namespace starling {
namespace {

std::atomic<int> min_level{0};
std::atomic<int> log_format{0};
std::atomic<int64_t> log_round{-1};
std::atomic<int64_t> log_step{-1};

absl::Mutex& StderrMutex() {
  static absl::Mutex* mu = new absl::Mutex();
  return *mu;
}

absl::Mutex& NodeMutex() {
  static absl::Mutex* mu = new absl::Mutex();
  return *mu;
}

std::string& LogNode() {
  static std::string* node = new std::string();
  return *node;
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

const char* LevelWord(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "?";
}

// `text` with its control characters escaped (\n, \r, \t, \xNN), so that
// a message carrying a peer's words (an error a peer sent back, a reason it
// gave) stays one line and cannot forge the lines after it. UTF-8 passes.
std::string OneLine(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c != 0x7f) {
      out.push_back(ch);
    } else if (c == '\n') {
      out.append("\\n");
    } else if (c == '\r') {
      out.append("\\r");
    } else if (c == '\t') {
      out.append("\\t");
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    }
  }
  return out;
}

void WriteRaw(const std::string& line) {
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

std::string Node() {
  absl::MutexLock lock(&NodeMutex());
  return LogNode();
}

// " node=N round=R step=S" for text lines; empty without a node.
std::string TextContext() {
  std::string node = Node();
  if (node.empty()) return "";
  std::string out = absl::StrCat(" node=", node);
  if (int64_t r = log_round.load(); r >= 0) absl::StrAppend(&out, " round=", r);
  if (int64_t s = log_step.load(); s >= 0) absl::StrAppend(&out, " step=", s);
  return out;
}

std::string JsonLine(LogLevel level, absl::string_view event,
                     absl::string_view message, const LogFields& fields,
                     absl::string_view source) {
  std::string out = absl::StrCat(
      "{\"time\":",
      JsonQuote(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(),
                                 absl::UTCTimeZone())),
      ",\"level\":\"", LevelWord(level), "\"");
  if (std::string node = Node(); !node.empty()) {
    absl::StrAppend(&out, ",\"node\":", JsonQuote(node));
  }
  if (int64_t r = log_round.load(); r >= 0) {
    absl::StrAppend(&out, ",\"round\":", r);
  }
  if (int64_t s = log_step.load(); s >= 0) {
    absl::StrAppend(&out, ",\"step\":", s);
  }
  absl::StrAppend(&out, ",\"event\":", JsonQuote(event));
  for (const auto& [k, v] : fields) {
    absl::StrAppend(&out, ",", JsonQuote(k), ":", JsonQuote(v));
  }
  if (!source.empty()) absl::StrAppend(&out, ",\"source\":", JsonQuote(source));
  absl::StrAppend(&out, ",\"msg\":", JsonQuote(message), "}");
  return out;
}

std::string TextTime() {
  return absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::LocalTimeZone());
}

}  // namespace

void SetMinLogLevel(LogLevel level) {
  min_level.store(static_cast<int>(level));
}

void SetLogFormat(LogFormat format) {
  log_format.store(static_cast<int>(format));
}

LogFormat GetLogFormat() { return static_cast<LogFormat>(log_format.load()); }

absl::Status ParseLogFormat(absl::string_view text, LogFormat* format) {
  if (text == "text") {
    *format = LogFormat::kText;
  } else if (text == "json") {
    *format = LogFormat::kJson;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_format=", text, ": expected text or json"));
  }
  return absl::OkStatus();
}

void SetLogNode(const std::string& node) {
  absl::MutexLock lock(&NodeMutex());
  LogNode() = node;
}

void SetLogPosition(int64_t round, int64_t step) {
  log_round.store(round);
  log_step.store(step);
}

void LogEvent(LogLevel level, absl::string_view event,
              absl::string_view message, const LogFields& fields) {
  if (static_cast<int>(level) < min_level.load()) return;
  if (GetLogFormat() == LogFormat::kJson) {
    WriteRaw(JsonLine(level, event, message, fields, ""));
    return;
  }
  std::string line =
      absl::StrCat(LevelName(level), " ", TextTime(), TextContext());
  // Text lines carry the peer; the other fields are in the message.
  for (const auto& [k, v] : fields) {
    if (k == "peer") absl::StrAppend(&line, " ", k, "=", v);
  }
  absl::StrAppend(&line, " ", OneLine(message));
  WriteRaw(line);
}

void WriteStderrLine(const std::string& line) {
  if (GetLogFormat() == LogFormat::kJson) {
    std::string msg = line;
    while (!msg.empty() && msg.back() == '\n') msg.pop_back();
    WriteRaw(JsonLine(LogLevel::kInfo, "progress", msg, {}, ""));
    return;
  }
  WriteRaw(line);
}

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level) {
  const char* base = std::strrchr(file, '/');
  source_ = absl::StrCat(base ? base + 1 : file, ":", line);
}

LogMessage::~LogMessage() {
  if (static_cast<int>(level_) < min_level.load()) return;
  if (GetLogFormat() == LogFormat::kJson) {
    WriteRaw(JsonLine(level_, "log", stream_.str(), {}, source_));
    return;
  }
  WriteRaw(absl::StrCat(LevelName(level_), " ", TextTime(), " ", source_, "]",
                        TextContext(), " ", OneLine(stream_.str())));
}

std::string QuoteForLog(absl::string_view text, size_t max_bytes) {
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, max_bytes)),
                      text.size() > max_bytes
                          ? absl::StrCat("\"... (", text.size(), " bytes)")
                          : "\"");
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f %s", bytes, units[u])
                : absl::StrFormat("%.1f %s", bytes, units[u]);
}

}  // namespace starling
