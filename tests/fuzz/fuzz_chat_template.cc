// libFuzzer target: the chat template engine (jinja/ through model/chat_template.cc).
//   selector % 4 == 0: a template source, NUL, a request JSON (below): parse + render
//     (what an operator's --chat_template file or a model's tokenizer_config.json holds)
//   selector % 4 == 1: one of the six real templates of ../shared/chat_templates
//     ((selector / 4) % 6) rendering a request JSON: the client-controlled part
//   selector % 4 == 2: the same, with the messages as the gRPC edge passes them
//     (model::ChatMessage structs, tools as JSON text)
//   selector % 4 == 3: tokenizer_config.json, NUL, special_tokens_map.json
//     (ChatTemplateFromConfig: chat_template as a string or a list of named templates)
// Request JSON: {"messages": [...], "tools": [...], "add_generation_prompt": bool}, or a
// bare messages array.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/chat_template.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_util.h"

namespace {

using echokv::model::ChatTemplate;
using echokv::model::ChatTemplateTokens;
using ojson = nlohmann::ordered_json;

const char* const kTemplateFiles[] = {
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja",             "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja",              "mistralai-Mistral-Nemo-Instruct-2407.jinja",
};

ChatTemplateTokens Tokens() { return {"<s>", "</s>", {{"unk_token", "<unk>"}, {"pad_token", "<pad>"}}}; }

const std::vector<ChatTemplate>& RealTemplates() {
  static const auto* all = [] {
    auto* v = new std::vector<ChatTemplate>();
    for (const char* name : kTemplateFiles) {
      const std::string path = echokv::fuzz::TestData() + "/chat_templates/" + name;
      FILE* f = std::fopen(path.c_str(), "rb");
      if (f == nullptr) {
        std::fprintf(stderr, "fuzz_chat_template: cannot read %s\n", path.c_str());
        std::abort();
      }
      std::string source;
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) source.append(buf, n);
      std::fclose(f);
      auto t = ChatTemplate::Create(source, Tokens(), path);
      if (!t.ok()) {
        std::fprintf(stderr, "fuzz_chat_template: %s\n", t.status().ToString().c_str());
        std::abort();
      }
      v->push_back(std::move(*t));
    }
    return v;
  }();
  return *all;
}

// A fixed clock: renders are reproducible.
const echokv::jinja::RenderOptions& Options() {
  static const auto* options = [] {
    auto* o = new echokv::jinja::RenderOptions();
    o->now = [] { return echokv::jinja::CivilTime{2026, 12, 1, 12, 0, 0, 0}; };
    return o;
  }();
  return *options;
}

struct Request {
  ojson messages = ojson::array();
  ojson tools;  // null = none
  bool add_generation_prompt = true;
};

bool ParseRequest(absl::string_view text, Request* out) {
  ojson j = ojson::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return false;
  if (j.is_object()) {
    if (auto it = j.find("messages"); it != j.end()) out->messages = *it;
    if (auto it = j.find("tools"); it != j.end()) out->tools = *it;
    if (auto it = j.find("add_generation_prompt"); it != j.end() && it->is_boolean()) {
      out->add_generation_prompt = it->get<bool>();
    }
  } else {
    out->messages = std::move(j);
  }
  return true;
}

void RenderJson(const ChatTemplate& t, const Request& r) {
  (void)t.Render(r.messages, r.tools.is_null() ? nullptr : &r.tools, r.add_generation_prompt, Options());
}

// The messages as structs (string fields only; what the gRPC edge builds).
void RenderStructs(const ChatTemplate& t, const Request& r) {
  if (!r.messages.is_array()) return;
  std::vector<echokv::model::ChatMessage> messages;
  auto str = [](const ojson& m, const char* key) {
    auto it = m.find(key);
    return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  for (const ojson& m : r.messages) {
    if (!m.is_object()) continue;
    echokv::model::ChatMessage msg;
    msg.role = str(m, "role");
    msg.content = str(m, "content");
    msg.name = str(m, "name");
    msg.tool_call_id = str(m, "tool_call_id");
    if (auto it = m.find("tool_calls"); it != m.end() && it->is_array()) {
      for (const ojson& c : *it) {
        if (!c.is_object()) continue;
        msg.tool_calls.push_back({str(c, "id"), str(c, "type"), str(c, "name"), str(c, "arguments")});
      }
    }
    messages.push_back(std::move(msg));
  }
  const std::string tools = r.tools.is_null() ? "" : r.tools.dump(-1, ' ', false, ojson::error_handler_t::replace);
  (void)t.Render(messages, tools, r.add_generation_prompt, Options());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  RealTemplates();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const echokv::fuzz::Selected in = echokv::fuzz::Select(data, size);
  switch (in.selector % 4) {
    case 0: {
      auto [source, request] = echokv::fuzz::SplitAtNul(in.rest);
      auto t = ChatTemplate::Create(source, Tokens(), "fuzz");
      if (!t.ok()) return 0;
      Request r;
      if (!ParseRequest(request, &r)) r.messages = ojson::parse(R"([{"role":"user","content":"hi"}])");
      RenderJson(*t, r);
      break;
    }
    case 1:
    case 2: {
      const ChatTemplate& t = RealTemplates()[(in.selector / 4) % RealTemplates().size()];
      Request r;
      if (!ParseRequest(in.rest, &r)) return 0;
      if (in.selector % 4 == 1) {
        RenderJson(t, r);
      } else {
        RenderStructs(t, r);
      }
      break;
    }
    case 3: {
      auto [config, special] = echokv::fuzz::SplitAtNul(in.rest);
      auto t = echokv::model::ChatTemplateFromConfig(config, special);
      if (t.ok()) {
        Request r;
        r.messages = ojson::parse(R"([{"role":"system","content":"s"},{"role":"user","content":"hi"}])");
        RenderJson(*t, r);
      }
      break;
    }
  }
  return 0;
}
