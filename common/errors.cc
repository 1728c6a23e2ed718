#include "common/errors.h"

#include <optional>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace echokv {

absl::string_view ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid_argument";
    case ErrorKind::kContextLengthExceeded: return "context_length_exceeded";
    case ErrorKind::kOutOfRange: return "out_of_range";
    case ErrorKind::kNotFound: return "not_found";
    case ErrorKind::kAlreadyExists: return "already_exists";
    case ErrorKind::kFailedPrecondition: return "failed_precondition";
    case ErrorKind::kBusy: return "busy";
    case ErrorKind::kConversationMismatch: return "conversation_mismatch";
    case ErrorKind::kAborted: return "aborted";
    case ErrorKind::kLimitReached: return "limit_reached";
    case ErrorKind::kCancelled: return "cancelled";
    case ErrorKind::kDeadlineExceeded: return "deadline_exceeded";
    case ErrorKind::kUnavailable: return "unavailable";
    case ErrorKind::kUnimplemented: return "unimplemented";
    case ErrorKind::kUnauthenticated: return "unauthenticated";
    case ErrorKind::kPermissionDenied: return "permission_denied";
    case ErrorKind::kDataLoss: return "data_loss";
    case ErrorKind::kInternal: return "internal";
    case ErrorKind::kUnknown: return "unknown";
  }
  return "unknown";
}

absl::StatusCode StatusCodeOf(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return absl::StatusCode::kInvalidArgument;
    case ErrorKind::kContextLengthExceeded: return absl::StatusCode::kInvalidArgument;
    case ErrorKind::kOutOfRange: return absl::StatusCode::kOutOfRange;
    case ErrorKind::kNotFound: return absl::StatusCode::kNotFound;
    case ErrorKind::kAlreadyExists: return absl::StatusCode::kAlreadyExists;
    case ErrorKind::kFailedPrecondition: return absl::StatusCode::kFailedPrecondition;
    case ErrorKind::kBusy: return absl::StatusCode::kFailedPrecondition;
    case ErrorKind::kConversationMismatch: return absl::StatusCode::kFailedPrecondition;
    case ErrorKind::kAborted: return absl::StatusCode::kAborted;
    case ErrorKind::kLimitReached: return absl::StatusCode::kResourceExhausted;
    case ErrorKind::kCancelled: return absl::StatusCode::kCancelled;
    case ErrorKind::kDeadlineExceeded: return absl::StatusCode::kDeadlineExceeded;
    case ErrorKind::kUnavailable: return absl::StatusCode::kUnavailable;
    case ErrorKind::kUnimplemented: return absl::StatusCode::kUnimplemented;
    case ErrorKind::kUnauthenticated: return absl::StatusCode::kUnauthenticated;
    case ErrorKind::kPermissionDenied: return absl::StatusCode::kPermissionDenied;
    case ErrorKind::kDataLoss: return absl::StatusCode::kDataLoss;
    case ErrorKind::kInternal: return absl::StatusCode::kInternal;
    case ErrorKind::kUnknown: return absl::StatusCode::kUnknown;
  }
  return absl::StatusCode::kUnknown;
}

ErrorKind KindOfCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument: return ErrorKind::kInvalidArgument;
    case absl::StatusCode::kOutOfRange: return ErrorKind::kOutOfRange;
    case absl::StatusCode::kNotFound: return ErrorKind::kNotFound;
    case absl::StatusCode::kAlreadyExists: return ErrorKind::kAlreadyExists;
    case absl::StatusCode::kFailedPrecondition: return ErrorKind::kFailedPrecondition;
    case absl::StatusCode::kAborted: return ErrorKind::kAborted;
    case absl::StatusCode::kResourceExhausted: return ErrorKind::kLimitReached;
    case absl::StatusCode::kCancelled: return ErrorKind::kCancelled;
    case absl::StatusCode::kDeadlineExceeded: return ErrorKind::kDeadlineExceeded;
    case absl::StatusCode::kUnavailable: return ErrorKind::kUnavailable;
    case absl::StatusCode::kUnimplemented: return ErrorKind::kUnimplemented;
    case absl::StatusCode::kUnauthenticated: return ErrorKind::kUnauthenticated;
    case absl::StatusCode::kPermissionDenied: return ErrorKind::kPermissionDenied;
    case absl::StatusCode::kDataLoss: return ErrorKind::kDataLoss;
    case absl::StatusCode::kOk:  // a caller bug: report it rather than a success
    case absl::StatusCode::kInternal: return ErrorKind::kInternal;
    case absl::StatusCode::kUnknown:
    default:  // absl's enum is open-ended
      return ErrorKind::kUnknown;
  }
}

namespace {

std::optional<ErrorKind> KindFromName(absl::string_view name) {
  for (ErrorKind k : kAllErrorKinds) {
    if (ErrorKindName(k) == name) return k;
  }
  return std::nullopt;
}

// The payload: "<kind name>\n<field>\n<limit>" (fields and limits hold no newline).
absl::Cord Encode(const ErrorInfo& info) {
  return absl::Cord(absl::StrCat(ErrorKindName(info.kind), "\n", info.field, "\n", info.limit));
}

}  // namespace

absl::Status WithErrorInfo(absl::Status status, const ErrorInfo& info) {
  if (status.ok()) return status;
  status.SetPayload(kErrorInfoTypeUrl, Encode(info));
  return status;
}

absl::Status MakeError(ErrorKind kind, absl::string_view field, absl::string_view message) {
  ErrorInfo info;
  info.kind = kind;
  info.field = std::string(field);
  return WithErrorInfo(absl::Status(StatusCodeOf(kind), message), info);
}

absl::Status LimitError(absl::string_view limit, absl::string_view message) {
  ErrorInfo info;
  info.kind = ErrorKind::kLimitReached;
  info.limit = std::string(limit);
  return WithErrorInfo(absl::Status(absl::StatusCode::kResourceExhausted, message), info);
}

ErrorInfo ErrorInfoOf(const absl::Status& status) {
  ErrorInfo info;
  info.kind = KindOfCode(status.code());
  if (status.ok()) return info;
  const auto payload = status.GetPayload(kErrorInfoTypeUrl);  // absl::optional (C++17 absl may not alias std)
  if (!payload.has_value()) return info;
  const std::vector<std::string> parts = absl::StrSplit(std::string(*payload), '\n');
  if (parts.size() != 3) return info;
  const std::optional<ErrorKind> kind = KindFromName(parts[0]);
  if (!kind.has_value() || StatusCodeOf(*kind) != status.code()) return info;  // re-coded since
  info.kind = *kind;
  info.field = parts[1];
  info.limit = parts[2];
  return info;
}

absl::Status WithFieldPrefix(const absl::Status& status, absl::string_view message_prefix,
                             absl::string_view field_prefix) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(message_prefix, status.message()));
  status.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  if (field_prefix.empty()) return out;
  ErrorInfo info = ErrorInfoOf(status);
  info.field = info.field.empty() ? std::string(field_prefix) : absl::StrCat(field_prefix, ".", info.field);
  return WithErrorInfo(std::move(out), info);
}

}  // namespace echokv
