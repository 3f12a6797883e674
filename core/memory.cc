#include "core/memory.h"

#include <malloc.h>

#include <algorithm>

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

}  // namespace starling
