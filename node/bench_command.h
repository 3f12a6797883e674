// `starling bench allreduce`: Starling's ring all-reduce (gossip/
// ring_allreduce.h over gRPC on loopback, raw fp32 and with codecs) against
// PyTorch's Gloo all-reduce (c10d::ProcessGroupGloo), measured in the same
// worker processes on the same buffers, sizes and loopback. Every result is
// checked against the exact sum. Writes DIR/allreduce.json and
// DIR/allreduce.md.
// Call from the main thread only: the parent forks and execs one worker
// process per rank (this binary again) and waits for them.
#ifndef STARLING_NODE_BENCH_COMMAND_H_
#define STARLING_NODE_BENCH_COMMAND_H_

#include "node/flags.h"

namespace starling {

const Subcommand& BenchSubcommand();

// Runs `starling bench allreduce` with the already-parsed flags (as the
// parent, or as a worker when the parent started this process). Returns the
// exit code: 0 ok, 2 bad flags, 1 runtime failure (including a wrong sum).
int RunBenchCommand();

}  // namespace starling

#endif  // STARLING_NODE_BENCH_COMMAND_H_
