// echokv-chat-render: renders a conversation with a chat template (jinja/) and writes
// exactly the rendered string to stdout (no newline added). It is how renders are
// checked from the outside against Jinja2 / transformers.
//
//   echokv-chat-render --template FILE [--bos-token S] [--eos-token S]
//       --messages FILE.json [--tools FILE.json] [--add-generation-prompt]
//       [--now 2026-12-01T09:30:00]
//
// Exit status: 0 rendered; 3 the template called raise_exception (its message on
// stderr); 1 the template failed to parse or render (message with line and column);
// 2 bad command line or unreadable / invalid input files.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "jinja/chat.h"
#include "jinja/template.h"
#include "jinja/value.h"

namespace {

constexpr char kUsage[] =
    "usage: echokv-chat-render --template FILE [--bos-token S] [--eos-token S]\n"
    "           --messages FILE.json [--tools FILE.json] [--add-generation-prompt]\n"
    "           [--now YYYY-MM-DDTHH:MM:SS]\n"
    "Renders the messages (a JSON list of {role, content, ...}) with the Jinja2 chat\n"
    "template as transformers' apply_chat_template does and writes the result to stdout.\n"
    "Exit status: 0 ok, 1 template error, 2 usage / input error, 3 raise_exception.\n";

int Usage(const std::string& message) {
  std::cerr << "echokv-chat-render: " << message << "\n" << kUsage;
  return 2;
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return false;
  *out = ss.str();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<std::string> template_path, messages_path, tools_path, now_text;
  std::string bos, eos;
  bool add_generation_prompt = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (arg == "--add-generation-prompt") {
      add_generation_prompt = true;
      continue;
    }
    std::string name = arg, value;
    bool has_value = false;
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    const bool known = name == "--template" || name == "--bos-token" || name == "--eos-token" ||
                       name == "--messages" || name == "--tools" || name == "--now";
    if (!known) return Usage("unknown argument '" + arg + "'");
    if (!has_value) {
      if (i + 1 >= argc) return Usage(name + " needs a value");
      value = argv[++i];
    }
    if (name == "--template") template_path = value;
    if (name == "--bos-token") bos = value;
    if (name == "--eos-token") eos = value;
    if (name == "--messages") messages_path = value;
    if (name == "--tools") tools_path = value;
    if (name == "--now") now_text = value;
  }
  if (!template_path) return Usage("--template is required");
  if (!messages_path) return Usage("--messages is required");

  std::string source, messages_text, tools_text;
  if (!ReadFile(*template_path, &source)) return Usage("cannot read template file " + *template_path);
  if (!ReadFile(*messages_path, &messages_text)) return Usage("cannot read messages file " + *messages_path);
  if (tools_path && !ReadFile(*tools_path, &tools_text)) return Usage("cannot read tools file " + *tools_path);

  echokv::jinja::ChatInput input;
  input.bos_token = bos;
  input.eos_token = eos;
  input.add_generation_prompt = add_generation_prompt;
  absl::StatusOr<echokv::jinja::Value> messages = echokv::jinja::Value::FromJsonText(messages_text);
  if (!messages.ok()) return Usage(*messages_path + ": " + std::string(messages.status().message()));
  input.messages = *messages;
  if (tools_path) {
    absl::StatusOr<echokv::jinja::Value> tools = echokv::jinja::Value::FromJsonText(tools_text);
    if (!tools.ok()) return Usage(*tools_path + ": " + std::string(tools.status().message()));
    input.tools = *tools;
  }
  absl::Status valid = echokv::jinja::ValidateChatInput(input);
  if (!valid.ok()) return Usage(std::string(valid.message()));

  echokv::jinja::RenderOptions options;
  if (now_text) {
    absl::StatusOr<echokv::jinja::CivilTime> now = echokv::jinja::ParseCivilTime(*now_text);
    if (!now.ok()) return Usage("--now: " + std::string(now.status().message()));
    const echokv::jinja::CivilTime fixed = *now;
    options.now = [fixed]() { return fixed; };
  }

  absl::StatusOr<std::unique_ptr<echokv::jinja::Template>> tmpl = echokv::jinja::Template::Create(source);
  if (!tmpl.ok()) {
    std::cerr << "echokv-chat-render: " << *template_path << ": " << tmpl.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<std::string> out = echokv::jinja::RenderChat(**tmpl, input, options);
  if (!out.ok()) {
    if (echokv::jinja::IsRaisedByTemplate(out.status())) {
      std::cerr << out.status().message() << "\n";
      return 3;
    }
    std::cerr << "echokv-chat-render: " << *template_path << ": " << out.status().message() << "\n";
    return 1;
  }
  std::fwrite(out->data(), 1, out->size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 2;
}
