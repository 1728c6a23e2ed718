// Tests of client/arg_parser.h and client/cli_util.h (no server involved).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "client/arg_parser.h"
#include "client/cli_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace echokv::client {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ArgParserTest, ParsesEveryKindAndKeepsPositionals) {
  ArgParser parser("x");
  std::optional<std::string> text;
  std::optional<int64_t> budget;
  std::optional<double> top_p;
  std::optional<bool> commit, repair;
  std::vector<std::string> stop;
  parser.AddString("text", &text, "");
  parser.AddInt("budget", &budget, "");
  parser.AddDouble("top-p", &top_p, "");
  parser.AddBool("commit", &commit, "");
  parser.AddBool("repair", &repair, "");
  parser.AddStringList("stop", &stop, "");
  std::vector<std::string> positional;
  ASSERT_OK(parser.Parse({"abc", "--text", "-5 a", "--budget=64", "--top_p", "0.9", "--commit",
                          "--no-repair", "--stop", "x", "--stop=y", "--", "--not-a-flag"},
                         &positional));
  EXPECT_EQ(text, "-5 a");
  EXPECT_EQ(budget, 64);
  EXPECT_DOUBLE_EQ(*top_p, 0.9);
  EXPECT_EQ(commit, true);
  EXPECT_EQ(repair, false);
  EXPECT_THAT(stop, ElementsAre("x", "y"));
  EXPECT_THAT(positional, ElementsAre("abc", "--not-a-flag"));
}

TEST(ArgParserTest, ErrorsNameTheFlag) {
  ArgParser parser("x");
  std::optional<int64_t> budget;
  std::optional<bool> commit;
  parser.AddInt("budget", &budget, "");
  parser.AddBool("commit", &commit, "");
  std::vector<std::string> positional;
  EXPECT_THAT(parser.Parse({"--budget", "abc"}, &positional),
              StatusIs(absl::StatusCode::kInvalidArgument, "--budget: 'abc' is not an integer"));
  EXPECT_THAT(parser.Parse({"--budget"}, &positional),
              StatusIs(absl::StatusCode::kInvalidArgument, "--budget needs a value"));
  EXPECT_THAT(parser.Parse({"--bugdet=3"}, &positional),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown flag --bugdet"));
  EXPECT_THAT(parser.Parse({"--commit=maybe"}, &positional),
              StatusIs(absl::StatusCode::kInvalidArgument, "--commit"));
  EXPECT_FALSE(budget.has_value());
  EXPECT_THAT(parser.Usage(), HasSubstr("--budget INT"));
}

TEST(ParseIdListTest, ParsesAndRejectsBadEntries) {
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, ParseIdList("1, 2,300"));
  EXPECT_THAT(ids, ElementsAre(1, 2, 300));
  EXPECT_THAT(ParseIdList("1,,2").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "entry 1 is empty"));
  EXPECT_THAT(ParseIdList("1,x").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "entry 1 ('x')"));
  EXPECT_THAT(ParseIdList("-1").status(), StatusIs(absl::StatusCode::kInvalidArgument, "entry 0"));
  EXPECT_THAT(ParseIdList("4294967296").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "entry 0"));
}

TEST(ParseChatJsonTest, AcceptsArrayAndMessagesObject) {
  ASSERT_OK_AND_ASSIGN(
      echokv::v1::ChatMessages chat,
      ParseChatJson(R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}])",
                    "t"));
  ASSERT_EQ(chat.messages_size(), 2);
  EXPECT_EQ(chat.messages(1).role(), "user");
  EXPECT_EQ(chat.messages(1).content(), "Hi");
  ASSERT_OK_AND_ASSIGN(chat, ParseChatJson(R"({"messages":[{"role":"user","content":"x"}]})", "t"));
  EXPECT_EQ(chat.messages_size(), 1);
}

TEST(ParseChatJsonTest, ErrorsNameTheEntry) {
  EXPECT_THAT(ParseChatJson("[", "chat.json").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "chat.json: not valid JSON"));
  EXPECT_THAT(ParseChatJson("[]", "c").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "non-empty array"));
  EXPECT_THAT(ParseChatJson(R"([{"role":"user","content":"a"},{"role":"user"}])", "c").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "entry 1 lacks a string \"content\""));
  EXPECT_THAT(ParseChatJson(R"([{"role":1,"content":"a"}])", "c").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "entry 0 lacks a string \"role\""));
}

TEST(BuildInputTest, ExactlyOneSource) {
  InputSpec none;
  EXPECT_THAT(BuildInput(none).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "exactly one input"));
  InputSpec two;
  two.text = "a";
  two.ids = "1";
  EXPECT_THAT(BuildInput(two).status(), StatusIs(absl::StatusCode::kInvalidArgument, "got 2"));

  InputSpec ids;
  ids.ids = "5,6";
  ids.add_special_tokens = false;
  ASSERT_OK_AND_ASSIGN(echokv::v1::Input input, BuildInput(ids));
  EXPECT_THAT(input.tokens().ids(), ElementsAre(5, 6));
  ASSERT_TRUE(input.has_add_special_tokens());
  EXPECT_FALSE(input.add_special_tokens());
}

TEST(BuildInputTest, ReadsFilesAndNamesMissingOnes) {
  const std::string path = ::testing::TempDir() + "/client_util_test_input.txt";
  {
    std::ofstream out(path);
    out << "Once upon a time\n";
  }
  InputSpec spec;
  spec.file = path;
  ASSERT_OK_AND_ASSIGN(echokv::v1::Input input, BuildInput(spec));
  EXPECT_EQ(input.text(), "Once upon a time\n");
  EXPECT_FALSE(input.has_add_special_tokens());
  std::remove(path.c_str());
  EXPECT_THAT(BuildInput(spec).status(), StatusIs(absl::StatusCode::kNotFound, path));
}

TEST(BuildCompressionTest, SetsOnlyGivenFieldsAndChecksRange) {
  CompressionFlags flags;
  flags.policy = "echokv";
  flags.budget = 64;
  flags.repair = false;
  ASSERT_OK_AND_ASSIGN(echokv::v1::CompressionConfig config, BuildCompression(flags));
  EXPECT_EQ(config.policy(), "echokv");
  EXPECT_EQ(config.budget(), 64);
  EXPECT_TRUE(config.has_repair());
  EXPECT_FALSE(config.repair());
  EXPECT_FALSE(config.has_lookahead());
  EXPECT_FALSE(config.has_workspace());
  flags.lookahead = int64_t{1} << 40;
  EXPECT_THAT(BuildCompression(flags).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "--lookahead"));
}

TEST(FormatTest, BytesAndStatus) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 30), "3.00 GiB");
  EXPECT_EQ(DescribeStatus(FromGrpcStatus(grpc::Status(grpc::StatusCode::NOT_FOUND, "session x"))),
            "NOT_FOUND: session x");
}

TEST(FormatTest, InspectTableListsEveryGroupAndTotals) {
  echokv::v1::InspectCacheResponse response;
  for (int l = 0; l < 2; ++l) {
    echokv::v1::LayerCache* layer = response.add_layers();
    layer->set_layer(l);
    layer->set_retained(3);
    layer->set_kv_bytes(2 * 96);
    for (int g = 0; g < 2; ++g) {
      echokv::v1::KvGroupCache* group = layer->add_groups();
      group->set_group(g);
      group->set_retained(3);
      group->set_kv_bytes(96);
      for (int p : {0, 7, 11 + g}) group->add_positions(p);
    }
  }
  response.set_total_retained_entries(12);
  response.set_total_kv_bytes(384);
  response.set_full_equivalent_kv_bytes(1536);
  const std::string table = FormatInspect(response, /*positions=*/true);
  EXPECT_THAT(table, HasSubstr("positions: 0 7 12"));
  EXPECT_THAT(table, HasSubstr("total         12"));
  EXPECT_THAT(table, HasSubstr("KV bytes retained 384 B of 1.50 KiB full-equivalent (25.0%)"));
  EXPECT_THAT(FormatInspect(response, /*positions=*/false), ::testing::Not(HasSubstr("positions:")));
}

}  // namespace
}  // namespace echokv::client

namespace echokv::client {
namespace {

TEST(LoadCredentialsTest, TokensAndTlsFilesAndTheirConflicts) {
  const std::string dir = ::testing::TempDir() + "/echokv_cli_creds";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  CredentialFlags f;
  absl::StatusOr<Credentials> c = LoadCredentials(f, nullptr);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->bearer, "");
  EXPECT_FALSE(c->tls);
  c = LoadCredentials(f, "from-env");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->bearer, "from-env");
  f.token_file = write("tok", "s3cret\n");
  c = LoadCredentials(f, "from-env");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->bearer, "s3cret");  // the file wins over the environment, newline dropped
  f.token = "inline";
  EXPECT_THAT(LoadCredentials(f, nullptr).status().message(), ::testing::HasSubstr("--token and --token_file"));
  f.token.reset();
  f.token_file = write("empty", "\n");
  EXPECT_THAT(LoadCredentials(f, nullptr).status().message(), ::testing::HasSubstr("is empty"));
  f.token_file.reset();
  f.tls_ca = write("ca.pem", "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n");
  c = LoadCredentials(f, nullptr);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->tls);
  EXPECT_THAT(c->root_pem, ::testing::HasSubstr("BEGIN CERTIFICATE"));
  f.tls_cert = f.tls_ca;
  EXPECT_THAT(LoadCredentials(f, nullptr).status().message(), ::testing::HasSubstr("--tls_cert and --tls_key"));
  f.tls_key = write("key", "not pem");
  EXPECT_THAT(LoadCredentials(f, nullptr).status().message(), ::testing::HasSubstr("--tls_key: "));
  f.tls_key = dir + "/missing";
  EXPECT_THAT(LoadCredentials(f, nullptr).status().message(), ::testing::HasSubstr("--tls_key: "));
}

TEST(LoadCredentialsTest, ServerNameOnlyWithTls) {
  const std::string dir = ::testing::TempDir() + "/echokv_cli_server_name";
  std::filesystem::create_directories(dir);
  CredentialFlags f;
  f.tls_server_name = "echokv.ns.svc";
  EXPECT_THAT(LoadCredentials(f, nullptr).status().message(), ::testing::HasSubstr("--tls_server_name needs TLS"));
  f.tls_ca = dir + "/ca.pem";
  std::ofstream(*f.tls_ca) << "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n";
  absl::StatusOr<Credentials> c = LoadCredentials(f, nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server_name, "echokv.ns.svc");
  f.tls_server_name = "";
  EXPECT_THAT(LoadCredentials(f, nullptr).status().message(), ::testing::HasSubstr("--tls_server_name: empty"));
}

}  // namespace
}  // namespace echokv::client
