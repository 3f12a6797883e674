// The sections that `starling SUBCOMMAND --help` groups its flags into, and
// the one table that places every flag of every subcommand in a section.
// The files that define the flags stay unaware of it: help looks a flag up
// here by name, and tests/node/cli_test.cc fails when a subcommand accepts a
// flag the table lacks, so a new flag must be placed here.
// Everything here is immutable static data: thread-safe.
#ifndef STARLING_NODE_FLAG_SECTIONS_H_
#define STARLING_NODE_FLAG_SECTIONS_H_

#include <optional>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace starling {

// In the order help lists them: what is trained first, how it runs last.
enum class FlagSection {
  kModelAndData,
  kTraining,
  kSwarm,
  kCompression,
  kSecurity,
  kOperations,
  // Fault injection for Starling's own tests: accepted, but listed only by
  // --helpfull.
  kTestOnly,
};

struct FlagSectionInfo {
  FlagSection section;
  absl::string_view heading;  // one line, e.g. "Swarm flags: peers, ..."
  bool hidden;                // listed only by --helpfull
};

// Every section, in help order.
absl::Span<const FlagSectionInfo> FlagSections();

struct PlacedFlag {
  absl::string_view name;  // without the leading --
  FlagSection section;
};

// Every flag of every subcommand, in the order help lists them within a
// section.
absl::Span<const PlacedFlag> FlagTable();

// The section of flag `name`; nullopt when the table lacks it.
std::optional<FlagSection> SectionOfFlag(absl::string_view name);

}  // namespace starling

#endif  // STARLING_NODE_FLAG_SECTIONS_H_
