// echokv-chat-render as a user runs it: the exact interface (flags, stdout holds the
// render and nothing else, exit 3 + message for raise_exception, 1 for template
// errors, 2 for bad command lines / input files), and the public golden renders
// through the binary.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_data.h"

namespace echokv {
namespace {

using ordered_json = nlohmann::ordered_json;

// Single-quotes `s` for /bin/sh.
std::string Q(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

class ChatRenderCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("echokv_chat_render_"); }
  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = dir_ + "/" + name;
    testing::WriteFileOrDie(path, contents);
    return path;
  }
  testing::CommandResult Run(const std::string& args) {
    return testing::RunCommand(std::string(ECHOKV_CHAT_RENDER_BIN) + " " + args);
  }
  std::string dir_;  // scratch files
};

TEST_F(ChatRenderCliTest, WritesExactlyTheRender) {
  const std::string t = Write("t.jinja",
                              "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
                              "{% if add_generation_prompt %}<gen>{% endif %}{{ eos_token }}"
                              "{% if tools is defined %}{{ tools|tojson }}{% endif %}\n");
  const std::string m = Write("m.json", R"([{"role": "user", "content": "héllo {x}\n"}])");
  testing::CommandResult r = Run("--template " + t + " --messages " + m);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[user]héllo {x}\n");  // the template's trailing newline is dropped, as Jinja does
  EXPECT_EQ(r.err, "");
  const std::string tools = Write("tools.json", R"([{"type": "function", "function": {"name": "f"}}])");
  r = Run("--template=" + t + " --bos-token " + Q("<s>") + " --eos-token=" + Q("</s>") + " --messages " + m +
          " --tools " + tools + " --add-generation-prompt");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<s>[user]héllo {x}\n<gen></s>[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]");
  // A tools file holding null leaves `tools` undefined, as without --tools.
  r = Run("--template " + t + " --messages " + m + " --tools " + Write("null.json", "null"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[user]héllo {x}\n");
}

TEST_F(ChatRenderCliTest, NowFixesStrftimeNow) {
  const std::string t = Write("t.jinja", "{{ strftime_now('%d %b %Y %H:%M') }}");
  const std::string m = Write("m.json", "[]");
  testing::CommandResult r = Run("--template " + t + " --messages " + m + " --now 2026-12-01T09:30:00");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "01 Dec 2026 09:30");
  r = Run("--template " + t + " --messages " + m + " --now yesterday");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--now"), std::string::npos) << r.err;
}

TEST_F(ChatRenderCliTest, RaiseExceptionExitsThreeWithItsMessage) {
  const std::string t = Write("t.jinja",
                              "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must "
                              "alternate user/assistant/user/assistant/...') }}{% endif %}ok");
  const std::string m = Write("m.json", R"([{"role": "assistant", "content": "x"}])");
  testing::CommandResult r = Run("--template " + t + " --messages " + m);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "Conversation roles must alternate user/assistant/user/assistant/...\n");
}

TEST_F(ChatRenderCliTest, TemplateErrorsExitOneWithThePosition) {
  const std::string m = Write("m.json", "[]");
  testing::CommandResult r = Run("--template " + Write("bad.jinja", "ok\n{% if %}") + " --messages " + m);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("line 2 column"), std::string::npos) << r.err;
  r = Run("--template " + Write("runtime.jinja", "{{ 1 + 'a' }}") + " --messages " + m);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unsupported operand type(s) for +: 'int' and 'str'"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_F(ChatRenderCliTest, BadCommandLinesAndInputsExitTwo) {
  const std::string t = Write("t.jinja", "x");
  const std::string m = Write("m.json", "[]");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--messages " + m, "--template is required"},
      {"--template " + t, "--messages is required"},
      {"--template " + t + " --messages " + m + " --bogus", "unknown argument '--bogus'"},
      {"--template " + t + " --messages", "--messages needs a value"},
      {"--template " + dir_ + "/missing.jinja --messages " + m, "cannot read template file"},
      {"--template " + t + " --messages " + Write("bad.json", "[{"), "invalid JSON"},
      {"--template " + t + " --messages " + Write("obj.json", "{\"role\": \"user\"}"), "messages: expected a list"},
      {"--template " + t + " --messages " + Write("norole.json", "[{\"content\": \"x\"}]"), "messages[0].role: missing"},
      {"--template " + t + " --messages " + m + " --tools " + Write("tools.json", "{}"), "tools: expected a list"},
  };
  for (const auto& [args, want] : cases) {
    SCOPED_TRACE(args);
    testing::CommandResult r = Run(args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
  testing::CommandResult help = Run("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--add-generation-prompt"), std::string::npos);
}

TEST_F(ChatRenderCliTest, PublicGoldenRendersThroughTheBinary) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  const std::string folder = data + "/chat_templates";
  const ordered_json golden = ordered_json::parse(testing::ReadFileOrDie(folder + "/golden_public.json"));
  int checked = 0;
  for (const auto& [key, entry] : golden.at("templates").items()) {
    for (const ordered_json& c : entry.at("cases")) {
      SCOPED_TRACE(key + " " + c.at("name").get<std::string>());
      std::string args = "--template " + Q(folder + "/" + entry.at("file").get<std::string>()) + " --messages " +
                         Write("m.json", c.at("messages").dump()) + " --now " + golden.at("now").get<std::string>();
      if (!entry.at("bos_token").is_null()) args += " --bos-token " + Q(entry.at("bos_token").get<std::string>());
      if (!entry.at("eos_token").is_null()) args += " --eos-token " + Q(entry.at("eos_token").get<std::string>());
      if (!c.at("tools").is_null()) args += " --tools " + Write("t.json", c.at("tools").dump());
      if (c.at("add_generation_prompt").get<bool>()) args += " --add-generation-prompt";
      testing::CommandResult r = Run(args);
      if (c.contains("raises") && !c.at("raises").is_null()) {
        EXPECT_EQ(r.exit_code, 3);
        EXPECT_EQ(r.err, c.at("raises").get<std::string>() + "\n");
      } else {
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.out, c.at("rendered").get<std::string>());
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 36);
}

}  // namespace
}  // namespace echokv
