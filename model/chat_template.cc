#include "model/chat_template.h"

#include <algorithm>
#include <limits>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "jinja/chat.h"
#include "model/gguf.h"
#include "model/gguf_tokenizer.h"
#include "jinja/value.h"
#include "nlohmann/json.hpp"

namespace echokv::model {
namespace {

using ordered_json = nlohmann::ordered_json;

// ---- built-in templates (ordinary Jinja; see the header for what they render) ----

constexpr char kChatMl[] = R"JINJA({%- for message in messages %}
    {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %})JINJA";

// Qwen2-Instruct's template.
constexpr char kQwen2[] = R"JINJA({%- for message in messages %}
    {%- if loop.first and messages[0]['role'] != 'system' %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
    {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %})JINJA";

// Qwen2.5-Instruct's template, as its tokenizer_config.json ships it.
constexpr char kQwen25[] = R"JINJA({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)JINJA";

// Mistral v1 instruct in the form mistral-common tokenizes: each user turn is
// "[INST] ... [/INST]", each assistant turn " {content}" + EOS (the space stands for
// the dummy prefix mistral-common's separate encoding gives the answer).
constexpr char kMistral[] = R"JINJA({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if loop_messages | length == 0 %}
    {{- raise_exception('The conversation has no user message.') }}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- '[INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- (' ' + message['content'] if message['content'] else '') + eos_token }}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %})JINJA";

// Llama-2-chat's template (Meta's chat_completion format).
constexpr char kLlama2[] = R"JINJA({%- if messages[0]['role'] == 'system' %}
    {%- set loop_messages = messages[1:] %}
    {%- set system_message = messages[0]['content'] %}
{%- else %}
    {%- set loop_messages = messages %}
    {%- set system_message = false %}
{%- endif %}
{%- if loop_messages | length == 0 %}
    {{- raise_exception('The conversation has no user message.') }}
{%- endif %}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if loop.index0 == 0 and system_message != false %}
        {%- set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}
    {%- else %}
        {%- set content = message['content'] %}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {{- bos_token + '[INST] ' + content.strip() + ' [/INST]' }}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + content.strip() + ' ' + eos_token }}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %})JINJA";

struct Builtin {
  const char* name;
  const char* source;
};
constexpr Builtin kBuiltins[] = {
    {"chatml", kChatMl}, {"qwen2", kQwen2}, {"qwen2.5", kQwen25}, {"mistral", kMistral}, {"llama2", kLlama2},
};

// ---- files ----

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", ec.message()));
  if (size > (64u << 20)) return absl::InvalidArgumentError(absl::StrCat(path, " is larger than 64 MiB"));
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return ss.str();
}

// "" when the file does not exist.
absl::StatusOr<std::string> ReadOptionalFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::string();
  return ReadFile(path);
}

absl::StatusOr<ordered_json> ParseObject(absl::string_view text, const char* file) {
  if (text.empty()) return ordered_json::object();
  ordered_json j = ordered_json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": invalid JSON (expected an object)"));
  }
  return j;
}

// A special-token field: "text", {"content": "text", ...} (AddedToken) or null.
absl::StatusOr<std::optional<std::string>> TokenField(const ordered_json& cfg, const std::string& key,
                                                      const char* file) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return std::optional<std::string>((*it)["content"].get<std::string>());
  }
  return absl::InvalidArgumentError(
      absl::StrCat(file, ": ", key, " must be a string or an object with a string \"content\""));
}

// The non-SentencePiece path leaves special-token matching to the tokenizer; this is
// SentencePiece's: every control piece, longest first.
std::vector<std::pair<std::string, int>> SpecialPieces(const Tokenizer& tokenizer) {
  std::vector<std::pair<std::string, int>> out;
  for (int id = 0; id < tokenizer.vocab_size(); ++id) {
    if (!tokenizer.IsSpecial(id)) continue;
    std::string piece = tokenizer.IdToPiece(id);
    if (!piece.empty()) out.emplace_back(std::move(piece), id);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return out;
}

}  // namespace

bool ChatMessage::operator==(const ChatMessage& o) const {
  if (role != o.role || content != o.content || name != o.name || tool_call_id != o.tool_call_id ||
      tool_calls.size() != o.tool_calls.size()) {
    return false;
  }
  for (size_t i = 0; i < tool_calls.size(); ++i) {
    const ToolCall& a = tool_calls[i];
    const ToolCall& b = o.tool_calls[i];
    if (a.id != b.id || a.type != b.type || a.name != b.name || a.arguments_json != b.arguments_json) return false;
  }
  return true;
}

ordered_json MessagesToJson(const std::vector<ChatMessage>& messages) {
  ordered_json out = ordered_json::array();
  for (const ChatMessage& m : messages) {
    ordered_json j = ordered_json::object();
    j["role"] = m.role;
    if (m.content.empty() && !m.tool_calls.empty()) {
      j["content"] = nullptr;
    } else {
      j["content"] = m.content;
    }
    if (!m.name.empty()) j["name"] = m.name;
    if (!m.tool_calls.empty()) {
      ordered_json calls = ordered_json::array();
      for (const ToolCall& c : m.tool_calls) {
        ordered_json call = ordered_json::object();
        if (!c.id.empty()) call["id"] = c.id;
        call["type"] = c.type.empty() ? "function" : c.type;
        ordered_json fn = ordered_json::object();
        fn["name"] = c.name;
        ordered_json args = ordered_json::parse(c.arguments_json, nullptr, /*allow_exceptions=*/false);
        if (!args.is_discarded() && args.is_object()) {
          fn["arguments"] = std::move(args);
        } else {
          fn["arguments"] = c.arguments_json;
        }
        call["function"] = std::move(fn);
        calls.push_back(std::move(call));
      }
      j["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    out.push_back(std::move(j));
  }
  return out;
}

absl::StatusOr<ChatTemplate> ChatTemplate::Create(absl::string_view source, ChatTemplateTokens tokens,
                                                  std::string origin, std::optional<std::string> tool_use_source) {
  ChatTemplate t;
  absl::StatusOr<std::unique_ptr<jinja::Template>> main = jinja::Template::Create(source);
  if (!main.ok()) {
    return absl::Status(main.status().code(), absl::StrCat(origin, ": ", main.status().message()));
  }
  t.default_ = std::shared_ptr<const jinja::Template>(std::move(*main));
  if (tool_use_source) {
    absl::StatusOr<std::unique_ptr<jinja::Template>> tool = jinja::Template::Create(*tool_use_source);
    if (!tool.ok()) {
      return absl::Status(tool.status().code(),
                          absl::StrCat(origin, " (tool_use): ", tool.status().message()));
    }
    t.tool_use_ = std::shared_ptr<const jinja::Template>(std::move(*tool));
  }
  t.tokens_ = std::move(tokens);
  t.origin_ = std::move(origin);
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Render(const ordered_json& messages, const ordered_json* tools,
                                                 bool add_generation_prompt,
                                                 const jinja::RenderOptions& options) const {
  jinja::ChatInput in;
  ECHOKV_ASSIGN_OR_RETURN(in.messages, jinja::Value::FromOrderedJson(messages));
  const bool with_tools = tools != nullptr && !tools->is_null();
  if (with_tools) {
    ECHOKV_ASSIGN_OR_RETURN(jinja::Value t, jinja::Value::FromOrderedJson(*tools));
    in.tools = std::move(t);
  }
  in.add_generation_prompt = add_generation_prompt;
  in.bos_token = tokens_.bos_token;
  in.eos_token = tokens_.eos_token;
  for (const auto& [name, text] : tokens_.others) in.extra.emplace_back(name, jinja::Value(text));
  const jinja::Template& tmpl = with_tools && tool_use_ ? *tool_use_ : *default_;
  absl::StatusOr<std::string> out = jinja::RenderChat(tmpl, in, options);
  if (!out.ok() && !jinja::IsRaisedByTemplate(out.status())) {
    // The template's own raise_exception message stays as it is (it is for the
    // client); anything else says which template failed.
    return absl::Status(out.status().code(), absl::StrCat("chat template ", origin_, ": ", out.status().message()));
  }
  return out;
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt,
                                                 const jinja::RenderOptions& options) const {
  return Render(MessagesToJson(messages), nullptr, add_generation_prompt, options);
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 absl::string_view tools_json, bool add_generation_prompt,
                                                 const jinja::RenderOptions& options) const {
  if (tools_json.empty()) return Render(MessagesToJson(messages), nullptr, add_generation_prompt, options);
  ordered_json tools = ordered_json::parse(tools_json, nullptr, /*allow_exceptions=*/false);
  if (tools.is_discarded() || !tools.is_array()) {
    return absl::InvalidArgumentError("tools: must be a JSON array of tool definitions");
  }
  return Render(MessagesToJson(messages), &tools, add_generation_prompt, options);
}

std::string BuiltinChatTemplateSource(absl::string_view name) {
  for (const Builtin& b : kBuiltins) {
    if (name == b.name) return b.source;
  }
  return "";
}

absl::StatusOr<ChatTemplate> BuiltinChatTemplate(absl::string_view name, ChatTemplateTokens tokens) {
  const std::string source = BuiltinChatTemplateSource(name);
  if (source.empty()) {
    std::string names;
    for (const Builtin& b : kBuiltins) absl::StrAppend(&names, names.empty() ? "" : ", ", b.name);
    return absl::InvalidArgumentError(absl::StrCat("unknown built-in chat template '", name, "' (", names, ")"));
  }
  return ChatTemplate::Create(source, std::move(tokens), absl::StrCat("builtin:", name));
}

absl::StatusOr<ChatTemplateTokens> ParseChatTemplateTokens(absl::string_view tokenizer_config_json,
                                                           absl::string_view special_tokens_map_json) {
  ECHOKV_ASSIGN_OR_RETURN(ordered_json cfg, ParseObject(tokenizer_config_json, "tokenizer_config.json"));
  ECHOKV_ASSIGN_OR_RETURN(ordered_json map, ParseObject(special_tokens_map_json, "special_tokens_map.json"));
  ChatTemplateTokens tokens;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}) {
    ECHOKV_ASSIGN_OR_RETURN(std::optional<std::string> v, TokenField(cfg, key, "tokenizer_config.json"));
    if (!v) {
      ECHOKV_ASSIGN_OR_RETURN(v, TokenField(map, key, "special_tokens_map.json"));
    }
    if (!v) continue;
    if (std::string(key) == "bos_token") {
      tokens.bos_token = *v;
    } else if (std::string(key) == "eos_token") {
      tokens.eos_token = *v;
    } else {
      tokens.others.emplace_back(key, *v);
    }
  }
  return tokens;
}

absl::StatusOr<ChatTemplate> ChatTemplateFromConfig(absl::string_view tokenizer_config_json,
                                                    absl::string_view special_tokens_map_json) {
  ECHOKV_ASSIGN_OR_RETURN(ChatTemplateTokens tokens,
                          ParseChatTemplateTokens(tokenizer_config_json, special_tokens_map_json));
  ECHOKV_ASSIGN_OR_RETURN(ordered_json cfg, ParseObject(tokenizer_config_json, "tokenizer_config.json"));
  const ordered_json ct = cfg.value("chat_template", ordered_json());
  if (ct.is_string()) {
    if (ct.get<std::string>().empty()) {
      return absl::UnimplementedError("tokenizer_config.json: chat_template is empty");
    }
    return ChatTemplate::Create(ct.get<std::string>(), std::move(tokens), "tokenizer_config.json");
  }
  if (ct.is_array()) {
    std::optional<std::string> main, tool_use;
    for (size_t i = 0; i < ct.size(); ++i) {
      const ordered_json& e = ct[i];
      if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") ||
          !e["template"].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tokenizer_config.json: chat_template[", i, "] must be an object with string \"name\" and \"template\""));
      }
      if (e["name"] == "default") main = e["template"].get<std::string>();
      if (e["name"] == "tool_use") tool_use = e["template"].get<std::string>();
    }
    if (!main) {
      return absl::InvalidArgumentError(
          "tokenizer_config.json: chat_template is a list without a \"default\" entry");
    }
    return ChatTemplate::Create(*main, std::move(tokens), "tokenizer_config.json", tool_use);
  }
  if (!ct.is_null()) {
    return absl::InvalidArgumentError(
        "tokenizer_config.json: chat_template must be a string or a list of {name, template}");
  }
  return absl::UnimplementedError("tokenizer_config.json has no chat_template");
}

absl::StatusOr<ChatTemplate> LoadChatTemplateOverride(const std::string& override_path, ChatTemplateTokens tokens) {
  if (absl::StartsWith(override_path, "builtin:")) return BuiltinChatTemplate(override_path.substr(8), std::move(tokens));
  ECHOKV_ASSIGN_OR_RETURN(std::string source, ReadFile(override_path));
  return ChatTemplate::Create(source, std::move(tokens), override_path);
}

absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& dir, const std::optional<std::string>& override_path) {
  if (IsGgufFile(dir)) {
    ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(dir));
    absl::StatusOr<ChatTemplate> t = LoadGgufChatTemplate(*gguf, override_path);
    if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat(dir, ": ", t.status().message()));
    return t;
  }
  const std::string config_path = dir + "/tokenizer_config.json";
  ECHOKV_ASSIGN_OR_RETURN(std::string config, ReadOptionalFile(config_path));
  ECHOKV_ASSIGN_OR_RETURN(std::string special_map, ReadOptionalFile(dir + "/special_tokens_map.json"));
  absl::StatusOr<ChatTemplateTokens> tokens = ParseChatTemplateTokens(config, special_map);
  if (!tokens.ok()) return absl::Status(tokens.status().code(), absl::StrCat(dir, ": ", tokens.status().message()));
  if (override_path) return LoadChatTemplateOverride(*override_path, *std::move(tokens));
  const std::string jinja_path = dir + "/chat_template.jinja";
  ECHOKV_ASSIGN_OR_RETURN(std::string jinja_source, ReadOptionalFile(jinja_path));
  if (!jinja_source.empty()) return ChatTemplate::Create(jinja_source, *std::move(tokens), jinja_path);
  absl::StatusOr<ChatTemplate> t = ChatTemplateFromConfig(config, special_map);
  if (t.ok()) return t;
  if (t.status().code() == absl::StatusCode::kUnimplemented) {
    return absl::UnimplementedError(absl::StrCat(
        dir, ": the model has no chat template (", t.status().message(),
        ", no chat_template.jinja); chat input needs one: start with --chat-template FILE"));
  }
  return absl::Status(t.status().code(), absl::StrCat(dir, ": ", t.status().message()));
}

absl::StatusOr<BoundedEncoding> EncodeRenderedChatAtMost(absl::string_view rendered, const Tokenizer& tokenizer,
                                                         int64_t max_tokens) {
  EncodeOptions plain;
  plain.add_special_tokens = false;
  if (tokenizer.kind() != "sentencepiece") {
    plain.parse_special = true;
    return tokenizer.EncodeAtMost(rendered, plain, max_tokens);
  }
  plain.parse_special = false;
  const std::vector<std::pair<std::string, int>> specials = SpecialPieces(tokenizer);
  BoundedEncoding out;
  std::vector<int>& ids = out.ids;
  size_t chunk_start = 0, i = 0;
  // Encodes rendered[chunk_start, end) within what is left of the budget.
  const auto flush = [&](size_t end) -> absl::Status {
    if (end > chunk_start) {
      const int64_t left = std::max<int64_t>(max_tokens - static_cast<int64_t>(ids.size()), -1);
      ECHOKV_ASSIGN_OR_RETURN(BoundedEncoding part,
                              tokenizer.EncodeAtMost(rendered.substr(chunk_start, end - chunk_start), plain, left));
      if (part.exceeded) {
        out.exceeded = true;
        out.at_least = static_cast<int64_t>(ids.size()) + part.at_least;
        return absl::OkStatus();
      }
      ids.insert(ids.end(), part.ids.begin(), part.ids.end());
    }
    return absl::OkStatus();
  };
  const auto over = [&] {
    if (!out.exceeded && static_cast<int64_t>(ids.size()) > max_tokens) {
      out.exceeded = true;
      out.at_least = static_cast<int64_t>(ids.size());
    }
    if (out.exceeded) ids.clear();
    return out.exceeded;
  };
  while (i < rendered.size()) {
    const std::pair<std::string, int>* hit = nullptr;
    for (const auto& s : specials) {
      if (rendered.substr(i, s.first.size()) == s.first) {
        hit = &s;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    ECHOKV_RETURN_IF_ERROR(flush(i));
    if (over()) return out;
    ids.push_back(hit->second);
    if (over()) return out;
    i += hit->first.size();
    chunk_start = i;
  }
  ECHOKV_RETURN_IF_ERROR(flush(rendered.size()));
  over();
  return out;
}

absl::StatusOr<std::vector<int>> EncodeRenderedChat(absl::string_view rendered, const Tokenizer& tokenizer) {
  ECHOKV_ASSIGN_OR_RETURN(BoundedEncoding enc,
                          EncodeRenderedChatAtMost(rendered, tokenizer, std::numeric_limits<int64_t>::max() - 1));
  return std::move(enc.ids);
}

absl::StatusOr<int> SpecialTokenId(absl::string_view text, const Tokenizer& tokenizer) {
  if (!text.empty()) {
    if (tokenizer.kind() == "sentencepiece") {
      for (const auto& [piece, id] : SpecialPieces(tokenizer)) {
        if (piece == text) return id;
      }
    } else {
      EncodeOptions o;
      o.add_special_tokens = false;
      o.parse_special = true;
      absl::StatusOr<std::vector<int>> ids = tokenizer.Encode(text, o);
      if (ids.ok() && ids->size() == 1 && tokenizer.IsSpecial(ids->front())) return ids->front();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("the tokenizer has no special token '", text, "'"));
}

std::vector<int> EndOfTurnIds(const ChatTemplate& tmpl, const Tokenizer& tokenizer) {
  std::vector<int> ids;
  if (absl::StatusOr<int> eos = SpecialTokenId(tmpl.eos_token(), tokenizer); eos.ok()) ids.push_back(*eos);
  for (int id : tokenizer.eos_ids()) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::vector<int>> EncodeChat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                            bool add_generation_prompt, const Tokenizer& tokenizer) {
  ECHOKV_ASSIGN_OR_RETURN(std::string text, tmpl.Render(messages, add_generation_prompt));
  return EncodeRenderedChat(text, tokenizer);
}

absl::StatusOr<BoundedEncoding> EncodeChatAtMost(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt, const Tokenizer& tokenizer,
                                                 int64_t max_tokens) {
  ECHOKV_ASSIGN_OR_RETURN(std::string text, tmpl.Render(messages, add_generation_prompt));
  return EncodeRenderedChatAtMost(text, tokenizer, max_tokens);
}

}  // namespace echokv::model
