// Multi-turn chat sessions (issue 10 point 3) for every real template of
// shared/chat_templates: a 4-turn conversation built by CreateSession + Generate(commit)
// + AppendToSession ... holds exactly the ids of tokenizing render(whole conversation)
// — the replies as the model produced them, re-rendered by the template. Model: a tiny
// random llama with the Qwen2.5 byte-level BPE tokenizer (151,665 ids); each template
// is the model's own (tokenizer_config.json's chat_template).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "nlohmann/json.hpp"
#include "server/engine/engine.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"
#include "tools/make_test_model.h"

namespace echokv::server {
namespace {

using ::echokv::testing::IsOk;
namespace fs = std::filesystem;

// Qwen2.5's 151,665 ids plus the Llama-3 special tokens the Llama/Hermes templates
// emit (added below as special tokens, as Llama-3's own tokenizer has them).
constexpr int kQwenVocab = 151665;
constexpr int kVocab = kQwenVocab + 8;
const char* const kLlama3Specials[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                        "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"};

// The model weights, made once and shared by every template's directory.
const std::string& WeightsDir() {
  static const std::string* dir = [] {
    auto* d = new std::string(echokv::testing::MakeTempDir("chat-session-weights"));
    tools::TestModelOptions o;
    o.out_dir = *d;
    o.layers = 1;
    o.hidden = 32;
    o.heads = 2;
    o.kv_heads = 1;
    o.intermediate = 64;
    o.vocab = kVocab;
    o.tie_word_embeddings = true;
    o.max_pos = 4096;
    o.weights_only = true;
    EXPECT_THAT(tools::MakeTestModel(o), IsOk());
    return d;
  }();
  return *dir;
}

struct TemplateCase {
  std::string name;         // key of golden_public.json's templates
  bool system_message;      // Mistral-Nemo renders the system text into the LAST user turn
  bool tools;               // Hermes-3's template is the tool-use variant
};

class ChatSessionTest : public ::testing::TestWithParam<TemplateCase> {};

TEST_P(ChatSessionTest, AFourTurnConversationHoldsExactlyTheTokensOfItsRender) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  const TemplateCase& tc = GetParam();
  const nlohmann::json golden =
      nlohmann::json::parse(echokv::testing::ReadFileOrDie(data + "/chat_templates/golden_public.json"));
  const nlohmann::json& entry = golden["templates"][tc.name];
  const std::string source = echokv::testing::ReadFileOrDie(data + "/chat_templates/" + entry["file"].get<std::string>());

  // A model directory: the weights, the Qwen tokenizer files and a tokenizer_config.json
  // carrying this template and its special tokens.
  const std::string dir = echokv::testing::MakeTempDir("chat-session-" + tc.name);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"}) {
    fs::copy_file(WeightsDir() + "/" + f, dir + "/" + f);
  }
  for (const char* f : {"vocab.json", "merges.txt"}) {
    fs::copy_file(data + "/tokenizers/qwen2.5/" + f, dir + "/" + f);
  }
  nlohmann::json tj = nlohmann::json::parse(echokv::testing::ReadFileOrDie(data + "/tokenizers/qwen2.5/tokenizer.json"));
  int next_id = kQwenVocab;
  for (const char* special : kLlama3Specials) {
    tj["added_tokens"].push_back({{"id", next_id++}, {"content", special}, {"single_word", false}, {"lstrip", false},
                                  {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  echokv::testing::WriteFileOrDie(dir + "/tokenizer.json", tj.dump());
  nlohmann::json cfg = nlohmann::json::parse(echokv::testing::ReadFileOrDie(data + "/tokenizers/qwen2.5/tokenizer_config.json"));
  cfg["chat_template"] = source;
  cfg["bos_token"] = entry["bos_token"];
  cfg["eos_token"] = entry["eos_token"];
  echokv::testing::WriteFileOrDie(dir + "/tokenizer_config.json", cfg.dump());

  model::DeviceOptions dev;
  dev.num_threads = 1;
  absl::StatusOr<std::unique_ptr<model::Transformer>> m = model::Transformer::Load(dir, dev);
  ASSERT_THAT(m.status(), IsOk());
  absl::StatusOr<std::unique_ptr<model::Tokenizer>> tok = model::LoadTokenizer(dir);
  ASSERT_THAT(tok.status(), IsOk());
  absl::StatusOr<model::ChatTemplate> tmpl = model::LoadChatTemplate(dir);
  ASSERT_THAT(tmpl.status(), IsOk());
  std::shared_ptr<const model::Tokenizer> tokenizer = std::move(*tok);
  FakeClock clock;
  EngineConfig ec;
  ec.model_dir = dir;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::CreateWithModel(ec, std::move(*m), tokenizer, *tmpl, nullptr, &clock);
  ASSERT_THAT(engine.status(), IsOk());
  Engine& e = **engine;

  const std::string tools =
      tc.tools ? R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",)"
                 R"( "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])"
               : "";
  compression::CompressionConfig cc;
  cc.policy = compression::PolicyKind::kSnapKv;
  cc.budget = 64;
  cc.snapkv_window = 8;

  std::vector<model::ChatMessage> first;
  if (tc.system_message) first.push_back({"system", "You answer briefly."});
  first.push_back({"user", "Hello! Who are you?"});
  CreateRequest cr;
  cr.input.kind = InputSpec::Kind::kChat;
  cr.input.chat = first;
  cr.input.tools_json = tools;
  cr.config = cc;
  cr.memory = MemoryMode::kTiered;
  std::promise<absl::StatusOr<SessionInfo>> created;
  e.CreateSession(cr, nullptr, nullptr, [&](absl::StatusOr<SessionInfo> s) { created.set_value(s); });
  absl::StatusOr<SessionInfo> session = created.get_future().get();
  ASSERT_THAT(session.status(), IsOk());
  const std::string id = session->id;

  const std::vector<std::string> users = {"Tell me about {braces} and ünïcödé.", "  Spaces around  ",
                                          "Last question?"};
  for (int turn = 0; turn < 4; ++turn) {
    // The assistant answers (a few tokens of a random model), committed.
    GenerateParams g;
    g.session_id = id;
    g.max_tokens = 6;
    g.commit = true;
    g.sampling.temperature = 1.0f;
    g.sampling.seed = 7 + turn;
    std::promise<absl::StatusOr<GenerateSummary>> gen;
    e.Generate(g, nullptr, StreamSink{}, [&](absl::StatusOr<GenerateSummary> s) { gen.set_value(s); });
    absl::StatusOr<GenerateSummary> done = gen.get_future().get();
    ASSERT_THAT(done.status(), IsOk()) << "turn " << turn;
    if (turn == 3) break;
    AppendRequest ar;
    ar.session_id = id;
    ar.input.kind = InputSpec::Kind::kChat;
    ar.input.chat = {{"user", users[turn]}};
    std::promise<absl::StatusOr<SessionInfo>> appended;
    e.AppendToSession(ar, nullptr, nullptr, [&](absl::StatusOr<SessionInfo> s) { appended.set_value(s); });
    ASSERT_THAT(appended.get_future().get().status(), IsOk()) << "turn " << turn;
  }

  std::promise<absl::StatusOr<SessionInfo>> info;
  e.GetSession(Caller{}, id, [&](absl::StatusOr<SessionInfo> s) { info.set_value(s); });
  absl::StatusOr<SessionInfo> final_info = info.get_future().get();
  ASSERT_THAT(final_info.status(), IsOk());
  ASSERT_EQ(final_info->messages.size(), first.size() + 7u);  // 4 user turns, 4 replies
  std::promise<absl::StatusOr<std::vector<int>>> held;
  e.SessionTokens(Caller{}, id, [&](absl::StatusOr<std::vector<int>> t) { held.set_value(t); });
  absl::StatusOr<std::vector<int>> tokens = held.get_future().get();
  ASSERT_THAT(tokens.status(), IsOk());

  // The oracle: the whole conversation rendered once and tokenized. The last reply
  // ends the session's tokens where its turn ends: the render continued by one more
  // user turn, cut at the common token prefix (Phi-3.5 closes a conversation that ends
  // with an assistant message with an extra eos it never shows mid-conversation).
  absl::StatusOr<std::string> ended = tmpl->Render(final_info->messages, tools, false);
  ASSERT_THAT(ended.status(), IsOk());
  absl::StatusOr<std::vector<int>> want = model::EncodeRenderedChat(*ended, *tokenizer);
  ASSERT_THAT(want.status(), IsOk());
  std::vector<model::ChatMessage> continued = final_info->messages;
  continued.push_back({"user", "next"});
  absl::StatusOr<std::string> more = tmpl->Render(continued, tools, true);
  ASSERT_THAT(more.status(), IsOk());
  absl::StatusOr<std::vector<int>> more_ids = model::EncodeRenderedChat(*more, *tokenizer);
  ASSERT_THAT(more_ids.status(), IsOk());
  size_t common = 0;
  while (common < want->size() && common < more_ids->size() && (*want)[common] == (*more_ids)[common]) ++common;
  want->resize(common);
  EXPECT_EQ(*tokens, *want);
  // And the session continues with exactly the render's next user turn.
  AppendRequest ar;
  ar.session_id = id;
  ar.input.kind = InputSpec::Kind::kChat;
  ar.input.chat = {{"user", "next"}};
  std::promise<absl::StatusOr<SessionInfo>> appended;
  e.AppendToSession(ar, nullptr, nullptr, [&](absl::StatusOr<SessionInfo> s) { appended.set_value(s); });
  ASSERT_THAT(appended.get_future().get().status(), IsOk());
  std::promise<absl::StatusOr<std::vector<int>>> held2;
  e.SessionTokens(Caller{}, id, [&](absl::StatusOr<std::vector<int>> t) { held2.set_value(t); });
  absl::StatusOr<std::vector<int>> tokens2 = held2.get_future().get();
  ASSERT_THAT(tokens2.status(), IsOk());
  EXPECT_EQ(*tokens2, *more_ids);
}

INSTANTIATE_TEST_SUITE_P(
    RealTemplates, ChatSessionTest,
    ::testing::Values(TemplateCase{"Qwen-Qwen2.5-7B-Instruct", true, false},
                      TemplateCase{"meta-llama-Llama-3.1-8B-Instruct", true, false},
                      TemplateCase{"meta-llama-Llama-3.2-3B-Instruct", true, false},
                      TemplateCase{"mistralai-Mistral-Nemo-Instruct-2407", false, false},
                      TemplateCase{"microsoft-Phi-3.5-mini-instruct", true, false},
                      TemplateCase{"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", true, true}),
    [](const auto& info) {
      std::string n = info.param.name;
      for (char& c : n) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return n;
    });

}  // namespace
}  // namespace echokv::server
