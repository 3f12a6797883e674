#include "core/torch_error.h"

#include <c10/util/Exception.h>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace starling {

std::string TorchErrorMessage(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) {
    std::string msg = c10->what_without_backtrace();
    return msg.substr(0, msg.find('\n'));
  }
  // TorchScript errors end with the Python-level error after a traceback.
  std::string last;
  for (absl::string_view line : absl::StrSplit(e.what(), '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty() && line != "\"") last = std::string(line);
  }
  return last.empty() ? std::string(e.what()) : last;
}

}  // namespace starling
