#include "core/checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/status.h"

namespace starling {
namespace {

// Layout (little-endian):
//   "STARCKPT" u32 version u32 n_sections
//   n x { u32 name_len, name, u64 size, bytes }
//   u64 HashBytes(everything above)
constexpr char kMagic[8] = {'S', 'T', 'A', 'R', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

}  // namespace

std::string CheckpointPathInRunDir(const std::string& run_dir) {
  return absl::StrCat(run_dir, "/checkpoint.ckpt");
}

absl::Status WriteCheckpoint(const std::string& path, const Checkpoint& ckpt) {
  // The small framing goes into `heads`, one per section (plus the file's
  // own); the sections' bytes are written from where they are, never
  // copied into one buffer: a checkpoint holds the model several times
  // over (weights, optimizer state, outer state).
  // A deque: `parts` points into its strings, which emplace_back never
  // moves (a short string's bytes live inside the object).
  std::deque<std::string> heads;
  heads.emplace_back(kMagic, sizeof(kMagic));
  Put<uint32_t>(&heads.back(), kVersion);
  Put<uint32_t>(&heads.back(), static_cast<uint32_t>(ckpt.sections.size()));
  std::vector<absl::string_view> parts = {heads.back()};
  size_t size = heads.back().size();
  for (const auto& [name, bytes] : ckpt.sections) {
    heads.emplace_back();
    std::string& head = heads.back();
    Put<uint32_t>(&head, static_cast<uint32_t>(name.size()));
    head += name;
    Put<uint64_t>(&head, bytes.size());
    parts.push_back(head);
    parts.push_back(bytes);
    size += head.size() + bytes.size();
  }
  BytesHasher hasher(size);
  for (absl::string_view part : parts) hasher.Update(part.data(), part.size());
  heads.emplace_back();
  Put<uint64_t>(&heads.back(), hasher.Finish());
  parts.push_back(heads.back());
  return WriteFileAtomic(path, parts);
}

absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path) {
  // Streamed: each section is read straight into its string and every byte
  // is hashed as it goes by, so the file is never held twice in memory. A
  // framing error met on the way is reported only once the rest of the file
  // has been hashed: a damaged file is a checksum mismatch whichever field
  // the damage hit, and a size field is trusted only up to the file's end.
  STARLING_ASSIGN_OR_RETURN(FileReader file, FileReader::Open(path));
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

  Checkpoint ckpt;
  std::string framing;  // the first framing error, reported after the hash
  uint32_t version = 0, n = 0;
  if (!get(&version) || version != kVersion) {
    framing = absl::StrCat("unsupported version ", version);
  } else if (!get(&n)) {
    framing = "missing section count";
  }
  for (uint32_t i = 0; framing.empty() && i < n; ++i) {
    uint32_t name_len = 0;
    uint64_t size = 0;
    std::string name, bytes;
    if (!get(&name_len) || !get_string(name_len, &name) || !get(&size) ||
        !get_string(size, &bytes)) {
      framing = absl::StrCat("section ", i, " is out of bounds");
      break;
    }
    ckpt.sections[name] = std::move(bytes);
  }
  if (framing.empty() && pos != body) {
    framing = "trailing bytes after the sections";
  }
  if (!framing.empty()) {
    ckpt.sections.clear();
    std::string rest(std::min<uint64_t>(body - pos, 1 << 20), '\0');
    while (io.ok() && pos < body) {
      get_bytes(rest.data(), std::min<uint64_t>(body - pos, rest.size()));
    }
  }
  uint64_t stored = 0;
  if (io.ok()) io = file.Read(&stored, sizeof(stored));
  if (!io.ok()) return io;
  if (stored != hasher.Finish()) {
    return corrupt("checksum mismatch (truncated or corrupted file)");
  }
  if (!framing.empty()) return corrupt(framing);
  return ckpt;
}

}  // namespace starling
