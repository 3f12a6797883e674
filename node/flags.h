// Command-line parsing for the `starling` subcommands on top of absl flags.
// Unlike absl::ParseCommandLine it reports every problem as a Status naming
// the flag (so that main can exit with code 2), accepts only the flags that
// belong to the subcommand, and expands --flagfile. Also writes each
// subcommand's --help, its flags grouped by node/flag_sections.h.
// Not thread-safe: call once from main before starting threads.
#ifndef STARLING_NODE_FLAGS_H_
#define STARLING_NODE_FLAGS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace starling {

struct Subcommand {
  std::string name;
  std::string summary;             // one line for `starling --help`
  std::string description;         // paragraph for `starling NAME --help`
  std::vector<std::string> flags;  // flag names this subcommand accepts
  // A word that must follow the name, e.g. "allreduce" in `starling bench
  // allreduce`; empty for none.
  std::string operand;
  // Defaults of shared flags that differ for this subcommand (flag name to
  // value): set before the arguments are parsed and shown in its usage.
  std::map<std::string, std::string> defaults;
  // Help texts of shared flags that read differently for this subcommand.
  std::map<std::string, std::string> help;
};

// What the arguments ask of help: --help and -h list the flags a user needs,
// --helpfull also the test-only ones (see node/flag_sections.h).
enum class HelpRequest { kNone, kHelp, kHelpFull };

// Parses args (without the program and subcommand names) into the absl
// flags. Sets *help to kHelp when --help or -h is present, to kHelpFull
// when --helpfull is (it wins). InvalidArgument naming the flag for unknown
// flags, flags of other subcommands, bad values, missing
// values and unreadable flag files. A subcommand with an operand expects it
// first in args and consumes it.
absl::Status ParseSubcommandFlags(const Subcommand& sub,
                                  const std::vector<std::string>& args,
                                  HelpRequest* help);

// Whether the arguments ParseSubcommandFlags parsed (a --flagfile's
// included) set flag `name`, as opposed to its default or the
// subcommand's: for a default that a flag's other settings may turn off
// but an explicit value may not (--tls_bind_node_ids).
bool FlagGiven(absl::string_view name);

// Usage text for one subcommand: its description (which ends with an
// example), then its flags with their help texts and defaults, grouped in
// the sections of node/flag_sections.h. kHelpFull adds the hidden sections.
std::string SubcommandUsage(const Subcommand& sub,
                            HelpRequest help = HelpRequest::kHelp);

}  // namespace starling

#endif  // STARLING_NODE_FLAGS_H_
