// Typed errors: what an error is (its ErrorKind), which request field it is about and
// which limit refused it, carried on absl::Status as a payload so that no code decides
// anything by a message's text (messages are for people and free to change). The
// doors map a kind to their wire in one table each: server/doors/grpc/status_util.h (GrpcCode)
// and server/doors/http/http_status.h (OpenAiError). Torch-free; compression/ and model/ use it
// for the field of their own validation errors.
//
//   return MakeError(ErrorKind::kInvalidArgument, "temperature", "temperature must be >= 0, got -1");
//   return LimitError("max_sessions", "max_sessions (2) reached; delete a session first");
//   absl::Status s = WithFieldPrefix(params.sampling.Validate(), "sampling.", "sampling");
//   // s.message() == "sampling.temperature must be ...", ErrorInfoOf(s).field == "sampling.temperature"
//   if (ErrorInfoOf(s).kind == ErrorKind::kLimitReached) observer->OnSessionRejected(ErrorInfoOf(s).limit);
#ifndef ECHOKV_COMMON_ERRORS_H_
#define ECHOKV_COMMON_ERRORS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace echokv {

// One kind per absl::StatusCode (the default of a status without a payload) plus the
// refinements the doors answer differently or that name a limit. (Not
// state::ErrorKind, server/state/types.h: why saved state was refused, a metric
// label; those statuses read here as the kind of their code, e.g. kDataLoss.) Each kind has exactly
// one status code (StatusCodeOf). Append new kinds to kAllErrorKinds as well: the
// doors' table tests run over it.
enum class ErrorKind {
  kInvalidArgument,        // INVALID_ARGUMENT: a bad request field (`field` names it)
  kContextLengthExceeded,  // INVALID_ARGUMENT: the input (+ max_tokens) does not fit max_context_tokens
  kOutOfRange,             // OUT_OF_RANGE
  kNotFound,               // NOT_FOUND: an unknown, expired or foreign session
  kAlreadyExists,          // ALREADY_EXISTS: an imported id that is taken
  kFailedPrecondition,     // FAILED_PRECONDITION: e.g. a snapshot of another model
  kBusy,                   // FAILED_PRECONDITION: another mutation holds the session
  kConversationMismatch,   // FAILED_PRECONDITION: a whole conversation sent to continue a
                           // session does not begin with the session's (`field` names the
                           // first message that differs, "input.chat[3]")
  kAborted,                // ABORTED
  kLimitReached,           // RESOURCE_EXHAUSTED: a server or tenant limit (`limit` names it), a full disk
  kCancelled,              // CANCELLED: by the client, or the server shutting down
  kDeadlineExceeded,       // DEADLINE_EXCEEDED
  kUnavailable,            // UNAVAILABLE: shutting down / draining
  kUnimplemented,          // UNIMPLEMENTED: e.g. chat input without a chat template
  kUnauthenticated,        // UNAUTHENTICATED
  kPermissionDenied,       // PERMISSION_DENIED
  kDataLoss,               // DATA_LOSS: saved state that fails verification
  kInternal,               // INTERNAL (also what ErrorInfoOf says for an OK status)
  kUnknown,                // UNKNOWN (and any code absl may add)
};

inline constexpr ErrorKind kAllErrorKinds[] = {
    ErrorKind::kInvalidArgument, ErrorKind::kContextLengthExceeded, ErrorKind::kOutOfRange,
    ErrorKind::kNotFound,        ErrorKind::kAlreadyExists,         ErrorKind::kFailedPrecondition,
    ErrorKind::kBusy,            ErrorKind::kConversationMismatch,  ErrorKind::kAborted,
    ErrorKind::kLimitReached,
    ErrorKind::kCancelled,       ErrorKind::kDeadlineExceeded,      ErrorKind::kUnavailable,
    ErrorKind::kUnimplemented,   ErrorKind::kUnauthenticated,       ErrorKind::kPermissionDenied,
    ErrorKind::kDataLoss,        ErrorKind::kInternal,              ErrorKind::kUnknown,
};

// "invalid_argument", "context_length_exceeded", "busy", "limit_reached", ...
absl::string_view ErrorKindName(ErrorKind kind);
// The status code of `kind` (never OK).
absl::StatusCode StatusCodeOf(ErrorKind kind);
// The kind of a status that carries no ErrorInfo: the plain kind of its code
// (kInvalidArgument, kNotFound, kLimitReached, ...; kInternal for OK).
ErrorKind KindOfCode(absl::StatusCode code);

struct ErrorInfo {
  ErrorKind kind = ErrorKind::kInternal;
  // Bad input: the request field at fault, in the gRPC API's spelling without indices
  // ("input", "input.chat", "sampling.temperature", "stop", "ttl_seconds",
  // "compression.budget", "max_tokens", "session_id"); "" when none. An index only where
  // the error is about one element: kConversationMismatch's "input.chat[3]".
  std::string field;
  // kLimitReached: the limit ("max_sessions", "max_kv_bytes", "max_cold_bytes",
  // "max_concurrent_streams", "max_streams"); "" when none (e.g. a full disk).
  std::string limit;
};

// The payload's type URL (absl::Status::SetPayload).
inline constexpr absl::string_view kErrorInfoTypeUrl = "type.echokv.dev/echokv.ErrorInfo";

// A status of StatusCodeOf(kind) with `message`, carrying kind and field.
absl::Status MakeError(ErrorKind kind, absl::string_view field, absl::string_view message);
// RESOURCE_EXHAUSTED, kind kLimitReached, naming `limit`.
absl::Status LimitError(absl::string_view limit, absl::string_view message);
// `status` with `info` attached (replacing an earlier one). `info.kind` must have the
// status's code; otherwise ErrorInfoOf ignores the payload. OK stays OK.
absl::Status WithErrorInfo(absl::Status status, const ErrorInfo& info);
// What `status` carries. Without a payload (or with one that does not fit its code):
// {KindOfCode(code), "", ""}. OK: {kInternal} (a caller bug, reported as such).
ErrorInfo ErrorInfoOf(const absl::Status& status);

// `status` with `message_prefix` before its message, every payload kept, and its field
// nested under `field_prefix`: "a" + "b" -> "a.b", "a" + "" -> "a". Used where a layer
// names the part of the request a lower layer's check was about ("sampling.", "snapshot: ").
// A status without a field gets `field_prefix` as its field. OK stays OK.
absl::Status WithFieldPrefix(const absl::Status& status, absl::string_view message_prefix,
                             absl::string_view field_prefix);

}  // namespace echokv

#endif  // ECHOKV_COMMON_ERRORS_H_
