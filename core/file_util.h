// Whole-file reads and crash-safe whole-file writes.
// WriteFileAtomic writes a temp file in the same directory, fsyncs it, renames
// it over the target and fsyncs the directory: a crash at any point leaves
// either the old file or the new one, never a torn one.
// Thread-safe (no shared state); concurrent writers to one path race benignly
// (last rename wins).
#ifndef STARLING_CORE_FILE_UTIL_H_
#define STARLING_CORE_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace starling {

// The whole file, read to its end (so also /proc files, whose stat size is
// 0). NotFound if `path` does not exist; InvalidArgument if it is not a
// readable regular file.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// The bytes of `path` from byte `offset` to its end (empty when the file is
// shorter), for following a growing file. NotFound if it does not exist.
absl::StatusOr<std::string> ReadFileFrom(const std::string& path,
                                         int64_t offset);

// Internal on any I/O failure; the target is untouched in that case.
absl::Status WriteFileAtomic(const std::string& path, absl::string_view data);
// The same for the concatenation of `parts`, written one after another
// without being joined in memory.
absl::Status WriteFileAtomic(const std::string& path,
                             absl::Span<const absl::string_view> parts);

// Appends `line` plus '\n' with one write(2) (O_APPEND) and no fsync.
absl::Status AppendLine(const std::string& path, absl::string_view line);

// mkdir -p. Internal on failure.
absl::Status MakeDirs(const std::string& path);

bool FileExists(const std::string& path);

}  // namespace starling

#endif  // STARLING_CORE_FILE_UTIL_H_
