// The HTTP API's wire format without a server or model: request parsing (defaults,
// every accepted form, errors naming the param), the Status -> HTTP mapping against a
// hand-written table, token bytes of both tokenizer kinds, and the response / chunk
// shapes of OpenAI's API reference. The end-to-end behaviour is
// tests/server/http_api_test.py.
#include "server/doors/http/openai_protocol.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/tokenizer.h"
#include "server/doors/http/http_status.h"
#include "tests/testing/test_data.h"

namespace echokv::server::openai {
namespace {

using nlohmann::json;

ChatRequest Chat(const std::string& body) {
  ChatRequest r;
  HttpError e;
  EXPECT_TRUE(ParseChatRequest(body, &r, &e)) << e.message;
  return r;
}

HttpError ChatError(const json& body) {
  ChatRequest r;
  HttpError e;
  EXPECT_FALSE(ParseChatRequest(body.dump(), &r, &e)) << body.dump();
  return e;
}

json Base() { return json{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}}; }

TEST(ParseChatRequest, DefaultsAreOpenAis) {
  const ChatRequest r = Chat(Base().dump());
  EXPECT_EQ(r.gen.model, "m");
  EXPECT_FALSE(r.gen.stream);
  EXPECT_FALSE(r.gen.include_usage);
  EXPECT_FALSE(r.gen.max_tokens.has_value());
  EXPECT_EQ(r.gen.sampling.temperature, 1.0f);
  EXPECT_EQ(r.gen.sampling.top_p, 1.0f);
  EXPECT_FALSE(r.gen.sampling.logprobs);
  EXPECT_FALSE(r.gen.seed.has_value());
  EXPECT_TRUE(r.gen.stop.empty());
  EXPECT_TRUE(r.add_generation_prompt);
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, "user");
  EXPECT_EQ(r.messages[0].content, "Hi");
}

TEST(ParseChatRequest, EveryField) {
  json b = Base();
  b["messages"] = json::array({
      {{"role", "developer"}, {"content", "Be brief."}},
      {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}},
      {{"role", "assistant"}, {"content", nullptr}},
  });
  b.update(json{{"stream", true},
                {"stream_options", {{"include_usage", true}}},
                {"max_tokens", 5},
                {"max_completion_tokens", 7},
                {"temperature", 0},
                {"top_p", 0.5},
                {"top_k", -1},
                {"min_p", 0.1},
                {"repetition_penalty", 1.2},
                {"presence_penalty", -1.5},
                {"frequency_penalty", 2},
                {"seed", -1},
                {"stop", "END"},
                {"stop_token_ids", {2, 3}},
                {"ignore_eos", true},
                {"logprobs", true},
                {"top_logprobs", 4},
                {"n", 1},
                {"session_id", "new"},
                {"add_generation_prompt", false},
                {"tools", json::array()},
                {"tool_choice", "none"},
                {"response_format", {{"type", "text"}}},
                {"echokv", {{"policy", "snapkv"}, {"budget", 64}, {"memory", "tiered"}, {"ttl_seconds", 60}}},
                {"user", "ignored"},
                {"stop_sequences_typo", 1}});
  const ChatRequest r = Chat(b.dump());
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0].role, "system");  // developer is the system role
  EXPECT_EQ(r.messages[1].content, "a\nb");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_TRUE(r.gen.stream);
  EXPECT_TRUE(r.gen.include_usage);
  EXPECT_EQ(r.gen.max_tokens, 7);  // max_completion_tokens wins
  EXPECT_EQ(r.gen.max_tokens_param, "max_completion_tokens");
  EXPECT_EQ(r.gen.sampling.temperature, 0.0f);
  EXPECT_EQ(r.gen.sampling.top_p, 0.5f);
  EXPECT_EQ(r.gen.sampling.top_k, 0);  // -1 = off
  EXPECT_FLOAT_EQ(r.gen.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.gen.sampling.repetition_penalty, 1.2f);
  EXPECT_FLOAT_EQ(r.gen.sampling.presence_penalty, -1.5f);
  EXPECT_FLOAT_EQ(r.gen.sampling.frequency_penalty, 2.0f);
  EXPECT_EQ(r.gen.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_THAT(r.gen.stop, ::testing::ElementsAre("END"));
  EXPECT_THAT(r.gen.stop_token_ids, ::testing::ElementsAre(2, 3));
  EXPECT_TRUE(r.gen.ignore_eos);
  EXPECT_TRUE(r.gen.sampling.logprobs);
  EXPECT_EQ(r.gen.sampling.top_logprobs, 4);
  EXPECT_EQ(r.gen.session_id, "new");
  EXPECT_FALSE(r.add_generation_prompt);
  EXPECT_EQ(r.gen.echokv.policy, "snapkv");
  EXPECT_EQ(r.gen.echokv.budget, 64);
  EXPECT_EQ(r.gen.echokv.memory, "tiered");
  EXPECT_EQ(r.gen.echokv.ttl_seconds, 60);
}

TEST(ParseChatRequest, NullMeansAbsent) {
  json b = Base();
  b.update(json{{"temperature", nullptr}, {"stop", nullptr}, {"max_tokens", nullptr}, {"seed", nullptr}});
  const ChatRequest r = Chat(b.dump());
  EXPECT_EQ(r.gen.sampling.temperature, 1.0f);
  EXPECT_TRUE(r.gen.stop.empty());
  EXPECT_FALSE(r.gen.max_tokens.has_value());
}

TEST(ParseChatRequest, ErrorsNameTheParam) {
  struct Case {
    json change;
    std::string param;
    std::string code;
  };
  const std::vector<Case> cases = {
      {{{"temperature", "0"}}, "temperature", "invalid_type"},
      {{{"temperature", 2.5}}, "temperature", "invalid_value"},
      {{{"top_p", 0}}, "top_p", "invalid_value"},
      {{{"max_tokens", 2.0}}, "max_tokens", "invalid_type"},
      {{{"max_tokens", -3}}, "max_tokens", "invalid_value"},
      {{{"n", 3}}, "n", "unsupported_value"},
      {{{"stream", 1}}, "stream", "invalid_type"},
      {{{"stream_options", {{"include_usage", true}}}}, "stream_options", "invalid_value"},
      {{{"stream", true}, {"stream_options", {{"include_usage", "yes"}}}}, "stream_options.include_usage",
       "invalid_type"},
      {{{"stop", {"a", ""}}}, "stop[1]", "invalid_value"},
      {{{"stop", {{"a", 1}}}}, "stop", "invalid_type"},
      {{{"seed", 1.5}}, "seed", "invalid_type"},
      {{{"top_logprobs", 3}}, "top_logprobs", "invalid_value"},
      {{{"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs", "invalid_value"},
      {{{"messages", json::object()}}, "messages", "invalid_type"},
      {{{"messages", json::array()}}, "messages", "invalid_value"},
      {{{"messages", {{{"content", "x"}}}}}, "messages[0].role", "missing"},
      {{{"messages", {{{"role", "user"}}}}}, "messages[0].content", "invalid_value"},
      {{{"messages", {{{"role", "user"}, {"content", {{{"type", "input_audio"}}}}}}}},
       "messages[0].content[0].type", "unsupported_value"},
      {{{"messages", {{{"role", "user"}, {"content", "x"}}, {{"role", "tool"}, {"content", "y"}}}}},
       "messages[1].role", "unsupported_value"},
      {{{"messages", {{{"role", "assistant"}, {"content", "x"}, {"tool_calls", {{{"id", "1"}}}}}}}},
       "messages[0].tool_calls", "unsupported_parameter"},
      {{{"tools", {{{"type", "function"}}}}}, "tools", "unsupported_parameter"},
      {{{"tool_choice", "required"}}, "tool_choice", "unsupported_parameter"},
      {{{"response_format", {{"type", "json_schema"}}}}, "response_format.type", "unsupported_value"},
      {{{"logit_bias", {{"1", 2}}}}, "logit_bias", "unsupported_parameter"},
      {{{"echokv", {{"budget", 0}}}}, "echokv.budget", "invalid_value"},
      {{{"echokv", 3}}, "echokv", "invalid_type"},
      {{{"session_id", false}}, "session_id", "invalid_type"},
      {{{"model", nullptr}}, "model", "missing"},
  };
  for (const Case& c : cases) {
    json b = Base();
    b.update(c.change);
    const HttpError e = ChatError(b);
    EXPECT_EQ(e.status, 400) << c.change.dump();
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_EQ(e.param, c.param) << c.change.dump() << ": " << e.message;
    EXPECT_EQ(e.code, c.code) << c.change.dump() << ": " << e.message;
    EXPECT_THAT(e.message, ::testing::StartsWith(c.param)) << c.change.dump();
  }
}

// Issue 25 point 11: the range max_tokens is checked against is the server's
// max_new_tokens (kDefaultMaxNewTokens unless the flag says otherwise), and the message
// states that bound, not 2^30.
TEST(ParseChatRequest, MaxTokensRangeIsTheServersMaxNewTokens) {
  for (const char* param : {"max_tokens", "max_completion_tokens"}) {
    json zero = Base();
    zero[param] = 0;
    HttpError e = ChatError(zero);
    EXPECT_EQ(e.param, param);
    EXPECT_THAT(e.message, ::testing::HasSubstr("[1, 1024]")) << e.message;
    EXPECT_THAT(e.message, ::testing::Not(::testing::HasSubstr("1073741824"))) << e.message;
    json over = Base();
    over[param] = kDefaultMaxNewTokens + 1;
    EXPECT_THAT(ChatError(over).message, ::testing::HasSubstr("[1, 1024]"));
    json at = Base();
    at[param] = kDefaultMaxNewTokens;
    EXPECT_EQ(Chat(at.dump()).gen.max_tokens, kDefaultMaxNewTokens);
  }
  // A server started with --max_new_tokens 4096: 2000 is fine, 0 names 4096.
  ChatRequest r;
  HttpError e;
  json big = Base();
  big["max_tokens"] = 2000;
  EXPECT_TRUE(ParseChatRequest(big.dump(), &r, &e, 4096)) << e.message;
  EXPECT_EQ(r.gen.max_tokens, 2000);
  CompletionRequest c;
  EXPECT_FALSE(ParseCompletionRequest(R"({"model":"m","prompt":"x","max_tokens":0})", &c, &e, 4096));
  EXPECT_THAT(e.message, ::testing::HasSubstr("[1, 4096]")) << e.message;
}

TEST(ParseChatRequest, MalformedJson) {
  for (const char* body : {"{", "", "[]", "null", "{\"model\": \"m\",}"}) {
    ChatRequest r;
    HttpError e;
    EXPECT_FALSE(ParseChatRequest(body, &r, &e)) << body;
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "");
    EXPECT_EQ(e.code, "invalid_json");
  }
}

// A number beyond a double makes nlohmann throw out_of_range (error 406), not a
// parse_error: it must be the same 400 invalid_json, not an exception out of the parser
// (fuzz_edge's first crash, the body "99999e9917360156...").
TEST(ParseRequestBody, NumberOverflowIsInvalidJson) {
  for (const char* body : {"99999e9917360156", "{\"model\": \"m\", \"max_tokens\": 1e999}",
                           "{\"messages\": [], \"temperature\": -4e400}"}) {
    ChatRequest chat;
    HttpError e;
    EXPECT_FALSE(ParseChatRequest(body, &chat, &e)) << body;
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.code, "invalid_json") << body;
    EXPECT_THAT(e.message, ::testing::HasSubstr("number overflow")) << body;
    CompletionRequest completion;
    HttpError e2;
    EXPECT_FALSE(ParseCompletionRequest(body, &completion, &e2)) << body;
    EXPECT_EQ(e2.status, 400) << body;
    EXPECT_EQ(e2.code, "invalid_json") << body;
  }
}

TEST(ParseCompletionRequest, PromptForms) {
  struct Case {
    json prompt;
    bool tokens;
    std::string text;
    std::vector<int> ids;
  };
  const std::vector<Case> cases = {
      {"hello", false, "hello", {}},
      {json::array({"hello"}), false, "hello", {}},
      {json::array({1, 2, 3}), true, "", {1, 2, 3}},
      {json::array({json::array({4, 5})}), true, "", {4, 5}},
      {"", false, "", {}},
  };
  for (const Case& c : cases) {
    CompletionRequest r;
    HttpError e;
    ASSERT_TRUE(ParseCompletionRequest(json{{"model", "m"}, {"prompt", c.prompt}}.dump(), &r, &e)) << e.message;
    EXPECT_EQ(r.token_prompt, c.tokens);
    EXPECT_EQ(r.text, c.text);
    EXPECT_EQ(r.tokens, c.ids);
  }
  CompletionRequest r;
  HttpError e;
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":"x","logprobs":3,"max_tokens":9})", &r, &e));
  EXPECT_TRUE(r.gen.sampling.logprobs);
  EXPECT_EQ(r.gen.sampling.top_logprobs, 3);
  EXPECT_EQ(r.gen.max_tokens_param, "max_tokens");
  // max_completion_tokens is a chat field: ignored here like any unknown field.
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":"x","max_completion_tokens":"x"})", &r, &e));

  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"model":"m"})", "prompt"},
      {R"({"model":"m","prompt":["a",5]})", "prompt[1]"},
      {R"({"model":"m","prompt":[[1],[]]})", "prompt[1]"},
      {R"({"model":"m","prompt":[[1],[2,"x"]]})", "prompt[1][1]"},
      {R"({"model":"m","prompt":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})",
       "prompt"},
      {R"({"model":"m","prompt":[]})", "prompt"},
      {R"({"model":"m","prompt":[1,-2]})", "prompt[1]"},
      {R"({"model":"m","prompt":[1,"a"]})", "prompt[1]"},
      {R"({"model":"m","prompt":5})", "prompt"},
      {R"({"model":"m","prompt":"x","logprobs":true})", "logprobs"},
      {R"({"model":"m","prompt":"x","logprobs":21})", "logprobs"},
      {R"({"model":"m","prompt":"x","echo":true})", "echo"},
      {R"({"model":"m","prompt":"x","suffix":"s"})", "suffix"},
      {R"({"model":"m","prompt":"x","best_of":3})", "best_of"},
  };
  for (const auto& [body, param] : bad) {
    CompletionRequest c;
    HttpError err;
    EXPECT_FALSE(ParseCompletionRequest(body, &c, &err)) << body;
    EXPECT_EQ(err.param, param) << body << ": " << err.message;
    EXPECT_EQ(err.status, 400);
    // The message names the field once (issue 25 item 11: "echo: echo: true is not supported").
    EXPECT_EQ(err.message.rfind(param + ": ", 0), 0u) << err.message;
    EXPECT_EQ(err.message.find(param + ": " + param + ":"), std::string::npos) << err.message;
  }
  CompletionRequest c;
  HttpError err;
  EXPECT_FALSE(ParseCompletionRequest(R"({"model":"m","prompt":"x","echo":true})", &c, &err));
  EXPECT_EQ(err.message, "echo: true is not supported");
}

// Issue 25 point 10: a list of prompts is one choice per prompt (OpenAI's behaviour,
// LangChain's generate(["a", "b"])), strings or token-id lists.
TEST(ParseCompletionRequest, PromptLists) {
  CompletionRequest r;
  HttpError e;
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":["a","b",""]})", &r, &e)) << e.message;
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(r.prompts[0].text, "a");
  EXPECT_EQ(r.prompts[1].text, "b");
  EXPECT_FALSE(r.prompts[2].tokens);
  EXPECT_EQ(r.text, "a");
  CompletionRequest t;
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":[[1,2],[3]]})", &t, &e)) << e.message;
  ASSERT_EQ(t.prompts.size(), 2u);
  EXPECT_TRUE(t.prompts[1].tokens);
  EXPECT_EQ(t.prompts[1].ids, std::vector<int>({3}));
  EXPECT_EQ(t.tokens, std::vector<int>({1, 2}));
  CompletionRequest one;
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":[7,8]})", &one, &e));
  EXPECT_EQ(one.prompts.size(), 1u);
  CompletionRequest many;
  const std::string sixteen = R"({"model":"m","prompt":["1","2","3","4","5","6","7","8","9","a","b","c","d","e","f","g"]})";
  ASSERT_TRUE(ParseCompletionRequest(sixteen, &many, &e));
  EXPECT_EQ(many.prompts.size(), static_cast<size_t>(kMaxPrompts));
}

// Issue 25 point 6: client strings in errors are EchoPrefix'ed (at most 40 bytes).
TEST(ParseChatRequest, EchoedStringsAreCut) {
  const std::string big(1 << 20, 'r');
  ChatRequest r;
  HttpError e;
  const std::string body = json{{"model", "m"}, {"messages", json::array({json{{"role", big}, {"content", "x"}}})}}.dump();
  ASSERT_FALSE(ParseChatRequest(body, &r, &e));
  EXPECT_EQ(e.param, "messages[0].role");
  EXPECT_LT(e.message.size(), 200u) << e.message.substr(0, 300);
  EXPECT_NE(e.message.find("(1048576 bytes)"), std::string::npos) << e.message;
  // An unterminated 1 MB string: the parser's "last read" is cut too.
  ASSERT_FALSE(ParseChatRequest("{\"model\": \"" + big, &r, &e));
  EXPECT_LT(e.message.size(), 400u) << e.message.substr(0, 500);
  SessionRef ref;
  ASSERT_FALSE(ResolveSession(big, "other", &ref, &e));
  EXPECT_LT(e.message.size(), 200u);
}

TEST(HttpErrorHeaders, RetryHints) {
  HttpError busy = ToHttpError(absl::ResourceExhaustedError("full"));
  EXPECT_EQ(busy.status, 429);
  EXPECT_EQ(HttpErrorHeaders(busy),
            (std::vector<std::pair<std::string, std::string>>{{"Retry-After", "1"}}));
  HttpError mismatch = ToHttpError(absl::FailedPreconditionError("differs"));
  mismatch.no_retry = true;
  EXPECT_EQ(HttpErrorHeaders(mismatch),
            (std::vector<std::pair<std::string, std::string>>{{"x-should-retry", "false"}}));
  EXPECT_TRUE(HttpErrorHeaders(ToHttpError(absl::InvalidArgumentError("x"))).empty());
}

TEST(ResolveSession, HeaderAndBody) {
  SessionRef ref;
  HttpError e;
  ASSERT_TRUE(ResolveSession("", "", &ref, &e));
  EXPECT_EQ(ref.mode, SessionRef::Mode::kStateless);
  ASSERT_TRUE(ResolveSession("", "NEW", &ref, &e));
  EXPECT_EQ(ref.mode, SessionRef::Mode::kNew);
  ASSERT_TRUE(ResolveSession("abc", "", &ref, &e));
  EXPECT_EQ(ref.mode, SessionRef::Mode::kContinue);
  EXPECT_EQ(ref.id, "abc");
  ASSERT_TRUE(ResolveSession("abc", "abc", &ref, &e));
  EXPECT_EQ(ref.id, "abc");
  EXPECT_FALSE(ResolveSession("abc", "def", &ref, &e));
  EXPECT_EQ(e.param, "session_id");
}

TEST(ToHttpError, EveryCode) {
  struct Row {
    absl::StatusCode code;
    int status;
    const char* type;
    const char* name;
  };
  const Row rows[] = {
      {absl::StatusCode::kInvalidArgument, 400, "invalid_request_error", "invalid_argument"},
      {absl::StatusCode::kOutOfRange, 400, "invalid_request_error", "out_of_range"},
      {absl::StatusCode::kUnimplemented, 400, "invalid_request_error", "unimplemented"},
      {absl::StatusCode::kUnauthenticated, 401, "authentication_error", "unauthenticated"},
      {absl::StatusCode::kPermissionDenied, 403, "permission_error", "permission_denied"},
      {absl::StatusCode::kNotFound, 404, "invalid_request_error", "not_found"},
      {absl::StatusCode::kFailedPrecondition, 409, "invalid_request_error", "failed_precondition"},
      {absl::StatusCode::kAlreadyExists, 409, "invalid_request_error", "already_exists"},
      {absl::StatusCode::kAborted, 409, "invalid_request_error", "aborted"},
      {absl::StatusCode::kResourceExhausted, 429, "rate_limit_error", "resource_exhausted"},
      {absl::StatusCode::kCancelled, 503, "server_error", "cancelled"},
      {absl::StatusCode::kUnavailable, 503, "server_error", "unavailable"},
      {absl::StatusCode::kDeadlineExceeded, 504, "server_error", "deadline_exceeded"},
      {absl::StatusCode::kInternal, 500, "server_error", "internal"},
      {absl::StatusCode::kUnknown, 500, "server_error", "unknown"},
      {absl::StatusCode::kDataLoss, 500, "server_error", "data_loss"},
  };
  for (const Row& r : rows) {
    const HttpError e = ToHttpError(absl::Status(r.code, "msg"));
    EXPECT_EQ(e.status, r.status) << r.name;
    EXPECT_EQ(e.type, r.type) << r.name;
    EXPECT_EQ(e.code, r.name);
    EXPECT_EQ(e.message, "msg");
    EXPECT_EQ(e.param, "");
  }
}

TEST(HttpErrorJson, OpenAisShape) {
  HttpError e = InvalidParam("temperature", "temperature: too hot");
  json j = json::parse(HttpErrorJson(e));
  EXPECT_EQ(j, json::parse(R"({"error":{"message":"temperature: too hot","type":"invalid_request_error",
                                         "param":"temperature","code":"invalid_value"}})"));
  e.param.clear();
  e.code.clear();
  j = json::parse(HttpErrorJson(e));
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_TRUE(j["error"]["code"].is_null());
}

TEST(TokenTable, SentencePiece) {
  const TokenTable t({"<unk>", "</s>", "\xE2\x96\x81Once", "<0x0A>", "<0xE2>", "up"},
                     {true, true, false, false, false, false}, "sentencepiece");
  EXPECT_EQ(t.Bytes(1), "</s>");
  EXPECT_EQ(t.Bytes(2), " Once");
  EXPECT_EQ(t.Bytes(3), "\n");
  EXPECT_EQ(t.Bytes(4), "\xE2");
  EXPECT_EQ(t.Display(4), "bytes:\\xe2");  // not valid UTF-8 on its own
  EXPECT_EQ(t.Display(5), "up");
  EXPECT_EQ(t.Bytes(99), "");
}

TEST(TokenTable, ByteLevelBpe) {
  // GPT-2's map: space -> U+0120 "Ġ", newline -> U+010A "Ċ", byte 0xE2 -> "â" (U+00E2),
  // byte 0x80 -> U+0122 "Ģ" (the 34th unprintable byte: 256 + 33 + 1).
  const TokenTable t({"\xC4\xA0world", "\xC4\x8A", "\xC3\xA2\xC4\xA2", "<|im_end|>", "hello there"},
                     {false, false, false, true, false}, "bpe");
  EXPECT_EQ(t.Bytes(0), " world");
  EXPECT_EQ(t.Bytes(1), "\n");
  EXPECT_EQ(t.Bytes(2), "\xE2\x80");
  EXPECT_EQ(t.Display(2), "bytes:\\xe2\\x80");
  EXPECT_EQ(t.Bytes(3), "<|im_end|>");
  EXPECT_EQ(t.Bytes(4), "hello there");  // a plain space is no byte-level char: an added token's text
}

// Oracle: a text's tokens, their bytes concatenated, are the text again (SentencePiece:
// with its dummy-prefix space in front). Byte tokens and multi-byte characters included.
TEST(TokenTable, RealTokenizersRoundTrip) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  const std::string text = "Once upon a time, Ünïcødé ✓ 日本 🙂\nnew line\t!";
  for (const char* dir : {"tokenizers/qwen2.5", "tokenizers/gpt2", "tokenizers/mistral-7b-v0.2",
                          "models/stories260K"}) {
    absl::StatusOr<std::unique_ptr<model::Tokenizer>> tok = model::LoadTokenizer(data + "/" + dir);
    ASSERT_TRUE(tok.ok()) << dir << ": " << tok.status();
    const TokenTable table(**tok);
    model::EncodeOptions eo;
    eo.add_special_tokens = false;
    absl::StatusOr<std::vector<int>> ids = (*tok)->Encode(text, eo);
    ASSERT_TRUE(ids.ok()) << ids.status();
    std::string joined;
    for (int id : *ids) joined += table.Bytes(id);
    const std::string want = (*tok)->kind() == "bpe" ? text : " " + text;
    EXPECT_EQ(joined, want) << dir;
  }
}

TEST(WireLogprob, MinusInfinityIsMinus9999) {
  EXPECT_EQ(WireLogprob(-std::numeric_limits<float>::infinity()), -9999.0);
  EXPECT_EQ(WireLogprob(std::nanf("")), -9999.0);
  EXPECT_EQ(WireLogprob(-0.5f), -0.5);
}

GenerateDelta Delta(const std::string& text, std::vector<int> ids, bool logprobs) {
  GenerateDelta d;
  d.text = text;
  d.ids = ids;
  if (logprobs) {
    for (int id : ids) {
      model::SampledToken t;
      t.token = id;
      t.logprob = -0.25f;
      t.top_logprobs = {{id, -0.25f}, {id == 0 ? 1 : 0, -std::numeric_limits<float>::infinity()}};
      d.logprobs.push_back(t);
    }
  }
  return d;
}

TEST(ResponseBuilder, ChatChunks) {
  const TokenTable tokens({"A", "\xE2\x96\x81" "b"}, {false, false}, "sentencepiece");
  ResponseBuilder b(ApiKind::kChat, "chatcmpl-1", 7, "m", &tokens);
  b.set_include_usage(true);
  b.set_logprobs(true);
  b.set_session_id("s1");
  EXPECT_EQ(json::parse(b.FirstChunk()), json::parse(R"({"id":"chatcmpl-1","object":"chat.completion.chunk",
      "created":7,"model":"m","session_id":"s1","choices":[{"index":0,"delta":{"role":"assistant","content":""},
      "logprobs":null,"finish_reason":null}],"usage":null})"));
  EXPECT_EQ(json::parse(b.DeltaChunk(Delta(" b", {1}, true))), json::parse(R"({"id":"chatcmpl-1",
      "object":"chat.completion.chunk","created":7,"model":"m","session_id":"s1","choices":[{"index":0,
      "delta":{"content":" b"},"logprobs":{"content":[{"token":" b","logprob":-0.25,"bytes":[32,98],
      "top_logprobs":[{"token":" b","logprob":-0.25,"bytes":[32,98]},{"token":"A","logprob":-9999.0,"bytes":[65]}]}],
      "refusal":null},"finish_reason":null}],"usage":null})"));
  EXPECT_EQ(json::parse(b.FinishChunk(FinishReason::kEos))["choices"],
            json::parse(R"([{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}])"));
  const json usage = json::parse(b.UsageChunk({10, 3}));
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"], json::parse(R"({"prompt_tokens":10,"completion_tokens":3,"total_tokens":13})"));
  const json full = json::parse(b.Full("hi", {}, FinishReason::kLength, {4, 1}));
  EXPECT_EQ(full["object"], "chat.completion");
  EXPECT_EQ(full["choices"][0]["message"], json::parse(R"({"role":"assistant","content":"hi","refusal":null})"));
  EXPECT_EQ(full["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(full["usage"]["total_tokens"], 5);
}

TEST(ResponseBuilder, CompletionChunksWithoutUsageOrSession) {
  const TokenTable tokens({"A", "\xE2\x96\x81" "b"}, {false, false}, "sentencepiece");
  ResponseBuilder b(ApiKind::kCompletion, "cmpl-1", 7, "m", &tokens);
  b.set_logprobs(true);
  EXPECT_EQ(b.FirstChunk(), "");
  const json c1 = json::parse(b.DeltaChunk(Delta("A b", {0, 1}, true)));
  EXPECT_FALSE(c1.contains("usage"));
  EXPECT_FALSE(c1.contains("session_id"));
  EXPECT_EQ(c1["object"], "text_completion");
  EXPECT_EQ(c1["choices"][0]["text"], "A b");
  EXPECT_EQ(c1["choices"][0]["logprobs"], json::parse(R"({"tokens":["A"," b"],"token_logprobs":[-0.25,-0.25],
      "top_logprobs":[{"A":-0.25," b":-9999.0},{" b":-0.25,"A":-9999.0}],"text_offset":[0,1]})"));
  // Offsets continue across chunks.
  const json c2 = json::parse(b.DeltaChunk(Delta("A", {0}, true)));
  EXPECT_EQ(c2["choices"][0]["logprobs"]["text_offset"], json::array({3}));
  EXPECT_EQ(json::parse(b.FinishChunk(FinishReason::kStopString))["choices"][0]["finish_reason"], "stop");
}

TEST(Sse, Framing) {
  EXPECT_EQ(SseEvent("{}"), "data: {}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  EXPECT_THAT(NewResponseId(ApiKind::kChat), ::testing::MatchesRegex("chatcmpl-[0-9a-f]{24}"));
  EXPECT_THAT(NewResponseId(ApiKind::kCompletion), ::testing::MatchesRegex("cmpl-[0-9a-f]{24}"));
}

}  // namespace
}  // namespace echokv::server::openai
