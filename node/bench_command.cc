#include "node/bench_command.h"

#include <ATen/ATen.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#ifdef STARLING_WITH_GLOO
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "compression/codec.h"
#include "compression/tensor_policy.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/logging.h"
#include "core/status.h"
#include "gossip/grpc_transport.h"
#include "gossip/ring_allreduce.h"
#include "node/run_output.h"

ABSL_FLAG(std::string, sizes_mib, "4,64,256",
          "bench allreduce: payload sizes in MiB (fp32), comma-separated; a "
          "K suffix gives KiB instead (e.g. 4K,1024K,4)");
ABSL_FLAG(int, iterations, 20,
          "bench allreduce: timed all-reduces per size and method, after one "
          "untimed warm-up; the median is reported");
// Shared with the other subcommands.
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(int, nodes);
ABSL_DECLARE_FLAG(std::string, compression);
ABSL_DECLARE_FLAG(int, chunk_bytes);

namespace starling {
#ifdef STARLING_WITH_GLOO
namespace {

// Set by the parent in each worker's environment: "RANK:STORE_PATH".
constexpr char kWorkerEnv[] = "STARLING_BENCH_WORKER";

struct BenchConfig {
  std::string out;
  int nodes = 4;
  std::vector<int64_t> sizes;  // payload bytes
  int iterations = 20;
  std::vector<std::string> codecs;  // Starling's, e.g. {"fp32", "int8"}
  int64_t chunk_bytes = 1 << 20;
};

absl::StatusOr<BenchConfig> ConfigFromFlags() {
  BenchConfig c;
  c.out = absl::GetFlag(FLAGS_out);
  c.nodes = absl::GetFlag(FLAGS_nodes);
  if (c.nodes < 2 || c.nodes > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nodes=", c.nodes, ": must be in [2, 64]"));
  }
  const std::string sizes = absl::GetFlag(FLAGS_sizes_mib);
  for (absl::string_view s : absl::StrSplit(sizes, ',')) {
    const bool kib = absl::ConsumeSuffix(&s, "K");
    int64_t n = 0;
    const int64_t unit = kib ? 1 << 10 : 1 << 20;
    if (!absl::SimpleAtoi(s, &n) || n < 1 || n > (int64_t{4096} << 20) / unit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--sizes_mib=", sizes, ": '", s, kib ? "K" : "",
          "' is not a size in MiB in [1, 4096], or in KiB with a K suffix "
          "(e.g. --sizes_mib=4,64,256 or --sizes_mib=4K,1024K)"));
    }
    c.sizes.push_back(n * unit);
  }
  c.iterations = absl::GetFlag(FLAGS_iterations);
  if (c.iterations < 1 || c.iterations > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--iterations=", c.iterations, ": must be in [1, 1000]"));
  }
  const std::string codecs = absl::GetFlag(FLAGS_compression);
  for (absl::string_view s : absl::StrSplit(codecs, ',')) {
    absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec(s);
    if (!codec.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--compression=", codecs, ": ", codec.status().message(),
          " (bench allreduce takes a comma-separated list, e.g. fp32,int8)"));
    }
    const std::string name = (*codec)->Name();
    if (std::find(c.codecs.begin(), c.codecs.end(), name) != c.codecs.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--compression=", codecs, ": '", name, "' twice"));
    }
    c.codecs.push_back(name);
  }
  c.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  if (c.chunk_bytes < 1024 || c.chunk_bytes > (4 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--chunk_bytes=", c.chunk_bytes, ": must be in [1024, 4194304]"));
  }
  return c;
}

// "4 MiB", or "64 KiB" below a whole MiB.
std::string SizeLabel(int64_t bytes) {
  return bytes % (1 << 20) == 0 ? absl::StrCat(bytes >> 20, " MiB")
                                : absl::StrCat(bytes >> 10, " KiB");
}

// The --sizes_mib spelling of `bytes`: "4", or "64K".
std::string SizeArg(int64_t bytes) {
  return bytes % (1 << 20) == 0 ? absl::StrCat(bytes >> 20)
                                : absl::StrCat(bytes >> 10, "K");
}

// ---------------------------------------------------------------------------
// The data: rank r contributes a pseudo-random pattern of multiples of 1/16
// in [-8, 8) with period kPeriod, so that every sum is exact in fp32 in any
// order and the expected result is known.

constexpr int64_t kPeriod = 4099;  // prime: not aligned with blocks/segments
constexpr float kMaxAbs = 8.0f;

float Pattern(int64_t k, int rank) {
  const uint32_t h = static_cast<uint32_t>(k) * 2654435761u +
                     static_cast<uint32_t>(rank + 1) * 40503u;
  return static_cast<float>((h >> 11) & 255) * 0.0625f - kMaxAbs;
}

void FillPeriodic(const std::vector<float>& table, absl::Span<float> out) {
  size_t k = 0;
  for (float& x : out) {
    x = table[k];
    if (++k == table.size()) k = 0;
  }
}

// The worst absolute error of a codec on a sum over `n` ranks of values in
// [-kMaxAbs, kMaxAbs]: each of the n encodings of a partial sum (n-1
// reduce-scatter hops, then the owner's) errs by at most the codec's step
// relative to the partial sum's magnitude. Negative: no bound (top-k).
double ErrorBound(const std::string& codec, int n) {
  double step;
  if (absl::StartsWith(codec, "fp32")) {
    return 0;
  } else if (absl::StartsWith(codec, "int8")) {
    step = 1.0 / 127;
  } else if (absl::StartsWith(codec, "int4")) {
    step = 1.0 / 7;
  } else if (absl::StartsWith(codec, "fp16")) {
    step = 1.0 / 1024;
  } else if (absl::StartsWith(codec, "bf16")) {
    step = 1.0 / 128;
  } else {
    return -1;
  }
  return step * kMaxAbs * n * (n + 1) / 2;
}

// A sum of the buffer's 32-bit words: equal on every rank iff (almost
// certainly) the bytes are.
int64_t Checksum(absl::Span<const float> data) {
  uint64_t a = 0, b = 0;
  const uint32_t* w = reinterpret_cast<const uint32_t*>(data.data());
  for (size_t i = 0; i < data.size(); ++i) {
    a += w[i];
    b += a;
  }
  return static_cast<int64_t>((a ^ (b << 17)) & ((uint64_t{1} << 62) - 1));
}

// ---------------------------------------------------------------------------
// One worker (rank): both all-reduces in this process.

struct Method {
  std::string name;                     // "gloo" or "starling/CODEC"
  std::string codec;                    // empty for gloo
  std::unique_ptr<PolicyCodec> policy;  // null for Gloo and fp32
  std::string tensor;                   // the mailbox tensor name
  std::vector<double> seconds;          // max over ranks, timed iterations
  // Process CPU time (all threads, user + system) during each timed
  // iteration, the mean over ranks.
  std::vector<double> cpu_seconds;
  int64_t bytes_sent = 0;  // by this rank in one all-reduce (Starling)
  int64_t wire_bytes = 0;  // ring payload bytes this rank sent (Starling)
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string Seconds(double s) { return absl::StrFormat("%.3f", s); }

// CPU time this process (every thread) has used so far.
double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// The host's CPU time so far from the "cpu" line of /proc/stat, in clock
// ticks summed over every CPU: all of it (user through steal) and what the
// hypervisor gave other guests while this VM wanted to run (steal). Zeros
// where the file cannot be read or parsed.
struct HostTicks {
  double total = 0;
  double steal = 0;
};
HostTicks ReadHostTicks() {
  absl::StatusOr<std::string> stat = ReadFile("/proc/stat");
  if (!stat.ok()) return {};
  absl::string_view line(*stat);
  line = line.substr(0, line.find('\n'));
  if (!absl::ConsumePrefix(&line, "cpu ")) return {};
  const std::vector<absl::string_view> fields =
      absl::StrSplit(line, ' ', absl::SkipEmpty());
  // user nice system idle iowait irq softirq steal (then guest time, which
  // user already counts).
  if (fields.size() < 8) return {};
  HostTicks t;
  for (size_t i = 0; i < 8; ++i) {
    double v = 0;
    if (!absl::SimpleAtod(fields[i], &v)) return {};
    t.total += v;
    if (i == 7) t.steal = v;
  }
  return t;
}

// Size `size`'s rows: its table rows appended to *md, and its JSON entry.
JsonObject SizeReport(int64_t size, int n, const std::vector<Method>& methods,
                      std::string* md) {
  const int64_t elems = size / 4;
  const double payload = static_cast<double>(elems) * 4;
  const double gloo = Median(methods[0].seconds);
  int64_t gloo_bytes = 0;  // the ring's: all but one segment, twice
  for (int s = 0; s < n - 1; ++s) gloo_bytes += SegmentLength(elems, n, s);
  gloo_bytes *= 2 * 4;
  JsonArray gloo_all;
  for (double x : methods[0].seconds) gloo_all.Push(x);
  JsonArray starling;
  const double gloo_cpu = Median(methods[0].cpu_seconds);
  absl::StrAppend(md, "| ", SizeLabel(size), " | Gloo | ", Seconds(gloo),
                  " | 1.00 | ", FormatBytes(gloo_bytes), " | ",
                  absl::StrFormat("%.2f", payload / gloo / 1e9), " | ",
                  Seconds(gloo_cpu), " |\n");
  for (size_t m = 1; m < methods.size(); ++m) {
    const double sec = Median(methods[m].seconds);
    const double cpu = Median(methods[m].cpu_seconds);
    JsonArray all;
    for (double x : methods[m].seconds) all.Push(x);
    JsonObject o;
    o.Add("compression", methods[m].codec)
        .Add("seconds", sec)
        .Add("seconds_all", all)
        .Add("ratio_to_gloo", sec / gloo)
        .Add("bytes_sent_per_rank", methods[m].bytes_sent)
        .Add("payload_bytes_sent_per_rank", methods[m].wire_bytes)
        .Add("algbw_GBps", payload / sec / 1e9)
        .Add("cpu_seconds_per_rank", cpu);
    starling.Push(o);
    absl::StrAppend(md, "| ", SizeLabel(size), " | Starling ", methods[m].codec,
                    " | ", Seconds(sec), " | ",
                    absl::StrFormat("%.2f", sec / gloo), " | ",
                    FormatBytes(static_cast<double>(methods[m].bytes_sent)),
                    " | ", absl::StrFormat("%.2f", payload / sec / 1e9), " | ",
                    Seconds(cpu), " |\n");
  }
  JsonObject entry;
  if (size % (1 << 20) == 0) {
    entry.Add("size_mib", size >> 20);
  } else {
    entry.Add("size_mib", static_cast<double>(size) / (1 << 20));
  }
  entry.Add("payload_bytes", static_cast<int64_t>(payload))
      .Add("gloo_seconds", gloo)
      .Add("gloo_seconds_all", gloo_all)
      .Add("gloo_bytes_sent_per_rank", gloo_bytes)
      .Add("gloo_algbw_GBps", payload / gloo / 1e9)
      .Add("gloo_cpu_seconds_per_rank", gloo_cpu)
      .Add("starling", starling);
  return entry;
}

// The share of the host's CPU time the hypervisor gave others since
// `host_start` (steal), or -1 when /proc/stat cannot tell.
double StealSince(const HostTicks& host_start) {
  const HostTicks host_end = ReadHostTicks();
  const double host_ticks = host_end.total - host_start.total;
  return host_ticks > 0 ? (host_end.steal - host_start.steal) / host_ticks : -1;
}

// The JSON and markdown reports, written by rank 0. `host_start`: the
// host's ticks when the bench began.
absl::Status WriteReports(const BenchConfig& c,
                          const std::vector<std::vector<Method>>& results,
                          const HostTicks& host_start) {
  const int n = c.nodes;
  const std::string date = absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", absl::Now(),
                                            absl::LocalTimeZone());
  const unsigned cores = std::thread::hardware_concurrency();
  JsonArray sizes;
  std::string md = absl::StrCat(
      "# All-reduce: Starling vs Gloo\n\n", n, " processes on 127.0.0.1, ",
      cores, " CPU cores, ", date, ". Median of ", c.iterations,
      " timed all-reduces per row (after one warm-up); each all-reduce's "
      "time is the slowest rank's. Ratio = Starling / Gloo (below 1: "
      "Starling is faster). Gloo's bytes per rank are its ring's "
      "2(N-1)/N of the payload. CPU s per rank: the CPU time (user + "
      "system, every thread) one worker process used during the "
      "all-reduce, the mean over ranks (median over iterations); with "
      "more processes than cores, the method that needs more CPU waits "
      "for it.\n\n",
      "| size | method | median s | ratio to Gloo | sent per rank | "
      "algbw GB/s | CPU s per rank |\n",
      "|---:|---|---:|---:|---:|---:|---:|\n");
  for (size_t i = 0; i < c.sizes.size(); ++i) {
    sizes.Push(SizeReport(c.sizes[i], n, results[i], &md));
  }
  // The same code's ratios have differed by 1.5x between days on one VM
  // type: say how loaded this one was.
  const double steal = StealSince(host_start);
  if (steal >= 0) {
    absl::StrAppend(
        &md, absl::StrFormat(
                 "\nThe hypervisor gave %.1f%% of this VM's CPU time to others "
                 "during the run (steal in /proc/stat); a loaded VM's ratios "
                 "are not comparable with a quiet one's.\n",
                 100 * steal));
  }
  absl::StrAppend(&md,
                  "\nTargets (issue #7): uncompressed Starling within 1.25x "
                  "of Gloo; with int8, faster than Gloo.\n");
  JsonArray codecs;
  for (const std::string& s : c.codecs) codecs.Push(s);
  JsonObject root;
  root.Add("benchmark", "allreduce")
      .Add("date", date)
      .Add("cpu_cores", static_cast<int64_t>(cores))
      .Add("nodes", static_cast<int64_t>(n))
      .Add("transport", "grpc loopback 127.0.0.1")
      .Add("iterations", static_cast<int64_t>(c.iterations))
      .Add("warmup_iterations", static_cast<int64_t>(1))
      .Add("timing", "median over iterations of the slowest rank's seconds")
      .Add("cpu_timing",
           "median over iterations of the mean over ranks of each worker "
           "process's CPU seconds (user + system, all threads)")
      .Add("chunk_bytes", c.chunk_bytes)
      .Add("gloo_threads", static_cast<int64_t>(2))
      .Add("compression", codecs);
  if (steal >= 0) root.Add("host_steal_fraction", steal);
  root.Add("sizes", sizes);
  STARLING_RETURN_IF_ERROR(WriteFileAtomic(
      absl::StrCat(c.out, "/allreduce.json"), root.Dump() + "\n"));
  return WriteFileAtomic(absl::StrCat(c.out, "/allreduce.md"), md);
}

// Gloo's process group, as torch.distributed builds it for backend="gloo"
// (two worker threads, a TCP device on the loopback address).
c10::intrusive_ptr<::c10d::ProcessGroupGloo> StartGloo(
    const c10::intrusive_ptr<::c10d::Store>& store, int rank, int n) {
  auto gloo_options =
      ::c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(300));
  gloo_options->devices.push_back(
      ::c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  gloo_options->threads = 2;
  return c10::make_intrusive<::c10d::ProcessGroupGloo>(store, rank, n,
                                                       gloo_options);
}

// The methods of each size, Gloo's first, and the tensors Starling's take
// (one mailbox tensor per size and codec) in *mailbox.
absl::StatusOr<std::vector<std::vector<Method>>> MakeMethods(
    const BenchConfig& c, MailboxOptions* mailbox) {
  std::vector<std::vector<Method>> results(c.sizes.size());
  for (size_t i = 0; i < c.sizes.size(); ++i) {
    const int64_t elems = c.sizes[i] / 4;
    Method gloo;
    gloo.name = "gloo";
    results[i].push_back(std::move(gloo));
    for (const std::string& codec : c.codecs) {
      Method m;
      m.codec = codec;
      m.name = absl::StrCat("starling/", codec);
      m.tensor = absl::StrCat(SizeArg(c.sizes[i]), "/", codec);
      if (codec != "fp32") {
        PolicyOptions po;
        po.main = codec;
        STARLING_ASSIGN_OR_RETURN(m.policy, PolicyCodec::Create({elems}, po));
        mailbox->compressed_bytes_per_element[m.tensor] = 8;
      }
      mailbox->tensors[m.tensor] = elems;
      results[i].push_back(std::move(m));
    }
  }
  return results;
}

// Starling's transport, connected to every rank: each publishes its
// address in the store and reads the others'.
absl::StatusOr<std::unique_ptr<GrpcTransport>> StartStarling(
    const BenchConfig& c, int rank, ::c10d::Store& store,
    const MailboxOptions& mailbox) {
  const int n = c.nodes;
  int64_t total_elements = 0;
  for (int64_t size : c.sizes) total_elements += size / 4;
  PeerIdentity id;
  id.run_id = mailbox.run_id;
  id.algo = "diloco";
  id.world = n;
  id.compression = absl::StrJoin(c.codecs, ",");
  id.model = MakeFingerprint("bench", total_elements, "0");
  GrpcTransportOptions to;
  to.listen = "127.0.0.1:0";
  to.chunk_bytes = c.chunk_bytes;
  STARLING_ASSIGN_OR_RETURN(std::unique_ptr<GrpcTransport> transport,
                            GrpcTransport::Start(to, id));
  const std::string address = transport->address();
  store.set(absl::StrCat("starling/address/", rank),
            std::vector<uint8_t>(address.begin(), address.end()));
  std::vector<std::string> members;
  for (int r = 0; r < n; ++r) {
    std::vector<uint8_t> a = store.get(absl::StrCat("starling/address/", r));
    members.emplace_back(a.begin(), a.end());
  }
  STARLING_RETURN_IF_ERROR(transport->Connect(members, rank, mailbox,
                                              absl::Now() + absl::Seconds(60)));
  return transport;
}

// Checks `buf`, the result of method `m` at size `size`, against the exact
// sum (`sum`, one period of it) within the codec's error bound.
absl::Status CheckSum(const Method& m, int64_t size, int n,
                      absl::Span<const float> buf,
                      const std::vector<float>& sum) {
  const double bound = ErrorBound(m.codec.empty() ? "fp32" : m.codec, n);
  size_t k = 0;
  for (size_t e = 0; e < buf.size(); ++e) {
    const float want = sum[k];
    if (++k == sum.size()) k = 0;
    const float got = buf[e];
    const bool ok = bound == 0  ? got == want
                    : bound > 0 ? std::fabs(got - want) <= bound
                                : std::isfinite(got);
    if (!ok) {
      return absl::InternalError(
          absl::StrFormat("%s, %s: element %d is %.9g, the exact sum is %.9g "
                          "(allowed error %g): the all-reduce is wrong",
                          m.name, SizeLabel(size), static_cast<int64_t>(e), got,
                          want, std::max(bound, 0.0)));
    }
  }
  return absl::OkStatus();
}

// One worker's state across its all-reduces.
struct Worker {
  const BenchConfig& c;
  int rank;
  ::c10d::ProcessGroupGloo& pg;
  GrpcTransport& transport;
  int64_t round = 0;  // Starling's next all-reduce round
};

// What one all-reduce measured on this rank.
struct Sample {
  double seconds = 0;
  double cpu_seconds = 0;
  int64_t checksum = 0;
};

// One all-reduce of `m` over `buf` (filled with this rank's `mine`),
// timed from a barrier, and its result checked against `sum`.
absl::StatusOr<Sample> AllReduceOnce(
    Worker& w, Method& m, int64_t size, const std::vector<float>& mine,
    const std::vector<float>& sum,
    const std::shared_ptr<std::vector<float>>& shared,
    std::vector<at::Tensor>& gloo_tensors) {
  std::vector<float>& buf = *shared;
  FillPeriodic(mine, absl::MakeSpan(buf));
  RingStats stats;
  w.pg.barrier()->wait();
  const int64_t sent_before = w.transport.bytes_sent();
  const double cpu_start = ProcessCpuSeconds();
  const absl::Time start = absl::Now();
  if (m.codec.empty()) {
    w.pg.allreduce(gloo_tensors)->wait();
  } else {
    w.transport.mailbox().AdvanceRound(w.round);
    RingOptions ro;
    ro.tensor = m.tensor;
    ro.round = w.round++;
    ro.codec = m.policy.get();
    ro.stats = &stats;
    ro.data_owner = shared;
    STARLING_RETURN_IF_ERROR(
        RingAllReduceSum(w.transport, absl::MakeSpan(buf), ro));
  }
  Sample sample;
  sample.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  sample.cpu_seconds = ProcessCpuSeconds() - cpu_start;
  m.bytes_sent = w.transport.bytes_sent() - sent_before;
  m.wire_bytes = stats.wire_bytes;
  STARLING_RETURN_IF_ERROR(CheckSum(m, size, w.c.nodes, buf, sum));
  sample.checksum = Checksum(buf);
  return sample;
}

// Per method, over the ranks: the slowest rank's time, the ranks' mean CPU
// time, and whether all hold the same bytes. Records them in `methods`
// unless `warm_up`; returns the progress line's entries.
absl::StatusOr<std::vector<std::string>> Gather(
    Worker& w, int64_t size, bool warm_up, const std::vector<Sample>& samples,
    std::vector<Method>& methods) {
  const int count = static_cast<int>(methods.size());
  std::vector<double> seconds(count), cpu(count);
  std::vector<int64_t> checksums(count);
  for (int m = 0; m < count; ++m) {
    seconds[m] = samples[m].seconds;
    cpu[m] = samples[m].cpu_seconds;
    checksums[m] = samples[m].checksum;
  }
  at::Tensor t = at::tensor(seconds, at::kDouble);
  at::Tensor cpu_sum = at::tensor(cpu, at::kDouble);
  at::Tensor lo = at::tensor(checksums, at::kLong);
  at::Tensor hi = lo.clone();
  std::vector<at::Tensor> v = {t};
  ::c10d::AllreduceOptions max;
  max.reduceOp = ::c10d::ReduceOp::MAX;
  w.pg.allreduce(v, max)->wait();
  v = {hi};
  w.pg.allreduce(v, max)->wait();
  ::c10d::AllreduceOptions min;
  min.reduceOp = ::c10d::ReduceOp::MIN;
  v = {lo};
  w.pg.allreduce(v, min)->wait();
  v = {cpu_sum};
  w.pg.allreduce(v)->wait();  // SUM
  std::vector<std::string> line;
  for (int m = 0; m < count; ++m) {
    if (lo[m].item<int64_t>() != hi[m].item<int64_t>()) {
      return absl::InternalError(
          absl::StrCat(methods[m].name, ", ", SizeLabel(size),
                       ": the ranks ended with different bytes"));
    }
    const double s = t[m].item<double>();
    if (!warm_up) {
      methods[m].seconds.push_back(s);
      methods[m].cpu_seconds.push_back(cpu_sum[m].item<double>() / w.c.nodes);
    }
    line.push_back(
        absl::StrCat(m == 0 ? "gloo" : methods[m].codec, " ", Seconds(s), "s"));
  }
  return line;
}

// Every method at payload size `size`: one warm-up, then the timed
// iterations, each method taking its turn on the same buffer.
absl::Status RunSize(Worker& w, int64_t size, std::vector<Method>& methods) {
  const int n = w.c.nodes;
  const int64_t elems = size / 4;
  const int count = static_cast<int>(methods.size());
  std::vector<float> mine(kPeriod), sum(kPeriod, 0.0f);
  for (int64_t k = 0; k < kPeriod; ++k) {
    mine[k] = Pattern(k, w.rank);
    for (int r = 0; r < n; ++r) sum[k] += Pattern(k, r);
  }
  // Shared, so that Starling's fp32 sends go out from it with no copy, as
  // in `starling node` (a run that fails ends the bench, so nothing
  // writes into memory a failed send still holds).
  auto shared = std::make_shared<std::vector<float>>(elems);
  at::Tensor tensor = at::from_blob(shared->data(), {elems}, at::kFloat);
  std::vector<at::Tensor> gloo_tensors = {tensor};
  for (int it = 0; it <= w.c.iterations; ++it) {  // iteration 0: warm-up
    std::vector<Sample> samples(count);
    // Rotate the order so that no method always runs first.
    for (int j = 0; j < count; ++j) {
      const int m = (j + it) % count;
      STARLING_ASSIGN_OR_RETURN(
          samples[m],
          AllReduceOnce(w, methods[m], size, mine, sum, shared, gloo_tensors));
    }
    STARLING_ASSIGN_OR_RETURN(std::vector<std::string> line,
                              Gather(w, size, it == 0, samples, methods));
    if (w.rank == 0) {
      WriteStderrLine(absl::StrCat(
          "bench allreduce: ", SizeLabel(size), " ",
          it == 0 ? "warm-up" : absl::StrCat(it, "/", w.c.iterations), ": ",
          absl::StrJoin(line, ", ")));
    }
  }
  return absl::OkStatus();
}

absl::Status RunWorker(const BenchConfig& c, int rank,
                       const std::string& store_path) {
  const HostTicks host_start = ReadHostTicks();
  auto store = c10::make_intrusive<::c10d::FileStore>(store_path, c.nodes);
  c10::intrusive_ptr<::c10d::ProcessGroupGloo> pg =
      StartGloo(store, rank, c.nodes);
  MailboxOptions mailbox;
  mailbox.run_id = "bench-allreduce";
  STARLING_ASSIGN_OR_RETURN(std::vector<std::vector<Method>> results,
                            MakeMethods(c, &mailbox));
  STARLING_ASSIGN_OR_RETURN(std::unique_ptr<GrpcTransport> transport,
                            StartStarling(c, rank, *store, mailbox));
  Worker w{c, rank, *pg, *transport};
  for (size_t i = 0; i < c.sizes.size(); ++i) {
    STARLING_RETURN_IF_ERROR(RunSize(w, c.sizes[i], results[i]));
  }
  pg->barrier()->wait();
  if (rank == 0) {
    STARLING_RETURN_IF_ERROR(WriteReports(c, results, host_start));
  }
  pg->barrier()->wait();
  transport->Shutdown();
  return absl::OkStatus();
}

int Worker(const BenchConfig& c, const std::string& spec) {
  std::pair<std::string, std::string> parts =
      absl::StrSplit(spec, absl::MaxSplits(':', 1));
  int rank = -1;
  if (!absl::SimpleAtoi(parts.first, &rank) || rank < 0 || rank >= c.nodes ||
      parts.second.empty()) {
    WriteStderrLine(absl::StrCat("starling bench allreduce: bad ", kWorkerEnv,
                                 "='", spec, "'"));
    return 2;
  }
  absl::Status s;
  try {
    s = RunWorker(c, rank, parts.second);
  } catch (const std::exception& e) {
    s = absl::InternalError(absl::StrCat("c10d/Gloo: ", e.what()));
  }
  if (!s.ok()) {
    WriteStderrLine(absl::StrCat("starling bench allreduce: rank ", rank,
                                 ": error: ", s.message()));
    return 1;
  }
  return 0;
}

// Starts one worker process per rank (this binary again, told its rank and
// Gloo's store through kWorkerEnv) and waits for all of them; when one
// fails, stops the others, which would otherwise wait for it until Gloo's
// timeout. 0 when every worker succeeded.
int RunWorkers(const BenchConfig& c, const std::string& store) {
  std::vector<std::string> args = {
      "starling",
      "bench",
      "allreduce",
      absl::StrCat("--out=", c.out),
      absl::StrCat("--nodes=", c.nodes),
      absl::StrCat("--sizes_mib=",
                   absl::StrJoin(c.sizes, ",",
                                 [](std::string* out, int64_t b) {
                                   out->append(SizeArg(b));
                                 })),
      absl::StrCat("--iterations=", c.iterations),
      absl::StrCat("--compression=", absl::StrJoin(c.codecs, ",")),
      absl::StrCat("--chunk_bytes=", c.chunk_bytes)};
  std::vector<pid_t> pids;
  for (int r = 0; r < c.nodes; ++r) {
    const std::string env = absl::StrCat(kWorkerEnv, "=", r, ":", store);
    pid_t pid = ::fork();
    if (pid < 0) {
      WriteStderrLine("starling bench allreduce: error: fork failed");
      for (pid_t p : pids) ::kill(p, SIGTERM);
      return 1;
    }
    if (pid == 0) {
      ::putenv(const_cast<char*>(env.c_str()));
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv("/proc/self/exe", argv.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  std::vector<bool> running(pids.size(), true);
  for (size_t left = pids.size(); left > 0; --left) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) break;
    const size_t rank = std::find(pids.begin(), pids.end(), pid) - pids.begin();
    if (rank < running.size()) running[rank] = false;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    if (rc == 0) {
      WriteStderrLine(absl::StrCat(
          "starling bench allreduce: error: worker rank ", rank,
          WIFEXITED(status)
              ? absl::StrCat(" exited with ", WEXITSTATUS(status))
              : absl::StrCat(" died of signal ", WTERMSIG(status))));
      for (size_t r = 0; r < pids.size(); ++r) {
        if (running[r]) ::kill(pids[r], SIGTERM);
      }
    }
    rc = 1;
  }
  return rc;
}

}  // namespace
#endif  // STARLING_WITH_GLOO

const Subcommand& BenchSubcommand() {
  static const Subcommand* sub = new Subcommand{
      "bench",
      "allreduce: Starling's ring all-reduce vs PyTorch Gloo's, same run",
      "Starts --nodes worker processes on 127.0.0.1. In each, for every size "
      "in --sizes_mib, PyTorch's Gloo all-reduce (c10d ProcessGroupGloo) and "
      "Starling's ring all-reduce over gRPC with each --compression codec "
      "(a comma-separated list) reduce the same fp32 buffer, taking turns, "
      "one warm-up then --iterations timed runs each. Every result is checked "
      "against the exact sum (within the codec's error bound when lossy) and "
      "across ranks. Writes allreduce.json and allreduce.md into --out "
      "(default runs/bench-allreduce-TIMESTAMP) and prints the table.\n"
      "example:\n"
      "  starling bench allreduce --out=runs/ar --sizes_mib=4,64,256",
      {"out", "nodes", "sizes_mib", "iterations", "compression", "chunk_bytes"},
      "allreduce",
      {{"compression", "fp32,int8"}},
      {{"out",
        "directory for allreduce.json and allreduce.md; empty = "
        "runs/bench-allreduce-TIMESTAMP"},
       {"nodes", "worker processes (ranks), 2 to 64"},
       {"compression",
        "Starling codecs to measure, comma-separated: fp32 (raw) and any "
        "--compression spec, e.g. fp32,int8,int8+zstd"},
       {"chunk_bytes", "Starling's gRPC stream chunk size in bytes"}}};
  return *sub;
}

int RunBenchCommand() {
#ifndef STARLING_WITH_GLOO
  WriteStderrLine(
      "starling bench allreduce: error: this starling was built without "
      "Gloo (-DSTARLING_WITH_GLOO=OFF, as against a LibTorch whose Gloo "
      "headers are not at hand), and the bench measures against Gloo's "
      "all-reduce; build with Debian's LibTorch and libgloo-dev");
  return 2;
#else
  absl::StatusOr<BenchConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    WriteStderrLine(absl::StrCat("starling bench allreduce: error: ",
                                 config.status().message()));
    return 2;
  }
  BenchConfig& c = *config;
  if (const char* spec = std::getenv(kWorkerEnv); spec != nullptr) {
    return Worker(c, spec);
  }
  if (c.out.empty()) {
    c.out = absl::StrCat(
        "runs/bench-allreduce-",
        absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone()));
  }
  if (absl::Status s = MakeDirs(c.out); !s.ok()) {
    WriteStderrLine(absl::StrCat(
        "starling bench allreduce: error: --out=", c.out, ": ", s.message()));
    return 2;
  }
  // Gloo's rendezvous: a FileStore in a fresh temporary directory.
  std::string tmp =
      (std::filesystem::temp_directory_path() / "starling-bench-XXXXXX")
          .string();
  if (::mkdtemp(tmp.data()) == nullptr) {
    WriteStderrLine(absl::StrCat("starling bench allreduce: error: mkdtemp ",
                                 tmp, " failed"));
    return 1;
  }
  const std::string store = tmp + "/store";
  WriteStderrLine(absl::StrCat(
      "bench allreduce: ", c.nodes, " processes, sizes ",
      absl::StrJoin(
          c.sizes, ",",
          [](std::string* out, int64_t b) { out->append(SizeLabel(b)); }),
      ", gloo vs starling ", absl::StrJoin(c.codecs, ","), ", ", c.iterations,
      " timed iterations each; writing ", c.out));
  const int rc = RunWorkers(c, store);
  std::error_code ignored;
  std::filesystem::remove_all(tmp, ignored);
  if (rc != 0) return rc;
  absl::StatusOr<std::string> md = ReadFile(c.out + "/allreduce.md");
  if (!md.ok()) {
    WriteStderrLine(absl::StrCat("starling bench allreduce: error: ",
                                 md.status().message()));
    return 1;
  }
  std::fputs(md->c_str(), stdout);
  WriteStderrLine(absl::StrCat("bench allreduce: wrote ", c.out,
                               "/allreduce.json and ", c.out, "/allreduce.md"));
  return 0;
#endif  // STARLING_WITH_GLOO
}

}  // namespace starling
