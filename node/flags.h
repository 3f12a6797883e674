// Command-line parsing for the `starling` subcommands on top of absl flags.
// Unlike absl::ParseCommandLine it reports every problem as a Status naming
// the flag (so that main can exit with code 2), accepts only the flags that
// belong to the subcommand, and expands --flagfile.
// Not thread-safe: call once from main before starting threads.
#ifndef STARLING_NODE_FLAGS_H_
#define STARLING_NODE_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace starling {

struct Subcommand {
  std::string name;
  std::string summary;             // one line for `starling --help`
  std::string description;         // paragraph for `starling NAME --help`
  std::vector<std::string> flags;  // flag names this subcommand accepts
};

// Parses args (without the program and subcommand names) into the absl
// flags. Sets *help when --help / -h is present. InvalidArgument naming the
// flag for unknown flags, flags of other subcommands, bad values, missing
// values and unreadable flag files.
absl::Status ParseSubcommandFlags(const Subcommand& sub,
                                  const std::vector<std::string>& args,
                                  bool* help);

// Usage text for one subcommand: description and each flag with its help
// text and default.
std::string SubcommandUsage(const Subcommand& sub);

}  // namespace starling

#endif  // STARLING_NODE_FLAGS_H_
