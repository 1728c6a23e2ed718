#include "model/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace echokv::model {
namespace {

using json = nlohmann::json;

constexpr char kQwen25System[] =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
constexpr char kQwen2System[] = "You are a helpful assistant.";

ChatSegment Text(std::string text) { return {ChatSegment::Kind::kText, std::move(text)}; }
ChatSegment Special(std::string text) { return {ChatSegment::Kind::kSpecialToken, std::move(text)}; }
ChatSegment Bos() { return {ChatSegment::Kind::kBos, "<s>"}; }
ChatSegment Eos() { return {ChatSegment::Kind::kEos, "</s>"}; }

ChatTemplate Make(ChatTemplateFamily family, std::string system = "") {
  ChatTemplate t;
  t.family = family;
  t.default_system_prompt = std::move(system);
  return t;
}

absl::Status CheckRole(const ChatMessage& m, size_t i) {
  if (m.role == "system" || m.role == "user" || m.role == "assistant") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("chat message ", i, ": unknown role '", m.role,
                                                 "' (system, user or assistant)"));
}

// Checks [system] user assistant user ... and returns the index of the first non-system
// message.
absl::StatusOr<size_t> CheckAlternation(const std::vector<ChatMessage>& messages) {
  size_t start = 0;
  for (size_t i = 0; i < messages.size(); ++i) ECHOKV_RETURN_IF_ERROR(CheckRole(messages[i], i));
  if (!messages.empty() && messages[0].role == "system") start = 1;
  if (start == messages.size()) {
    return absl::InvalidArgumentError("chat has no user message");
  }
  for (size_t i = start; i < messages.size(); ++i) {
    const char* want = ((i - start) % 2 == 0) ? "user" : "assistant";
    if (messages[i].role != want) {
      return absl::InvalidArgumentError(absl::StrCat("chat message ", i, ": role '", messages[i].role,
                                                     "' where '", want,
                                                     "' was expected (roles must alternate)"));
    }
  }
  return start;
}

std::vector<ChatSegment> RenderChatMl(const ChatTemplate& t, const std::vector<ChatMessage>& msgs) {
  std::vector<ChatSegment> out;
  const auto turn = [&](const std::string& role, const std::string& content) {
    out.push_back(Special("<|im_start|>"));
    out.push_back(Text(absl::StrCat(role, "\n", content)));
    out.push_back(Special("<|im_end|>"));
    out.push_back(Text("\n"));
  };
  size_t start = 0;
  if (!msgs.empty() && msgs[0].role == "system") {
    turn("system", msgs[0].content);
    start = 1;
  } else if (!t.default_system_prompt.empty()) {
    turn("system", t.default_system_prompt);
  }
  for (size_t i = start; i < msgs.size(); ++i) turn(msgs[i].role, msgs[i].content);
  if (t.add_generation_prompt) {
    out.push_back(Special("<|im_start|>"));
    out.push_back(Text("assistant\n"));
  }
  return out;
}

absl::StatusOr<std::vector<ChatSegment>> RenderMistral(const std::vector<ChatMessage>& msgs) {
  ECHOKV_ASSIGN_OR_RETURN(size_t start, CheckAlternation(msgs));
  std::vector<ChatSegment> out = {Bos()};
  for (size_t i = start; i < msgs.size(); ++i) {
    if (msgs[i].role == "user") {
      std::string content = msgs[i].content;
      if (i == start && start == 1) content = absl::StrCat(msgs[0].content, "\n\n", content);
      out.push_back(Text(absl::StrCat("[INST] ", content, " [/INST]")));
    } else {
      out.push_back(Text(msgs[i].content));
      out.push_back(Eos());
    }
  }
  return out;
}

absl::StatusOr<std::vector<ChatSegment>> RenderLlama2(const std::vector<ChatMessage>& msgs) {
  ECHOKV_ASSIGN_OR_RETURN(size_t start, CheckAlternation(msgs));
  std::vector<ChatSegment> out;
  for (size_t i = start; i < msgs.size(); i += 2) {
    std::string user = msgs[i].content;
    if (i == start && start == 1) {
      user = absl::StrCat("<<SYS>>\n", msgs[0].content, "\n<</SYS>>\n\n", user);
    }
    std::string text = absl::StrCat("[INST] ", absl::StripAsciiWhitespace(user), " [/INST]");
    out.push_back(Bos());
    if (i + 1 < msgs.size()) {
      absl::StrAppend(&text, " ", absl::StripAsciiWhitespace(msgs[i + 1].content), " ");
      out.push_back(Text(std::move(text)));
      out.push_back(Eos());
    } else {
      out.push_back(Text(std::move(text)));
    }
  }
  return out;
}

absl::StatusOr<std::string> ReadOptionalFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::string();
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec || size > (64u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", path, " (or larger than 64 MiB)"));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return ss.str();
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplateFromName(absl::string_view name) {
  if (name == "raw") return Make(ChatTemplateFamily::kRaw);
  if (name == "chatml") return Make(ChatTemplateFamily::kChatMl);
  if (name == "qwen2") return Make(ChatTemplateFamily::kChatMl, kQwen2System);
  if (name == "qwen2.5") return Make(ChatTemplateFamily::kChatMl, kQwen25System);
  if (name == "mistral") return Make(ChatTemplateFamily::kMistral);
  if (name == "llama2") return Make(ChatTemplateFamily::kLlama2);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown chat template '", name, "' (raw, chatml, qwen2, qwen2.5, mistral, llama2)"));
}

absl::StatusOr<ChatTemplate> DetectChatTemplate(absl::string_view tokenizer_config_json,
                                                absl::string_view model_type) {
  std::string tmpl;
  if (!tokenizer_config_json.empty()) {
    json cfg = json::parse(tokenizer_config_json.begin(), tokenizer_config_json.end(), nullptr,
                           /*allow_exceptions=*/false);
    if (cfg.is_discarded() || !cfg.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json: invalid JSON");
    }
    const json ct = cfg.value("chat_template", json());
    if (ct.is_string()) {
      tmpl = ct.get<std::string>();
    } else if (ct.is_array()) {
      for (const json& entry : ct) {
        if (entry.is_object() && entry.value("name", std::string()) == "default" &&
            entry.contains("template") && entry["template"].is_string()) {
          tmpl = entry["template"].get<std::string>();
        }
      }
      if (tmpl.empty()) {
        return absl::InvalidArgumentError(
            "tokenizer_config.json: chat_template list has no 'default' entry");
      }
    } else if (!ct.is_null()) {
      return absl::InvalidArgumentError("tokenizer_config.json: chat_template is not a string or list");
    }
  }
  if (!tmpl.empty()) {
    if (absl::StrContains(tmpl, "<|im_start|>")) {
      if (absl::StrContains(tmpl, "You are Qwen, created by Alibaba Cloud")) {
        return Make(ChatTemplateFamily::kChatMl, kQwen25System);
      }
      if (absl::StrContains(tmpl, kQwen2System)) return Make(ChatTemplateFamily::kChatMl, kQwen2System);
      return Make(ChatTemplateFamily::kChatMl);
    }
    if (absl::StrContains(tmpl, "<<SYS>>")) return Make(ChatTemplateFamily::kLlama2);
    if (absl::StrContains(tmpl, "[INST]") && absl::StrContains(tmpl, "[/INST]") &&
        !absl::StrContains(tmpl, "[AVAILABLE_TOOLS]") &&
        !absl::StrContains(tmpl, "[SYSTEM_PROMPT]")) {
      return Make(ChatTemplateFamily::kMistral);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer_config.json: unrecognised chat_template (known: ChatML/Qwen2, Mistral v1 "
        "[INST], Llama-2 <<SYS>>); its start: '",
        tmpl.substr(0, 80), "'"));
  }
  if (model_type == "qwen2") return Make(ChatTemplateFamily::kChatMl, kQwen25System);
  if (model_type == "mistral") return Make(ChatTemplateFamily::kMistral);
  if (model_type == "llama") return Make(ChatTemplateFamily::kLlama2);
  return absl::InvalidArgumentError(absl::StrCat(
      "no chat_template in tokenizer_config.json and no default for model_type '", model_type,
      "' (qwen2, mistral, llama); pick one by name or use raw"));
}

absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& dir) {
  ECHOKV_ASSIGN_OR_RETURN(std::string tok_cfg, ReadOptionalFile(dir + "/tokenizer_config.json"));
  ECHOKV_ASSIGN_OR_RETURN(std::string config, ReadOptionalFile(dir + "/config.json"));
  std::string model_type;
  if (!config.empty()) {
    json c = json::parse(config.begin(), config.end(), nullptr, /*allow_exceptions=*/false);
    if (c.is_object() && c.contains("model_type") && c["model_type"].is_string()) {
      model_type = c["model_type"].get<std::string>();
    }
  }
  auto t = DetectChatTemplate(tok_cfg, model_type);
  if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat(dir, ": ", t.status().message()));
  return t;
}

absl::StatusOr<std::vector<ChatSegment>> RenderChat(const ChatTemplate& tmpl,
                                                    const std::vector<ChatMessage>& messages) {
  if (messages.empty()) return absl::InvalidArgumentError("chat has no messages");
  switch (tmpl.family) {
    case ChatTemplateFamily::kRaw: {
      std::string text;
      for (const ChatMessage& m : messages) text += m.content;
      return std::vector<ChatSegment>{{ChatSegment::Kind::kRawText, std::move(text)}};
    }
    case ChatTemplateFamily::kChatMl:
      return RenderChatMl(tmpl, messages);
    case ChatTemplateFamily::kMistral:
      return RenderMistral(messages);
    case ChatTemplateFamily::kLlama2:
      return RenderLlama2(messages);
  }
  return absl::InvalidArgumentError("unknown chat template family");
}

absl::StatusOr<std::string> RenderChatToString(const ChatTemplate& tmpl,
                                               const std::vector<ChatMessage>& messages) {
  ECHOKV_ASSIGN_OR_RETURN(std::vector<ChatSegment> segments, RenderChat(tmpl, messages));
  std::string out;
  for (const ChatSegment& s : segments) out += s.text;
  return out;
}

absl::StatusOr<std::vector<int>> EncodeChatSegments(const std::vector<ChatSegment>& segments,
                                                    const Tokenizer& tokenizer) {
  std::vector<int> ids;
  EncodeOptions plain;
  plain.add_special_tokens = false;
  plain.parse_special = false;
  for (const ChatSegment& s : segments) {
    switch (s.kind) {
      case ChatSegment::Kind::kText: {
        if (s.text.empty()) break;
        ECHOKV_ASSIGN_OR_RETURN(std::vector<int> part, tokenizer.Encode(s.text, plain));
        ids.insert(ids.end(), part.begin(), part.end());
        break;
      }
      case ChatSegment::Kind::kRawText: {
        ECHOKV_ASSIGN_OR_RETURN(std::vector<int> part, tokenizer.Encode(s.text, EncodeOptions{}));
        ids.insert(ids.end(), part.begin(), part.end());
        break;
      }
      case ChatSegment::Kind::kBos: {
        if (!tokenizer.bos_id()) {
          return absl::InvalidArgumentError("chat template needs a BOS token but the tokenizer has none");
        }
        ids.push_back(*tokenizer.bos_id());
        break;
      }
      case ChatSegment::Kind::kEos: {
        const std::vector<int> eos = tokenizer.eos_ids();
        if (eos.empty()) {
          return absl::InvalidArgumentError("chat template needs an EOS token but the tokenizer has none");
        }
        ids.push_back(eos.front());
        break;
      }
      case ChatSegment::Kind::kSpecialToken: {
        EncodeOptions special;
        special.add_special_tokens = false;
        special.parse_special = true;
        auto part = tokenizer.Encode(s.text, special);
        if (!part.ok() || part->size() != 1 || !tokenizer.IsSpecial(part->front())) {
          return absl::InvalidArgumentError(absl::StrCat(
              "chat template needs the special token '", s.text, "', which this tokenizer lacks"));
        }
        ids.push_back(part->front());
        break;
      }
    }
  }
  return ids;
}

absl::StatusOr<std::vector<int>> EncodeChat(const ChatTemplate& tmpl,
                                            const std::vector<ChatMessage>& messages,
                                            const Tokenizer& tokenizer) {
  ECHOKV_ASSIGN_OR_RETURN(std::vector<ChatSegment> segments, RenderChat(tmpl, messages));
  return EncodeChatSegments(segments, tokenizer);
}

}  // namespace echokv::model
