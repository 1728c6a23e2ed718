// The one place where absl::Status becomes an HTTP error of the OpenAI-compatible API
// (the HTTP twin of status_util.h): from the status's ErrorKind and field
// (common/errors.h), the HTTP status, OpenAI error `type`, `code` and `param`, with the
// message kept. Body shape (what OpenAI clients parse):
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature",
//              "code": "invalid_argument"}}
//
//   HttpError e = ToHttpError(absl::NotFoundError("session ... not found"));
//   // e.status == 404, e.type == "invalid_request_error", e.code == "not_found"
//   e.code = "session_not_found";        // callers may name it more precisely
//   res.status = e.status; res.set_content(HttpErrorJson(e), "application/json");
#ifndef ECHOKV_SERVER_DOORS_HTTP_HTTP_STATUS_H_
#define ECHOKV_SERVER_DOORS_HTTP_HTTP_STATUS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/errors.h"

namespace echokv::server {

struct HttpError {
  int status = 500;           // HTTP status
  std::string type;           // OpenAI error type ("invalid_request_error", ...)
  std::string code;           // machine-readable code ("invalid_argument", "model_not_found", ...)
  std::string param;          // the request field at fault; "" = null
  std::string message;
  // Response headers the OpenAI SDKs act on: `x-should-retry: false` for a refusal a
  // retry cannot change (409 conversation_mismatch); `Retry-After: <s>` on 429 / 503.
  bool no_retry = false;
  int retry_after_s = 0;      // 0 = no header
};

// The request's names for the fields the engine reports (ErrorInfo::field, in the gRPC
// API's spelling): "input..." is the request's `messages` (chat) or `prompt`
// (completions); "max_tokens" is whichever of max_tokens / max_completion_tokens the
// request used.
struct OpenAiParamNames {
  std::string input = "input";
  std::string max_tokens = "max_tokens";
};

// The one table of the HTTP door: an ErrorKind (and the field it names) -> HTTP status,
// OpenAI error type, code and param (docs/API.md "HTTP errors"):
//   kInvalidArgument, kOutOfRange, kUnimplemented    400 invalid_request_error
//   kContextLengthExceeded                           400 invalid_request_error, code
//                                                        context_length_exceeded, param
//                                                        messages / prompt (names.input)
//   kUnauthenticated                                 401 authentication_error
//   kPermissionDenied                                403 permission_error
//   kNotFound                                        404 invalid_request_error
//   kFailedPrecondition, kBusy, kAlreadyExists, kAborted   409 invalid_request_error (conflict)
//   kConversationMismatch                            409 invalid_request_error, code
//                                                        conversation_mismatch, param
//                                                        messages[i] (input.chat[i]), no_retry
//   kLimitReached                                    429 rate_limit_error (a server limit)
//   kCancelled, kUnavailable                         503 server_error (shutting down, cancelled by the server)
//   kDeadlineExceeded                                504 server_error
//   kInternal, kUnknown, kDataLoss                   500 server_error
// `code` is the lower-case canonical name of the kind's status code ("not_found"),
// except context_length_exceeded and conversation_mismatch. 429 and 503 carry retry_after_s = 1. `param`, for
// kInvalidArgument and kUnimplemented only, from the field: input* -> names.input,
// max_tokens -> names.max_tokens, sampling.X -> X, stop* -> stop, stop_token_ids* ->
// stop_token_ids, compression.X -> echokv.X for the `echokv` object's fields (policy,
// budget, lookahead, workspace, window, memory, cache_dtype, target_mass), any other compression* ->
// echokv, ttl_seconds -> echokv.ttl_seconds, echokv.X and session_id as they are; any
// other field -> null.
struct OpenAiErrorShape {
  int http_status = 500;
  std::string type;
  std::string code;
  std::string param;   // "" = null
  int retry_after_s = 0;
  bool no_retry = false;  // x-should-retry: false (the same request fails again)
};
OpenAiErrorShape OpenAiError(ErrorKind kind, absl::string_view field, const OpenAiParamNames& names = {});

// `status` through OpenAiError (its ErrorInfoOf). The message is the engine's, with the
// engine's dotted field (e.g. "compression.cache_dtype", "sampling.temperature",
// "input.chat[3]") written as the request's param wherever it occurs ("echokv.cache_dtype",
// "temperature", "messages[3]"); an undotted field ("input", "max_tokens") is left alone
// in the text (a word of prose as well). Must not be called with OK.
HttpError ToHttpError(const absl::Status& status, const OpenAiParamNames& names = {});

// A 400 invalid_request_error naming `param` (a request field, e.g. "messages[2].role").
HttpError InvalidParam(const std::string& param, const std::string& message,
                       const std::string& code = "invalid_value");

// The error body above (compact JSON).
std::string HttpErrorJson(const HttpError& error);

// The headers of `error` (x-should-retry, Retry-After) as name/value pairs.
std::vector<std::pair<std::string, std::string>> HttpErrorHeaders(const HttpError& error);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_DOORS_HTTP_HTTP_STATUS_H_
