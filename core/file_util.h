// Whole-file reads (or piece by piece, FileReader) and crash-safe whole-file
// writes (at once, WriteFileAtomic, or piece by piece, AtomicFileWriter).
// A crash-safe write goes to a temp file in the same directory, which is
// fsynced, renamed over the target, and the directory fsynced: a crash at
// any point leaves either the old file or the new one, never a torn one.
// The free functions are thread-safe (no shared state); concurrent writers to
// one path race benignly (last rename wins). A FileReader or an
// AtomicFileWriter is used by one thread at a time (FileReader::ReadAt, which
// keeps no position, by several).
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
  // Reads `n` bytes from byte `offset` into `dst`, leaving Read's position
  // where it was. Errors as Read's.
  absl::Status ReadAt(uint64_t offset, void* dst, size_t n) const;

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

// A file written front to back under a temporary name and renamed over its
// path by Commit, with WriteFileAtomic's guarantees. Destroyed without a
// successful Commit, it removes the temporary file and leaves the path as it
// was. It starts the kernel's writeback as it goes, so that Commit's fsync
// has little left to wait for. Move-only.
class AtomicFileWriter {
 public:
  // Internal when the temporary file cannot be created.
  static absl::StatusOr<AtomicFileWriter> Create(const std::string& path);
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&&) = delete;
  ~AtomicFileWriter();

  // Appends `n` bytes, written before it returns. Internal on I/O failure.
  absl::Status Write(const void* data, size_t n);
  // fsync, rename over the path, fsync of the directory. Internal on
  // failure, the path then untouched. Once only.
  absl::Status Commit();

 private:
  AtomicFileWriter(std::string path, std::string tmp, int fd)
      : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}
  std::string path_;
  std::string tmp_;
  int fd_;                       // -1 once closed
  uint64_t written_ = 0;         // bytes so far
  uint64_t writeback_from_ = 0;  // the first byte whose writeback is not due
};

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
