// Checkpoint files: named binary sections with a checksum, written atomically
// (temp file, fsync, rename). A crash mid-write leaves the previous checkpoint
// readable. Modules add their own sections (trainer state, model, optimizer,
// and later outer-optimizer state and error-feedback residuals).
// Free functions, no shared state: thread-safe for distinct paths.
#ifndef STARLING_CORE_CHECKPOINT_H_
#define STARLING_CORE_CHECKPOINT_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace starling {

struct Checkpoint {
  std::map<std::string, std::string> sections;
};

// Internal on I/O failure (the previous file at `path` is then untouched).
absl::Status WriteCheckpoint(const std::string& path, const Checkpoint& ckpt);

// NotFound when `path` does not exist; DataLoss naming the file when it is
// truncated, corrupt or not a Starling checkpoint.
absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path);

// The checkpoint file inside a run directory.
std::string CheckpointPathInRunDir(const std::string& run_dir);

}  // namespace starling

#endif  // STARLING_CORE_CHECKPOINT_H_
