#include "jinja/chat.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace echokv::jinja {

absl::Status ValidateChatInput(const ChatInput& input) {
  if (input.messages.kind() != Value::Kind::kList) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages: expected a list of messages, got ", input.messages.TypeName()));
  }
  const std::vector<Value>& messages = input.messages.list_value();
  for (size_t i = 0; i < messages.size(); ++i) {
    const Value& m = messages[i];
    if (m.kind() != Value::Kind::kDict) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "]: expected an object, got ", m.TypeName()));
    }
    const Value* role = m.dict_value().Find(Value("role"));
    if (role == nullptr) return absl::InvalidArgumentError(absl::StrCat("messages[", i, "].role: missing"));
    if (!role->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].role: expected a string, got ", role->TypeName()));
    }
  }
  if (input.tools && !input.tools->is_none() && input.tools->kind() != Value::Kind::kList) {
    return absl::InvalidArgumentError(
        absl::StrCat("tools: expected a list of tool definitions, got ", input.tools->TypeName()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RenderChat(const Template& tmpl, const ChatInput& input,
                                       const RenderOptions& options) {
  absl::Status valid = ValidateChatInput(input);
  if (!valid.ok()) return valid;
  std::vector<std::pair<std::string, Value>> vars = input.extra;
  vars.emplace_back("messages", input.messages);
  if (input.tools && !input.tools->is_none()) vars.emplace_back("tools", *input.tools);
  vars.emplace_back("add_generation_prompt", Value(input.add_generation_prompt));
  vars.emplace_back("bos_token", Value(input.bos_token));
  vars.emplace_back("eos_token", Value(input.eos_token));
  return tmpl.Render(Value::MakeDict(std::move(vars)), options);
}

}  // namespace echokv::jinja
