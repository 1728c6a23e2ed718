#include "server/doors/http/http_status.h"

#include <nlohmann/json.hpp>

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace echokv::server {

namespace {

// The request parameter a field names (OpenAiError's param rule).
std::string ParamOf(absl::string_view field, const OpenAiParamNames& names) {
  const absl::string_view head = field.substr(0, field.find_first_of(".["));
  // One message of a conversation: input.chat[3] -> messages[3].
  if (absl::StartsWith(field, "input.chat[")) return absl::StrCat(names.input, field.substr(10));
  if (head == "input") return names.input;
  if (head == "max_tokens") return names.max_tokens;
  if (head == "sampling") return field.size() > head.size() + 1 && field[head.size()] == '.'
                                     ? std::string(field.substr(head.size() + 1))
                                     : "";
  if (head == "stop") return "stop";
  if (head == "stop_token_ids") return "stop_token_ids";
  if (head == "compression") {
    // The fields the HTTP door's `echokv` object has, under the same names; the others
    // (bootstrap, repair, snapkv_window, ...) have no HTTP spelling: the object.
    static constexpr absl::string_view kEchokvFields[] = {"policy", "budget", "lookahead", "workspace",
                                                          "window", "memory", "cache_dtype", "target_mass"};
    const absl::string_view rest = field.substr(head.size());
    for (absl::string_view f : kEchokvFields) {
      if (rest.size() == f.size() + 1 && rest[0] == '.' && rest.substr(1) == f) return absl::StrCat("echokv.", f);
    }
    return "echokv";
  }
  if (head == "ttl_seconds") return "echokv.ttl_seconds";
  if (head == "echokv" || head == "session_id") return std::string(field);
  return "";
}

}  // namespace

OpenAiErrorShape OpenAiError(ErrorKind kind, absl::string_view field, const OpenAiParamNames& names) {
  OpenAiErrorShape e;
  e.code = absl::AsciiStrToLower(absl::StatusCodeToString(StatusCodeOf(kind)));
  switch (kind) {
    case ErrorKind::kInvalidArgument:
    case ErrorKind::kOutOfRange:
    case ErrorKind::kUnimplemented:
      e.http_status = 400;
      e.type = "invalid_request_error";
      if (kind != ErrorKind::kOutOfRange) e.param = ParamOf(field, names);
      break;
    case ErrorKind::kContextLengthExceeded:
      // OpenAI's shape for a context overflow (LangChain raises its overflow error on it),
      // whether the prompt or prompt + max_tokens is what does not fit.
      e.http_status = 400;
      e.type = "invalid_request_error";
      e.code = "context_length_exceeded";
      e.param = names.input;
      break;
    case ErrorKind::kUnauthenticated:
      e.http_status = 401;
      e.type = "authentication_error";
      break;
    case ErrorKind::kPermissionDenied:
      e.http_status = 403;
      e.type = "permission_error";
      break;
    case ErrorKind::kNotFound:
      e.http_status = 404;
      e.type = "invalid_request_error";
      break;
    case ErrorKind::kConversationMismatch:
      e.http_status = 409;
      e.type = "invalid_request_error";
      e.code = "conversation_mismatch";
      e.param = ParamOf(field, names);
      e.no_retry = true;
      break;
    case ErrorKind::kFailedPrecondition:
    case ErrorKind::kBusy:
    case ErrorKind::kAlreadyExists:
    case ErrorKind::kAborted:
      e.http_status = 409;
      e.type = "invalid_request_error";
      break;
    case ErrorKind::kLimitReached:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.retry_after_s = 1;
      break;
    case ErrorKind::kCancelled:
    case ErrorKind::kUnavailable:
      e.http_status = 503;
      e.type = "server_error";
      e.retry_after_s = 1;
      break;
    case ErrorKind::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "server_error";
      break;
    case ErrorKind::kInternal:
    case ErrorKind::kUnknown:
    case ErrorKind::kDataLoss:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

HttpError ToHttpError(const absl::Status& status, const OpenAiParamNames& names) {
  const ErrorInfo info = ErrorInfoOf(status);  // OK: kInternal, a caller bug reported as a 500
  const OpenAiErrorShape shape = OpenAiError(info.kind, info.field, names);
  HttpError e;
  e.status = shape.http_status;
  e.type = shape.type;
  e.code = shape.code;
  e.param = shape.param;
  e.retry_after_s = shape.retry_after_s;
  e.no_retry = shape.no_retry;
  e.message = std::string(status.message());
  // The engine's dotted field in the request's spelling (the param), wherever the
  // message names it.
  if (!e.param.empty() && e.param != info.field && info.field.find_first_of(".[") != std::string::npos) {
    e.message = absl::StrReplaceAll(e.message, {{info.field, e.param}});
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
