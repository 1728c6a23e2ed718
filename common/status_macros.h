// The two status macros of echokv (bookworm's Abseil 20220623 has neither).
//
//   absl::StatusOr<int> ParseCount(absl::string_view s);
//   absl::Status Use(absl::string_view s) {
//     ECHOKV_ASSIGN_OR_RETURN(int n, ParseCount(s));
//     ECHOKV_RETURN_IF_ERROR(CheckCount(n));
//     return absl::OkStatus();
//   }
#ifndef ECHOKV_COMMON_STATUS_MACROS_H_
#define ECHOKV_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if not OK.
#define ECHOKV_RETURN_IF_ERROR(expr)                         \
  do {                                                       \
    ::absl::Status echokv_status_internal_ = (expr);         \
    if (!echokv_status_internal_.ok()) {                     \
      return echokv_status_internal_;                        \
    }                                                        \
  } while (false)

#define ECHOKV_STATUS_MACROS_CONCAT_INNER_(a, b) a##b
#define ECHOKV_STATUS_MACROS_CONCAT_(a, b) ECHOKV_STATUS_MACROS_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, otherwise
// moves the value into `lhs` (a declaration such as `auto x` or an existing lvalue).
#define ECHOKV_ASSIGN_OR_RETURN(lhs, rexpr)                                      \
  ECHOKV_ASSIGN_OR_RETURN_IMPL_(                                                 \
      ECHOKV_STATUS_MACROS_CONCAT_(echokv_statusor_, __LINE__), lhs, rexpr)

#define ECHOKV_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) {                                     \
    return std::move(statusor).status();                    \
  }                                                         \
  lhs = std::move(statusor).value()

#endif  // ECHOKV_COMMON_STATUS_MACROS_H_
