#include "core/memory.h"

#include <malloc.h>

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/file_util.h"
#include "core/logging.h"

// ASan's allocator replaces glibc's, and counts its own bytes.
#if defined(__SANITIZE_ADDRESS__)
#define STARLING_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STARLING_ASAN 1
#endif
#endif
#ifdef STARLING_ASAN
#include <sanitizer/allocator_interface.h>
#endif

namespace starling {
namespace {

// "  12345 kB" (a /proc field's value) in bytes.
bool KibToBytes(absl::string_view text, int64_t* bytes) {
  int64_t kib = 0;
  if (!absl::SimpleAtoi(
          absl::StripSuffix(absl::StripAsciiWhitespace(text), " kB"), &kib)) {
    return false;
  }
  *bytes = kib * 1024;
  return true;
}

}  // namespace

int64_t HeapBytesInUse() {
#ifdef STARLING_ASAN
  return static_cast<int64_t>(__sanitizer_get_current_allocated_bytes());
#elif defined(__GLIBC__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
#else
  return 0;
#endif
}

void ReleaseFreeHeap() {
#if defined(__GLIBC__) && !defined(STARLING_ASAN)
  malloc_trim(0);
#endif
}

ResidentMemory ResidentMemoryNow() {
  ResidentMemory out;
  absl::StatusOr<std::string> status = ReadFile("/proc/self/status");
  for (absl::string_view line :
       absl::StrSplit(status.ok() ? *status : "", '\n')) {
    if (absl::ConsumePrefix(&line, "VmRSS:")) KibToBytes(line, &out.rss);
    if (absl::ConsumePrefix(&line, "VmHWM:")) KibToBytes(line, &out.peak);
    if (absl::ConsumePrefix(&line, "RssAnon:")) KibToBytes(line, &out.anon);
    if (absl::ConsumePrefix(&line, "RssFile:")) KibToBytes(line, &out.file);
  }
  return out;
}

AvailableMemory AvailableMemoryNow() {
  AvailableMemory out;
  auto number = [](absl::string_view text, int64_t* value) {
    return absl::SimpleAtoi(
        absl::StripSuffix(absl::StripAsciiWhitespace(text), " kB"), value);
  };
  if (absl::StatusOr<std::string> info = ReadFile("/proc/meminfo"); info.ok()) {
    for (absl::string_view line : absl::StrSplit(*info, '\n')) {
      int64_t kib = 0;
      if (absl::ConsumePrefix(&line, "MemAvailable:") && number(line, &kib)) {
        out = {kib * 1024, "MemAvailable in /proc/meminfo"};
      }
    }
  }
  // /proc/self/cgroup names the cgroup ("0::/PATH" in v2, "N:memory:/PATH"
  // in v1) as the host sees it; a container that mounts its own cgroup at
  // the root of /sys/fs/cgroup has its limit there instead.
  absl::StatusOr<std::string> cgroup = ReadFile("/proc/self/cgroup");
  for (absl::string_view line :
       absl::StrSplit(cgroup.ok() ? *cgroup : "", '\n')) {
    std::string root, limit_file, usage_file;
    if (absl::ConsumePrefix(&line, "0::")) {
      root = "/sys/fs/cgroup";
      limit_file = "memory.max";
      usage_file = "memory.current";
    } else if (std::vector<absl::string_view> f =
                   absl::StrSplit(line, absl::MaxSplits(':', 2));
               f.size() == 3 && absl::StrContains(f[1], "memory")) {
      line = f[2];
      root = "/sys/fs/cgroup/memory";
      limit_file = "memory.limit_in_bytes";
      usage_file = "memory.usage_in_bytes";
    } else {
      continue;
    }
    for (const std::string& dir : {absl::StrCat(root, line), root}) {
      absl::StatusOr<std::string> limit_text = ReadFile(dir + "/" + limit_file);
      absl::StatusOr<std::string> usage_text = ReadFile(dir + "/" + usage_file);
      int64_t limit = 0, used = 0;
      if (!limit_text.ok() || !usage_text.ok()) continue;
      // "max" (v2) or a huge number (v1) when there is no limit.
      if (number(*limit_text, &limit) && number(*usage_text, &used) &&
          (out.bytes < 0 || limit - used < out.bytes)) {
        out = {std::max<int64_t>(0, limit - used),
               absl::StrCat("the headroom under ", dir, "/", limit_file)};
      }
      break;
    }
  }
  return out;
}

namespace {

// Measured by bench/memory.py (docs/results/2026-12-07-memory.md), where
// counting from the code is not practical:
// - the backward pass's own transients (gradients of the activations, the
//   optimizer step's temporaries), per byte of activations;
constexpr double kBackwardPerActivation = 0.5;
// - the transport's buffers during a round's exchange (ring all-reduce
//   segments, each hop's encoded and decoded partial sums, gRPC's
//   messages, the allocator's arenas of the threads that hold them), in
//   copies of the weights: a ring, whatever its dense codec (fp32 sends
//   segments as they are, int8 re-encodes them at every hop: fitted at 4.3
//   and 3.9 copies over the 3M and 19M runs), and the sparse codec's
//   gather of every member's encoded contribution (2.9);
// - a node's runtime beyond the process a trainer measures before its
//   model: the gRPC server's and clients' threads and the swarm's own
//   (their stacks, the allocator's arena per thread), gRPC's channels, and
//   the code paged in once the node runs (RssFile grows from about 106 to
//   135 MB), whatever the model's size: 20 to 56 MB over the other items,
//   most of a node at 0.1M parameters.
// Each is set above what was fitted, so that the plan bounds the peak of
// every node in five runs of each configuration by 10% or more: one
// configuration's peak varies by up to 5% (19M) and 7% (3M) between runs.
constexpr double kTransportCopiesRing = 6.0;
constexpr double kTransportCopiesSparse = 3.5;
constexpr double kNodeRuntimeBytes = 96.0 * (1 << 20);
// node/main.cc keeps up to this much freed heap for reuse
// (M_TRIM_THRESHOLD): an inner step's transients stay resident through the
// phases that follow it.
constexpr double kKeptFreeHeap = 512.0 * (1 << 20);

double Sum(const std::vector<MemoryItem>& items) {
  double total = 0;
  for (const MemoryItem& i : items) total += i.bytes;
  return total;
}

}  // namespace

double MemoryEstimate::Held() const { return Sum(held); }

std::string MemoryEstimate::PeakPhase() const {
  const double s = Sum(step), r = Sum(round), c = Sum(checkpoint);
  if (r > s && r >= c) return "round";
  if (c > s && c > r) return "checkpoint";
  return "step";
}

double MemoryEstimate::Peak() const {
  return Held() + std::max({Sum(step), Sum(round), Sum(checkpoint)});
}

double RunPeak(const MemoryEstimate& each, int nodes, double launcher_bytes) {
  return nodes * (each.Peak() - each.shared) + each.shared + launcher_bytes;
}

std::string MemoryEstimate::Describe() const {
  const std::string phase = PeakPhase();
  std::vector<MemoryItem> items = held;
  const std::vector<MemoryItem>& top = phase == "round"        ? round
                                       : phase == "checkpoint" ? checkpoint
                                                               : step;
  items.insert(items.end(), top.begin(), top.end());
  std::stable_sort(items.begin(), items.end(),
                   [](const MemoryItem& a, const MemoryItem& b) {
                     return a.bytes > b.bytes;
                   });
  std::string out = absl::StrCat(FormatBytes(Peak()), " at peak (",
                                 phase == "round"        ? "a round's exchange"
                                 : phase == "checkpoint" ? "a checkpoint"
                                                         : "an inner step",
                                 "): ");
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].bytes <= 0) continue;
    absl::StrAppend(&out, i > 0 ? ", " : "", FormatBytes(items[i].bytes), " ",
                    items[i].what);
  }
  return out;
}

MemoryEstimate EstimateMemory(const MemoryPlanOptions& o) {
  const double copy = 4.0 * static_cast<double>(o.parameters);
  const bool diloco = o.algo == "diloco", gossip = o.algo == "gossip";
  const bool ddp = o.algo == "ddp";
  // With the residual in the model (DiLoCo without --overlap), the node
  // rebuilds its own model θ_global − e around rounds and checkpoints.
  const bool ef_in_model = o.error_feedback && diloco && !o.overlap;
  MemoryEstimate e;
  auto add = [](std::vector<MemoryItem>& to, std::string what, double bytes) {
    if (bytes > 0) to.push_back({std::move(what), bytes});
  };

  // For the whole run.
  add(e.held, "of the process itself (data, threads)", o.process_bytes);
  add(e.held, "of code (shared by the processes of one binary)", o.code_bytes);
  e.shared = o.code_bytes;
  add(e.held, "of the node's runtime (gRPC, the swarm's threads)",
      o.algo == "train" ? 0 : kNodeRuntimeBytes);
  add(e.held, "of weights", copy);
  if (o.optimizer == "sgd") {
    add(e.held, "of SGD momentum", o.sgd_momentum ? copy : 0);
  } else {
    add(e.held,
        absl::StrCat("of ", o.optimizer == "adam" ? "Adam" : "AdamW",
                     " moments"),
        2 * copy);
  }
  if (diloco) {
    add(e.held, "of θ_global", copy);  // RunDiloco's theta_global
    add(e.held, "of outer momentum", o.outer_momentum ? copy : 0);
    // --overlap: the round in flight outlives the loop iteration that
    // launched it (its start, the ring's input and buffer).
    add(e.held, "of the round in flight", o.overlap ? 3 * copy : 0);
  }
  if (gossip) {
    add(e.held, "of the push-sum model", copy);  // RunGossip's y
    add(e.held, "of gossip momentum", o.gossip_momentum ? 2 * copy : 0);
  }
  add(e.held, "of error-feedback residual", o.error_feedback ? copy : 0);

  // An inner step: Trainer::Step's gradients live from the backward pass
  // to the optimizer step.
  add(e.step, "of gradients", copy);
  add(e.step, "of activations", o.activation_bytes);
  add(e.step, "of the backward pass's transients",
      kBackwardPerActivation * o.activation_bytes);
  // ddp: the flat gradients and the all-reduce's working copy.
  add(e.step, "of flat gradients for the all-reduce", ddp ? 2 * copy : 0);

  // What the allocator keeps of the last step through the phases after it.
  const double kept = std::min(
      kKeptFreeHeap, (1 + kBackwardPerActivation) * o.activation_bytes + copy);
  if (diloco) {
    add(e.round, "of freed step memory the allocator keeps", kept);
    // RunDiloco: Δ, the ring's input, and each attempt's working copy.
    add(e.round, "of Δ and the ring's input and working copy", 3 * copy);
    add(e.round, "of the error feedback's compressed Δ and saved residual",
        o.error_feedback ? 2 * copy : 0);
    add(e.round, "of the node's own model", ef_in_model ? copy : 0);
    add(e.round, "of the overlapped round's start", o.overlap ? copy : 0);
    add(e.round, "of transport buffers",
        (o.sparse ? kTransportCopiesSparse : kTransportCopiesRing) * copy);
  }
  if (gossip) {
    add(e.round, "of freed step memory the allocator keeps", kept);
    // A push's share and the pushes received (RunGossip, PushSum).
    add(e.round, "of push buffers", 2 * copy);
  }
  if (o.checkpoints) {
    add(e.checkpoint, "of freed step memory the allocator keeps", kept);
    // The node's own sections, passed as strings (OuterOptimizer::SaveState,
    // ErrorFeedback::SaveState); the trainer's tensors go to the file from
    // their own memory.
    add(e.checkpoint, "of the outer optimizer's saved state",
        diloco && o.outer_momentum ? copy : 0);
    add(e.checkpoint, "of the error feedback's saved state",
        o.error_feedback ? copy : 0);
    add(e.checkpoint, "of the node's own model", ef_in_model ? copy : 0);
  }
  return e;
}

}  // namespace starling
