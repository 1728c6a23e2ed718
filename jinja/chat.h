// Rendering a conversation with a Hugging Face chat template: the variables
// transformers' apply_chat_template passes (messages, tools, add_generation_prompt,
// bos_token, eos_token, other special tokens), with the conventions of the reference
// renders in shared/chat_templates (tools absent -> `tools` undefined, not None; a
// missing bos/eos token -> "").
//
//   ECHOKV_ASSIGN_OR_RETURN(auto tmpl, jinja::Template::Create(source));
//   jinja::ChatInput in;
//   ECHOKV_ASSIGN_OR_RETURN(in.messages, jinja::Value::FromJsonText(R"([{"role":"user","content":"Hi"}])"));
//   in.add_generation_prompt = true;
//   in.bos_token = "<|begin_of_text|>";
//   ECHOKV_ASSIGN_OR_RETURN(std::string prompt, jinja::RenderChat(*tmpl, in));
#ifndef ECHOKV_JINJA_CHAT_H_
#define ECHOKV_JINJA_CHAT_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "jinja/template.h"
#include "jinja/value.h"

namespace echokv::jinja {

struct ChatInput {
  // OpenAI-style messages: a list of dicts with a string `role`; `content` a string,
  // null or a list of parts; optional tool_calls, tool_call_id, name (passed through
  // to the template unchanged).
  Value messages;
  // The tool definitions; nullopt (or None) leaves `tools` undefined in the template.
  std::optional<Value> tools;
  bool add_generation_prompt = false;
  std::string bos_token;
  std::string eos_token;
  // More template variables (e.g. unk_token, pad_token, date_string); they override
  // nothing above.
  std::vector<std::pair<std::string, Value>> extra;
};

// InvalidArgument naming the bad field ("messages[1].role: ...") unless `messages` is
// a list of dicts each with a string role, and `tools` (when given) a list.
absl::Status ValidateChatInput(const ChatInput& input);

// ValidateChatInput + Template::Render with the variables above.
absl::StatusOr<std::string> RenderChat(const Template& tmpl, const ChatInput& input,
                                       const RenderOptions& options = {});

}  // namespace echokv::jinja

#endif  // ECHOKV_JINJA_CHAT_H_
