// The flags of `starling node` (defined in node_flags.cc; `starling sim`
// passes them through to its nodes, see NodeFlagNames in node_command.h)
// and the NodeConfig (node_run.h) they make. Not thread-safe: read the
// flags from the main thread, after parsing.
#ifndef STARLING_NODE_NODE_FLAGS_H_
#define STARLING_NODE_NODE_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "node/node_run.h"

// Read where they are used: the operational flags by StartOps
// (node_ops.h), the others by RunNodeCommand.
ABSL_DECLARE_FLAG(std::string, listen);
ABSL_DECLARE_FLAG(int, health_port);
ABSL_DECLARE_FLAG(int, metrics_port);
ABSL_DECLARE_FLAG(std::string, log_format);
ABSL_DECLARE_FLAG(bool, resume_if_exists);
ABSL_DECLARE_FLAG(double, watchdog_multiple);
ABSL_DECLARE_FLAG(double, watchdog_min_seconds);
ABSL_DECLARE_FLAG(std::string, test_stall);

namespace starling {

// Reads the node flags that need no model, data, file or peer into
// `config` and checks them: InvalidArgument naming the flag. Leaves out
// the train config, --test_poison, the link flags and the credentials
// (`starling sim` sets some of them per node); NodeConfigFromFlags reads
// those too.
absl::Status ParseNodeFlags(NodeConfig* config);

// Everything: the train config (resolved), ParseNodeFlags, --test_poison,
// the link flags and the peer credentials. InvalidArgument naming the flag.
absl::StatusOr<NodeConfig> NodeConfigFromFlags();

}  // namespace starling

#endif  // STARLING_NODE_NODE_FLAGS_H_
