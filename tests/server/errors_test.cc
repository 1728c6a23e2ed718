// Typed errors (common/errors.h) and the doors' two tables: every ErrorKind -> its gRPC
// code (server/doors/grpc/status_util.h GrpcCode) and its OpenAI error (server/doors/http/http_status.h
// OpenAiError: HTTP status, type, code, param, Retry-After), exhaustively over the
// enum, so that a kind added without a row, or a row changed, fails here. ErrorInfo
// travels on absl::Status and survives the prefixes the engine adds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>

#include "common/errors.h"
#include "server/doors/http/http_status.h"
#include "server/doors/grpc/status_util.h"

namespace echokv::server {
namespace {

// ---- ErrorInfo on absl::Status ----

TEST(ErrorInfoTest, RoundTripsKindFieldAndLimit) {
  const absl::Status s = MakeError(ErrorKind::kInvalidArgument, "sampling.temperature", "temperature must be >= 0");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "temperature must be >= 0");
  ErrorInfo info = ErrorInfoOf(s);
  EXPECT_EQ(info.kind, ErrorKind::kInvalidArgument);
  EXPECT_EQ(info.field, "sampling.temperature");
  EXPECT_EQ(info.limit, "");

  const absl::Status l = LimitError("max_sessions", "max_sessions (2) reached");
  EXPECT_EQ(l.code(), absl::StatusCode::kResourceExhausted);
  info = ErrorInfoOf(l);
  EXPECT_EQ(info.kind, ErrorKind::kLimitReached);
  EXPECT_EQ(info.limit, "max_sessions");
  EXPECT_EQ(info.field, "");

  // Every kind makes a status of its own code and comes back.
  for (ErrorKind k : kAllErrorKinds) {
    const absl::Status e = MakeError(k, "f", "m");
    EXPECT_EQ(e.code(), StatusCodeOf(k)) << ErrorKindName(k);
    EXPECT_EQ(ErrorInfoOf(e).kind, k) << ErrorKindName(k);
    EXPECT_EQ(ErrorInfoOf(e).field, "f") << ErrorKindName(k);
  }
}

TEST(ErrorInfoTest, WithoutPayloadTheKindOfTheCode) {
  // The documented default: the plain kind of the code, no field, no limit.
  EXPECT_EQ(ErrorInfoOf(absl::NotFoundError("x")).kind, ErrorKind::kNotFound);
  EXPECT_EQ(ErrorInfoOf(absl::ResourceExhaustedError("x")).kind, ErrorKind::kLimitReached);
  EXPECT_EQ(ErrorInfoOf(absl::ResourceExhaustedError("x")).limit, "");
  EXPECT_EQ(ErrorInfoOf(absl::FailedPreconditionError("x")).kind, ErrorKind::kFailedPrecondition);
  EXPECT_EQ(ErrorInfoOf(absl::InvalidArgumentError("input: x")).field, "");  // never read from the text
  EXPECT_EQ(ErrorInfoOf(absl::UnknownError("x")).kind, ErrorKind::kUnknown);
  EXPECT_EQ(ErrorInfoOf(absl::Status(static_cast<absl::StatusCode>(99), "x")).kind, ErrorKind::kUnknown);
  // OK is a caller bug: reported as internal (ToHttpError answers 500 for it).
  EXPECT_EQ(ErrorInfoOf(absl::OkStatus()).kind, ErrorKind::kInternal);
  // A payload that does not fit the code (re-coded since) is ignored.
  ErrorInfo busy{ErrorKind::kBusy, "session_id", ""};
  EXPECT_EQ(ErrorInfoOf(WithErrorInfo(absl::NotFoundError("x"), busy)).kind, ErrorKind::kNotFound);
  EXPECT_EQ(ErrorInfoOf(WithErrorInfo(absl::FailedPreconditionError("x"), busy)).kind, ErrorKind::kBusy);
  // A payload of another shape is ignored.
  absl::Status odd = absl::InvalidArgumentError("x");
  odd.SetPayload(kErrorInfoTypeUrl, absl::Cord("no_such_kind\nf\n"));
  EXPECT_EQ(ErrorInfoOf(odd).kind, ErrorKind::kInvalidArgument);
  EXPECT_EQ(ErrorInfoOf(odd).field, "");
  EXPECT_TRUE(WithErrorInfo(absl::OkStatus(), busy).ok());
}

TEST(ErrorInfoTest, FieldPrefixNestsTheFieldAndKeepsTheKind) {
  const absl::Status inner = MakeError(ErrorKind::kInvalidArgument, "top_p", "top_p must be in (0, 1], got 2");
  const absl::Status s = WithFieldPrefix(inner, "sampling.", "sampling");
  EXPECT_EQ(s.message(), "sampling.top_p must be in (0, 1], got 2");
  EXPECT_EQ(ErrorInfoOf(s).field, "sampling.top_p");
  EXPECT_EQ(ErrorInfoOf(s).kind, ErrorKind::kInvalidArgument);
  // No field below: the prefix is the field; the code and other payloads are kept.
  absl::Status plain = absl::UnimplementedError("no template");
  plain.SetPayload("type.example/other", absl::Cord("x"));
  const absl::Status chat = WithFieldPrefix(plain, "input.chat: ", "input.chat");
  EXPECT_EQ(chat.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(chat.message(), "input.chat: no template");
  EXPECT_EQ(ErrorInfoOf(chat).field, "input.chat");
  EXPECT_EQ(ErrorInfoOf(chat).kind, ErrorKind::kUnimplemented);
  EXPECT_TRUE(chat.GetPayload("type.example/other").has_value());
  // A limit survives.
  const absl::Status lim = WithFieldPrefix(LimitError("max_kv_bytes", "m"), "snapshot: ", "");
  EXPECT_EQ(ErrorInfoOf(lim).limit, "max_kv_bytes");
  EXPECT_EQ(ErrorInfoOf(lim).field, "");
  EXPECT_TRUE(WithFieldPrefix(absl::OkStatus(), "a", "b").ok());
}

TEST(ErrorInfoTest, EveryKindIsListedOnceWithItsOwnName) {
  // kUnknown is the last enumerator: a kind added anywhere grows the enum, and
  // kAllErrorKinds (which the tables below run over) must list it.
  EXPECT_EQ(std::size(kAllErrorKinds), static_cast<size_t>(ErrorKind::kUnknown) + 1);
  std::set<std::string> names;
  std::set<ErrorKind> kinds;
  for (ErrorKind k : kAllErrorKinds) {
    names.insert(std::string(ErrorKindName(k)));
    kinds.insert(k);
  }
  EXPECT_EQ(names.size(), std::size(kAllErrorKinds));
  EXPECT_EQ(kinds.size(), std::size(kAllErrorKinds));
}

// ---- the gRPC table ----

TEST(GrpcTableTest, EveryKindHasItsCode) {
  const std::map<ErrorKind, grpc::StatusCode> want = {
      {ErrorKind::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {ErrorKind::kContextLengthExceeded, grpc::StatusCode::INVALID_ARGUMENT},
      {ErrorKind::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
      {ErrorKind::kNotFound, grpc::StatusCode::NOT_FOUND},
      {ErrorKind::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {ErrorKind::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
      {ErrorKind::kBusy, grpc::StatusCode::FAILED_PRECONDITION},
      {ErrorKind::kConversationMismatch, grpc::StatusCode::FAILED_PRECONDITION},
      {ErrorKind::kAborted, grpc::StatusCode::ABORTED},
      {ErrorKind::kLimitReached, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {ErrorKind::kCancelled, grpc::StatusCode::CANCELLED},
      {ErrorKind::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
      {ErrorKind::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {ErrorKind::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
      {ErrorKind::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
      {ErrorKind::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
      {ErrorKind::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {ErrorKind::kInternal, grpc::StatusCode::INTERNAL},
      {ErrorKind::kUnknown, grpc::StatusCode::UNKNOWN},
  };
  for (ErrorKind k : kAllErrorKinds) {
    auto it = want.find(k);
    ASSERT_NE(it, want.end()) << "no expected gRPC code for " << ErrorKindName(k);
    EXPECT_EQ(GrpcCode(k), it->second) << ErrorKindName(k);
    // The status a kind makes says the same (both follow google.rpc.Code).
    EXPECT_EQ(static_cast<int>(GrpcCode(k)), static_cast<int>(StatusCodeOf(k))) << ErrorKindName(k);
    const grpc::Status g = ToGrpcStatus(MakeError(k, "f", "the message"));
    EXPECT_EQ(g.error_code(), it->second) << ErrorKindName(k);
    EXPECT_EQ(g.error_message(), "the message");
  }
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(GrpcTableTest, StatusesWithoutPayloadKeepTheirCode) {
  for (int c = 1; c <= 16; ++c) {
    const absl::Status s(static_cast<absl::StatusCode>(c), "m");
    EXPECT_EQ(static_cast<int>(ToGrpcStatus(s).error_code()), c) << s;
  }
  EXPECT_EQ(ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(99), "m")).error_code(),
            grpc::StatusCode::UNKNOWN);
}

// ---- the OpenAI table ----

struct Shape {
  int http_status;
  std::string type;
  std::string code;
  std::string param;  // with names {messages, max_completion_tokens} and field "input"
  int retry_after_s;
};

TEST(OpenAiTableTest, EveryKindHasItsStatusTypeCodeAndParam) {
  const std::map<ErrorKind, Shape> want = {
      {ErrorKind::kInvalidArgument, {400, "invalid_request_error", "invalid_argument", "messages", 0}},
      {ErrorKind::kContextLengthExceeded, {400, "invalid_request_error", "context_length_exceeded", "messages", 0}},
      {ErrorKind::kOutOfRange, {400, "invalid_request_error", "out_of_range", "", 0}},
      {ErrorKind::kNotFound, {404, "invalid_request_error", "not_found", "", 0}},
      {ErrorKind::kAlreadyExists, {409, "invalid_request_error", "already_exists", "", 0}},
      {ErrorKind::kFailedPrecondition, {409, "invalid_request_error", "failed_precondition", "", 0}},
      {ErrorKind::kBusy, {409, "invalid_request_error", "failed_precondition", "", 0}},
      {ErrorKind::kConversationMismatch, {409, "invalid_request_error", "conversation_mismatch", "messages", 0}},
      {ErrorKind::kAborted, {409, "invalid_request_error", "aborted", "", 0}},
      {ErrorKind::kLimitReached, {429, "rate_limit_error", "resource_exhausted", "", 1}},
      {ErrorKind::kCancelled, {503, "server_error", "cancelled", "", 1}},
      {ErrorKind::kDeadlineExceeded, {504, "server_error", "deadline_exceeded", "", 0}},
      {ErrorKind::kUnavailable, {503, "server_error", "unavailable", "", 1}},
      {ErrorKind::kUnimplemented, {400, "invalid_request_error", "unimplemented", "messages", 0}},
      {ErrorKind::kUnauthenticated, {401, "authentication_error", "unauthenticated", "", 0}},
      {ErrorKind::kPermissionDenied, {403, "permission_error", "permission_denied", "", 0}},
      {ErrorKind::kDataLoss, {500, "server_error", "data_loss", "", 0}},
      {ErrorKind::kInternal, {500, "server_error", "internal", "", 0}},
      {ErrorKind::kUnknown, {500, "server_error", "unknown", "", 0}},
  };
  OpenAiParamNames names;
  names.input = "messages";
  names.max_tokens = "max_completion_tokens";
  for (ErrorKind k : kAllErrorKinds) {
    auto it = want.find(k);
    ASSERT_NE(it, want.end()) << "no expected OpenAI error for " << ErrorKindName(k);
    const OpenAiErrorShape got = OpenAiError(k, "input", names);
    EXPECT_EQ(got.http_status, it->second.http_status) << ErrorKindName(k);
    EXPECT_EQ(got.type, it->second.type) << ErrorKindName(k);
    EXPECT_EQ(got.code, it->second.code) << ErrorKindName(k);
    EXPECT_EQ(got.param, it->second.param) << ErrorKindName(k);
    EXPECT_EQ(got.retry_after_s, it->second.retry_after_s) << ErrorKindName(k);
    // ToHttpError is the same row, with the message and the headers it implies.
    const HttpError e = ToHttpError(MakeError(k, "input", "the message"), names);
    EXPECT_EQ(e.status, it->second.http_status) << ErrorKindName(k);
    EXPECT_EQ(e.code, it->second.code) << ErrorKindName(k);
    EXPECT_EQ(e.param, it->second.param) << ErrorKindName(k);
    EXPECT_EQ(e.message, "the message");
    EXPECT_EQ(e.no_retry, k == ErrorKind::kConversationMismatch) << ErrorKindName(k);
    EXPECT_EQ(got.no_retry, e.no_retry) << ErrorKindName(k);
    const auto headers = HttpErrorHeaders(e);
    const bool retry_after = !headers.empty() && headers[0].first == "Retry-After" && headers[0].second == "1";
    EXPECT_EQ(retry_after, it->second.retry_after_s == 1) << ErrorKindName(k);
  }
}

TEST(OpenAiTableTest, ParamOfEachEngineField) {
  OpenAiParamNames chat;
  chat.input = "messages";
  OpenAiParamNames completion;
  completion.input = "prompt";
  completion.max_tokens = "max_completion_tokens";
  const std::tuple<std::string, std::string, std::string> cases[] = {
      // field, param (chat), param (completion)
      {"input", "messages", "prompt"},
      {"input.chat", "messages", "prompt"},
      {"input.tokens.ids", "messages", "prompt"},
      {"input.text", "messages", "prompt"},
      {"max_tokens", "max_tokens", "max_completion_tokens"},
      {"sampling.temperature", "temperature", "temperature"},
      {"sampling.top_logprobs", "top_logprobs", "top_logprobs"},
      {"sampling", "", ""},
      {"stop", "stop", "stop"},
      {"stop_token_ids", "stop_token_ids", "stop_token_ids"},
      {"compression", "echokv", "echokv"},
      {"compression.budget", "echokv.budget", "echokv.budget"},
      {"compression.cache_dtype", "echokv.cache_dtype", "echokv.cache_dtype"},
      {"compression.target_mass", "echokv.target_mass", "echokv.target_mass"},
      {"compression.bootstrap", "echokv", "echokv"},  // no HTTP spelling: the object
      {"compression.budgets", "echokv", "echokv"},
      {"ttl_seconds", "echokv.ttl_seconds", "echokv.ttl_seconds"},
      {"echokv.policy", "echokv.policy", "echokv.policy"},
      {"session_id", "session_id", "session_id"},
      {"snapshot.tokens", "", ""},
      {"prefill_chunk", "", ""},
      {"", "", ""},
  };
  for (const auto& [field, want_chat, want_completion] : cases) {
    EXPECT_EQ(OpenAiError(ErrorKind::kInvalidArgument, field, chat).param, want_chat) << field;
    EXPECT_EQ(OpenAiError(ErrorKind::kInvalidArgument, field, completion).param, want_completion) << field;
  }
  // A context overflow names the input whatever the field (the prompt, max_tokens, the commit).
  for (const char* field : {"input", "max_tokens", "commit", ""}) {
    EXPECT_EQ(OpenAiError(ErrorKind::kContextLengthExceeded, field, completion).param, "prompt") << field;
    EXPECT_EQ(OpenAiError(ErrorKind::kContextLengthExceeded, field, chat).param, "messages") << field;
  }
  // Fields name a param only for bad input: a missing session is a 404 without one.
  EXPECT_EQ(OpenAiError(ErrorKind::kNotFound, "session_id", chat).param, "");
  EXPECT_EQ(OpenAiError(ErrorKind::kBusy, "session_id", chat).param, "");
  EXPECT_EQ(OpenAiError(ErrorKind::kLimitReached, "", chat).param, "");
  // A conversation that does not continue the session's names the first message that
  // differs, in the request's spelling, and tells the SDKs not to retry.
  const OpenAiErrorShape mismatch = OpenAiError(ErrorKind::kConversationMismatch, "input.chat[3]", chat);
  EXPECT_EQ(mismatch.param, "messages[3]");
  EXPECT_TRUE(mismatch.no_retry);
  EXPECT_EQ(OpenAiError(ErrorKind::kConversationMismatch, "input.chat", chat).param, "messages");
  EXPECT_FALSE(OpenAiError(ErrorKind::kBusy, "session_id", chat).no_retry);
}

// The message names the field as the request spells it (the param), not as the engine
// does; an undotted field is a word the text may use otherwise, so it is left alone.
TEST(OpenAiTableTest, MessageNamesTheRequestsField) {
  OpenAiParamNames chat;
  chat.input = "messages";
  const std::tuple<std::string, std::string, std::string, std::string> cases[] = {
      // field, engine message, HTTP message, param
      {"compression.cache_dtype", "compression.cache_dtype int8 needs the CPU float32 model",
       "echokv.cache_dtype int8 needs the CPU float32 model", "echokv.cache_dtype"},
      {"sampling.temperature", "sampling.temperature: must be in [0, 2], got 3",
       "temperature: must be in [0, 2], got 3", "temperature"},
      {"input.chat[3]", "input.chat[3] differs from the session's message 3",
       "messages[3] differs from the session's message 3", "messages[3]"},
      {"compression.bootstrap", "compression.bootstrap: unknown mode x", "echokv: unknown mode x", "echokv"},
      {"input", "the input is empty", "the input is empty", "messages"},
      {"echokv.policy", "echokv.policy: unknown policy x", "echokv.policy: unknown policy x", "echokv.policy"},
  };
  for (const auto& [field, engine, http, param] : cases) {
    const ErrorKind kind = field == "input.chat[3]" ? ErrorKind::kConversationMismatch : ErrorKind::kInvalidArgument;
    const HttpError e = ToHttpError(MakeError(kind, field, engine), chat);
    EXPECT_EQ(e.message, http) << field;
    EXPECT_EQ(e.param, param) << field;
  }
  // Errors without a param keep the engine's text.
  EXPECT_EQ(ToHttpError(MakeError(ErrorKind::kOutOfRange, "compression.budget", "compression.budget too large"),
                        chat).message,
            "compression.budget too large");
}

TEST(OpenAiTableTest, StatusesWithoutPayloadAnswerAsTheirCode) {
  // Today's HTTP answer of every code (docs/API.md "HTTP errors").
  const std::map<absl::StatusCode, std::pair<int, std::string>> want = {
      {absl::StatusCode::kCancelled, {503, "cancelled"}},
      {absl::StatusCode::kUnknown, {500, "unknown"}},
      {absl::StatusCode::kInvalidArgument, {400, "invalid_argument"}},
      {absl::StatusCode::kDeadlineExceeded, {504, "deadline_exceeded"}},
      {absl::StatusCode::kNotFound, {404, "not_found"}},
      {absl::StatusCode::kAlreadyExists, {409, "already_exists"}},
      {absl::StatusCode::kPermissionDenied, {403, "permission_denied"}},
      {absl::StatusCode::kResourceExhausted, {429, "resource_exhausted"}},
      {absl::StatusCode::kFailedPrecondition, {409, "failed_precondition"}},
      {absl::StatusCode::kAborted, {409, "aborted"}},
      {absl::StatusCode::kOutOfRange, {400, "out_of_range"}},
      {absl::StatusCode::kUnimplemented, {400, "unimplemented"}},
      {absl::StatusCode::kInternal, {500, "internal"}},
      {absl::StatusCode::kUnavailable, {503, "unavailable"}},
      {absl::StatusCode::kDataLoss, {500, "data_loss"}},
      {absl::StatusCode::kUnauthenticated, {401, "unauthenticated"}},
  };
  for (const auto& [code, shape] : want) {
    const HttpError e = ToHttpError(absl::Status(code, "input: a text that names a field"));
    EXPECT_EQ(e.status, shape.first) << absl::StatusCodeToString(code);
    EXPECT_EQ(e.code, shape.second) << absl::StatusCodeToString(code);
    EXPECT_EQ(e.param, "") << "a param read from the message: " << absl::StatusCodeToString(code);
  }
  EXPECT_EQ(ToHttpError(absl::OkStatus()).status, 500);
}

}  // namespace
}  // namespace echokv::server
