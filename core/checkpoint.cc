#include "core/checkpoint.h"

#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/file_util.h"
#include "core/flat_params.h"

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

class Reader {
 public:
  explicit Reader(const std::string& data) : data_(data) {}
  template <typename T>
  bool Get(T* v) {
    if (data_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetBytes(uint64_t n, std::string* out) {
    if (data_.size() - pos_ < n) return false;
    out->assign(data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  const std::string& data_;
  size_t pos_ = 0;
};

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
  absl::StatusOr<std::string> data = ReadFile(path);
  if (!data.ok()) return data.status();
  auto corrupt = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, " is unreadable: ", why));
  };
  if (data->size() < sizeof(kMagic) + 16 ||
      std::memcmp(data->data(), kMagic, sizeof(kMagic)) != 0) {
    return corrupt("not a Starling checkpoint (bad magic)");
  }
  size_t body = data->size() - sizeof(uint64_t);
  uint64_t stored;
  std::memcpy(&stored, data->data() + body, sizeof(stored));
  if (stored != HashBytes(data->data(), body)) {
    return corrupt("checksum mismatch (truncated or corrupted file)");
  }
  Reader r(*data);
  std::string magic;
  uint32_t version = 0, n = 0;
  r.GetBytes(sizeof(kMagic), &magic);
  if (!r.Get(&version) || version != kVersion) {
    return corrupt(absl::StrCat("unsupported version ", version));
  }
  if (!r.Get(&n)) return corrupt("missing section count");
  Checkpoint ckpt;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t name_len = 0;
    uint64_t size = 0;
    std::string name, bytes;
    if (!r.Get(&name_len) || !r.GetBytes(name_len, &name) || !r.Get(&size) ||
        r.pos() + size > body || !r.GetBytes(size, &bytes)) {
      return corrupt(absl::StrCat("section ", i, " is out of bounds"));
    }
    ckpt.sections[name] = std::move(bytes);
  }
  if (r.pos() != body) return corrupt("trailing bytes after the sections");
  return ckpt;
}

}  // namespace starling
