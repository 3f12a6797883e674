// What a process holds in memory: the heap in use (glibc's or the sanitizer
// allocator's count), the memory still available to this process
// (MemAvailable, capped by its memory cgroup), and this process's resident
// set (/proc/self/status).
// Free functions, no shared state: thread-safe.
#ifndef STARLING_CORE_MEMORY_H_
#define STARLING_CORE_MEMORY_H_

#include <cstdint>
#include <string>

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

}  // namespace starling

#endif  // STARLING_CORE_MEMORY_H_
