// The one place where absl::Status becomes an HTTP error of the OpenAI-compatible API
// (the HTTP twin of status_util.h): status code, OpenAI error `type`, and a `code`
// string, with the message kept. Body shape (what OpenAI clients parse):
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature",
//              "code": "invalid_argument"}}
//
//   HttpError e = ToHttpError(absl::NotFoundError("session ... not found"));
//   // e.status == 404, e.type == "invalid_request_error", e.code == "not_found"
//   e.code = "session_not_found";        // callers may name it more precisely
//   res.status = e.status; res.set_content(HttpErrorJson(e), "application/json");
#ifndef ECHOKV_SERVER_HTTP_STATUS_H_
#define ECHOKV_SERVER_HTTP_STATUS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

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

// Status -> HTTP (docs/API.md "HTTP errors"):
//   INVALID_ARGUMENT, OUT_OF_RANGE, UNIMPLEMENTED  400 invalid_request_error
//   UNAUTHENTICATED                                 401 authentication_error
//   PERMISSION_DENIED                               403 permission_error
//   NOT_FOUND                                       404 invalid_request_error
//   FAILED_PRECONDITION, ALREADY_EXISTS, ABORTED    409 invalid_request_error (conflict, e.g. busy)
//   RESOURCE_EXHAUSTED                              429 rate_limit_error (a server limit)
//   CANCELLED, UNAVAILABLE                          503 server_error (shutting down, cancelled by the server)
//   DEADLINE_EXCEEDED                               504 server_error
//   INTERNAL, UNKNOWN, DATA_LOSS, other             500 server_error
// `code` is the lower-case canonical name of the status code ("not_found").
// 429 and 503 carry retry_after_s = 1. Must not be called with OK.
HttpError ToHttpError(const absl::Status& status);

// A 400 invalid_request_error naming `param` (a request field, e.g. "messages[2].role").
HttpError InvalidParam(const std::string& param, const std::string& message,
                       const std::string& code = "invalid_value");

// The error body above (compact JSON).
std::string HttpErrorJson(const HttpError& error);

// The headers of `error` (x-should-retry, Retry-After) as name/value pairs.
std::vector<std::pair<std::string, std::string>> HttpErrorHeaders(const HttpError& error);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_HTTP_STATUS_H_
