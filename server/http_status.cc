#include "server/http_status.h"

#include <nlohmann/json.hpp>

#include <string>

#include "absl/strings/ascii.h"

namespace echokv::server {

HttpError ToHttpError(const absl::Status& status) {
  HttpError e;
  e.message = std::string(status.message());
  e.code = absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
      e.status = 400;
      e.type = "invalid_request_error";
      break;
    case absl::StatusCode::kUnauthenticated:
      e.status = 401;
      e.type = "authentication_error";
      break;
    case absl::StatusCode::kPermissionDenied:
      e.status = 403;
      e.type = "permission_error";
      break;
    case absl::StatusCode::kNotFound:
      e.status = 404;
      e.type = "invalid_request_error";
      break;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      e.status = 409;
      e.type = "invalid_request_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      e.retry_after_s = 1;
      break;
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnavailable:
      e.status = 503;
      e.type = "server_error";
      e.retry_after_s = 1;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.status = 504;
      e.type = "server_error";
      break;
    case absl::StatusCode::kOk:  // a caller bug: report it rather than a success
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
    default:  // absl's enum is open-ended
      e.status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

HttpError InvalidParam(const std::string& param, const std::string& message, const std::string& code) {
  HttpError e;
  e.status = 400;
  e.type = "invalid_request_error";
  e.code = code;
  e.param = param;
  e.message = message;
  return e;
}

std::string HttpErrorJson(const HttpError& error) {
  nlohmann::ordered_json body;
  body["error"] = {{"message", error.message},
                   {"type", error.type},
                   {"param", error.param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(error.param)},
                   {"code", error.code.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(error.code)}};
  return body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::vector<std::pair<std::string, std::string>> HttpErrorHeaders(const HttpError& error) {
  std::vector<std::pair<std::string, std::string>> h;
  if (error.no_retry) h.emplace_back("x-should-retry", "false");
  if (error.retry_after_s > 0) h.emplace_back("Retry-After", std::to_string(error.retry_after_s));
  return h;
}

}  // namespace echokv::server
