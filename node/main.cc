// The `starling` binary: dispatches to its subcommands.
#include <malloc.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/codec.h"
#include "core/logging.h"
#include "node/flags.h"
#include "node/subcommands.h"

namespace {

constexpr char kUsage[] =
    "Starling: a low-communication decentralized trainer.\n\n"
    "usage: starling SUBCOMMAND [--flag=value ...]\n\n"
    "subcommands:\n";

std::string TopUsage() {
  std::string out = kUsage;
  for (const starling::SubcommandEntry& e : starling::Subcommands()) {
    absl::StrAppend(&out,
                    absl::StrFormat("  %-8s %s\n", e.sub.name, e.sub.summary));
  }
  absl::StrAppend(&out, "\n", starling::CompressionSpecHelp(), "\n");
  absl::StrAppend(&out,
                  "\n`starling SUBCOMMAND --help` lists a subcommand's flags.\n"
                  "Exit codes: 0 ok, 2 bad flags/config/input, 1 runtime "
                  "failure, 3 a node (node, sim) ended apart from its swarm "
                  "(its model is not the swarm's).\n");
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // Collective messages and gRPC's read buffers are large and short-lived.
  // By default glibc maps every block of a few MiB fresh and unmaps it on
  // free, so each message faults its pages in again: half of an
  // all-reduce's time on loopback. Serve blocks up to 32 MiB (glibc's
  // maximum) from the heap and keep up to 512 MiB of freed heap for reuse.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" ||
      args[0] == "help") {
    std::fputs(TopUsage().c_str(), stdout);
    return args.empty() ? 2 : 0;
  }
  for (const starling::SubcommandEntry& e : starling::Subcommands()) {
    if (args[0] != e.sub.name) continue;
    starling::HelpRequest help = starling::HelpRequest::kNone;
    absl::Status s = starling::ParseSubcommandFlags(
        e.sub, std::vector<std::string>(args.begin() + 1, args.end()), &help);
    if (help != starling::HelpRequest::kNone) {
      std::fputs(starling::SubcommandUsage(e.sub, help).c_str(), stdout);
      return 0;
    }
    if (!s.ok()) {
      starling::WriteStderrLine(
          absl::StrCat("starling ", e.sub.name, ": error: ", s.message()));
      return 2;
    }
    return e.run();
  }
  starling::WriteStderrLine(absl::StrCat("starling: unknown subcommand '",
                                         args[0], "'\n\n", TopUsage()));
  return 2;
}
