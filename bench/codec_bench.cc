// Codec throughput on one thread: int8 encode and decode-accumulate against a
// memcpy of the same 64 MiB (the reference bandwidth), zstd over int8 codes,
// top-k selection over 10M floats, and the check (and add) of a received
// fp32 chunk. Writes JSON with --benchmark_format=json; asserts nothing.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "compression/topk.h"
#include "compression/zstd_stage.h"

namespace starling {
namespace {

constexpr size_t kFloats = size_t{16} << 20;  // 64 MiB of fp32
constexpr size_t kTopKFloats = 10000000;

const std::vector<float>& Input(size_t n) {
  static std::vector<float>* cache = [] {
    auto* v = new std::vector<float>(kFloats);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : *v) x = normal(rng);
    return v;
  }();
  static std::vector<float>* topk_input =
      new std::vector<float>(cache->begin(), cache->begin() + kTopKFloats);
  return n == kFloats ? *cache : *topk_input;
}

std::unique_ptr<Codec> MustMake(const std::string& spec) {
  auto codec = MakeCodec(spec);
  if (!codec.ok()) std::abort();
  return std::move(codec).value();
}

void BM_Memcpy64MiB(benchmark::State& state) {
  const std::vector<float>& in = Input(kFloats);
  std::vector<float> out(kFloats, 1.0f);
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), kFloats * 4);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kFloats * 4);
}
BENCHMARK(BM_Memcpy64MiB)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Int8Encode(benchmark::State& state) {
  const std::vector<float>& in = Input(kFloats);
  auto codec = MustMake("int8");
  for (auto _ : state) {
    absl::StatusOr<std::string> bytes = codec->Encode(in);
    benchmark::DoNotOptimize(bytes);
  }
  state.SetBytesProcessed(state.iterations() * kFloats * 4);
}
BENCHMARK(BM_Int8Encode)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Int8DecodeAccumulate(benchmark::State& state) {
  const std::vector<float>& in = Input(kFloats);
  auto codec = MustMake("int8");
  const std::string bytes = codec->Encode(in).value();
  std::vector<float> acc(kFloats, 0.0f);
  for (auto _ : state) {
    if (!codec->DecodeAccumulate(bytes, absl::MakeSpan(acc)).ok()) std::abort();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kFloats * 4);
}
BENCHMARK(BM_Int8DecodeAccumulate)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

constexpr size_t kChunkBytes = size_t{1} << 20;

// kChunkBytes of the input at offset 1 of the returned buffer.
std::string OddChunkBuffer() {
  std::string buf(kChunkBytes + 1, '\0');
  std::memcpy(&buf[1], Input(kFloats).data(), kChunkBytes);
  return buf;
}

// The NaN/Inf scan of a received fp32 chunk that is buffered rather than
// streamed into the ring's values (1 MiB, as the transport's chunks, at an
// odd address, as in gRPC's slices).
void BM_FirstNonFinite1MiB(benchmark::State& state) {
  const std::string buf = OddChunkBuffer();
  const absl::string_view chunk(buf.data() + 1, kChunkBytes);
  for (auto _ : state) {
    if (FirstNonFinite(chunk) != -1) std::abort();
  }
  state.SetBytesProcessed(state.iterations() * kChunkBytes);
}
BENCHMARK(BM_FirstNonFinite1MiB)->Unit(benchmark::kMicrosecond)->UseRealTime();

// A raw fp32 chunk that streams into the ring's values: added and checked
// for NaN/Inf and overflow in one pass (1 MiB at an odd address, as above).
void BM_ApplyFp32Add1MiB(benchmark::State& state) {
  const std::string buf = OddChunkBuffer();
  const absl::string_view chunk(buf.data() + 1, kChunkBytes);
  std::vector<float> acc(kChunkBytes / 4, 0.0f);
  for (auto _ : state) {
    if (!ApplyFp32(chunk, absl::MakeSpan(acc), true)) std::abort();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kChunkBytes);
}
BENCHMARK(BM_ApplyFp32Add1MiB)->Unit(benchmark::kMicrosecond)->UseRealTime();

// zstd over the 16 MiB of int8 codes (scales excluded); bytes/s is over the
// codes, i.e. the zstd input.
void BM_ZstdInt8Codes(benchmark::State& state) {
  const std::vector<float>& in = Input(kFloats);
  const std::string bytes = MustMake("int8")->Encode(in).value();
  const size_t codes_offset = 28 + 4 * (kFloats / 256);
  const std::string codes = bytes.substr(codes_offset);
  const int level = static_cast<int>(state.range(0));
  std::string out;
  for (auto _ : state) {
    out.clear();
    benchmark::DoNotOptimize(
        compression_internal::ZstdCompressChunks(codes, level, 1 << 20, &out));
  }
  state.counters["ratio"] =
      out.empty() ? 1.0 : static_cast<double>(codes.size()) / out.size();
  state.SetBytesProcessed(state.iterations() * codes.size());
}
BENCHMARK(BM_ZstdInt8Codes)
    ->Arg(1)
    ->Arg(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_ZstdDecompressInt8Codes(benchmark::State& state) {
  const std::vector<float>& in = Input(kFloats);
  const std::string bytes = MustMake("int8")->Encode(in).value();
  const std::string codes = bytes.substr(28 + 4 * (kFloats / 256));
  std::string compressed;
  if (!compression_internal::ZstdCompressChunks(codes, 1, 1 << 20,
                                                &compressed)) {
    std::abort();
  }
  std::string out(codes.size(), '\0');
  for (auto _ : state) {
    if (!compression_internal::ZstdDecompressChunks(compressed, out.size(),
                                                    out.data())
             .ok()) {
      std::abort();
    }
  }
  state.SetBytesProcessed(state.iterations() * codes.size());
}
BENCHMARK(BM_ZstdDecompressInt8Codes)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_TopK1Percent10M(benchmark::State& state) {
  const std::vector<float>& in = Input(kTopKFloats);
  const uint64_t k = TopKCount(0.01, in.size());
  for (auto _ : state) {
    std::vector<uint32_t> idx = TopKIndices(in, k);
    benchmark::DoNotOptimize(idx.data());
  }
  state.SetItemsProcessed(state.iterations() * in.size());
}
BENCHMARK(BM_TopK1Percent10M)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_TopKEncode1Percent10M(benchmark::State& state) {
  const std::vector<float>& in = Input(kTopKFloats);
  auto codec = MustMake("topk:0.01");
  for (auto _ : state) {
    absl::StatusOr<std::string> bytes =
        codec->Encode(absl::MakeConstSpan(in.data(), in.size()));
    benchmark::DoNotOptimize(bytes);
  }
  state.SetItemsProcessed(state.iterations() * in.size());
}
BENCHMARK(BM_TopKEncode1Percent10M)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace starling

BENCHMARK_MAIN();
