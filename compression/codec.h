// Codecs for pseudo-gradients: fp32, fp16, bf16, blockwise int8/int4, top-k,
// each with an optional lossless zstd stage, the chunk-wise sparse codec
// (compression/sparse_codec.h), plus error feedback for lossy codecs. Pure CPU
// code. Codec objects are immutable after MakeCodec and safe to use from many
// threads at once; ErrorFeedback is not thread-safe.
#ifndef STARLING_COMPRESSION_CODEC_H_
#define STARLING_COMPRESSION_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace starling {

// Every encoded payload starts with a self-describing 28-byte header
// (little-endian):
//   u8 magic 0xC5, u8 codec id, u8 version (1), u8 flags, u32 block size (0 if
//   n/a), u64 element count, u64 param (top-k: k; else 0), u32 payload bytes
//   that follow.
// Flags: bit0 = zstd stage applied, bit1 = byte-shuffled before zstd,
// bit2 = top-k values are blockwise int8 (else fp16). The sparse codec's
// block size is its chunk and its param K | bits << 32
// (compression/sparse_codec.h).
enum class CodecId : uint8_t {
  kFp32 = 1,
  kFp16 = 2,
  kBf16 = 3,
  kInt8 = 4,
  kInt4 = 5,
  kTopK = 6,
  kSparse = 7
};

class Codec {
 public:
  virtual ~Codec() = default;
  // The canonical spec, e.g. "int8", "int4:32", "topk:0.01+int8+zstd".
  virtual std::string Name() const = 0;
  // True when Decode(Encode(x)) == x bit for bit.
  virtual bool lossless() const = 0;
  // InvalidArgument naming the index of the first NaN/Inf input value, or
  // when the payload would not fit the header's u32 size field.
  virtual absl::StatusOr<std::string> Encode(
      absl::Span<const float> values) const = 0;
  // `out.size()` must equal the header's element count. InvalidArgument (wrong
  // codec id, version or size) or DataLoss (truncated or corrupt bytes). Never
  // reads or writes out of bounds, whatever the input bytes.
  virtual absl::Status Decode(absl::string_view bytes,
                              absl::Span<float> out) const = 0;
  // acc[i] += decoded[i]. Same errors as Decode, and those leave `acc`
  // unchanged. InvalidArgument when a sum overflows to ±Inf (checked in the
  // same pass as the adds, so `acc` is then partly updated): on success
  // every sum written is finite.
  virtual absl::Status DecodeAccumulate(absl::string_view bytes,
                                        absl::Span<float> acc) const = 0;
};

// Knobs that are not part of the spec (the wire format records what was used,
// so any decoder reads any choice).
struct CodecOptions {
  // Byte-shuffle fp32/fp16/bf16 payloads before zstd.
  bool shuffle = true;
  // zstd level for the "+zstd" stage (1 is fast; negative is faster).
  int zstd_level = 1;
  // The zstd stage compresses independent chunks of this many raw bytes.
  uint32_t zstd_chunk_bytes = 1 << 20;
};

// Spec grammar: CODEC[+zstd], where CODEC is fp32 | fp16 | bf16 | int8 |
// int8:BLOCK | int4 | int4:BLOCK | topk:FRACTION | topk:FRACTION+int8 |
// topk:FRACTION+fp16 (top-k values are fp16 by default), or
// sparse:FRACTION[:CHUNK][+int2|+int3|+int4] (no +zstd: its indices are
// entropy-coded already). Examples: "int8", "int8+zstd", "topk:0.01+int8",
// "int4", "fp16+zstd", "fp32", "sparse:0.01", "sparse:0.02:4096+int3".
// InvalidArgument whose message quotes the spec ("invalid codec '<spec>'")
// and says what is valid; callers name their flag.
absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(
    absl::string_view spec, const CodecOptions& options = CodecOptions());

// The index of the first NaN or ±Inf among little-endian fp32 values (a
// trailing partial value is ignored), or -1: the check of values that come
// from peers, vectorized (about memory speed).
int64_t FirstNonFinite(absl::string_view fp32);
inline int64_t FirstNonFinite(absl::Span<const float> v) {
  return FirstNonFinite(absl::string_view(
      reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
}

// What DecodeAccumulate returns when a sum overflows to ±Inf.
absl::Status AccumulateOverflowError();

// out[i] = x[i], or out[i] += x[i] with `accumulate` (the same single fp32
// add as a plain loop), for the little-endian fp32 values x in `fp32`
// (4 * out.size() bytes), in one vectorized pass that checks what it
// writes: false when a written value is NaN or ±Inf (a non-finite x[i], or
// a sum that overflowed), and `out` is then partly written. The receive
// path for raw fp32 from peers; on false, FirstNonFinite(fp32) tells which
// x[i] was non-finite, or -1 when a sum overflowed.
bool ApplyFp32(absl::string_view fp32, absl::Span<float> out, bool accumulate);

// One paragraph for `starling --help` listing the specs.
std::string CompressionSpecHelp();

// Whether error feedback is on by default for this spec: true for int4,
// topk and sparse, false otherwise (and for invalid specs).
bool ErrorFeedbackByDefault(absl::string_view spec);

// Whether the spec is the sparse codec (whose DiLoCo rounds gather every
// member's contribution instead of re-encoding partial sums in a ring).
bool IsSparseSpec(absl::string_view spec);

// Error feedback around any lossy codec: keeps the residual e in fp32.
// Compress: x = delta + e; bytes = codec.Encode(x); sent = Decode(bytes);
// e = x - sent. Not thread-safe.
class ErrorFeedback {
 public:
  explicit ErrorFeedback(int64_t size);

  // Returns the encoded bytes and fills `sent` with what the receivers decode.
  // InvalidArgument when `delta` or `sent` is not size() long, or when the
  // codec rejects x (NaN/Inf); the residual is then unchanged.
  absl::StatusOr<std::string> Compress(const Codec& codec,
                                       absl::Span<const float> delta,
                                       absl::Span<float> sent);

  int64_t size() const { return static_cast<int64_t>(residual_.size()); }
  absl::Span<const float> residual() const { return residual_; }

  // e <- factor * e: drops (1 - factor) of what is held back. A DiLoCo node
  // with --overlap scales by the inner learning rate's decay over a round,
  // and a flush empties it (factor 0; see docs/compression.md).
  // InvalidArgument unless factor is in [0, 1]; the residual is then
  // unchanged.
  absl::Status ScaleResidual(float factor);

  // The residual as bytes, for checkpoints.
  std::string SaveState() const;
  // DataLoss on size mismatch, corruption or non-finite values; the residual
  // is then unchanged.
  absl::Status LoadState(absl::string_view bytes);

 private:
  std::vector<float> residual_;
  std::vector<float> x_;  // Scratch for delta + e.
};

}  // namespace starling

#endif  // STARLING_COMPRESSION_CODEC_H_
