// Chat templates: turn a list of {role, content} messages into the token ids a chat
// model was trained on, for the families echokv serves. A conversation renders to
// segments (text, or a special token given by id), and each text segment is encoded
// on its own with special-token matching OFF, so a user message containing
// "<|im_end|>" or "</s>" stays plain text (mistral-common style).
//
//   ECHOKV_ASSIGN_OR_RETURN(ChatTemplate tmpl, LoadChatTemplate("/models/qwen2.5-7b"));
//   std::vector<ChatMessage> chat = {{"user", "Hi!"}};
//   ECHOKV_ASSIGN_OR_RETURN(std::vector<int> ids, EncodeChat(tmpl, chat, *tokenizer));
//   std::string shown = RenderChatToString(tmpl, chat).value();  // for logs and tests
//
// What each family renders ([BOS]/[EOS] are token ids, shown as <s>/</s>; text between
// them is one segment; {sys} is the system message content, {uN}/{aN} the user /
// assistant contents; roles must alternate user/assistant after an optional leading
// system message, except in ChatML, which accepts any role names and order):
//
// kChatMl (Qwen2 / Qwen2.5; <|im_start|> and <|im_end|> are special-token segments):
//   <|im_start|>system\n{sys}<|im_end|>\n          (or default_system_prompt; nothing
//                                                   when both are empty)
//   <|im_start|>{role}\n{content}<|im_end|>\n      for every other message
//   <|im_start|>assistant\n                        when add_generation_prompt
//   Qwen2.5's default system prompt is "You are Qwen, created by Alibaba Cloud. You
//   are a helpful assistant."; Qwen2's is "You are a helpful assistant.".
//
// kMistral (Mistral-7B-Instruct v0.1/v0.2, mistral-common "v1" tokenizer):
//   [BOS] "[INST] {u1} [/INST]" "{a1}" [EOS] "[INST] {u2} [/INST]" ...
//   a system message is prepended to the first user message as "{sys}\n\n{u1}".
//   Each quoted part is its own text segment (SentencePiece adds its dummy-prefix
//   space to each). Nothing is added for the generation prompt. A final assistant
//   message is closed with [EOS].
//
// kLlama2 (Llama-2-chat, Meta's reference chat_completion):
//   [BOS] "[INST] <<SYS>>\n{sys}\n<</SYS>>\n\n{u1} [/INST] {a1} " [EOS]
//   [BOS] "[INST] {u2} [/INST] {a2} " [EOS] ... [BOS] "[INST] {uN} [/INST]"
//   contents are stripped of leading/trailing whitespace (as the reference does);
//   without a system message the <<SYS>> block is absent. One segment per turn pair.
//
// kRaw: the contents of all messages concatenated verbatim (pre-formatted text), encoded
//   as one segment with special-token matching ON and the tokenizer's default BOS.
#ifndef ECHOKV_MODEL_CHAT_TEMPLATE_H_
#define ECHOKV_MODEL_CHAT_TEMPLATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/tokenizer.h"

namespace echokv::model {

struct ChatMessage {
  std::string role;     // "system", "user" or "assistant"
  std::string content;  // plain text; never parsed for special tokens (except kRaw)
};

enum class ChatTemplateFamily { kRaw, kChatMl, kMistral, kLlama2 };

struct ChatTemplate {
  ChatTemplateFamily family = ChatTemplateFamily::kRaw;
  // kChatMl only: the system message used when the conversation has none ("" = none).
  std::string default_system_prompt;
  // Append the assistant header (kChatMl) so the model continues as the assistant.
  bool add_generation_prompt = true;
};

// "raw", "chatml", "qwen2", "qwen2.5", "mistral", "llama2" -> a template;
// anything else -> InvalidArgument listing the names.
absl::StatusOr<ChatTemplate> ChatTemplateFromName(absl::string_view name);

// Picks the template from tokenizer_config.json's `chat_template` (a string, or a list
// of {name, template} where "default" is used) by fingerprinting known templates;
// without one, from config.json's `model_type` ("qwen2" -> Qwen2.5 ChatML, "mistral",
// "llama" -> Llama-2). An unrecognised template or model type -> InvalidArgument.
// Either text may be empty ("no such file").
absl::StatusOr<ChatTemplate> DetectChatTemplate(absl::string_view tokenizer_config_json,
                                                absl::string_view model_type);

// Reads `dir`/tokenizer_config.json and `dir`/config.json (each optional) and calls
// DetectChatTemplate.
absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& dir);

// One piece of a rendered conversation.
struct ChatSegment {
  enum class Kind {
    kText,          // plain text: encoded alone, no BOS, parse_special = false
    kRawText,       // pre-formatted text: parse_special = true, tokenizer's default BOS
    kBos,           // the tokenizer's bos_id()
    kEos,           // the tokenizer's first eos id
    kSpecialToken,  // the special token whose text is `text` (e.g. "<|im_start|>")
  };
  Kind kind;
  std::string text;  // the text; for kBos/kEos the display form "<s>" / "</s>"
};

// Renders `messages`; InvalidArgument naming the message index for an empty
// conversation, an unknown role or a broken user/assistant alternation.
absl::StatusOr<std::vector<ChatSegment>> RenderChat(const ChatTemplate& tmpl,
                                                    const std::vector<ChatMessage>& messages);

// The rendering as one string (segment texts concatenated): for logs and tests.
absl::StatusOr<std::string> RenderChatToString(const ChatTemplate& tmpl,
                                               const std::vector<ChatMessage>& messages);

// Encodes rendered segments with `tokenizer`. A kSpecialToken text must encode (with
// parse_special) to exactly one special id, and kBos/kEos need the tokenizer to have
// them; otherwise InvalidArgument naming the token.
absl::StatusOr<std::vector<int>> EncodeChatSegments(const std::vector<ChatSegment>& segments,
                                                    const Tokenizer& tokenizer);

// RenderChat + EncodeChatSegments.
absl::StatusOr<std::vector<int>> EncodeChat(const ChatTemplate& tmpl,
                                            const std::vector<ChatMessage>& messages,
                                            const Tokenizer& tokenizer);

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_CHAT_TEMPLATE_H_
