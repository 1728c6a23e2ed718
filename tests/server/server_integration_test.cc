// Integration tests of echokv-server: the real binary on 127.0.0.1 (port 0 + port
// file) serving stories260K, driven by a C++ gRPC client. Streamed greedy text is
// compared with the offline pipeline (compression::PrefillAndCompress + greedy
// Transformer::Decode) computed here on the same model.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
// GCC 12 reports its own <regex> internals (std::function in _NFA) as maybe used
// uninitialized when optimizing this file; a known false positive of libstdc++'s regex.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "compression/config.h"
#include "compression/pipeline.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "proto/echokv/v1/echokv.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::server {
namespace {

namespace pb = ::echokv::v1;
using ::testing::HasSubstr;
using ::echokv::testing::MakeTempDir;
using ::echokv::testing::TestDataDir;
using ::echokv::testing::WriteFileOrDie;

// A running echokv-server process.
class ServerProcess {
 public:
  ServerProcess(const std::string& model, std::vector<std::string> extra) {
    dir_ = MakeTempDir("echokv_server_test");
    const std::string port_file = dir_ + "/ports";
    std::vector<std::string> args = {ECHOKV_SERVER_BIN, "--model", model, "--insecure", "--host", "127.0.0.1",
                                     "--port", "0", "--metrics-port", "0", "--port-file", port_file,
                                     "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    for (int i = 0; i < 600; ++i) {
      std::ifstream in(port_file);
      int p = 0, m = 0;
      if (in >> p >> m) {
        port_ = p;
        metrics_port_ = m;
        break;
      }
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (port_ > 0) {
      channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials());
      stub_ = pb::EchoKV::NewStub(channel_);
    }
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool ok() const { return port_ > 0; }
  pid_t pid() const { return pid_; }
  void Forget() { pid_ = -1; }
  pb::EchoKV::Stub* stub() { return stub_.get(); }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }
  int metrics_port() const { return metrics_port_; }
  int port() const { return port_; }

 private:
  std::string dir_;
  pid_t pid_ = -1;
  int port_ = 0;
  int metrics_port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::EchoKV::Stub> stub_;
};

std::string LongPrompt(int variant) {
  std::string s = "Once upon a time, there was a little ";
  const char* names[] = {"girl named Lily", "boy named Tom", "dog named Max", "cat named Sue",
                         "bird named Bob", "fish named Kim", "bear named Ben", "frog named Zoe"};
  for (int i = 0; i < 9; ++i) {
    absl::StrAppend(&s, names[(variant + i) % 8], ". She liked to play in the park with her friends. ",
                    "One day, she saw a big red ball. ");
  }
  return s;
}

struct Created {
  grpc::Status status;
  pb::Session session;
  std::vector<pb::SessionProgress> progress;
};

Created CreateSession(pb::EchoKV::Stub* stub, const pb::CreateSessionRequest& req) {
  grpc::ClientContext ctx;
  auto reader = stub->CreateSession(&ctx, req);
  Created out;
  pb::SessionProgress msg;
  while (reader->Read(&msg)) {
    if (msg.has_session()) out.session = msg.session();
    out.progress.push_back(msg);
  }
  out.status = reader->Finish();
  return out;
}

pb::CreateSessionRequest CreateRequest(const std::string& text, const std::string& policy, int budget) {
  pb::CreateSessionRequest req;
  req.mutable_input()->set_text(text);
  if (!policy.empty()) req.mutable_compression()->set_policy(policy);
  if (budget > 0) req.mutable_compression()->set_budget(budget);
  return req;
}

struct Generated {
  grpc::Status status;
  std::string text;
  std::vector<int> ids;
  pb::GenerateResponse::Final final;
};

Generated Generate(pb::EchoKV::Stub* stub, const std::string& id, int max_tokens, bool commit = false) {
  grpc::ClientContext ctx;
  pb::GenerateRequest req;
  req.set_session_id(id);
  req.set_max_tokens(max_tokens);
  req.set_ignore_eos(true);
  req.set_commit(commit);
  auto reader = stub->Generate(&ctx, req);
  Generated out;
  pb::GenerateResponse msg;
  while (reader->Read(&msg)) {
    out.text += msg.text();
    out.ids.insert(out.ids.end(), msg.token_ids().begin(), msg.token_ids().end());
    if (msg.has_final()) out.final = msg.final();
  }
  out.status = reader->Finish();
  return out;
}

// The offline result: the same pipeline in-process.
class Offline {
 public:
  explicit Offline(const std::string& model_dir) {
    model_ = model::Transformer::Load(model_dir, {}).value();
    tokenizer_ = model::LoadTokenizer(model_dir).value();
  }
  std::vector<int> Greedy(const std::string& text, compression::PolicyKind policy, int budget, int n) {
    std::vector<int> prompt = tokenizer_->Encode(text).value();
    compression::CompressionConfig cfg;
    cfg.policy = policy;
    cfg.budget = budget;
    auto ctx = compression::PrefillAndCompress(*model_, prompt, model_->NewCache(), cfg, {}).value();
    std::vector<int> out;
    at::Tensor logits = ctx.last_logits.contiguous();
    for (int i = 0; i < n; ++i) {
      const int t = model::Argmax(absl::MakeConstSpan(logits.data_ptr<float>(), logits.numel()));
      out.push_back(t);
      if (i + 1 < n) logits = model_->Decode(t, &ctx.cache).value().logits.contiguous();
    }
    return out;
  }
  std::vector<int64_t> Positions(const std::string& text, compression::PolicyKind policy, int budget, int layer,
                                 int group) {
    std::vector<int> prompt = tokenizer_->Encode(text).value();
    compression::CompressionConfig cfg;
    cfg.policy = policy;
    cfg.budget = budget;
    auto ctx = compression::PrefillAndCompress(*model_, prompt, model_->NewCache(), cfg, {}).value();
    return ctx.cache.cells().positions(layer, group);
  }
  int Tokens(const std::string& text) { return static_cast<int>(tokenizer_->Encode(text).value().size()); }
  std::string Decode(const std::vector<int>& ids) { return tokenizer_->Decode(ids).value(); }
  // The text `ids` add after `text`'s tokens: Decode(prompt + ids) - Decode(prompt).
  std::string Continuation(const std::string& text, const std::vector<int>& ids) {
    const std::vector<int> prompt = tokenizer_->Encode(text).value();
    std::vector<int> all = prompt;
    all.insert(all.end(), ids.begin(), ids.end());
    const std::string before = Decode(prompt);
    const std::string after = Decode(all);
    EXPECT_EQ(after.compare(0, before.size(), before), 0) << after;
    return after.substr(std::min(before.size(), after.size()));
  }

 private:
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
};

std::string Scrape(int port) {
  const std::string cmd = absl::StrCat("curl -s --max-time 5 http://127.0.0.1:", port, "/metrics");
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  pclose(f);
  return out;
}

// Value of the series `name{labels}` (exact label text), or -1.
double Series(const std::string& text, const std::string& name_and_labels) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, name_and_labels + " ")) {
      return std::stod(std::string(line.substr(name_and_labels.size() + 1)));
    }
  }
  return -1;
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto dir = TestDataDir();
    if (!dir.has_value()) return;
    model_dir_ = new std::string(*dir + "/models/stories260K");
    server_ = new ServerProcess(*model_dir_, {"--max-request-bytes", "65536", "--prefill-chunk", "32"});
    offline_ = new Offline(*model_dir_);
  }
  static void TearDownTestSuite() {
    delete server_;
    delete offline_;
    delete model_dir_;
    server_ = nullptr;
  }
  void SetUp() override {
    if (server_ == nullptr) GTEST_SKIP() << "ECHOKV_TEST_DATA is not set: skipping server integration tests";
    ASSERT_TRUE(server_->ok()) << "echokv-server did not start";
  }
  static std::string* model_dir_;
  static ServerProcess* server_;
  static Offline* offline_;
};
std::string* ServerTest::model_dir_ = nullptr;
ServerProcess* ServerTest::server_ = nullptr;
Offline* ServerTest::offline_ = nullptr;

// Runs echokv-generate --json (the offline CLI, a separate process) and returns its
// output_ids; empty on failure (the test then fails on the comparison).
std::vector<int> GenerateCliIds(const std::string& model, const std::string& prompt, const std::string& policy,
                                int budget, int max_tokens) {
  const std::string prompt_file = MakeTempDir("echokv_gen_cli") + "/prompt.txt";
  WriteFileOrDie(prompt_file, prompt);
  const std::string cmd = absl::StrCat(ECHOKV_GENERATE_BIN, " --model '", model, "' --prompt \"$(cat '", prompt_file,
                                       "')\" --max-tokens ", max_tokens, " --policy ", policy, " --budget ", budget,
                                       " --threads 1 --json");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (p != nullptr && (n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  if (p == nullptr || pclose(p) != 0) return {};
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("\"output_ids\":\\[([0-9,]*)\\]"))) return {};
  std::vector<int> ids;
  for (absl::string_view part : absl::StrSplit(m[1].str(), ',', absl::SkipEmpty())) {
    ids.push_back(std::stoi(std::string(part)));
  }
  return ids;
}

TEST_F(ServerTest, GreedyStreamEqualsOfflineForEveryPolicy) {
  const std::string prompt = LongPrompt(0);
  ASSERT_GT(offline_->Tokens(prompt), 250);
  for (compression::PolicyKind kind : compression::AllPolicies()) {
    const std::string name(compression::PolicyName(kind));
    SCOPED_TRACE(name);
    Created c = CreateSession(server_->stub(), CreateRequest(prompt, name, 64));
    ASSERT_TRUE(c.status.ok()) << c.status.error_message();
    ASSERT_FALSE(c.session.id().empty());
    EXPECT_EQ(c.session.tokens_seen(), offline_->Tokens(prompt));
    EXPECT_EQ(c.session.compression().policy(), name);
    Generated g = Generate(server_->stub(), c.session.id(), 24);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    const std::vector<int> expected = offline_->Greedy(prompt, kind, 64, 24);
    EXPECT_EQ(g.ids, expected);
    EXPECT_EQ(g.text, offline_->Continuation(prompt, expected));
    // And the same as the offline CLI a user would run (issue: `echokv-generate --json`).
    EXPECT_EQ(g.ids, GenerateCliIds(*model_dir_, prompt, name, 64, 24));
    EXPECT_EQ(g.final.generated_tokens(), 24);
    EXPECT_EQ(g.final.finish_reason(), pb::GenerateResponse::Final::LENGTH);
    if (kind != compression::PolicyKind::kFull) {
      EXPECT_LT(c.session.retained_kv_bytes(), c.session.full_kv_bytes());
    }
  }
}

// The one-time re-exec that configures OpenBLAS keeps the process name, so operators
// can find the server with ps / pkill echokv-server.
TEST_F(ServerTest, ProcessKeepsItsName) {
  const std::string comm = ::echokv::testing::ReadFileOrDie("/proc/" + std::to_string(server_->pid()) + "/comm");
  EXPECT_EQ(comm, "echokv-server\n");
}

TEST_F(ServerTest, EightConcurrentStreamsEachEqualOffline) {
  std::vector<std::string> ids(8), prompts(8);
  for (int i = 0; i < 8; ++i) {
    prompts[i] = LongPrompt(i);
    Created c = CreateSession(server_->stub(), CreateRequest(prompts[i], "echokv", 64));
    ASSERT_TRUE(c.status.ok()) << c.status.error_message();
    ids[i] = c.session.id();
  }
  std::vector<Generated> results(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] { results[i] = Generate(server_->stub(), ids[i], 40); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].ids, offline_->Greedy(prompts[i], compression::PolicyKind::kEchoKv, 64, 40)) << i;
  }
}

// Every message of one Generate stream, as the client received it.
struct Streamed {
  grpc::Status status;
  std::vector<pb::GenerateResponse> messages;
  std::string text;
  std::vector<int> ids;
  std::vector<std::string> logprobs;  // one serialized TokenLogprob per id
  int max_ids_per_message = 0;
};

Streamed StreamAll(pb::EchoKV::Stub* stub, const pb::GenerateRequest& req, std::chrono::milliseconds pause) {
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  Streamed out;
  pb::GenerateResponse msg;
  while (reader->Read(&msg)) {
    out.messages.push_back(msg);
    out.text += msg.text();
    out.ids.insert(out.ids.end(), msg.token_ids().begin(), msg.token_ids().end());
    for (const pb::TokenLogprob& lp : msg.logprobs()) out.logprobs.push_back(lp.SerializeAsString());
    out.max_ids_per_message = std::max(out.max_ids_per_message, msg.token_ids_size());
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
  }
  out.status = reader->Finish();
  return out;
}

// Coalescing (service.cc StreamReactor): a reader that lags gets the deltas queued
// behind the write in flight merged into fewer messages. What it reads, concatenated,
// must be exactly what a fast reader of the same seeded generation reads: the same ids,
// text, logprobs (one per id, in order) and final message, last and on its own.
TEST_F(ServerTest, SlowReaderGetsCoalescedDeltasWithTheSameIdsTextAndLogprobs) {
  Created c = CreateSession(server_->stub(), CreateRequest("Once upon a time", "full", 0));
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  pb::GenerateRequest req;
  req.set_session_id(c.session.id());
  req.set_max_tokens(400);
  req.set_ignore_eos(true);
  req.mutable_sampling()->set_temperature(0.9f);
  req.mutable_sampling()->set_seed(20261201);
  req.mutable_sampling()->set_logprobs(true);
  req.mutable_sampling()->set_top_logprobs(2);

  const Streamed fast = StreamAll(server_->stub(), req, std::chrono::milliseconds(0));
  // The slow reader: a 1 KiB HTTP/2 window (no BDP growth) and a pause after every
  // message, so the server's writes stall and deltas pile up behind them.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto slow_stub = pb::EchoKV::NewStub(grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                                                 grpc::InsecureChannelCredentials(), args));
  const Streamed slow = StreamAll(slow_stub.get(), req, std::chrono::milliseconds(3));

  for (const Streamed* s : {&fast, &slow}) {
    SCOPED_TRACE(s == &fast ? "fast reader" : "slow reader");
    ASSERT_TRUE(s->status.ok()) << s->status.error_message();
    ASSERT_EQ(s->ids.size(), 400u);
    // The text is the tokenizer's decoding of prompt + ids minus the prompt's (an
    // oracle outside the server).
    EXPECT_EQ(s->text, offline_->Continuation("Once upon a time", s->ids));
    EXPECT_EQ(s->logprobs.size(), s->ids.size());
    for (size_t i = 0; i < s->messages.size(); ++i) {
      const pb::GenerateResponse& m = s->messages[i];
      EXPECT_EQ(m.logprobs_size(), m.token_ids_size()) << "message " << i;
      for (int k = 0; k < m.logprobs_size(); ++k) EXPECT_EQ(m.logprobs(k).token_id(), m.token_ids(k));
      // The final message is the last one, on its own.
      EXPECT_EQ(m.has_final(), i + 1 == s->messages.size()) << "message " << i;
      if (m.has_final()) {
        EXPECT_EQ(m.token_ids_size() + m.text().size(), 0u);
      }
    }
    ASSERT_FALSE(s->messages.empty());
    EXPECT_EQ(s->messages.back().final().generated_tokens(), 400);
    EXPECT_EQ(s->messages.back().final().finish_reason(), pb::GenerateResponse::Final::LENGTH);
  }
  // The slow reader's messages were merged (else this test shows nothing)...
  EXPECT_GT(slow.max_ids_per_message, 1);
  EXPECT_LT(slow.messages.size(), slow.ids.size());
  // ...and carry exactly the fast reader's stream.
  EXPECT_EQ(slow.ids, fast.ids);
  EXPECT_EQ(slow.text, fast.text);
  EXPECT_EQ(slow.logprobs, fast.logprobs);
  EXPECT_EQ(slow.messages.back().final().prompt_tokens(), fast.messages.back().final().prompt_tokens());
}

// Backpressure with coalescing: the backlog counts deltas, not messages, so a reader
// that never reads is held back after max_stream_backlog deltas (bounded memory), not
// fed every token merged into one ever-growing message. Observed through commit=true:
// a held-back generation keeps its session busy; one that ran to its end would not.
TEST_F(ServerTest, ReaderThatNeverReadsIsHeldBackDespiteCoalescing) {
  Created c = CreateSession(server_->stub(), CreateRequest("Once upon a time", "full", 0));
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto slow_stub = pb::EchoKV::NewStub(grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                                                 grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext gctx;
  pb::GenerateRequest g;
  g.set_session_id(c.session.id());
  g.set_max_tokens(400);  // ~0.1 s of decoding when nothing holds it back
  g.set_ignore_eos(true);
  g.set_commit(true);
  auto gen = slow_stub->Generate(&gctx, g);
  pb::GenerateResponse delta;
  ASSERT_TRUE(gen->Read(&delta));  // then never read again
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto busy = [&] {
    grpc::ClientContext ctx;
    pb::GetSessionRequest req;
    req.set_session_id(c.session.id());
    pb::Session s;
    EXPECT_TRUE(server_->stub()->GetSession(&ctx, req, &s).ok());
    return s.busy();
  };
  EXPECT_TRUE(busy()) << "the generation ran to its end although its reader never read";
  gctx.TryCancel();
  while (gen->Read(&delta)) {
  }
  EXPECT_EQ(gen->Finish().error_code(), grpc::StatusCode::CANCELLED);
  for (int i = 0; i < 100 && busy(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(busy());
}

TEST_F(ServerTest, ClientCancelLeavesServerHealthy) {
  Created c = CreateSession(server_->stub(), CreateRequest("Once upon a time", "", 0));
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  {
    grpc::ClientContext ctx;
    pb::GenerateRequest req;
    req.set_session_id(c.session.id());
    req.set_max_tokens(400);
    req.set_ignore_eos(true);
    auto reader = server_->stub()->Generate(&ctx, req);
    pb::GenerateResponse msg;
    ASSERT_TRUE(reader->Read(&msg));
    ctx.TryCancel();
    while (reader->Read(&msg)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  auto health = grpc::health::v1::Health::NewStub(server_->channel());
  grpc::ClientContext hctx;
  grpc::health::v1::HealthCheckRequest hreq;
  grpc::health::v1::HealthCheckResponse hresp;
  ASSERT_TRUE(health->Check(&hctx, hreq, &hresp).ok());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  Generated g = Generate(server_->stub(), c.session.id(), 8);
  EXPECT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.ids.size(), 8u);
}

// Every engine step that runs work is timed, with the rows of its batched decode. A lone
// stream of 8 tokens is 8 steps: the first samples from the logits its session kept (no
// decode row), each of the 7 others decodes the stream's last token (one row).
TEST_F(ServerTest, MetricsTimeEveryEngineStepAndCountItsDecodeRows) {
  Created c = CreateSession(server_->stub(), CreateRequest(LongPrompt(1), "full", 0));
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  const std::string before = Scrape(server_->metrics_port());
  Generated g = Generate(server_->stub(), c.session.id(), 8);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  ASSERT_EQ(g.ids.size(), 8u);
  const std::string after = Scrape(server_->metrics_port());
  auto delta = [&](const std::string& series) {
    return Series(after, series) - std::max(0.0, Series(before, series));
  };
  const double steps = delta("echokv_engine_step_seconds_count");
  EXPECT_EQ(steps, 8);
  EXPECT_GT(delta("echokv_engine_step_seconds_sum"), 0);
  EXPECT_EQ(delta("echokv_engine_step_decode_rows_count"), steps);
  EXPECT_EQ(delta("echokv_engine_step_decode_rows_sum"), 7);
  EXPECT_EQ(delta("echokv_engine_step_decode_rows_bucket{le=\"0\"}"), 1);
  EXPECT_EQ(delta("echokv_engine_step_decode_rows_bucket{le=\"1\"}"), steps);
}

TEST_F(ServerTest, MetricsPassPromtoolAndCountOneCompression) {
  const std::string before = Scrape(server_->metrics_port());
  ASSERT_THAT(before, HasSubstr("echokv_"));
  const double count_before = std::max(0.0, Series(before, "echokv_lookahead_seconds_count{policy=\"echokv\"}"));
  Created c = CreateSession(server_->stub(), CreateRequest(LongPrompt(3), "echokv", 64));
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  ASSERT_TRUE(c.session.last_report().evicted());
  const std::string after = Scrape(server_->metrics_port());
  EXPECT_EQ(Series(after, "echokv_lookahead_seconds_count{policy=\"echokv\"}"), count_before + 1);
  EXPECT_GT(Series(after, "echokv_kv_bytes_saved"), 0);
  EXPECT_GT(Series(after, "echokv_session_retained_kv_bytes"), 0);
  // promtool reads the exposition from stdin.
  const std::string path = MakeTempDir("echokv_metrics") + "/metrics.txt";
  WriteFileOrDie(path, after);
  EXPECT_EQ(std::system(absl::StrCat("/usr/bin/promtool check metrics < ", path).c_str()), 0) << after;
  // No label value is a session id (or any 32-hex string).
  std::regex label_value("=\"([^\"]*)\"");
  std::set<std::string> values;
  for (auto it = std::sregex_iterator(after.begin(), after.end(), label_value); it != std::sregex_iterator(); ++it) {
    values.insert((*it)[1].str());
  }
  EXPECT_EQ(values.count(c.session.id()), 0u);
  for (const std::string& v : values) EXPECT_FALSE(std::regex_match(v, std::regex("[0-9a-f]{32}"))) << v;
}

TEST_F(ServerTest, CommitForkInspectDeleteAndCompress) {
  const std::string prompt = LongPrompt(5);
  Created c = CreateSession(server_->stub(), CreateRequest(prompt, "snapkv", 64));
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  Generated g = Generate(server_->stub(), c.session.id(), 10, /*commit=*/true);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.final.session().tokens_seen(), c.session.tokens_seen() + 10);

  grpc::ClientContext fctx;
  pb::ForkSessionRequest freq;
  freq.set_session_id(c.session.id());
  pb::Session fork;
  ASSERT_TRUE(server_->stub()->ForkSession(&fctx, freq, &fork).ok());
  EXPECT_NE(fork.id(), c.session.id());
  EXPECT_EQ(fork.tokens_seen(), c.session.tokens_seen() + 10);
  // The fork continues exactly like its source.
  EXPECT_EQ(Generate(server_->stub(), fork.id(), 6).ids, Generate(server_->stub(), c.session.id(), 6).ids);

  grpc::ClientContext ictx;
  pb::InspectCacheRequest ireq;
  ireq.set_session_id(fork.id());
  ireq.set_include_positions(true);
  pb::InspectCacheResponse ins;
  ASSERT_TRUE(server_->stub()->InspectCache(&ictx, ireq, &ins).ok());
  ASSERT_GT(ins.layers_size(), 0);
  EXPECT_EQ(ins.layers(0).groups(0).positions_size(), ins.layers(0).groups(0).retained());
  EXPECT_EQ(ins.total_kv_bytes(), fork.retained_kv_bytes());

  grpc::ClientContext dctx;
  pb::DeleteSessionRequest dreq;
  dreq.set_session_id(fork.id());
  pb::DeleteSessionResponse dresp;
  ASSERT_TRUE(server_->stub()->DeleteSession(&dctx, dreq, &dresp).ok());
  EXPECT_EQ(dresp.freed_kv_bytes(), fork.retained_kv_bytes());

  grpc::ClientContext cctx;
  pb::CompressRequest creq;
  creq.mutable_input()->set_text(prompt);
  creq.mutable_compression()->set_policy("echokv");
  creq.mutable_compression()->set_budget(64);
  pb::CompressResponse cresp;
  ASSERT_TRUE(server_->stub()->Compress(&cctx, creq, &cresp).ok());
  const std::vector<int64_t> expected = offline_->Positions(prompt, compression::PolicyKind::kEchoKv, 64, 2, 1);
  ASSERT_GT(cresp.layers_size(), 2);
  EXPECT_EQ(std::vector<int64_t>(cresp.layers(2).groups(1).positions().begin(),
                                 cresp.layers(2).groups(1).positions().end()),
            expected);
}

TEST_F(ServerTest, ErrorTable) {
  auto create_code = [&](pb::CreateSessionRequest req, grpc::StatusCode code, const std::string& what) {
    Created c = CreateSession(server_->stub(), req);
    EXPECT_EQ(c.status.error_code(), code) << what << ": " << c.status.error_message();
    EXPECT_THAT(c.status.error_message(), HasSubstr(what));
  };
  create_code(CreateRequest("", "", 0), grpc::StatusCode::INVALID_ARGUMENT, "input");
  create_code(pb::CreateSessionRequest(), grpc::StatusCode::INVALID_ARGUMENT, "input");
  std::string long_text;
  for (int i = 0; i < 4; ++i) long_text += LongPrompt(i);  // > 512 tokens
  create_code(CreateRequest(long_text, "", 0), grpc::StatusCode::INVALID_ARGUMENT, "max_context_tokens");
  create_code(CreateRequest(std::string(70000, 'a'), "", 0), grpc::StatusCode::INVALID_ARGUMENT,
              "max_request_bytes");
  create_code(CreateRequest("Once", "nosuch", 0), grpc::StatusCode::INVALID_ARGUMENT, "compression.policy");
  pb::CreateSessionRequest odd = CreateRequest("Once", "echokv", 0);
  odd.mutable_compression()->set_lookahead(3);
  create_code(odd, grpc::StatusCode::INVALID_ARGUMENT, "lookahead");
  pb::CreateSessionRequest zero = CreateRequest("Once", "", 0);
  zero.mutable_compression()->set_budget(0);
  create_code(zero, grpc::StatusCode::INVALID_ARGUMENT, "budget");

  Created ok = CreateSession(server_->stub(), CreateRequest("Once upon a time", "", 0));
  ASSERT_TRUE(ok.status.ok());
  Generated g0 = Generate(server_->stub(), ok.session.id(), 0);
  EXPECT_EQ(g0.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(g0.status.error_message(), HasSubstr("max_tokens"));
  Generated huge = Generate(server_->stub(), ok.session.id(), 1 << 20);
  EXPECT_EQ(huge.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(huge.status.error_message(), HasSubstr("max_new_tokens"));
  {
    grpc::ClientContext ctx;
    pb::GenerateRequest req;
    req.set_session_id(ok.session.id());
    req.mutable_sampling()->set_top_p(2.0f);
    auto reader = server_->stub()->Generate(&ctx, req);
    pb::GenerateResponse msg;
    while (reader->Read(&msg)) {
    }
    grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("top_p"));
  }
  Generated unknown = Generate(server_->stub(), "0123456789abcdef0123456789abcdef", 4);
  EXPECT_EQ(unknown.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(unknown.status.error_message(), HasSubstr("not found"));

  // Deleted.
  {
    grpc::ClientContext ctx;
    pb::DeleteSessionRequest req;
    req.set_session_id(ok.session.id());
    pb::DeleteSessionResponse resp;
    ASSERT_TRUE(server_->stub()->DeleteSession(&ctx, req, &resp).ok());
    EXPECT_EQ(Generate(server_->stub(), ok.session.id(), 4).status.error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // Expired (1 s TTL).
  {
    pb::CreateSessionRequest req = CreateRequest("Once upon a time", "", 0);
    req.set_ttl_seconds(1);
    Created e = CreateSession(server_->stub(), req);
    ASSERT_TRUE(e.status.ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(1600));
    grpc::ClientContext ctx;
    pb::GetSessionRequest greq;
    greq.set_session_id(e.session.id());
    pb::Session s;
    grpc::Status st = server_->stub()->GetSession(&ctx, greq, &s);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // Concurrent mutation: an append while a committing generation holds the session.
  // No race: the generation's channel advertises a 1 KiB HTTP/2 window (no BDP growth)
  // and reads one delta only, so the server's writes stall, the engine holds the stream
  // back (its backlog is full) and the generation cannot end before the append arrives.
  {
    Created base = CreateSession(server_->stub(), CreateRequest("Once upon a time", "echokv", 64));
    ASSERT_TRUE(base.status.ok());
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    auto slow_stub = pb::EchoKV::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", server_->port()), grpc::InsecureChannelCredentials(), args));
    grpc::ClientContext gctx;
    pb::GenerateRequest g;
    g.set_session_id(base.session.id());
    g.set_max_tokens(400);
    g.set_ignore_eos(true);
    g.set_commit(true);
    auto gen = slow_stub->Generate(&gctx, g);
    pb::GenerateResponse delta;
    ASSERT_TRUE(gen->Read(&delta));  // the generation holds the session now
    grpc::ClientContext ctx2;
    pb::AppendToSessionRequest a2;
    a2.set_session_id(base.session.id());
    a2.mutable_input()->set_text("More text.");
    auto reader2 = server_->stub()->AppendToSession(&ctx2, a2);
    pb::SessionProgress msg;
    while (reader2->Read(&msg)) {
    }
    grpc::Status s2 = reader2->Finish();
    EXPECT_EQ(s2.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s2.error_message(), HasSubstr("busy"));
    int deltas = 1;
    while (gen->Read(&delta)) ++deltas;
    ASSERT_TRUE(gen->Finish().ok());
    EXPECT_GT(deltas, 1);
    // Once the generation ended, the session takes appends again.
    grpc::ClientContext ctx3;
    auto reader3 = server_->stub()->AppendToSession(&ctx3, a2);
    pb::Session last;
    while (reader3->Read(&msg)) {
      if (msg.has_session()) last = msg.session();
    }
    ASSERT_TRUE(reader3->Finish().ok());
    EXPECT_GT(last.tokens_seen(), base.session.tokens_seen());
  }
  // Still serving.
  grpc::ClientContext ictx;
  pb::ServerInfo info;
  ASSERT_TRUE(server_->stub()->GetServerInfo(&ictx, pb::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.model().num_layers(), 5);
}

TEST(ServerLimitsTest, KvBytesLimitIsResourceExhausted) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  ServerProcess server(data + "/models/stories260K", {"--max-kv-bytes", "1000"});
  ASSERT_TRUE(server.ok());
  Created c = CreateSession(server.stub(), CreateRequest("Once upon a time there was", "", 0));
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(c.status.error_message(), HasSubstr("max_kv_bytes"));
  grpc::ClientContext ctx;
  pb::ServerInfo info;
  EXPECT_TRUE(server.stub()->GetServerInfo(&ctx, pb::GetServerInfoRequest(), &info).ok());
}

// --session-ttl is the default idle expiry of sessions created without ttl_seconds:
// an idle session is gone after it, a session that keeps being used is not.
TEST(ServerLimitsTest, SessionTtlFlagExpiresIdleSessions) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  ServerProcess server(data + "/models/stories260K", {"--session-ttl", "3s"});
  ASSERT_TRUE(server.ok());
  Created idle = CreateSession(server.stub(), CreateRequest("Once upon a time", "", 0));
  Created kept = CreateSession(server.stub(), CreateRequest("Lily and Tom went to the park.", "", 0));
  ASSERT_TRUE(idle.status.ok() && kept.status.ok());
  auto get = [&](const std::string& id) {
    grpc::ClientContext ctx;
    pb::GetSessionRequest req;
    req.set_session_id(id);
    pb::Session s;
    return server.stub()->GetSession(&ctx, req, &s);
  };
  // Touch `kept` every 0.2 s until `idle` has been idle longer than its TTL. Sleeps only
  // ever overshoot, so `idle` is surely expired at the end; `kept` could only expire if
  // one gap between touches reached the whole TTL (a 3 s stall), which the test checks
  // rather than assumes (the exact expiry arithmetic is tested on a fake clock in
  // server_engine_test).
  const auto created = std::chrono::steady_clock::now();
  auto last_touch = created;
  std::chrono::steady_clock::duration longest_gap{};
  while (std::chrono::steady_clock::now() - created < std::chrono::milliseconds(3600)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto now = std::chrono::steady_clock::now();
    longest_gap = std::max(longest_gap, now - last_touch);
    ASSERT_TRUE(get(kept.session.id()).ok()) << "a session in use must not expire";
    last_touch = std::chrono::steady_clock::now();
  }
  EXPECT_LT(longest_gap, std::chrono::seconds(3));
  EXPECT_EQ(get(idle.session.id()).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST(ServerShutdownTest, SigtermDuringStreamGoesNotServingAndExitsZero) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  ServerProcess server(data + "/models/stories260K", {"--shutdown-grace", "3s"});
  ASSERT_TRUE(server.ok());
  Created c = CreateSession(server.stub(), CreateRequest("Once upon a time", "", 0));
  ASSERT_TRUE(c.status.ok());
  auto health = grpc::health::v1::Health::NewStub(server.channel());
  grpc::ClientContext wctx;
  grpc::health::v1::HealthCheckRequest wreq;
  auto watch = health->Watch(&wctx, wreq);
  grpc::health::v1::HealthCheckResponse wresp;
  ASSERT_TRUE(watch->Read(&wresp));
  EXPECT_EQ(wresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  grpc::ClientContext gctx;
  pb::GenerateRequest greq;
  greq.set_session_id(c.session.id());
  greq.set_max_tokens(400);
  greq.set_ignore_eos(true);
  auto reader = server.stub()->Generate(&gctx, greq);
  pb::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  bool saw_not_serving = false;
  while (watch->Read(&wresp)) {
    if (wresp.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING) {
      saw_not_serving = true;
      break;
    }
  }
  EXPECT_TRUE(saw_not_serving);
  while (reader->Read(&msg)) {
  }
  reader->Finish();
  int status = -1;
  pid_t done = 0;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    done = waitpid(server.pid(), &status, WNOHANG);
    if (done == server.pid()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(done, server.pid()) << "server did not exit";
  server.Forget();
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // No wall-clock bound on the exit: what matters is that the server went NOT_SERVING,
  // ended the stream and exited 0 on its own (a hang fails the 60 s wait above).
  wctx.TryCancel();
}

}  // namespace
}  // namespace echokv::server
