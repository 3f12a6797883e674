// Test-only fault injection: integration tests make a node kill itself with
// SIGKILL at a named point of the protocol (e.g. "send", "reduce",
// "all_gather", "ready", "done" (a member whose all-reduce finished, before
// it reports so), "donate", "commit" (a coordinator before it tells
// anyone to commit), "commit_partial" (a coordinator that told one other
// member); "push_mid_stream" in gossip mode, where the "round" is the
// push's number), optionally only in a given round, to check that the
// others survive a crash at exactly that moment. "freeze:POINT" stops the
// node with SIGSTOP instead, the first time only: a hung process whose
// connections stay open, which nobody suspects until it misses the failure
// detector, and which goes on when continued. Unarmed (the default),
// CrashPoint costs one relaxed atomic load.
// Thread-safe: arm once at startup, before other threads start.
#ifndef STARLING_GOSSIP_CRASH_POINT_H_
#define STARLING_GOSSIP_CRASH_POINT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace starling {

// `spec` is "" (off), "POINT" or "POINT@ROUND", either optionally after
// "freeze:". InvalidArgument naming the spec when the point is unknown or
// the round is not a number.
absl::Status ArmCrashPoint(const std::string& spec);

// The round the node is in, for "POINT@ROUND" specs.
void SetCrashRound(int64_t round);

// Raises SIGKILL (SIGSTOP when frozen) when armed for `point` (and the
// current round matches).
void CrashPoint(absl::string_view point);

// True exactly once when armed for `point` (a fault that is not a crash,
// e.g. "corrupt_state": a donor flips a bit in one state chunk).
bool TakeFault(absl::string_view point);

}  // namespace starling

#endif  // STARLING_GOSSIP_CRASH_POINT_H_
