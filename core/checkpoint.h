// Checkpoint files: named binary sections with a checksum, written atomically
// (temp file, fsync, rename). A crash mid-write leaves the previous checkpoint
// readable. Modules add their own sections (trainer state, model, optimizer,
// outer-optimizer state, error-feedback residuals).
//
// Sections are streamed both ways, so that no model-sized section needs to
// be held whole in memory besides where it lives: a CheckpointSection is
// either bytes held (small ones) or a producer that writes its announced
// number of bytes into a ByteSink when the file is written (a tensor's bytes
// from its own memory); the file is hashed as it is written. A
// CheckpointReader verifies a file once, keeping its small sections, and
// then reads any section through a SectionReader straight into its
// destination. Checkpoint, WriteCheckpoint and ReadCheckpoint are the same
// files held as strings, for callers whose sections are small.
//
// The file's bytes are the same whichever API wrote them. Little-endian
// hosts only.
// Free functions, no shared state: thread-safe for distinct paths. A
// CheckpointReader and its SectionReaders are used by one thread at a time.
#ifndef STARLING_CORE_CHECKPOINT_H_
#define STARLING_CORE_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/byte_stream.h"

namespace starling {

class FileReader;

struct Checkpoint {
  std::map<std::string, std::string> sections;
};

// One section as it is written: bytes it holds, bytes the caller holds
// (View), or a producer of a size known in advance.
class CheckpointSection {
 public:
  // Writes the section's bytes into the sink, exactly size() of them, in
  // order. Its error fails the write.
  using Producer = std::function<absl::Status(ByteSink& sink)>;

  // Bytes the section holds. Implicit, so that small sections read as
  // {"round", "12"}.
  CheckpointSection(std::string bytes);  // NOLINT(runtime/explicit)
  CheckpointSection(const char* bytes);  // NOLINT(runtime/explicit)
  // `size` bytes from `produce`, called when the file is written.
  CheckpointSection(uint64_t size, Producer produce);
  // The caller's bytes, which must outlive the write.
  static CheckpointSection View(absl::string_view bytes);

  uint64_t size() const { return size_; }
  // Writes the section into `sink` (once or more).
  absl::Status WriteTo(ByteSink& sink) const;

 private:
  uint64_t size_;
  std::string bytes_;       // held bytes
  absl::string_view view_;  // View's bytes
  bool is_view_ = false;
  Producer produce_;  // set for a produced section
};

using CheckpointSections = std::map<std::string, CheckpointSection>;

// Writes `sections` (in name order) through a bounded buffer, hashing as it
// goes: no section is copied whole. Internal on I/O failure or when a
// producer writes other than its announced size; a producer's own error as
// it is. The previous file at `path` is then untouched.
absl::Status WriteCheckpoint(const std::string& path,
                             const CheckpointSections& sections);
// The same file for sections held as strings, written from where they are.
absl::Status WriteCheckpoint(const std::string& path, const Checkpoint& ckpt);

// NotFound when `path` does not exist; DataLoss naming the file when it is
// truncated, corrupt or not a Starling checkpoint. Reads the file once,
// every section into its string.
absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path);

// One section of a verified checkpoint, read front to back in pieces the
// caller sizes (from the file, or from memory when the reader kept it).
// Valid while the CheckpointReader that made it lives.
class SectionReader : public ByteSource {
 public:
  uint64_t remaining() const override { return end_ - pos_; }
  // DataLoss naming the file and section when fewer bytes remain;
  // InvalidArgument naming the file on a read error.
  absl::Status Read(void* dst, size_t size) override;
  absl::Status Skip(uint64_t size) override;

 private:
  friend class CheckpointReader;
  SectionReader(const FileReader* file, const std::string* kept,
                std::string what, uint64_t begin, uint64_t end)
      : file_(file),
        kept_(kept),
        what_(std::move(what)),
        pos_(begin),
        end_(end) {}
  absl::Status PastTheEnd(uint64_t size) const;
  const FileReader* file_;   // reads at file offsets [pos_, end_)
  const std::string* kept_;  // or, when not null, this string's bytes
  std::string what_;         // "checkpoint PATH section NAME"
  uint64_t pos_;
  uint64_t end_;
};

// A checkpoint file opened and verified once (its framing and checksum,
// reading it front to back through a bounded buffer). Its sections are then
// read in any order and as often as wanted, from the same open file: a
// checkpoint is replaced by renaming a new file over it, never changed in
// place, so what was verified is what is read. Move-only.
class CheckpointReader {
 public:
  // Sections up to this size are kept in memory by Open.
  static constexpr uint64_t kKeepBytes = 1 << 20;

  // Errors as ReadCheckpoint's. Keeps the sections of at most `keep_bytes`
  // bytes as it verifies them, so they are not read twice.
  static absl::StatusOr<CheckpointReader> Open(
      const std::string& path, uint64_t keep_bytes = kKeepBytes);
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;
  ~CheckpointReader();

  const std::string& path() const { return path_; }
  // Section names, sorted.
  std::vector<std::string> Names() const;
  bool Has(absl::string_view name) const;
  // The section's size; NotFound naming the file and section if absent.
  absl::StatusOr<uint64_t> Size(absl::string_view name) const;
  // The whole section; NotFound if absent, a read error naming the file.
  absl::StatusOr<std::string> ReadString(absl::string_view name) const;
  // A reader over the section; NotFound if absent.
  absl::StatusOr<SectionReader> Section(absl::string_view name) const;

 private:
  struct Entry {
    uint64_t offset = 0;  // of its first byte in the file
    uint64_t size = 0;
    bool kept = false;
    std::string bytes;  // when kept
  };
  CheckpointReader(std::string path, std::unique_ptr<FileReader> file);
  absl::StatusOr<const Entry*> Find(absl::string_view name) const;
  friend absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path);

  std::string path_;
  std::unique_ptr<FileReader> file_;
  std::map<std::string, Entry, std::less<>> sections_;
};

// The checkpoint file inside a run directory.
std::string CheckpointPathInRunDir(const std::string& run_dir);

}  // namespace starling

#endif  // STARLING_CORE_CHECKPOINT_H_
