#include "compression/zstd_stage.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace starling {
namespace compression_internal {
namespace {

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxDeleter {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

ZSTD_CCtx* ThreadCCtx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> ctx(ZSTD_createCCtx());
  return ctx.get();
}
ZSTD_DCtx* ThreadDCtx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DCtxDeleter> ctx(ZSTD_createDCtx());
  return ctx.get();
}

void PutU32(std::string* out, size_t pos, uint32_t v) {
  std::memcpy(&(*out)[pos], &v, 4);
}
uint32_t GetU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

bool ZstdCompressChunks(absl::string_view raw, int level, uint32_t chunk_bytes,
                        std::string* out) {
  if (raw.empty()) return false;
  chunk_bytes = std::clamp<uint32_t>(chunk_bytes, 1, kMaxZstdChunkBytes);
  const size_t num_chunks = (raw.size() + chunk_bytes - 1) / chunk_bytes;
  if (num_chunks > UINT32_MAX) return false;
  ZSTD_CCtx* cctx = ThreadCCtx();
  if (cctx == nullptr) return false;
  const size_t start = out->size();
  out->reserve(start + 8 + 4 * num_chunks + ZSTD_compressBound(raw.size()) +
               ZSTD_compressBound(chunk_bytes));
  out->resize(start + 8);
  PutU32(out, start, chunk_bytes);
  PutU32(out, start + 4, static_cast<uint32_t>(num_chunks));
  for (size_t c = 0; c < num_chunks; ++c) {
    const size_t off = c * chunk_bytes;
    const size_t len = std::min<size_t>(chunk_bytes, raw.size() - off);
    const size_t bound = ZSTD_compressBound(len);
    const size_t pos = out->size();
    out->resize(pos + 4 + bound);
    const size_t csize = ZSTD_compressCCtx(cctx, &(*out)[pos + 4], bound,
                                           raw.data() + off, len, level);
    // Give up (restoring `out`) on an error or when the first chunk gains
    // under 3%.
    if (ZSTD_isError(csize) || csize > UINT32_MAX ||
        (c == 0 && static_cast<double>(csize) > 0.97 * len)) {
      out->resize(start);
      return false;
    }
    PutU32(out, pos, static_cast<uint32_t>(csize));
    out->resize(pos + 4 + csize);
  }
  return true;
}

absl::Status ZstdDecompressChunks(absl::string_view in, size_t raw_size,
                                  char* out) {
  if (in.size() < 8) return absl::DataLossError("zstd stage: truncated");
  const uint32_t chunk_bytes = GetU32(in.data());
  const uint32_t num_chunks = GetU32(in.data() + 4);
  if (chunk_bytes == 0 || chunk_bytes > kMaxZstdChunkBytes) {
    return absl::DataLossError(
        absl::StrCat("zstd stage: bad chunk size ", chunk_bytes));
  }
  const uint64_t expected_chunks =
      (static_cast<uint64_t>(raw_size) + chunk_bytes - 1) / chunk_bytes;
  if (num_chunks != expected_chunks) {
    return absl::DataLossError(absl::StrCat(
        "zstd stage: ", num_chunks, " chunks, expected ", expected_chunks));
  }
  ZSTD_DCtx* dctx = ThreadDCtx();
  if (dctx == nullptr) return absl::InternalError("zstd: out of memory");
  size_t pos = 8;
  for (uint64_t c = 0; c < num_chunks; ++c) {
    if (in.size() - pos < 4)
      return absl::DataLossError("zstd stage: truncated");
    const uint32_t csize = GetU32(in.data() + pos);
    pos += 4;
    if (csize > in.size() - pos) {
      return absl::DataLossError("zstd stage: truncated frame");
    }
    const size_t off = c * chunk_bytes;
    const size_t len = std::min<size_t>(chunk_bytes, raw_size - off);
    const char* frame = in.data() + pos;
    const unsigned long long content = ZSTD_getFrameContentSize(frame, csize);
    if (content != len) {
      return absl::DataLossError(
          absl::StrCat("zstd stage: chunk ", c, " has a bad frame header"));
    }
    const size_t got = ZSTD_decompressDCtx(dctx, out + off, len, frame, csize);
    if (ZSTD_isError(got) || got != len) {
      return absl::DataLossError(absl::StrCat(
          "zstd stage: chunk ", c, " is corrupt: ",
          ZSTD_isError(got) ? ZSTD_getErrorName(got) : "wrong size"));
    }
    pos += csize;
  }
  if (pos != in.size()) {
    return absl::DataLossError("zstd stage: trailing bytes");
  }
  return absl::OkStatus();
}

}  // namespace compression_internal
}  // namespace starling
