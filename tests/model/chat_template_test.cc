// Tests of model chat templates: the built-in templates (exact strings, and ids with a
// fake tokenizer whose ids are known by hand), where templates come from
// (tokenizer_config.json strings and lists, chat_template.jinja, the operator's
// override, no template -> UNIMPLEMENTED), special tokens, errors, and the real
// tokenizers: Qwen2.5 ChatML against the golden ChatML case, and every Mistral chat
// golden case (mistral-common ids) through the built-in Mistral template.
#include "model/chat_template.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jinja/template.h"
#include "model/bpe_tokenizer.h"
#include "model/sentencepiece_tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/jinja/jinja_testing.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::model {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// Byte tokenizer: byte b -> id 100 + b; with parse_special, "<s>" 1, "</s>" 2,
// "<|im_start|>" 3 and "<|im_end|>" 4 (all special).
class FakeTokenizer : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int>> Encode(absl::string_view text, const EncodeOptions& options) const override {
    std::vector<int> ids;
    if (options.add_special_tokens) ids.push_back(1);
    static const std::vector<std::pair<std::string, int>> kSpecials = {
        {"<|im_start|>", 3}, {"<|im_end|>", 4}, {"</s>", 2}, {"<s>", 1}};
    for (size_t i = 0; i < text.size();) {
      bool matched = false;
      for (const auto& [s, id] : kSpecials) {
        if (options.parse_special && text.substr(i, s.size()) == s) {
          ids.push_back(id);
          i += s.size();
          matched = true;
          break;
        }
      }
      if (!matched) ids.push_back(100 + static_cast<unsigned char>(text[i++]));
    }
    return ids;
  }
  absl::StatusOr<std::string> Decode(absl::Span<const int>, const DecodeOptions&) const override {
    return absl::UnimplementedError("fake");
  }
  std::string IdToPiece(int) const override { return ""; }
  int vocab_size() const override { return 356; }
  std::optional<int> bos_id() const override { return 1; }
  std::vector<int> eos_ids() const override { return {2}; }
  bool IsSpecial(int id) const override { return id >= 1 && id <= 4; }
  absl::string_view kind() const override { return "fake"; }
};

// Expected ids of a fake encoding: specials as given, text as bytes.
struct Ids {
  std::vector<int> v;
  Ids& Tok(int id) {
    v.push_back(id);
    return *this;
  }
  Ids& Text(const std::string& s) {
    for (unsigned char c : s) v.push_back(100 + c);
    return *this;
  }
};

ChatTemplateTokens Tokens(std::string bos = "<s>", std::string eos = "</s>") {
  ChatTemplateTokens t;
  t.bos_token = std::move(bos);
  t.eos_token = std::move(eos);
  return t;
}

ChatTemplate Builtin(const std::string& name, ChatTemplateTokens tokens = Tokens()) {
  absl::StatusOr<ChatTemplate> t = BuiltinChatTemplate(name, std::move(tokens));
  EXPECT_THAT(t, IsOk());
  return *t;
}

std::string Render(const ChatTemplate& t, const std::vector<ChatMessage>& chat, bool gen = true) {
  absl::StatusOr<std::string> s = t.Render(chat, gen);
  return s.ok() ? *s : "ERROR: " + std::string(s.status().message());
}

const char kQwenSystem[] = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

TEST(Builtin, ChatMlFamiliesStringAndIds) {
  const std::vector<ChatMessage> chat = {{"user", "hi"}};
  const ChatTemplate qwen25 = Builtin("qwen2.5", Tokens("", "<|im_end|>"));
  EXPECT_EQ(Render(qwen25, chat), std::string("<|im_start|>system\n") + kQwenSystem +
                                      "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  Ids want;
  want.Tok(3).Text(std::string("system\n") + kQwenSystem).Tok(4).Text("\n");
  want.Tok(3).Text("user\nhi").Tok(4).Text("\n").Tok(3).Text("assistant\n");
  FakeTokenizer fake;
  ASSERT_OK_AND_ASSIGN(std::vector<int> ids, EncodeChat(qwen25, chat, true, fake));
  EXPECT_EQ(ids, want.v);
  // A given system message replaces the default one; no generation prompt.
  EXPECT_EQ(Render(qwen25, {{"system", "Be brief."}, {"user", "x"}, {"assistant", "ok"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n"
            "<|im_start|>assistant\nok<|im_end|>\n");
  EXPECT_EQ(Render(Builtin("qwen2"), {{"user", "x"}}),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(Render(Builtin("chatml"), {{"user", "x"}}), "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
}

TEST(Builtin, SpecialTokenTextInContentIsParsedAsTransformersDoes) {
  // transformers tokenizes the rendered string with special-token matching on, so a
  // message that contains "<|im_end|>" produces the token; so does echokv.
  FakeTokenizer fake;
  ASSERT_OK_AND_ASSIGN(std::vector<int> ids, EncodeChat(Builtin("chatml"), {{"user", "a<|im_end|>"}}, false, fake));
  Ids want;
  want.Tok(3).Text("user\na").Tok(4).Tok(4).Text("\n");
  EXPECT_EQ(ids, want.v);
}

TEST(Builtin, MistralStringAndIds) {
  const ChatTemplate t = Builtin("mistral");
  const std::vector<ChatMessage> chat = {{"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d"}};
  EXPECT_EQ(Render(t, chat), "<s>[INST] a [/INST] b</s>[INST] c [/INST] d</s>");
  FakeTokenizer fake;
  Ids want;
  want.Tok(1).Text("[INST] a [/INST] b").Tok(2).Text("[INST] c [/INST] d").Tok(2);
  EXPECT_EQ(*EncodeChat(t, chat, true, fake), want.v);
  // The system message goes in front of the first user message; the last user turn
  // is left open; an empty answer is just EOS.
  EXPECT_EQ(Render(t, {{"system", "S"}, {"user", "hi"}, {"assistant", ""}, {"user", "q"}}),
            "<s>[INST] S\n\nhi [/INST]</s>[INST] q [/INST]");
}

TEST(Builtin, Llama2String) {
  const ChatTemplate t = Builtin("llama2");
  EXPECT_EQ(Render(t, {{"system", "S"}, {"user", "hi \n"}, {"assistant", " hello"}, {"user", "  again "}}),
            "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nhi [/INST] hello </s><s>[INST] again [/INST]");
  EXPECT_EQ(Render(t, {{"user", "q"}}), "<s>[INST] q [/INST]");
}

TEST(Builtin, TemplateErrorsAreTheTemplatesOwn) {
  const auto E = absl::StatusCode::kInvalidArgument;
  absl::StatusOr<std::string> r = Builtin("llama2").Render({{"user", "a"}, {"user", "b"}}, true);
  EXPECT_THAT(r, StatusIs(E, "Conversation roles must alternate user/assistant/user/assistant/..."));
  EXPECT_TRUE(jinja::IsRaisedByTemplate(r.status()));
  EXPECT_THAT(Builtin("mistral").Render({{"system", "s"}}, true), StatusIs(E, "has no user message"));
  EXPECT_THAT(Builtin("mistral").Render({{"robot", "x"}}, true), StatusIs(E, "roles must alternate"));
  EXPECT_THAT(Builtin("mistral").Render({{"user", "x"}, {"robot", "y"}}, true),
              StatusIs(E, "Only user and assistant roles are supported"));
  EXPECT_THAT(BuiltinChatTemplate("vicuna", Tokens()),
              StatusIs(E, "unknown built-in chat template 'vicuna' (chatml, qwen2, qwen2.5, mistral, llama2)"));
  // A render failure that is not the template's own message names the template.
  absl::StatusOr<ChatTemplate> bad = ChatTemplate::Create("{{ messages[0].content + 1 }}", Tokens(), "my.jinja");
  ASSERT_THAT(bad, IsOk());
  r = bad->Render({{"user", "x"}}, true);
  EXPECT_THAT(r, StatusIs(E, "chat template my.jinja: template line 1 column 4"));
  EXPECT_FALSE(jinja::IsRaisedByTemplate(r.status()));
  EXPECT_THAT(ChatTemplate::Create("{% if %}", Tokens(), "my.jinja"), StatusIs(E, "my.jinja: template line 1"));
  // Bad messages name the field.
  EXPECT_THAT(Builtin("chatml").Render(ordered_json::parse(R"([{"content": "x"}])"), nullptr, true),
              StatusIs(E, "messages[0].role: missing"));
}

// The built-in templates are ordinary Jinja: Jinja2 itself renders them the same.
TEST(Builtin, SourcesRenderAsJinja2Does) {
  jinja::testing::Rng rng(77);
  std::vector<jinja::testing::RefCase> cases;
  for (const char* name : {"chatml", "qwen2", "qwen2.5", "mistral", "llama2"}) {
    const std::string source = BuiltinChatTemplateSource(name);
    ASSERT_FALSE(source.empty()) << name;
    for (int i = 0; i < 120; ++i) {
      ordered_json vars;
      vars["messages"] = jinja::testing::RandomMessages(rng);
      if (rng.Chance(30)) vars["tools"] = jinja::testing::RandomTools(rng);
      vars["add_generation_prompt"] = rng.Chance(50);
      vars["bos_token"] = "<s>";
      vars["eos_token"] = "</s>";
      cases.push_back({std::string(name) + " #" + std::to_string(i), source, vars});
    }
  }
  std::vector<jinja::testing::RefResult> want = jinja::testing::RunJinja2(cases);
  ASSERT_EQ(want.size(), cases.size());
  EXPECT_EQ(jinja::testing::ExpectMatchesJinja2(cases, want), 0);
}

TEST(Config, TemplateStringListsAndTokens) {
  const auto cfg = [](const ordered_json& j) { return ChatTemplateFromConfig(j.dump()); };
  ASSERT_OK_AND_ASSIGN(ChatTemplate t,
                       cfg({{"chat_template", "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"},
                            {"bos_token", {{"content", "<B>"}, {"lstrip", false}, {"__type", "AddedToken"}}},
                            {"eos_token", "<E>"},
                            {"unk_token", "<unk>"}}));
  EXPECT_EQ(t.bos_token(), "<B>");
  EXPECT_EQ(t.eos_token(), "<E>");
  EXPECT_EQ(t.origin(), "tokenizer_config.json");
  EXPECT_EQ(*t.Render({{"user", "x"}}, false), "<B>x<E>");
  EXPECT_FALSE(t.has_tool_use_variant());
  // A list: "default", and "tool_use" when tools are passed (transformers' rule).
  ASSERT_OK_AND_ASSIGN(t, cfg({{"chat_template", ordered_json::array({{{"name", "tool_use"}, {"template", "T{{ tools|length }}"}},
                                                                       {{"name", "default"}, {"template", "D"}}})}}));
  EXPECT_TRUE(t.has_tool_use_variant());
  const ordered_json messages = ordered_json::parse(R"([{"role": "user", "content": "x"}])");
  const ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  EXPECT_EQ(*t.Render(messages, nullptr, false), "D");
  const ordered_json null_tools;
  EXPECT_EQ(*t.Render(messages, &null_tools, false), "D");
  EXPECT_EQ(*t.Render(messages, &tools, false), "T1");
  // Missing bos/eos render as "" (not an error); special_tokens_map.json fills gaps.
  ASSERT_OK_AND_ASSIGN(t, ChatTemplateFromConfig(R"({"chat_template": "[{{ bos_token }}|{{ eos_token }}]"})",
                                                 R"({"eos_token": "</s>"})"));
  EXPECT_EQ(*t.Render({{"user", "x"}}, false), "[|</s>]");
  const auto E = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(cfg({{"chat_template", ordered_json::array({{{"name", "rag"}, {"template", "x"}}})}}),
              StatusIs(E, "without a \"default\" entry"));
  EXPECT_THAT(cfg({{"chat_template", 3}}), StatusIs(E, "must be a string or a list"));
  EXPECT_THAT(cfg({{"chat_template", ordered_json::array({1})}}), StatusIs(E, "chat_template[0]"));
  EXPECT_THAT(cfg({{"chat_template", "x"}, {"eos_token", 5}}), StatusIs(E, "eos_token must be a string"));
  EXPECT_THAT(ChatTemplateFromConfig("{nope"), StatusIs(E, "invalid JSON"));
  EXPECT_THAT(cfg({{"bos_token", "<s>"}}), StatusIs(absl::StatusCode::kUnimplemented, "no chat_template"));
  EXPECT_THAT(cfg({{"chat_template", ""}}), StatusIs(absl::StatusCode::kUnimplemented, "empty"));
}

TEST(Load, SourcesInOrderAndNoSilentGuess) {
  const std::string dir = ::echokv::testing::MakeTempDir("echokv_chat_tmpl_");
  // No template at all: chat needs one, and the error says how to give it.
  ::echokv::testing::WriteFileOrDie(dir + "/config.json", R"({"model_type": "llama"})");
  ::echokv::testing::WriteFileOrDie(dir + "/tokenizer_config.json", R"({"bos_token": "<s>", "eos_token": "</s>"})");
  EXPECT_THAT(LoadChatTemplate(dir), StatusIs(absl::StatusCode::kUnimplemented, "--chat-template"));
  // The operator's file or a built-in, with the model's tokens.
  ::echokv::testing::WriteFileOrDie(dir + "/mine.jinja", "{{ bos_token }}{{ messages|length }}{{ eos_token }}\n");
  ASSERT_OK_AND_ASSIGN(ChatTemplate t, LoadChatTemplate(dir, dir + "/mine.jinja"));
  EXPECT_EQ(*t.Render({{"user", "x"}}, true), "<s>1</s>");
  EXPECT_EQ(t.origin(), dir + "/mine.jinja");
  ASSERT_OK_AND_ASSIGN(t, LoadChatTemplate(dir, std::string("builtin:llama2")));
  EXPECT_EQ(*t.Render({{"user", "x"}}, true), "<s>[INST] x [/INST]");
  EXPECT_THAT(LoadChatTemplate(dir, dir + "/missing.jinja"), StatusIs(absl::StatusCode::kNotFound, "missing.jinja"));
  // tokenizer_config.json's template; chat_template.jinja takes precedence over it.
  ::echokv::testing::WriteFileOrDie(dir + "/tokenizer_config.json",
                                    R"({"bos_token": "<s>", "eos_token": "</s>", "chat_template": "config"})");
  ASSERT_OK_AND_ASSIGN(t, LoadChatTemplate(dir));
  EXPECT_EQ(*t.Render({{"user", "x"}}, true), "config");
  ::echokv::testing::WriteFileOrDie(dir + "/chat_template.jinja", "file");
  ASSERT_OK_AND_ASSIGN(t, LoadChatTemplate(dir));
  EXPECT_EQ(*t.Render({{"user", "x"}}, true), "file");
  ASSERT_OK_AND_ASSIGN(t, LoadChatTemplate(dir, dir + "/mine.jinja"));
  EXPECT_EQ(*t.Render({{"user", "x"}}, true), "<s>1</s>");
}

TEST(Load, RealModelWithoutTemplateIsUnimplemented) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  // stories260K is a base model: it has no chat template, and none is guessed.
  EXPECT_THAT(LoadChatTemplate(data + "/models/stories260K"), StatusIs(absl::StatusCode::kUnimplemented, "no chat template"));
}

TEST(RealTokenizers, QwenChatMlMatchesGoldenAndEndOfTurn) {
  ECHOKV_REQUIRE_TEST_DATA(dir);
  const std::string folder = dir + "/tokenizers/qwen2.5";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> qwen, LoadBpeTokenizer(folder));
  // The golden "special_chatml" case is exactly a plain-ChatML rendering of {user: hi}.
  const json golden = json::parse(::echokv::testing::ReadFileOrDie(folder + "/golden_public.json"));
  json chatml_case;
  for (const json& c : golden["cases"]) {
    if (c["id"] == "special_chatml") chatml_case = c;
  }
  ASSERT_FALSE(chatml_case.is_null());
  const ChatTemplate chatml = Builtin("chatml", Tokens("", "<|im_end|>"));
  const std::vector<ChatMessage> chat = {{"user", "hi"}};
  EXPECT_EQ(Render(chatml, chat), chatml_case["text"].get<std::string>());
  ASSERT_OK_AND_ASSIGN(std::vector<int> ids, EncodeChat(chatml, chat, true, *qwen));
  EXPECT_EQ(ids, chatml_case["ids"].get<std::vector<int>>());
  // No BOS is added (Qwen has none anyway), and the end-of-turn token resolves.
  EXPECT_EQ(SpecialTokenId("<|im_end|>", *qwen).value_or(-1), 151645);
  const std::vector<int> eot = EndOfTurnIds(chatml, *qwen);
  ASSERT_FALSE(eot.empty());
  EXPECT_EQ(eot.front(), 151645);
  EXPECT_THAT(SpecialTokenId("plain text", *qwen), StatusIs(absl::StatusCode::kInvalidArgument, "no special token"));
}

// Every Mistral chat case of every golden*.json (public and any fuller set): the
// conversation is read back from its segments ([bos] "[INST] u [/INST]" "a" [eos] ...),
// rendered with the built-in Mistral template, encoded, and compared with the golden
// ids, which are mistral-common's.
TEST(RealTokenizers, MistralEveryGoldenChatCase) {
  ECHOKV_REQUIRE_TEST_DATA(dir);
  const std::string folder = dir + "/tokenizers/mistral-7b-v0.2";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> spm, LoadSentencePieceTokenizer(folder));
  const ChatTemplate mistral = Builtin("mistral");
  int checked = 0;
  for (const std::string& file : ::echokv::testing::ListFiles(folder, "golden", ".json")) {
    const json golden = json::parse(::echokv::testing::ReadFileOrDie(file));
    if (!golden.contains("chat_cases")) continue;
    for (const json& c : golden["chat_cases"]) {
      SCOPED_TRACE(file + " " + c["id"].get<std::string>());
      std::vector<ChatMessage> chat;
      bool understood = true;
      const json& segs = c["segments"];
      for (size_t i = 0; i < segs.size() && understood; ++i) {
        const std::string type = segs[i]["type"];
        if (type == "bos" || type == "eos") continue;
        const std::string text = segs[i]["text"];
        const std::string open = "[INST] ", close = " [/INST]";
        if (text.rfind(open, 0) == 0 && text.size() >= open.size() + close.size() &&
            text.compare(text.size() - close.size(), close.size(), close) == 0) {
          chat.push_back({"user", text.substr(open.size(), text.size() - open.size() - close.size())});
        } else if (!chat.empty() && chat.back().role == "user") {
          chat.push_back({"assistant", text});
        } else {
          understood = false;
        }
      }
      ASSERT_TRUE(understood) << "segment layout not in the Mistral v1 instruct form";
      ASSERT_OK_AND_ASSIGN(std::vector<int> ids, EncodeChat(mistral, chat, true, *spm));
      EXPECT_THAT(ids, ElementsAreArray(c["ids"].get<std::vector<int>>()));
      ++checked;
    }
  }
  EXPECT_GE(checked, 1);
  // The SentencePiece path finds control tokens by their text.
  EXPECT_EQ(SpecialTokenId("</s>", *spm).value_or(-1), 2);
  EXPECT_EQ(EndOfTurnIds(mistral, *spm), std::vector<int>({2}));
  // A special token in the middle of text splits it, and each piece gets SentencePiece's
  // dummy-prefix space (HF's legacy Llama/Mistral tokenizers behave the same).
  EncodeOptions plain;
  plain.add_special_tokens = false;
  plain.parse_special = false;
  ASSERT_OK_AND_ASSIGN(std::vector<int> a, spm->Encode("Hello", plain));
  ASSERT_OK_AND_ASSIGN(std::vector<int> b, spm->Encode("world", plain));
  std::vector<int> want = {1};
  want.insert(want.end(), a.begin(), a.end());
  want.push_back(2);
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(EncodeRenderedChat("<s>Hello</s>world", *spm).value_or(std::vector<int>()), want);
}

// EncodeChatAtMost equals EncodeChat whenever the ids fit, and stops otherwise, for
// the BPE (Qwen, ChatML) and SentencePiece (Mistral) paths.
TEST(RealTokenizers, BoundedChatEncodeEqualsFullWhenItFits) {
  ECHOKV_REQUIRE_TEST_DATA(dir);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> qwen, LoadBpeTokenizer(dir + "/tokenizers/qwen2.5"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> spm, LoadTokenizer(dir + "/tokenizers/mistral-7b-v0.2"));
  const std::vector<std::pair<ChatTemplate, const Tokenizer*>> cases = {
      {Builtin("qwen2.5", Tokens("", "<|im_end|>")), qwen.get()}, {Builtin("mistral"), spm.get()}};
  const std::vector<std::vector<ChatMessage>> chats = {
      {{"user", "Hello there, how are you?"}},
      {{"user", "Tell me a story about a dog."}, {"assistant", "Once upon a time </s> <|im_end|> a dog ran."},
       {"user", "More!  Twice   the spaces.\n\nAnd lines."}}};
  for (const auto& [tmpl, tok] : cases) {
    for (const auto& chat : chats) {
      ASSERT_OK_AND_ASSIGN(std::vector<int> full, EncodeChat(tmpl, chat, true, *tok));
      const int64_t n = static_cast<int64_t>(full.size());
      for (int64_t limit : {n, n + 5}) {
        ASSERT_OK_AND_ASSIGN(BoundedEncoding b, EncodeChatAtMost(tmpl, chat, true, *tok, limit));
        EXPECT_FALSE(b.exceeded);
        EXPECT_EQ(b.ids, full);
      }
      for (int64_t limit : {int64_t{0}, n / 2, n - 1}) {
        ASSERT_OK_AND_ASSIGN(BoundedEncoding b, EncodeChatAtMost(tmpl, chat, true, *tok, limit));
        EXPECT_TRUE(b.exceeded) << limit;
        EXPECT_GT(b.at_least, limit);
        EXPECT_LE(b.at_least, n);
      }
    }
    // A huge message stops early.
    const std::vector<ChatMessage> huge = {{"user", std::string(1 << 20, 'a')}};
    ASSERT_OK_AND_ASSIGN(BoundedEncoding b, EncodeChatAtMost(tmpl, huge, true, *tok, 512));
    EXPECT_TRUE(b.exceeded);
  }
}

}  // namespace
}  // namespace echokv::model
