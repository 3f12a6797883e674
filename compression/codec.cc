#include "compression/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "compression/kernels.h"
#include "compression/sparse_codec.h"
#include "compression/topk.h"
#include "compression/zstd_stage.h"
#include "core/status.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "The codec wire format is little-endian; port the loads and stores."
#endif

namespace starling {
namespace {

namespace ci = compression_internal;

constexpr size_t kHeaderBytes = 28;
constexpr uint8_t kMagic = 0xC5;
constexpr uint8_t kVersion = 1;
constexpr uint8_t kFlagZstd = 1;
constexpr uint8_t kFlagShuffle = 2;
constexpr uint8_t kFlagTopKInt8 = 4;
constexpr uint8_t kKnownFlags = kFlagZstd | kFlagShuffle | kFlagTopKInt8;
constexpr uint32_t kDefaultInt8Block = 256;
constexpr uint32_t kDefaultInt4Block = 64;
constexpr uint32_t kTopKInt8Block = 256;
constexpr uint32_t kMaxBlock = 1u << 20;

constexpr char kValidSpecs[] =
    "Valid: fp32, fp16, bf16, int8, int8:BLOCK, int4, int4:BLOCK, "
    "topk:FRACTION, topk:FRACTION+int8, topk:FRACTION+fp16, each optionally "
    "followed by +zstd, and sparse:FRACTION[:CHUNK][+int2|+int3|+int4] "
    "(BLOCK in [1, 1048576], CHUNK in [1, 65536], FRACTION in (0, 1]; e.g. "
    "int8+zstd, topk:0.01+int8, sparse:0.01)";

struct Header {
  CodecId codec = CodecId::kFp32;
  uint8_t flags = 0;
  uint32_t block = 0;
  uint64_t count = 0;
  uint64_t param = 0;
  uint32_t payload_bytes = 0;
};

struct Config {
  CodecId id = CodecId::kFp32;
  uint32_t block = 0;   // int8/int4 block.
  double fraction = 0;  // top-k, sparse.
  bool topk_int8 = false;
  compression_internal::SparseShape sparse;  // chunk and bits (k: fraction)
  bool zstd = false;
};

template <typename T>
void Store(char* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

void WriteHeader(const Header& h, char* p) {
  Store<uint8_t>(p, kMagic);
  Store<uint8_t>(p + 1, static_cast<uint8_t>(h.codec));
  Store<uint8_t>(p + 2, kVersion);
  Store<uint8_t>(p + 3, h.flags);
  Store<uint32_t>(p + 4, h.block);
  Store<uint64_t>(p + 8, h.count);
  Store<uint64_t>(p + 16, h.param);
  Store<uint32_t>(p + 24, h.payload_bytes);
}

const char* CodecIdName(uint8_t id) {
  switch (id) {
    case 1:
      return "fp32";
    case 2:
      return "fp16";
    case 3:
      return "bf16";
    case 4:
      return "int8";
    case 5:
      return "int4";
    case 6:
      return "topk";
    case 7:
      return "sparse";
  }
  return "unknown";
}

size_t NumBlocks(uint64_t n, uint32_t block) {
  return static_cast<size_t>((n + block - 1) / block);
}

absl::Status NonFiniteError(absl::Span<const float> values, int64_t index) {
  return absl::InvalidArgumentError(
      absl::StrCat("cannot encode: value at index ", index, " is ",
                   std::isnan(values[index]) ? "NaN" : "Inf"));
}

// The shortest decimal that parses back to `v`.
std::string ShortestDouble(double v) {
  for (int precision = 1; precision < 17; ++precision) {
    std::string s = absl::StrFormat("%.*g", precision, v);
    double back;
    if (absl::SimpleAtod(s, &back) && back == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

class CodecImpl : public Codec {
 public:
  CodecImpl(Config config, CodecOptions options)
      : config_(config), options_(options) {}

  std::string Name() const override {
    std::string name;
    switch (config_.id) {
      case CodecId::kFp32:
      case CodecId::kFp16:
      case CodecId::kBf16:
        name = CodecIdName(static_cast<uint8_t>(config_.id));
        break;
      case CodecId::kInt8:
        name = config_.block == kDefaultInt8Block
                   ? "int8"
                   : absl::StrCat("int8:", config_.block);
        break;
      case CodecId::kInt4:
        name = config_.block == kDefaultInt4Block
                   ? "int4"
                   : absl::StrCat("int4:", config_.block);
        break;
      case CodecId::kTopK:
        name = absl::StrCat("topk:", ShortestDouble(config_.fraction),
                            config_.topk_int8 ? "+int8" : "");
        break;
      case CodecId::kSparse:
        name = absl::StrCat("sparse:", ShortestDouble(config_.fraction));
        if (config_.sparse.chunk != ci::kSparseDefaultChunk) {
          absl::StrAppend(&name, ":", config_.sparse.chunk);
        }
        if (config_.sparse.bits != ci::kSparseDefaultBits) {
          absl::StrAppend(&name, "+int", config_.sparse.bits);
        }
        break;
    }
    if (config_.zstd) absl::StrAppend(&name, "+zstd");
    return name;
  }

  bool lossless() const override { return config_.id == CodecId::kFp32; }

  absl::StatusOr<std::string> Encode(
      absl::Span<const float> values) const override;

  absl::Status Decode(absl::string_view bytes,
                      absl::Span<float> out) const override {
    return DecodeImpl(bytes, out, /*accumulate=*/false);
  }

  absl::Status DecodeAccumulate(absl::string_view bytes,
                                absl::Span<float> acc) const override {
    return DecodeImpl(bytes, acc, /*accumulate=*/true);
  }

 private:
  // Writes the inner payload (before zstd) of `values` into `raw` (resized),
  // fills the codec-specific header fields and returns the element size for
  // the byte shuffle (0: do not shuffle).
  absl::StatusOr<int> EncodeRaw(absl::Span<const float> values, Header* h,
                                std::string* raw, size_t offset) const;
  absl::Status DecodeImpl(absl::string_view bytes, absl::Span<float> out,
                          bool accumulate) const;
  absl::StatusOr<Header> ParseHeader(absl::string_view bytes,
                                     size_t expected_count) const;
  // The inner payload size the header implies, after checking the header's
  // codec-specific fields; also the element size for the byte shuffle.
  absl::StatusOr<size_t> RawSize(const Header& h, int* elem_size) const;

  Config config_;
  CodecOptions options_;
};

absl::StatusOr<int> CodecImpl::EncodeRaw(absl::Span<const float> values,
                                         Header* h, std::string* buf,
                                         size_t offset) const {
  const size_t n = values.size();
  const float* x = values.data();
  auto resize = [&](size_t raw_size) {
    buf->resize(offset + raw_size);
    return &(*buf)[offset];
  };
  switch (config_.id) {
    case CodecId::kFp32:
    case CodecId::kFp16:
    case CodecId::kBf16: {
      const int64_t bad = ci::FirstNonFinite(x, n);
      if (bad >= 0) return NonFiniteError(values, bad);
      if (config_.id == CodecId::kFp32) {
        char* raw = resize(4 * n);
        if (n > 0) std::memcpy(raw, x, 4 * n);
        return 4;
      }
      char* raw = resize(2 * n);
      if (config_.id == CodecId::kFp16) {
        ci::FloatToFp16(x, n, raw);
      } else {
        ci::FloatToBf16(x, n, raw);
      }
      return 2;
    }
    case CodecId::kInt8: {
      h->block = config_.block;
      // Codes are appended a few blocks at a time from a small buffer, so
      // the big output is written once (resize would zero it first).
      const uint32_t block = config_.block;
      const size_t nb = NumBlocks(n, block);
      buf->reserve(offset + 4 * nb + n);
      resize(4 * nb);
      const size_t chunk =
          static_cast<size_t>(block) * std::max<size_t>(1, 16384 / block);
      std::vector<int8_t> codes(std::min(chunk, n));
      for (size_t start = 0; start < n; start += chunk) {
        const size_t m = std::min(chunk, n - start);
        const int64_t bad = ci::QuantizeAbsmax(
            x + start, m, block, ci::kInt8Levels,
            &(*buf)[offset + 4 * (start / block)], codes.data());
        if (bad >= 0) return NonFiniteError(values, start + bad);
        buf->append(reinterpret_cast<const char*>(codes.data()), m);
      }
      return 0;
    }
    case CodecId::kInt4: {
      h->block = config_.block;
      const size_t nb = NumBlocks(n, config_.block);
      std::vector<int8_t> codes(n);
      char* raw = resize(4 * nb + (n + 1) / 2);
      const int64_t bad = ci::QuantizeAbsmax(
          x, n, config_.block, ci::kInt4Levels, raw, codes.data());
      if (bad >= 0) return NonFiniteError(values, bad);
      ci::PackNibbles(codes.data(), n,
                      reinterpret_cast<uint8_t*>(raw + 4 * nb));
      return 0;
    }
    case CodecId::kTopK: {
      const int64_t bad = ci::FirstNonFinite(x, n);
      if (bad >= 0) return NonFiniteError(values, bad);
      if (n > (uint64_t{1} << 32)) {
        return absl::InvalidArgumentError(
            absl::StrCat("top-k: ", n, " values exceed the u32 index range"));
      }
      const uint64_t k = TopKCount(config_.fraction, n);
      const std::vector<uint32_t> idx = TopKIndices(values, k);
      h->param = k;
      std::vector<float> selected(k);
      for (size_t i = 0; i < k; ++i) selected[i] = x[idx[i]];
      size_t values_size = 2 * k;
      size_t nb = 0;
      if (config_.topk_int8) {
        h->flags |= kFlagTopKInt8;
        h->block = kTopKInt8Block;
        nb = NumBlocks(k, kTopKInt8Block);
        values_size = 4 * nb + k;
      }
      char* raw = resize(4 * k + values_size);
      // Indices ascending, delta-encoded (the first one absolute).
      uint32_t prev = 0;
      for (size_t i = 0; i < k; ++i) {
        Store<uint32_t>(raw + 4 * i, idx[i] - prev);
        prev = idx[i];
      }
      char* vals = raw + 4 * k;
      if (config_.topk_int8) {
        ci::QuantizeAbsmax(selected.data(), k, kTopKInt8Block, ci::kInt8Levels,
                           vals, reinterpret_cast<int8_t*>(vals + 4 * nb));
      } else {
        ci::FloatToFp16(selected.data(), k, vals);
      }
      return 0;
    }
    case CodecId::kSparse: {
      const int64_t bad = ci::FirstNonFinite(x, n);
      if (bad >= 0) return NonFiniteError(values, bad);
      ci::SparseShape shape = config_.sparse;
      shape.k = TopKCount(config_.fraction, shape.chunk);
      h->block = shape.chunk;
      h->param = ci::SparseParam(shape);
      buf->resize(offset);
      ci::SparseEncode(x, n, shape, buf);
      return 0;
    }
  }
  return absl::InternalError("unknown codec");
}

absl::StatusOr<std::string> CodecImpl::Encode(
    absl::Span<const float> values) const {
  Header h;
  h.codec = config_.id;
  h.count = values.size();
  std::string out;
  STARLING_ASSIGN_OR_RETURN(const int elem_size,
                            EncodeRaw(values, &h, &out, kHeaderBytes));
  if (config_.zstd) {
    const absl::string_view raw(out.data() + kHeaderBytes,
                                out.size() - kHeaderBytes);
    std::string shuffled;
    const bool shuffle = options_.shuffle && elem_size > 1 && !raw.empty();
    if (shuffle) {
      shuffled.resize(raw.size());
      ci::ShuffleBytes(raw.data(), raw.size() / elem_size, elem_size,
                       shuffled.data());
    }
    std::string compressed(kHeaderBytes, '\0');
    const absl::string_view src = shuffle ? absl::string_view(shuffled) : raw;
    if (ci::ZstdCompressChunks(src, options_.zstd_level,
                               options_.zstd_chunk_bytes, &compressed)) {
      h.flags |= kFlagZstd | (shuffle ? kFlagShuffle : 0);
      out = std::move(compressed);
    }
  }
  const size_t payload = out.size() - kHeaderBytes;
  if (payload > UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot encode: payload of ", payload,
                     " bytes exceeds the 4 GiB message format"));
  }
  h.payload_bytes = static_cast<uint32_t>(payload);
  WriteHeader(h, out.data());
  return out;
}

absl::StatusOr<Header> CodecImpl::ParseHeader(absl::string_view bytes,
                                              size_t expected_count) const {
  if (bytes.size() < kHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("codec payload truncated: ", bytes.size(),
                     " bytes, header is ", kHeaderBytes));
  }
  const char* p = bytes.data();
  if (Load<uint8_t>(p) != kMagic) {
    return absl::DataLossError("codec payload: bad magic byte");
  }
  const uint8_t id = Load<uint8_t>(p + 1);
  if (id != static_cast<uint8_t>(config_.id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec payload is ", CodecIdName(id), " (id ", id, "), expected ",
        CodecIdName(static_cast<uint8_t>(config_.id))));
  }
  const uint8_t version = Load<uint8_t>(p + 2);
  if (version != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec payload version ", version, " is not supported (",
                     kVersion, " is)"));
  }
  Header h;
  h.codec = config_.id;
  h.flags = Load<uint8_t>(p + 3);
  h.block = Load<uint32_t>(p + 4);
  h.count = Load<uint64_t>(p + 8);
  h.param = Load<uint64_t>(p + 16);
  h.payload_bytes = Load<uint32_t>(p + 24);
  if (h.count != expected_count) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec payload holds ", h.count,
                     " values, the destination has ", expected_count));
  }
  if ((h.flags & ~kKnownFlags) != 0 ||
      ((h.flags & kFlagShuffle) != 0 && (h.flags & kFlagZstd) == 0)) {
    return absl::DataLossError(
        absl::StrCat("codec payload: bad flags ", h.flags));
  }
  if (h.payload_bytes != bytes.size() - kHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("codec payload: header says ", h.payload_bytes,
                     " payload bytes, got ", bytes.size() - kHeaderBytes));
  }
  return h;
}

absl::StatusOr<size_t> CodecImpl::RawSize(const Header& h,
                                          int* elem_size) const {
  const uint64_t n = h.count;
  const bool topk_int8 = (h.flags & kFlagTopKInt8) != 0;
  *elem_size = 0;
  auto bad = [](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("codec payload: bad ", what));
  };
  if (config_.id != CodecId::kTopK && config_.id != CodecId::kSparse) {
    if (h.param != 0) return bad("param");
    if (topk_int8) return bad("flags");
  }
  switch (config_.id) {
    case CodecId::kFp32:
    case CodecId::kFp16:
    case CodecId::kBf16:
      if (h.block != 0) return bad("block size");
      *elem_size = config_.id == CodecId::kFp32 ? 4 : 2;
      return static_cast<size_t>(*elem_size * n);
    case CodecId::kInt8:
    case CodecId::kInt4:
      if (h.block == 0 || h.block > kMaxBlock) return bad("block size");
      if ((h.flags & kFlagShuffle) != 0) return bad("flags");
      return 4 * NumBlocks(n, h.block) +
             static_cast<size_t>(config_.id == CodecId::kInt8 ? n
                                                              : (n + 1) / 2);
    case CodecId::kTopK: {
      const uint64_t k = h.param;
      if (k > n || n > (uint64_t{1} << 32)) return bad("top-k count");
      if ((h.flags & kFlagShuffle) != 0) return bad("flags");
      if (topk_int8) {
        if (h.block == 0 || h.block > kMaxBlock) return bad("block size");
        return static_cast<size_t>(5 * k) + 4 * NumBlocks(k, h.block);
      }
      if (h.block != 0) return bad("block size");
      return static_cast<size_t>(6 * k);
    }
    case CodecId::kSparse: {
      // Variable: the index gaps are Rice-coded. No zstd stage.
      ci::SparseShape shape;
      if (!ci::ParseSparseParam(h.param, h.block, &shape)) {
        return bad("sparse chunk, count or bits");
      }
      if (h.flags != 0) return bad("flags");
      return static_cast<size_t>(h.payload_bytes);
    }
  }
  return absl::InternalError("unknown codec");
}

absl::Status CodecImpl::DecodeImpl(absl::string_view bytes,
                                   absl::Span<float> out,
                                   bool accumulate) const {
  STARLING_ASSIGN_OR_RETURN(const Header h, ParseHeader(bytes, out.size()));
  int elem_size = 0;
  STARLING_ASSIGN_OR_RETURN(const size_t raw_size, RawSize(h, &elem_size));
  const absl::string_view payload = bytes.substr(kHeaderBytes);
  std::string buf;
  absl::string_view raw;
  if ((h.flags & kFlagZstd) != 0) {
    buf.resize(raw_size);
    STARLING_RETURN_IF_ERROR(
        ci::ZstdDecompressChunks(payload, raw_size, buf.data()));
    if ((h.flags & kFlagShuffle) != 0) {
      std::string unshuffled(raw_size, '\0');
      ci::UnshuffleBytes(buf.data(), raw_size / elem_size, elem_size,
                         unshuffled.data());
      buf.swap(unshuffled);
    }
    raw = buf;
  } else {
    if (payload.size() != raw_size) {
      return absl::DataLossError(absl::StrCat("codec payload: ", payload.size(),
                                              " bytes, the header "
                                              "implies ",
                                              raw_size));
    }
    raw = payload;
  }

  const size_t n = out.size();
  float* dst = out.data();
  const char* r = raw.data();
  switch (config_.id) {
    case CodecId::kFp32:
      if (!ci::Fp32AllFinite(r, n)) {
        return absl::DataLossError("codec payload: NaN/Inf value");
      }
      if (!ci::Fp32ToFloat(r, n, dst, accumulate)) {
        return AccumulateOverflowError();
      }
      return absl::OkStatus();
    case CodecId::kFp16:
      if (!ci::Fp16AllFinite(r, n)) {
        return absl::DataLossError("codec payload: NaN/Inf value");
      }
      if (!ci::Fp16ToFloat(r, n, dst, accumulate)) {
        return AccumulateOverflowError();
      }
      return absl::OkStatus();
    case CodecId::kBf16:
      if (!ci::Bf16AllFinite(r, n)) {
        return absl::DataLossError("codec payload: NaN/Inf value");
      }
      if (!ci::Bf16ToFloat(r, n, dst, accumulate)) {
        return AccumulateOverflowError();
      }
      return absl::OkStatus();
    case CodecId::kInt8:
    case CodecId::kInt4: {
      const size_t nb = NumBlocks(n, h.block);
      if (!ci::AbsmaxValid(r, nb)) {
        return absl::DataLossError("codec payload: bad block scale");
      }
      if (config_.id == CodecId::kInt8) {
        if (!ci::DequantizeAbsmax(
                r, reinterpret_cast<const int8_t*>(r + 4 * nb), n, h.block,
                ci::kInt8Levels, dst, accumulate)) {
          return AccumulateOverflowError();
        }
      } else {
        std::vector<int8_t> codes(n);
        ci::UnpackNibbles(reinterpret_cast<const uint8_t*>(r + 4 * nb), n,
                          codes.data());
        if (!ci::DequantizeAbsmax(r, codes.data(), n, h.block, ci::kInt4Levels,
                                  dst, accumulate)) {
          return AccumulateOverflowError();
        }
      }
      return absl::OkStatus();
    }
    case CodecId::kTopK: {
      const size_t k = static_cast<size_t>(h.param);
      std::vector<uint32_t> idx(k);
      uint64_t cur = 0;
      for (size_t i = 0; i < k; ++i) {
        const uint32_t d = Load<uint32_t>(r + 4 * i);
        if (i > 0 && d == 0) {
          return absl::DataLossError("top-k payload: repeated index");
        }
        cur = (i == 0 ? 0 : cur) + d;
        if (cur >= n) {
          return absl::DataLossError("top-k payload: index out of range");
        }
        idx[i] = static_cast<uint32_t>(cur);
      }
      const char* v = r + 4 * k;
      std::vector<float> vals(k);
      if ((h.flags & kFlagTopKInt8) != 0) {
        const size_t nb = NumBlocks(k, h.block);
        if (!ci::AbsmaxValid(v, nb)) {
          return absl::DataLossError("top-k payload: bad block scale");
        }
        ci::DequantizeAbsmax(v, reinterpret_cast<const int8_t*>(v + 4 * nb), k,
                             h.block, ci::kInt8Levels, vals.data(), false);
      } else {
        if (!ci::Fp16AllFinite(v, k)) {
          return absl::DataLossError("top-k payload: NaN/Inf value");
        }
        ci::Fp16ToFloat(v, k, vals.data(), false);
      }
      if (accumulate) {
        bool finite = true;
        for (size_t i = 0; i < k; ++i) {
          dst[idx[i]] += vals[i];
          finite &= std::isfinite(dst[idx[i]]);
        }
        if (!finite) return AccumulateOverflowError();
      } else {
        std::fill(out.begin(), out.end(), 0.0f);
        for (size_t i = 0; i < k; ++i) dst[idx[i]] = vals[i];
      }
      return absl::OkStatus();
    }
    case CodecId::kSparse: {
      ci::SparseShape shape;
      ci::ParseSparseParam(h.param, h.block, &shape);  // checked by RawSize
      bool overflow = false;
      STARLING_RETURN_IF_ERROR(
          ci::SparseDecode(raw, n, shape, dst, accumulate, &overflow));
      if (overflow) return AccumulateOverflowError();
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown codec");
}

// sparse:FRACTION[:CHUNK][+int2|+int3|+int4]; `arg` is what follows
// "sparse:", `parts` the spec split at '+' (a "+zstd" already taken off).
template <typename Invalid>
absl::StatusOr<Config> ParseSparseSpec(
    Config c, absl::string_view arg,
    const std::vector<absl::string_view>& parts, const Invalid& invalid) {
  if (c.zstd) {
    return invalid("sparse takes no +zstd: its indices are Rice-coded");
  }
  c.id = CodecId::kSparse;
  const size_t colon = arg.find(':');
  const absl::string_view fraction_text = arg.substr(0, colon);
  double fraction = 0;
  if (fraction_text.empty() ||
      fraction_text.find_first_not_of("0123456789.eE-") !=
          absl::string_view::npos ||
      !absl::SimpleAtod(fraction_text, &fraction) || !std::isfinite(fraction) ||
      fraction <= 0 || fraction > 1) {
    return invalid(absl::StrCat("sparse fraction '", fraction_text,
                                "' must be a number in (0, 1]"));
  }
  c.fraction = fraction;
  if (colon != absl::string_view::npos) {
    const absl::string_view chunk_text = arg.substr(colon + 1);
    uint32_t chunk = 0;
    if (chunk_text.empty() ||
        chunk_text.find_first_not_of("0123456789") != absl::string_view::npos ||
        !absl::SimpleAtoi(chunk_text, &chunk) || chunk == 0 ||
        chunk > ci::kSparseMaxChunk) {
      return invalid(absl::StrCat("sparse chunk '", chunk_text,
                                  "' must be an integer in [1, ",
                                  ci::kSparseMaxChunk, "]"));
    }
    c.sparse.chunk = chunk;
  }
  if (parts.size() > 2) {
    return invalid(absl::StrCat("unexpected '+", parts[2], "'"));
  }
  if (parts.size() == 2) {
    if (parts[1] == "int2" || parts[1] == "int3" || parts[1] == "int4") {
      c.sparse.bits = parts[1][3] - '0';
    } else {
      return invalid(absl::StrCat("sparse values are int2, int3 or int4, not '",
                                  parts[1], "'"));
    }
  }
  return c;
}

absl::StatusOr<Config> ParseSpec(absl::string_view spec) {
  auto invalid = [spec](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid codec '", spec, "': ", why, ". ", kValidSpecs));
  };
  if (spec.empty()) return invalid("empty spec");
  std::vector<absl::string_view> parts = absl::StrSplit(spec, '+');
  Config c;
  if (parts.size() > 1 && parts.back() == "zstd") {
    c.zstd = true;
    parts.pop_back();
  }
  const absl::string_view head = parts[0];
  const size_t colon = head.find(':');
  const absl::string_view name = head.substr(0, colon);
  const bool has_arg = colon != absl::string_view::npos;
  const absl::string_view arg = has_arg ? head.substr(colon + 1) : "";
  if (name == "fp32" || name == "fp16" || name == "bf16") {
    if (has_arg) return invalid(absl::StrCat("'", name, "' takes no ':'"));
    c.id = name == "fp32"   ? CodecId::kFp32
           : name == "fp16" ? CodecId::kFp16
                            : CodecId::kBf16;
  } else if (name == "int8" || name == "int4") {
    c.id = name == "int8" ? CodecId::kInt8 : CodecId::kInt4;
    c.block = name == "int8" ? kDefaultInt8Block : kDefaultInt4Block;
    if (has_arg) {
      uint32_t block = 0;
      if (arg.empty() ||
          arg.find_first_not_of("0123456789") != absl::string_view::npos ||
          !absl::SimpleAtoi(arg, &block) || block == 0 || block > kMaxBlock) {
        return invalid(absl::StrCat("block size '", arg,
                                    "' must be an integer in [1, ", kMaxBlock,
                                    "]"));
      }
      c.block = block;
    }
  } else if (name == "topk") {
    c.id = CodecId::kTopK;
    double fraction = 0;
    if (!has_arg || arg.empty() ||
        arg.find_first_not_of("0123456789.eE-") != absl::string_view::npos ||
        !absl::SimpleAtod(arg, &fraction) || !std::isfinite(fraction) ||
        fraction <= 0 || fraction > 1) {
      return invalid(absl::StrCat("top-k fraction '", arg,
                                  "' must be a number in (0, 1]"));
    }
    c.fraction = fraction;
    if (parts.size() > 2) {
      return invalid(absl::StrCat("unexpected '+", parts[2], "'"));
    }
    if (parts.size() == 2) {
      if (parts[1] == "int8") {
        c.topk_int8 = true;
      } else if (parts[1] != "fp16") {
        return invalid(absl::StrCat("top-k values are int8 or fp16, not '",
                                    parts[1], "'"));
      }
    }
    return c;
  } else if (name == "sparse") {
    return ParseSparseSpec(c, arg, parts, invalid);
  } else {
    return invalid(absl::StrCat("unknown codec '", name, "'"));
  }
  if (parts.size() > 1) {
    return invalid(absl::StrCat("unexpected '+", parts[1], "'"));
  }
  return c;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(absl::string_view spec,
                                                 const CodecOptions& options) {
  STARLING_ASSIGN_OR_RETURN(const Config config, ParseSpec(spec));
  return std::unique_ptr<Codec>(new CodecImpl(config, options));
}

absl::Status AccumulateOverflowError() {
  return absl::InvalidArgumentError(
      "codec payload: adding the decoded values overflows fp32 to Inf");
}

bool ApplyFp32(absl::string_view fp32, absl::Span<float> out, bool accumulate) {
  return compression_internal::Fp32ToFloat(
      fp32.data(), std::min(fp32.size() / 4, out.size()), out.data(),
      accumulate);
}

int64_t FirstNonFinite(absl::string_view fp32) {
  return compression_internal::Fp32FirstNonFinite(fp32.data(), fp32.size() / 4);
}

std::string CompressionSpecHelp() {
  return "--compression=SPEC picks how pseudo-gradients (diloco) and "
         "pushed models (gossip, where a lossy codec encodes the difference "
         "to the peer's copy of the last push) travel: fp32 "
         "(lossless), fp16 or bf16 (half precision, round to nearest even), "
         "int8[:BLOCK] (blockwise absmax, 8 bits, block 256 by default), "
         "int4[:BLOCK] (blockwise absmax, 4 bits, block 64 by default), "
         "topk:FRACTION[+int8|+fp16] (the largest FRACTION of values by "
         "magnitude with their indices; values in fp16 unless +int8), "
         "sparse:FRACTION[:CHUNK][+int2|+int3|+int4] (the largest FRACTION "
         "of each CHUNK of values, 4096 by default, as a sign and a 1-, 2- "
         "or 3-bit level, int2 by default, with Rice-coded indices; DiLoCo "
         "gathers every member's contribution instead of a ring). Append "
         "+zstd to any but sparse for a lossless zstd stage (skipped when it "
         "gains under 3%). Error feedback is on by default for int4, topk and "
         "sparse. Examples: int8, int8+zstd, topk:0.01+int8, int4, fp16+zstd, "
         "fp32, sparse:0.01.";
}

bool ErrorFeedbackByDefault(absl::string_view spec) {
  const absl::StatusOr<Config> config = ParseSpec(spec);
  return config.ok() &&
         (config->id == CodecId::kInt4 || config->id == CodecId::kTopK ||
          config->id == CodecId::kSparse);
}

bool IsSparseSpec(absl::string_view spec) {
  const absl::StatusOr<Config> config = ParseSpec(spec);
  return config.ok() && config->id == CodecId::kSparse;
}

}  // namespace starling
