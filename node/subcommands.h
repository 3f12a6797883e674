// Every `starling` subcommand with the function that runs it: the one list
// that main dispatches on and that tests walk (e.g. to check that every flag
// of every subcommand has a help section).
// The list is built once, on first use, and immutable after: thread-safe.
#ifndef STARLING_NODE_SUBCOMMANDS_H_
#define STARLING_NODE_SUBCOMMANDS_H_

#include <vector>

#include "node/flags.h"

namespace starling {

struct SubcommandEntry {
  const Subcommand& sub;
  int (*run)();  // after ParseSubcommandFlags; returns the exit code
};

// In the order `starling --help` lists them.
const std::vector<SubcommandEntry>& Subcommands();

}  // namespace starling

#endif  // STARLING_NODE_SUBCOMMANDS_H_
