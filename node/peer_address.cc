#include "node/peer_address.h"

#include <fstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace starling {

bool ValidHostPort(absl::string_view a) {
  size_t colon = a.rfind(':');
  int port = 0;
  return colon != absl::string_view::npos && colon > 0 &&
         absl::SimpleAtoi(a.substr(colon + 1), &port) && port >= 0 &&
         port < 65536;
}

int PortOf(absl::string_view a) {
  const size_t colon = a.rfind(':');
  int port = -1;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(a.substr(colon + 1), &port)) {
    return -1;
  }
  return port;
}

absl::StatusOr<std::map<std::string, std::string>> ReadHosts(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hosts=", path, ": cannot read it"));
  }
  std::map<std::string, std::string> names;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    line = line.substr(0, line.find('#'));
    std::vector<std::string> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.empty()) continue;
    if (words.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--hosts=", path, ":", n, ": expected ADDRESS NAME..."));
    }
    for (size_t i = 1; i < words.size(); ++i) names[words[i]] = words[0];
  }
  return names;
}

}  // namespace starling
