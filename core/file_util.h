// Whole-file reads (or piece by piece, FileReader) and crash-safe whole-file
// writes.
// WriteFileAtomic writes a temp file in the same directory, fsyncs it, renames
// it over the target and fsyncs the directory: a crash at any point leaves
// either the old file or the new one, never a torn one.
// The free functions are thread-safe (no shared state); concurrent writers to
// one path race benignly (last rename wins). A FileReader is used by one
// thread at a time.
#ifndef STARLING_CORE_FILE_UTIL_H_
#define STARLING_CORE_FILE_UTIL_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace starling {

// The whole file, read to its end (so also /proc files, whose stat size is
// 0). NotFound if `path` does not exist; InvalidArgument if it is not a
// readable regular file.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// A regular file read front to back in pieces the caller sizes, for a file
// too large to hold twice (a checkpoint's sections are read straight into
// their own strings). Move-only; one thread at a time.
class FileReader {
 public:
  // NotFound if `path` does not exist; InvalidArgument if it is not a
  // readable regular file.
  static absl::StatusOr<FileReader> Open(const std::string& path);
  FileReader(FileReader&& other) noexcept;
  FileReader& operator=(FileReader&&) = delete;
  ~FileReader();

  // The file's size when it was opened.
  uint64_t size() const { return size_; }
  // Reads the next `n` bytes into `dst`. InvalidArgument naming the file on
  // a read error or when the file ends first.
  absl::Status Read(void* dst, size_t n);

 private:
  friend absl::StatusOr<std::string> ReadFile(const std::string& path);
  FileReader(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}
  std::string path_;
  int fd_;
  uint64_t size_;
};

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

// mkdir -p, then writes a probe file in `path` the way WriteFileAtomic
// writes (temp file, fsync, rename) and removes it: a directory this
// process cannot write (mode 555 for another user, a read-only mount, /proc)
// is found before any work is done, not at the first checkpoint. Internal
// naming the path and the system's reason on failure.
absl::Status CheckDirWritable(const std::string& path);

bool FileExists(const std::string& path);

}  // namespace starling

#endif  // STARLING_CORE_FILE_UTIL_H_
