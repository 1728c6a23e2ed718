// Chat templates: the model's own Jinja2 chat template (tokenizer_config.json's
// `chat_template`), rendered with jinja/ exactly as transformers' apply_chat_template
// renders it, and the tokenization of the result. There is no guessing: a model
// without a template has no chat format unless the operator names one.
//
//   ECHOKV_ASSIGN_OR_RETURN(ChatTemplate tmpl, LoadChatTemplate("/models/qwen2.5-7b"));
//   ECHOKV_ASSIGN_OR_RETURN(std::string prompt,
//                           tmpl.Render(messages_json, /*tools=*/nullptr, /*add_generation_prompt=*/true));
//   ECHOKV_ASSIGN_OR_RETURN(std::vector<int> ids, EncodeRenderedChat(prompt, *tokenizer));
//
// Where the template comes from (LoadChatTemplate):
//   1. the operator's override file (`--chat-template FILE`: Jinja source), or
//      "builtin:NAME" for one of the built-in templates below;
//   2. `dir`/chat_template.jinja (where newer transformers save it);
//   3. `dir`/tokenizer_config.json's `chat_template`: a string, or a list of
//      {name, template} entries: "default" is used, and "tool_use" (when present)
//      for renders that pass tools - transformers' rule.
//   Otherwise UNIMPLEMENTED ("pass --chat-template").
// bos_token / eos_token (strings or AddedToken objects {"content": ...}) come from
// tokenizer_config.json, else special_tokens_map.json; a missing one renders as "".
// The other special tokens there (unk_token, pad_token, ...) are template variables
// too, as in transformers.
//
// Rendering conventions (those of shared/chat_templates/golden_public.json, which is
// transformers' behaviour): `messages` as given, `tools` undefined when absent,
// `add_generation_prompt`, the special tokens; strftime_now reads the local clock
// unless RenderOptions::now is set.
//
// Tokenization (EncodeRenderedChat): the rendered text is tokenized as
// `tokenizer.encode(text, add_special_tokens=False)` does in transformers: no BOS is
// added (templates emit it), and special-token text anywhere in it - including inside
// message contents - becomes the special token. SentencePiece has no special-token
// matching of its own, so the text is split at the tokenizer's control-token strings
// and each piece is encoded alone (each gets SentencePiece's dummy-prefix space, as
// HF's legacy Llama/Mistral tokenizers and mistral-common do).
//
// Built-in templates (BuiltinChatTemplate), ordinary Jinja templates kept for models
// whose tokenizer_config.json lacks one:
//   "chatml"   <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
//   "qwen2"    ChatML with default system "You are a helpful assistant."
//   "qwen2.5"  Qwen2.5-Instruct's own template (tools included)
//   "mistral"  Mistral v1 instruct as mistral-common encodes it:
//              {bos}[INST] {sys}\n\n{u1} [/INST] {a1}{eos}[INST] {u2} [/INST]
//   "llama2"   Llama-2-chat: {bos}[INST] <<SYS>>\n{sys}\n<</SYS>>\n\n{u1} [/INST] {a1} {eos}...
#ifndef ECHOKV_MODEL_CHAT_TEMPLATE_H_
#define ECHOKV_MODEL_CHAT_TEMPLATE_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "jinja/template.h"
#include "model/tokenizer.h"
#include "nlohmann/json_fwd.hpp"

namespace echokv::model {

// One tool call of an assistant message (OpenAI shape).
struct ToolCall {
  std::string id;
  std::string type = "function";
  std::string name;            // function.name
  std::string arguments_json;  // function.arguments: JSON text
};

// One message (the gRPC API's ChatMessage): role and content, plus the tool fields of
// OpenAI's message shape.
struct ChatMessage {
  std::string role;
  std::string content;
  // The rest default to absent, so `ChatMessage{role, content}` is a whole message.
  std::string name = {};                  // optional author name ("" = absent)
  std::vector<ToolCall> tool_calls = {};  // assistant messages that call tools
  std::string tool_call_id = {};          // tool messages: the call they answer ("" = absent)
  bool operator==(const ChatMessage& o) const;
};

// The JSON messages templates read: content is null for a tool-calling assistant
// message without text; tool call arguments are parsed into an object when they are a
// JSON object (HF templates print them with tojson), else kept as the string.
nlohmann::ordered_json MessagesToJson(const std::vector<ChatMessage>& messages);

// The special-token strings a template sees.
struct ChatTemplateTokens {
  std::string bos_token;  // "" when the model has none
  std::string eos_token;  // "" when the model has none
  // Other special tokens of the tokenizer files (unk_token, pad_token, ...), passed to
  // the template as variables.
  std::vector<std::pair<std::string, std::string>> others;
};

class ChatTemplate {
 public:
  // `source`: Jinja text of the default template; `tool_use_source`: the optional
  // tool-use variant (used when tools are passed). `origin` names where it came from
  // ("tokenizer_config.json", a file path, "builtin:chatml") for messages.
  // InvalidArgument "<origin>: template line L column C: ..." for a template that does
  // not parse.
  static absl::StatusOr<ChatTemplate> Create(absl::string_view source, ChatTemplateTokens tokens,
                                             std::string origin,
                                             std::optional<std::string> tool_use_source = std::nullopt);

  // Renders `messages` (a JSON array of OpenAI-style messages: role, content (string,
  // null or parts), tool_calls, tool_call_id, name). `tools`: a JSON array, or null /
  // nullptr for none. Errors: InvalidArgument naming the bad field; the template's
  // own raise_exception(msg) as InvalidArgument with message msg
  // (jinja::IsRaisedByTemplate tells it apart); other template failures as
  // InvalidArgument with the template line and column.
  // ordered_json keeps the key order of tool schemas, which tojson prints.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json* tools,
                                     bool add_generation_prompt, const jinja::RenderOptions& options = {}) const;
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                     const jinja::RenderOptions& options = {}) const;
  // With tool definitions given as JSON text (a JSON array; "" = none).
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages, absl::string_view tools_json,
                                     bool add_generation_prompt, const jinja::RenderOptions& options = {}) const;

  const std::string& bos_token() const { return tokens_.bos_token; }
  const std::string& eos_token() const { return tokens_.eos_token; }
  const ChatTemplateTokens& tokens() const { return tokens_; }
  const std::string& origin() const { return origin_; }
  bool has_tool_use_variant() const { return tool_use_ != nullptr; }

 private:
  std::shared_ptr<const jinja::Template> default_;   // the template (immutable, shareable)
  std::shared_ptr<const jinja::Template> tool_use_;  // the tool-use variant, or null
  ChatTemplateTokens tokens_;                         // special-token variables
  std::string origin_;                                // where the template came from
};

// The built-in templates named above; InvalidArgument listing the names otherwise.
absl::StatusOr<ChatTemplate> BuiltinChatTemplate(absl::string_view name, ChatTemplateTokens tokens);
// The Jinja source of a built-in template ("" for an unknown name).
std::string BuiltinChatTemplateSource(absl::string_view name);

// The special tokens of tokenizer_config.json text (and special_tokens_map.json text,
// used for tokens the first lacks). Either may be "" (no such file).
absl::StatusOr<ChatTemplateTokens> ParseChatTemplateTokens(absl::string_view tokenizer_config_json,
                                                           absl::string_view special_tokens_map_json = "");

// The template of tokenizer_config.json text (see the rules above). UNIMPLEMENTED when
// it has none; InvalidArgument for a malformed `chat_template` or bad JSON.
absl::StatusOr<ChatTemplate> ChatTemplateFromConfig(absl::string_view tokenizer_config_json,
                                                    absl::string_view special_tokens_map_json = "");

// Loads the model directory's template, or the operator's override (a Jinja file, or
// "builtin:NAME"), with the model's special tokens. UNIMPLEMENTED when there is no
// template; NotFound / InvalidArgument naming the file for unreadable or bad ones.
// `dir` may also be a .gguf file (its tokenizer.chat_template: model/gguf_tokenizer.h).
absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& dir,
                                              const std::optional<std::string>& override_path = std::nullopt);
// The operator's template: a Jinja file or "builtin:NAME", with the model's tokens.
absl::StatusOr<ChatTemplate> LoadChatTemplateOverride(const std::string& override_path, ChatTemplateTokens tokens);

// Token ids of a rendered conversation (see "Tokenization" above).
absl::StatusOr<std::vector<int>> EncodeRenderedChat(absl::string_view rendered, const Tokenizer& tokenizer);
// The same with bounded work (Tokenizer::EncodeAtMost): exactly EncodeRenderedChat's
// ids when they fit in `max_tokens`, else `exceeded` after about max_tokens ids.
absl::StatusOr<BoundedEncoding> EncodeRenderedChatAtMost(absl::string_view rendered, const Tokenizer& tokenizer,
                                                         int64_t max_tokens);

// The id of one special token given by its text ("<|eot_id|>", "</s>");
// InvalidArgument when the tokenizer has no such single special token.
absl::StatusOr<int> SpecialTokenId(absl::string_view text, const Tokenizer& tokenizer);

// The ids that end an assistant turn: the template's eos_token (when it is a special
// token of the tokenizer) followed by the tokenizer's EOS ids not already listed.
std::vector<int> EndOfTurnIds(const ChatTemplate& tmpl, const Tokenizer& tokenizer);

// Render + EncodeRenderedChat, for {role, content} messages. Errors carry the render's
// status unchanged.
absl::StatusOr<std::vector<int>> EncodeChat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                            bool add_generation_prompt, const Tokenizer& tokenizer);
// Render + EncodeRenderedChatAtMost (untrusted input: the server).
absl::StatusOr<BoundedEncoding> EncodeChatAtMost(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt, const Tokenizer& tokenizer,
                                                 int64_t max_tokens);

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_CHAT_TEMPLATE_H_
