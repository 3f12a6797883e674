#include "gossip/state_transfer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "compression/zstd_stage.h"
#include "core/flat_params.h"
#include "core/status.h"
#include "gossip/membership.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "The state layout is little-endian; port the loads and stores."
#endif

namespace starling {
namespace {

namespace ci = compression_internal;

// Encoded state: "SWST", u32 version, i64 round, i64 step, u64 lineage bytes
// + lineage, i64 member_rounds, u64 theta count + theta (fp32), u64 buffers
// count + buffers (fp32), u64 outer_state bytes + outer_state. (Version 1
// had no member_rounds, version 2 no buffers.)
constexpr char kStateMagic[4] = {'S', 'W', 'S', 'T'};
constexpr uint32_t kStateVersion = 3;

// Blob: "SWBL", u32 format, u64 raw size, then the encoded state either as
// is (kFormatRaw) or through the chunked zstd stage (kFormatZstd).
constexpr char kBlobMagic[4] = {'S', 'W', 'B', 'L'};
constexpr uint32_t kFormatRaw = 0;
constexpr uint32_t kFormatZstd = 1;
constexpr size_t kBlobHeaderBytes = 16;
constexpr int kZstdLevel = 1;
constexpr uint32_t kZstdChunkBytes = 1u << 20;

constexpr uint64_t kMaxStateBytes = uint64_t{4} << 30;

template <typename T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}

// Bounds-checked little-endian reads from a byte range.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}

  template <typename T>
  bool Get(T* v) {
    if (in_.size() < sizeof(T)) return false;
    std::memcpy(v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return true;
  }
  bool Bytes(uint64_t n, absl::string_view* v) {
    if (n > in_.size()) return false;
    *v = in_.substr(0, n);
    in_.remove_prefix(n);
    return true;
  }
  size_t remaining() const { return in_.size(); }

 private:
  absl::string_view in_;
};

absl::Status Truncated(absl::string_view field) {
  return absl::DataLossError(
      absl::StrCat("swarm state: truncated or oversized ", field));
}

// Asks the kernel to back [p, p + n) with 2 MiB pages where it is aligned
// (transparent huge pages in "madvise" mode): each first touch of a 4 KiB
// page costs a fault, which dominates a fresh buffer of hundreds of MB.
void AdviseHugePages(const void* p, size_t n) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin =
      (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) & ~(kHuge - 1);
  if (end > begin) {
    (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
}

// Reserves room for `count` elements of a string or vector, backed by huge
// pages where the kernel allows.
template <typename Buffer>
void ReserveHuge(Buffer& buffer, size_t count) {
  buffer.reserve(count);
  AdviseHugePages(buffer.data(), count * sizeof(typename Buffer::value_type));
}

std::string HexDigest(absl::string_view bytes) {
  return absl::StrFormat("%016x", HashBytes(bytes.data(), bytes.size()));
}

// The encoded state inside a blob.
absl::StatusOr<std::string> DecodeBlob(absl::string_view blob,
                                       int64_t max_raw_bytes) {
  Reader r(blob);
  absl::string_view magic;
  uint32_t format = 0;
  uint64_t raw_size = 0;
  if (!r.Bytes(4, &magic) || !r.Get(&format) || !r.Get(&raw_size)) {
    return absl::DataLossError("state blob: truncated header");
  }
  if (std::memcmp(magic.data(), kBlobMagic, 4) != 0) {
    return absl::DataLossError("state blob: bad magic");
  }
  if (raw_size > kMaxStateBytes ||
      raw_size > static_cast<uint64_t>(max_raw_bytes)) {
    return absl::DataLossError(
        absl::StrCat("state blob: raw size ", raw_size, " is over the ",
                     std::min<uint64_t>(kMaxStateBytes, max_raw_bytes),
                     " bytes a state of this model can take"));
  }
  absl::string_view payload = blob.substr(kBlobHeaderBytes);
  if (format == kFormatRaw) {
    if (payload.size() != raw_size) {
      return absl::DataLossError(absl::StrCat("state blob: ", payload.size(),
                                              " payload bytes, expected ",
                                              raw_size));
    }
    return std::string(payload);
  }
  if (format != kFormatZstd) {
    return absl::DataLossError(absl::StrCat("state blob: format ", format));
  }
  // Check the zstd stage's chunk count against raw_size before allocating
  // raw_size bytes (its layout: u32 chunk bytes, u32 chunk count, ...).
  Reader z(payload);
  uint32_t chunk_bytes = 0, num_chunks = 0;
  if (!z.Get(&chunk_bytes) || !z.Get(&num_chunks)) {
    return absl::DataLossError("state blob: truncated zstd header");
  }
  if (raw_size == 0 || chunk_bytes == 0 ||
      chunk_bytes > ci::kMaxZstdChunkBytes ||
      num_chunks != (raw_size + chunk_bytes - 1) / chunk_bytes ||
      z.remaining() / 4 < num_chunks) {
    return absl::DataLossError(
        absl::StrCat("state blob: zstd header (", chunk_bytes, " x ",
                     num_chunks, ") does not fit ", raw_size, " bytes"));
  }
  std::string raw;
  ReserveHuge(raw, raw_size);
  raw.resize(raw_size);
  STARLING_RETURN_IF_ERROR(
      ci::ZstdDecompressChunks(payload, raw.size(), raw.data()));
  return raw;
}

}  // namespace

int64_t MaxStateBytesFor(int64_t parameters) {
  return 16 * std::max<int64_t>(0, parameters) + (int64_t{16} << 20);
}

std::string EncodeSwarmState(const SwarmState& s) {
  std::string out;
  const size_t size = 4 + 4 + 8 * 7 + s.lineage.size() + 4 * s.theta.size() +
                      4 * s.buffers.size() + s.outer_state.size();
  ReserveHuge(out, size);
  out.append(kStateMagic, 4);
  Put<uint32_t>(&out, kStateVersion);
  Put<int64_t>(&out, s.round);
  Put<int64_t>(&out, s.step);
  Put<uint64_t>(&out, s.lineage.size());
  out.append(s.lineage);
  Put<int64_t>(&out, s.member_rounds);
  Put<uint64_t>(&out, s.theta.size());
  out.append(reinterpret_cast<const char*>(s.theta.data()), 4 * s.theta.size());
  Put<uint64_t>(&out, s.buffers.size());
  out.append(reinterpret_cast<const char*>(s.buffers.data()),
             4 * s.buffers.size());
  Put<uint64_t>(&out, s.outer_state.size());
  out.append(s.outer_state);
  return out;
}

absl::StatusOr<SwarmState> DecodeSwarmState(absl::string_view bytes) {
  Reader r(bytes);
  absl::string_view magic;
  if (!r.Bytes(4, &magic)) return Truncated("magic");
  if (std::memcmp(magic.data(), kStateMagic, 4) != 0) {
    return absl::DataLossError("swarm state: bad magic");
  }
  uint32_t version = 0;
  if (!r.Get(&version)) return Truncated("version");
  if (version != kStateVersion) {
    return absl::DataLossError(
        absl::StrCat("swarm state: unsupported version ", version));
  }
  SwarmState s;
  if (!r.Get(&s.round)) return Truncated("round");
  if (!r.Get(&s.step)) return Truncated("step");
  uint64_t n = 0;
  absl::string_view v;
  if (!r.Get(&n) || !r.Bytes(n, &v)) return Truncated("lineage");
  s.lineage = std::string(v);
  if (!r.Get(&s.member_rounds)) return Truncated("member_rounds");
  if (!r.Get(&n) || n > r.remaining() / 4 || !r.Bytes(4 * n, &v)) {
    return Truncated("theta");
  }
  ReserveHuge(s.theta, n);
  s.theta.resize(n);
  if (n > 0) std::memcpy(s.theta.data(), v.data(), 4 * n);
  if (!r.Get(&n) || n > r.remaining() / 4 || !r.Bytes(4 * n, &v)) {
    return Truncated("buffers");
  }
  s.buffers.resize(n);
  if (n > 0) std::memcpy(s.buffers.data(), v.data(), 4 * n);
  if (!r.Get(&n) || !r.Bytes(n, &v)) return Truncated("outer_state");
  ReserveHuge(s.outer_state, v.size());
  s.outer_state.assign(v.data(), v.size());
  if (r.remaining() != 0) {
    return absl::DataLossError(
        absl::StrCat("swarm state: ", r.remaining(), " trailing bytes"));
  }
  if (s.round < 0 || s.round > kMaxRound) {
    return absl::InvalidArgumentError(
        absl::StrCat("swarm state: round ", s.round, " is out of range [0, ",
                     kMaxRound, "]"));
  }
  if (s.member_rounds < 0 || s.member_rounds > kMaxMemberRounds) {
    return absl::InvalidArgumentError(
        absl::StrCat("swarm state: member_rounds ", s.member_rounds,
                     " is out of range [0, ", kMaxMemberRounds, "]"));
  }
  // The trainer counts steps in an int.
  if (s.step < 0 || s.step > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("swarm state: step ", s.step, " is out of range [0, ",
                     std::numeric_limits<int>::max(), "]"));
  }
  for (size_t i = 0; i < s.theta.size(); ++i) {
    if (!std::isfinite(s.theta[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("swarm state: theta[", i, "] is not finite"));
    }
  }
  // A buffer may hold an infinity (an attention mask), never a NaN.
  for (size_t i = 0; i < s.buffers.size(); ++i) {
    if (std::isnan(s.buffers[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("swarm state: buffers[", i, "] is NaN"));
    }
  }
  const std::string hash = FlatHash(s.theta, s.buffers);
  if (s.lineage != hash) {
    return absl::InvalidArgumentError(
        absl::StrCat("swarm state: lineage \"", s.lineage,
                     "\" does not match the hash of theta and buffers ", hash));
  }
  return s;
}

std::shared_ptr<const StateBlob> StateBlob::Make(const SwarmState& s) {
  auto blob = std::make_shared<StateBlob>();
  const std::string raw = EncodeSwarmState(s);
  std::string bytes;
  bytes.append(kBlobMagic, 4);
  Put<uint32_t>(&bytes, kFormatZstd);
  Put<uint64_t>(&bytes, raw.size());
  if (!ci::ZstdCompressChunks(raw, kZstdLevel, kZstdChunkBytes, &bytes)) {
    const uint32_t format = kFormatRaw;
    std::memcpy(&bytes[4], &format, 4);
    bytes.append(raw);
  }
  blob->round_ = s.round;
  blob->lineage_ = s.lineage;
  blob->member_rounds_ = s.member_rounds;
  blob->digest_ = HexDigest(bytes);
  blob->raw_bytes_ = static_cast<int64_t>(raw.size());
  blob->bytes_ = std::move(bytes);
  return blob;
}

uint64_t ChunkChecksum(absl::string_view data) {
  return HashBytes(data.data(), data.size());
}

absl::Status StateAssembler::Add(const std::string& digest, int64_t total_bytes,
                                 int64_t offset, absl::string_view data,
                                 uint64_t checksum) {
  if (digest.empty()) {
    return absl::InvalidArgumentError("state chunk: empty digest");
  }
  if (total_bytes <= 0 || static_cast<uint64_t>(total_bytes) > kMaxStateBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state chunk: total_bytes ", total_bytes, " is not in (0, 4 GiB]"));
  }
  const bool restart = digest != digest_;
  if (restart && offset != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("state chunk: new digest ", digest, " starts at offset ",
                     offset, ", not 0"));
  }
  if (!restart && total_bytes != total_) {
    return absl::InvalidArgumentError(absl::StrCat("state chunk: total_bytes ",
                                                   total_bytes, " for digest ",
                                                   digest, " was ", total_));
  }
  const int64_t expected = restart ? 0 : next_offset();
  if (offset != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("state chunk: offset ", offset, ", expected ", expected));
  }
  if (data.size() > static_cast<uint64_t>(total_bytes - offset)) {
    return absl::InvalidArgumentError(
        absl::StrCat("state chunk: ", data.size(), " bytes at offset ", offset,
                     " run past total_bytes ", total_bytes));
  }
  if (ChunkChecksum(data) != checksum) {
    return absl::DataLossError(
        absl::StrCat("state chunk: checksum mismatch at offset ", offset));
  }
  if (restart) {
    digest_ = digest;
    total_ = total_bytes;
    bytes_.clear();
    // total_bytes is the donor's word: reserve at most 256 MiB up front
    // (a false claim of 4 GiB must not allocate it), grow past that as
    // chunks actually arrive.
    ReserveHuge(bytes_, static_cast<size_t>(std::min<int64_t>(
                            total_bytes, int64_t{256} << 20)));
  }
  bytes_.append(data.data(), data.size());
  return absl::OkStatus();
}

absl::StatusOr<SwarmState> StateAssembler::Finish() {
  std::string bytes, digest;
  bytes.swap(bytes_);
  digest.swap(digest_);
  const int64_t total = total_;
  total_ = 0;
  if (total <= 0 || static_cast<int64_t>(bytes.size()) != total) {
    return absl::DataLossError(absl::StrCat("state transfer: incomplete (",
                                            bytes.size(), " of ", total,
                                            " bytes)"));
  }
  const std::string got = HexDigest(bytes);
  if (got != digest) {
    return absl::DataLossError(
        absl::StrCat("state transfer: digest ", got, ", expected ", digest));
  }
  absl::StatusOr<std::string> raw = DecodeBlob(bytes, max_raw_bytes_);
  std::string().swap(bytes);
  if (!raw.ok()) return raw.status();
  return DecodeSwarmState(*raw);
}

}  // namespace starling
