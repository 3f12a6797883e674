// What a process holds in memory: the heap in use (glibc's or the sanitizer
// allocator's count), the memory still available to this process
// (MemAvailable, capped by its memory cgroup), this process's resident set
// (/proc/self/status); and what a `starling train` or `starling node`
// process will hold (EstimateMemory, the plan behind the start-up check,
// Trainer::CheckMemory): every model-sized buffer, by phase, counted from
// what the code allocates and checked against RSS measured by
// bench/memory.py (tests/core/memory_test.cc).
// Free functions, no shared state: thread-safe.
#ifndef STARLING_CORE_MEMORY_H_
#define STARLING_CORE_MEMORY_H_

#include <cstdint>
#include <string>
#include <vector>

namespace starling {

// Bytes the C++ heap hands out now (LibTorch's CPU allocator is
// posix_memalign): the sanitizer allocator's count under ASan, else
// glibc's over all its arenas and mapped blocks; 0 where neither is there.
int64_t HeapBytesInUse();

// Gives the heap's free pages back to the system (glibc's malloc_trim): a
// process whose allocator keeps freed memory for reuse (node/main.cc keeps
// up to 512 MiB) drops the activations of its last inner step this way
// before a phase that allocates other buffers (a round's exchange).
void ReleaseFreeHeap();

// The memory this process may still take, and where that figure comes
// from: MemAvailable in /proc/meminfo, capped by the headroom under its
// memory cgroup's limit (a container's: v2 memory.max, v1
// memory.limit_in_bytes). Bytes -1 when unknown.
struct AvailableMemory {
  int64_t bytes = -1;
  std::string source;
};
AvailableMemory AvailableMemoryNow();

// This process's resident set from /proc/self/status, in bytes; -1 where
// unknown. `anon` is its private memory; `file` the mapped files' pages
// (the binary and its libraries), which processes of one binary share.
struct ResidentMemory {
  int64_t rss = -1;   // VmRSS
  int64_t peak = -1;  // VmHWM
  int64_t anon = -1;  // RssAnon
  int64_t file = -1;  // RssFile
};
ResidentMemory ResidentMemoryNow();

// What one process of a run is, for its memory plan.
struct MemoryPlanOptions {
  std::string algo = "train";       // train | diloco | gossip | ddp
  std::string optimizer = "adamw";  // adamw | adam | sgd
  bool sgd_momentum = true;         // sgd with --momentum > 0
  bool outer_momentum = true;       // diloco --outer=nesterov
  // --compression is the sparse codec (compression/codec.h IsSparseSpec):
  // its rounds gather every member's encoded contribution, not a ring.
  bool sparse = false;
  bool error_feedback = false;  // the node keeps a residual
  bool overlap = false;         // diloco --overlap
  bool checkpoints = true;      // a checkpoint is written at all
  // Gossip's momentum (--gossip_momentum > 0): the anchor and its buffer.
  bool gossip_momentum = false;
  int64_t parameters = 0;  // trainable fp32 values
  // What an inner step's forward pass holds for the backward pass, at the
  // run's --batch (Trainer measures it); 0 when unknown.
  double activation_bytes = 0;
  // The process without its model: its private memory (data, threads'
  // heaps; Trainer measures its own RssAnon before it builds the model); 0
  // when unknown.
  double process_bytes = 0;
  // The pages of the binary and its libraries the process has mapped in
  // (RssFile, measured with process_bytes): resident in every process, and
  // shared between the processes of one binary.
  double code_bytes = 0;
};

struct MemoryItem {
  std::string what;
  double bytes = 0;
};

// What one process holds: `held` for the whole run, and on top of it, at
// any moment, one of its phases.
struct MemoryEstimate {
  std::vector<MemoryItem> held;
  std::vector<MemoryItem> step;        // an inner step
  std::vector<MemoryItem> round;       // a round's exchange
  std::vector<MemoryItem> checkpoint;  // a checkpoint being written
  // The part of `held` that processes of one binary share (its code pages):
  // counted once for several processes on one machine (RunPeak).
  double shared = 0;
  double Held() const;
  // Held() plus the largest phase.
  double Peak() const;
  // The largest phase: "step", "round" or "checkpoint".
  std::string PeakPhase() const;
  // "1.8 GB at peak (a round's exchange): 76.8 MB of weights, ..." for
  // messages: the items held and those of the peak phase, largest first.
  std::string Describe() const;
};

// The plan of one process of `o`, item by item. Each item is a buffer the
// code allocates (its owner named in memory.cc), or, for the transport and
// the allocator, what bench/memory.py measured of them.
MemoryEstimate EstimateMemory(const MemoryPlanOptions& o);

// What `nodes` processes of `each` and a launcher holding `launcher_bytes`
// of its own hold together at their peaks on one machine: the shared code
// pages once, the rest per process.
double RunPeak(const MemoryEstimate& each, int nodes, double launcher_bytes);

}  // namespace starling

#endif  // STARLING_CORE_MEMORY_H_
