#include "core/checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/status.h"

namespace starling {
namespace {

// Layout (little-endian):
//   "STARCKPT" u32 version u32 n_sections
//   n x { u32 name_len, name, u64 size, bytes }   (by name)
//   u64 HashBytes(everything above)
constexpr char kMagic[8] = {'S', 'T', 'A', 'R', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = sizeof(kMagic) + 8;

// The bounded buffers of both directions. Pieces this small stay in the
// cache between being hashed and being written or used.
constexpr size_t kPieceBytes = 256 << 10;

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// The file being written: every byte is hashed as it goes by; small writes
// gather in a buffer, larger ones go to the file from where they are, a
// piece at a time, each hashed just before it is written.
class FileSink : public ByteSink {
 public:
  FileSink(AtomicFileWriter* file, uint64_t total)
      : file_(file), hasher_(total) {
    buffer_.reserve(kPieceBytes);
  }
  using ByteSink::Write;
  absl::Status Write(const void* data, size_t size) override {
    written_ += size;
    const char* p = static_cast<const char*>(data);
    if (buffer_.size() + size <= kPieceBytes) {
      hasher_.Update(p, size);
      buffer_.append(p, size);
      return absl::OkStatus();
    }
    STARLING_RETURN_IF_ERROR(Flush());
    while (size > 0) {
      const size_t n = std::min(size, kPieceBytes);
      hasher_.Update(p, n);
      STARLING_RETURN_IF_ERROR(file_->Write(p, n));
      p += n;
      size -= n;
    }
    return absl::OkStatus();
  }
  absl::Status Flush() {
    if (buffer_.empty()) return absl::OkStatus();
    absl::Status s = file_->Write(buffer_.data(), buffer_.size());
    buffer_.clear();
    return s;
  }
  uint64_t written() const { return written_; }
  uint64_t Finish() { return hasher_.Finish(); }

 private:
  AtomicFileWriter* file_;
  BytesHasher hasher_;
  std::string buffer_;
  uint64_t written_ = 0;
};

}  // namespace

std::string CheckpointPathInRunDir(const std::string& run_dir) {
  return absl::StrCat(run_dir, "/checkpoint.ckpt");
}

CheckpointSection::CheckpointSection(std::string bytes)
    : size_(bytes.size()), bytes_(std::move(bytes)) {}

CheckpointSection::CheckpointSection(const char* bytes)
    : CheckpointSection(std::string(bytes)) {}

CheckpointSection::CheckpointSection(uint64_t size, Producer produce)
    : size_(size), produce_(std::move(produce)) {}

CheckpointSection CheckpointSection::View(absl::string_view bytes) {
  CheckpointSection s{std::string()};
  s.size_ = bytes.size();
  s.view_ = bytes;
  s.is_view_ = true;
  return s;
}

absl::Status CheckpointSection::WriteTo(ByteSink& sink) const {
  if (produce_) return produce_(sink);
  return sink.Write(is_view_ ? view_ : absl::string_view(bytes_));
}

absl::Status WriteCheckpoint(const std::string& path,
                             const CheckpointSections& sections) {
  uint64_t total = kHeaderBytes;
  for (const auto& [name, section] : sections) {
    total += 4 + name.size() + 8 + section.size();
  }
  STARLING_ASSIGN_OR_RETURN(AtomicFileWriter file,
                            AtomicFileWriter::Create(path));
  FileSink sink(&file, total);
  std::string head(kMagic, sizeof(kMagic));
  Put<uint32_t>(&head, kVersion);
  Put<uint32_t>(&head, static_cast<uint32_t>(sections.size()));
  STARLING_RETURN_IF_ERROR(sink.Write(head));
  for (const auto& [name, section] : sections) {
    head.clear();
    Put<uint32_t>(&head, static_cast<uint32_t>(name.size()));
    head += name;
    Put<uint64_t>(&head, section.size());
    STARLING_RETURN_IF_ERROR(sink.Write(head));
    const uint64_t start = sink.written();
    STARLING_RETURN_IF_ERROR(section.WriteTo(sink));
    if (sink.written() - start != section.size()) {
      return absl::InternalError(
          absl::StrCat("checkpoint ", path, ": section ", name, " wrote ",
                       sink.written() - start, " bytes, not the ",
                       section.size(), " it announced"));
    }
  }
  head.clear();
  Put<uint64_t>(&head, sink.Finish());
  STARLING_RETURN_IF_ERROR(sink.Write(head));
  STARLING_RETURN_IF_ERROR(sink.Flush());
  return file.Commit();
}

absl::Status WriteCheckpoint(const std::string& path, const Checkpoint& ckpt) {
  CheckpointSections sections;
  for (const auto& [name, bytes] : ckpt.sections) {
    sections.emplace(name, CheckpointSection::View(bytes));
  }
  return WriteCheckpoint(path, sections);
}

absl::Status SectionReader::PastTheEnd(uint64_t size) const {
  return absl::DataLossError(absl::StrCat(what_, " ends after ", remaining(),
                                          " more bytes, not ", size));
}

absl::Status SectionReader::Read(void* dst, size_t size) {
  if (size > remaining()) return PastTheEnd(size);
  if (size == 0) return absl::OkStatus();
  if (kept_ != nullptr) {
    std::memcpy(dst, kept_->data() + pos_, size);
  } else {
    STARLING_RETURN_IF_ERROR(file_->ReadAt(pos_, dst, size));
  }
  pos_ += size;
  return absl::OkStatus();
}

absl::Status SectionReader::Skip(uint64_t size) {
  if (size > remaining()) return PastTheEnd(size);
  pos_ += size;
  return absl::OkStatus();
}

CheckpointReader::CheckpointReader(std::string path,
                                   std::unique_ptr<FileReader> file)
    : path_(std::move(path)), file_(std::move(file)) {}
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept =
    default;
CheckpointReader::~CheckpointReader() = default;

absl::StatusOr<CheckpointReader> CheckpointReader::Open(const std::string& path,
                                                        uint64_t keep_bytes) {
  // Streamed: every byte is hashed as it goes by, kept sections straight
  // into their strings and the others through one bounded buffer. A
  // framing error met on the way is reported only once the rest of the
  // file has been hashed: a damaged file is a checksum mismatch whichever
  // field the damage hit, and a size field is trusted only up to the
  // file's end.
  STARLING_ASSIGN_OR_RETURN(FileReader opened, FileReader::Open(path));
  CheckpointReader reader(path,
                          std::make_unique<FileReader>(std::move(opened)));
  FileReader& file = *reader.file_;
  auto corrupt = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, " is unreadable: ", why));
  };
  char magic[sizeof(kMagic)];
  if (file.size() < sizeof(kMagic) + 16) {
    return corrupt("not a Starling checkpoint (bad magic)");
  }
  // A read error is itself (naming the file), not a foreign file.
  STARLING_RETURN_IF_ERROR(file.Read(magic, sizeof(magic)));
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return corrupt("not a Starling checkpoint (bad magic)");
  }
  const uint64_t body = file.size() - sizeof(uint64_t);
  BytesHasher hasher(body);
  hasher.Update(magic, sizeof(magic));
  uint64_t pos = sizeof(magic);
  absl::Status io;
  auto get_bytes = [&](void* dst, uint64_t n) {
    if (!io.ok() || n > body - pos) return false;
    io = file.Read(dst, n);
    if (!io.ok()) return false;
    hasher.Update(dst, n);
    pos += n;
    return true;
  };
  auto get = [&](auto* v) { return get_bytes(v, sizeof(*v)); };
  // Sizes `out` only once the file is known to hold that many bytes more.
  auto get_string = [&](uint64_t n, std::string* out) {
    if (n > body - pos) return false;
    out->resize(n);
    return get_bytes(out->data(), n);
  };
  std::string scratch;
  // Hashes the next `n` bytes, a bounded piece at a time.
  auto pass_over = [&](uint64_t n) {
    if (n > body - pos) return false;
    scratch.resize(std::min<uint64_t>(n, kPieceBytes));
    while (n > 0) {
      const uint64_t piece = std::min<uint64_t>(n, scratch.size());
      if (!get_bytes(scratch.data(), piece)) return false;
      n -= piece;
    }
    return true;
  };

  std::string framing;  // the first framing error, reported after the hash
  uint32_t version = 0, n = 0;
  if (!get(&version) || version != kVersion) {
    framing = absl::StrCat("unsupported version ", version);
  } else if (!get(&n)) {
    framing = "missing section count";
  }
  for (uint32_t i = 0; framing.empty() && i < n; ++i) {
    uint32_t name_len = 0;
    Entry entry;
    std::string name;
    bool ok = get(&name_len) && get_string(name_len, &name) && get(&entry.size);
    entry.offset = pos;
    entry.kept = entry.size <= keep_bytes;
    ok = ok && (entry.kept ? get_string(entry.size, &entry.bytes)
                           : pass_over(entry.size));
    if (!ok) {
      framing = absl::StrCat("section ", i, " is out of bounds");
      break;
    }
    reader.sections_[name] = std::move(entry);
  }
  if (framing.empty() && pos != body) {
    framing = "trailing bytes after the sections";
  }
  if (!framing.empty()) {
    reader.sections_.clear();
    pass_over(body - pos);
  }
  uint64_t stored = 0;
  if (io.ok()) io = file.Read(&stored, sizeof(stored));
  if (!io.ok()) return io;
  if (stored != hasher.Finish()) {
    return corrupt("checksum mismatch (truncated or corrupted file)");
  }
  if (!framing.empty()) return corrupt(framing);
  return reader;
}

std::vector<std::string> CheckpointReader::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, entry] : sections_) names.push_back(name);
  return names;
}

bool CheckpointReader::Has(absl::string_view name) const {
  return sections_.find(name) != sections_.end();
}

absl::StatusOr<const CheckpointReader::Entry*> CheckpointReader::Find(
    absl::string_view name) const {
  auto it = sections_.find(name);
  if (it == sections_.end()) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", path_, " has no '", name, "' section"));
  }
  return &it->second;
}

absl::StatusOr<uint64_t> CheckpointReader::Size(absl::string_view name) const {
  STARLING_ASSIGN_OR_RETURN(const Entry* entry, Find(name));
  return entry->size;
}

absl::StatusOr<std::string> CheckpointReader::ReadString(
    absl::string_view name) const {
  STARLING_ASSIGN_OR_RETURN(const Entry* entry, Find(name));
  if (entry->kept) return entry->bytes;
  std::string out(entry->size, '\0');
  STARLING_RETURN_IF_ERROR(
      file_->ReadAt(entry->offset, out.data(), out.size()));
  return out;
}

absl::StatusOr<SectionReader> CheckpointReader::Section(
    absl::string_view name) const {
  STARLING_ASSIGN_OR_RETURN(const Entry* entry, Find(name));
  std::string what = absl::StrCat("checkpoint ", path_, " section ", name);
  if (entry->kept) {
    return SectionReader(nullptr, &entry->bytes, std::move(what), 0,
                         entry->size);
  }
  return SectionReader(file_.get(), nullptr, std::move(what), entry->offset,
                       entry->offset + entry->size);
}

absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path) {
  STARLING_ASSIGN_OR_RETURN(
      CheckpointReader reader,
      CheckpointReader::Open(path, std::numeric_limits<uint64_t>::max()));
  Checkpoint ckpt;
  for (auto& [name, entry] : reader.sections_) {
    ckpt.sections[name] = std::move(entry.bytes);
  }
  return ckpt;
}

}  // namespace starling
