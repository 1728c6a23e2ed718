// The OpenAI-compatible wire format of echokv-server's HTTP API (docs/API.md, "HTTP
// API"): JSON request bodies -> native structs (every field checked, errors name the
// field as OpenAI's `param`), and native results -> OpenAI's response, chunk and
// logprobs objects. No sockets, no engine: server/doors/http/openai_server.cc does the I/O, and
// tests/server/openai_protocol_test.cc checks these shapes without a model.
//
//   ChatRequest req;
//   HttpError err;
//   if (!ParseChatRequest(body, &req, &err)) return Reply(err);   // 400 naming the param
//   ResponseBuilder out(ApiKind::kChat, "chatcmpl-...", created, "stories260K", &tokens);
//   std::string sse = SseEvent(out.DeltaChunk(delta));              // "data: {...}\n\n"
#ifndef ECHOKV_SERVER_DOORS_HTTP_OPENAI_PROTOCOL_H_
#define ECHOKV_SERVER_DOORS_HTTP_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/string_view.h"
#include "model/chat_template.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "server/engine/engine.h"
#include "server/doors/http/http_status.h"

namespace echokv::server::openai {

// The session a request names (body `session_id` or header `x-echokv-session`).
struct SessionRef {
  enum class Mode {
    kStateless,  // none: a temporary session, deleted after the response
    kNew,        // "new": create a session that outlives the response
    kContinue,   // an existing session id
  };
  Mode mode = Mode::kStateless;
  std::string id;  // kContinue
};

// echokv's extension object `echokv` (applies to sessions the request creates:
// "new" and stateless ones). Unset fields take the server defaults.
struct EchokvOptions {
  std::optional<std::string> policy;
  std::optional<int> budget;
  std::optional<int> lookahead;
  std::optional<int> workspace;
  std::optional<int> window;
  std::optional<std::string> memory;     // "evict" | "tiered"
  std::optional<std::string> cache_dtype;  // "float32" | "int8"
  std::optional<double> target_mass;       // (0, 1]: quality-targeted budget (echokv, snapkv)
  std::optional<int64_t> ttl_seconds;
};

// Fields common to chat and legacy completions.
struct GenerationRequest {
  std::string model;
  bool stream = false;
  bool include_usage = false;          // stream_options.include_usage
  std::optional<int> max_tokens;       // max_completion_tokens, else max_tokens
  std::string max_tokens_param;        // which of the two was given (for messages)
  model::SamplingParams sampling;      // OpenAI defaults: temperature 1, top_p 1
  std::optional<uint64_t> seed;        // unset: the server draws one per request
  std::vector<std::string> stop;
  std::vector<int> stop_token_ids;     // extension (vLLM's name)
  bool ignore_eos = false;             // extension (vLLM's name)
  std::string session_id;              // body `session_id`; "" = not given
  EchokvOptions echokv;
};

struct ChatRequest {
  GenerationRequest gen;
  std::vector<model::ChatMessage> messages;
  bool add_generation_prompt = true;   // extension (vLLM's name)
};

// One prompt of /v1/completions: text, or token ids.
struct CompletionPrompt {
  bool tokens = false;
  std::string text;
  std::vector<int> ids;
};

// Prompts in one /v1/completions request at most (each is its own choice; they run one
// after the other). More: 400 naming `prompt`, code too_many_prompts.
inline constexpr int kMaxPrompts = 16;

struct CompletionRequest {
  GenerationRequest gen;
  // Every prompt, in order: choice i answers prompts[i]. Never empty after a parse.
  std::vector<CompletionPrompt> prompts;
  // prompts[0]: exactly one of text (a string prompt) or tokens (token-id prompt).
  bool token_prompt = false;
  std::string text;
  std::vector<int> tokens;
};

// Parse a request body. false: `error` holds a 400 naming the field (malformed JSON:
// param null, the parser's position in the message). Unknown fields are ignored (as
// OpenAI does); known fields of the wrong type or out of range are errors; features
// echokv does not have (n > 1, tools, logit_bias, response_format json, echo, suffix,
// best_of > 1, non-text content parts) are refused by name. Client strings quoted in a
// message are cut to common/echo.h's EchoPrefix.
// max_tokens / max_completion_tokens must be in [1, max_new_tokens] (the server's
// limits.max_new_tokens: the bound checked is the bound the message states).
bool ParseChatRequest(absl::string_view body, ChatRequest* out, HttpError* error,
                      int max_new_tokens = kDefaultMaxNewTokens);
bool ParseCompletionRequest(absl::string_view body, CompletionRequest* out, HttpError* error,
                            int max_new_tokens = kDefaultMaxNewTokens);

// Resolves the body field and the header into one reference ("" = absent). Both given
// and different -> 400 naming session_id; "new" (any case) -> kNew.
bool ResolveSession(const std::string& body_id, const std::string& header_id, SessionRef* out, HttpError* error);

// Every token's raw bytes and display string, for logprobs. SentencePiece: "▁" ->
// space, "<0xHH>" -> that byte; byte-level BPE: GPT-2's byte<->unicode map inverted;
// special tokens: their text. The display string is the bytes when they are valid
// UTF-8, else "bytes:\xHH..." (OpenAI's convention for partial characters).
class TokenTable {
 public:
  explicit TokenTable(const model::Tokenizer& tokenizer);
  // From explicit pieces (tests): kind "sentencepiece" or "bpe".
  TokenTable(const std::vector<std::string>& pieces, const std::vector<bool>& special, absl::string_view kind);
  const std::string& Bytes(int id) const;   // "" out of range
  std::string Display(int id) const;

 private:
  void Build(const std::vector<std::string>& pieces, const std::vector<bool>& special, absl::string_view kind);
  std::vector<std::string> bytes_;          // per id
};

enum class ApiKind { kChat, kCompletion };

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// "stop" for eos / stop token / stop string, "length" for max_tokens.
const char* FinishReasonName(FinishReason reason);

// -inf (and NaN) logprobs become -9999.0, as OpenAI reports them.
double WireLogprob(float logprob);

// Builds the response objects of one request: OpenAI's shapes, plus `session_id`
// when a session holds the conversation.
class ResponseBuilder {
 public:
  ResponseBuilder(ApiKind kind, std::string id, int64_t created, std::string model, const TokenTable* tokens);
  void set_session_id(std::string id) { session_id_ = std::move(id); }
  void set_include_usage(bool on) { include_usage_ = on; }  // "usage": null on chunks
  void set_logprobs(bool on) { logprobs_ = on; }

  // Streaming: the first chunk (chat: delta {role: "assistant", content: ""};
  // completions: none, returns "").
  std::string FirstChunk() const;
  // One chunk per engine delta: text and, with logprobs, its tokens' logprobs.
  std::string DeltaChunk(const GenerateDelta& delta);
  // The chunk carrying finish_reason (empty delta / text).
  std::string FinishChunk(FinishReason reason) const;
  // The extra chunk of stream_options.include_usage: choices [] and usage.
  std::string UsageChunk(const Usage& usage) const;
  // Non-streaming: the whole response.
  std::string Full(const std::string& text, const std::vector<model::SampledToken>& logprobs, FinishReason reason,
                   const Usage& usage);

 private:
  nlohmann::ordered_json Envelope(const char* object) const;
  nlohmann::ordered_json Logprobs(const std::vector<model::SampledToken>& tokens);  // chat or legacy shape

  ApiKind kind_;
  std::string id_;
  int64_t created_;
  std::string model_;
  const TokenTable* tokens_;      // not owned
  std::string session_id_;        // "" = stateless
  bool include_usage_ = false;
  bool logprobs_ = false;
  int64_t text_offset_ = 0;       // completions logprobs: characters emitted so far
};

// "data: <json>\n\n"; the terminator is kSseDone.
std::string SseEvent(const std::string& json);
inline constexpr absl::string_view kSseDone = "data: [DONE]\n\n";

// Compact JSON (invalid UTF-8 replaced, never a throw).
std::string Dump(const nlohmann::json& value);
std::string Dump(const nlohmann::ordered_json& value);

// "chatcmpl-" / "cmpl-" + 24 random hex digits.
std::string NewResponseId(ApiKind kind);

}  // namespace echokv::server::openai

#endif  // ECHOKV_SERVER_DOORS_HTTP_OPENAI_PROTOCOL_H_
