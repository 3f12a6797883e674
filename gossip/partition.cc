#include "gossip/partition.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/file_util.h"
#include "core/logging.h"

namespace starling {

std::map<std::string, int> ParsePartition(absl::string_view line) {
  std::map<std::string, int> groups;
  int g = 0;
  for (absl::string_view group : absl::StrSplit(line, '|', absl::SkipEmpty())) {
    for (absl::string_view id : absl::StrSplit(group, ',', absl::SkipEmpty())) {
      groups[std::string(absl::StripAsciiWhitespace(id))] = g;
    }
    ++g;
  }
  return groups;
}

void Partition::Reload() {
  if (file_.empty()) return;
  absl::StatusOr<std::string> text = ReadFile(file_);
  std::string line = text.ok() ? std::string(absl::StripAsciiWhitespace(
                                     text->substr(0, text->find('\n'))))
                               : "";
  {
    absl::MutexLock lock(&mu_);
    if (line == line_) return;
    line_ = line;
    groups_ = ParsePartition(line);
  }
  STARLING_LOG(INFO) << (line.empty() ? "network partition healed"
                                      : "network partition: " + line);
}

bool Partition::active() const {
  absl::MutexLock lock(&mu_);
  return !groups_.empty();
}

bool Partition::Separates(const std::string& a, const std::string& b) const {
  absl::MutexLock lock(&mu_);
  auto mine = groups_.find(a);
  auto theirs = groups_.find(b);
  return mine != groups_.end() && theirs != groups_.end() &&
         mine->second != theirs->second;
}

}  // namespace starling
