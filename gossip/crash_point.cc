#include "gossip/crash_point.h"

#include <signal.h>

#include <atomic>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace starling {
namespace {

std::atomic<bool> g_armed{false};
std::string* g_point = nullptr;
int g_signal = SIGKILL;
int64_t g_round = -1;  // -1: any round
std::atomic<int64_t> g_current{0};

}  // namespace

absl::Status ArmCrashPoint(const std::string& spec) {
  if (spec.empty()) return absl::OkStatus();
  constexpr absl::string_view kFreeze = "freeze:";
  const bool freeze = absl::StartsWith(spec, kFreeze);
  std::string point = freeze ? spec.substr(kFreeze.size()) : spec;
  int64_t round = -1;
  if (size_t at = point.find('@'); at != std::string::npos) {
    if (!absl::SimpleAtoi(point.substr(at + 1), &round) || round < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("crash point '", spec, "': round must be a number"));
    }
    point = point.substr(0, at);
  }
  for (const char* known :
       {"ready", "send", "reduce", "all_gather", "done", "donate", "commit",
        "commit_partial", "corrupt_state", "push_mid_stream"}) {
    if (point == known) {
      g_point = new std::string(point);
      g_round = round;
      g_signal = freeze ? SIGSTOP : SIGKILL;
      g_armed.store(true);
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "crash point '", spec,
      "': expected ready, send, reduce, all_gather, done, donate, commit, "
      "commit_partial, push_mid_stream or corrupt_state, optionally after "
      "freeze:"));
}

void SetCrashRound(int64_t round) { g_current.store(round); }

void CrashPoint(absl::string_view point) {
  if (!g_armed.load(std::memory_order_relaxed)) return;
  if (*g_point != point) return;
  if (g_round >= 0 && g_current.load() != g_round) return;
  if (g_signal == SIGSTOP) {  // frozen once; resumed, the node goes on
    static std::atomic<bool> frozen{false};
    if (frozen.exchange(true)) return;
  }
  ::raise(g_signal);
}

bool TakeFault(absl::string_view point) {
  if (!g_armed.load(std::memory_order_relaxed) || *g_point != point) {
    return false;
  }
  static std::atomic<bool> taken{false};
  return !taken.exchange(true);
}

}  // namespace starling
