// Status helpers shared by every module: Abseil 20220623 has no status macros,
// so Starling keeps these two. Header-only; no state, so thread-safe.
#ifndef STARLING_CORE_STATUS_H_
#define STARLING_CORE_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define STARLING_CONCAT_INNER_(a, b) a##b
#define STARLING_CONCAT_(a, b) STARLING_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define STARLING_RETURN_IF_ERROR(expr)        \
  do {                                        \
    ::absl::Status starling_status_ = (expr); \
    if (!starling_status_.ok()) {             \
      return starling_status_;                \
    }                                         \
  } while (0)

// `lhs = value` of the absl::StatusOr `rexpr`, or returns its error.
#define STARLING_ASSIGN_OR_RETURN(lhs, rexpr)                                \
  STARLING_ASSIGN_OR_RETURN_IMPL_(STARLING_CONCAT_(starling_sor_, __LINE__), \
                                  lhs, rexpr)

#define STARLING_ASSIGN_OR_RETURN_IMPL_(sor, lhs, rexpr) \
  auto sor = (rexpr);                                    \
  if (!sor.ok()) {                                       \
    return sor.status();                                 \
  }                                                      \
  lhs = std::move(sor).value()

#endif  // STARLING_CORE_STATUS_H_
