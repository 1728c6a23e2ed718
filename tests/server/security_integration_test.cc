// Security acceptance tests of echokv-server (docs/SECURITY.md): the real binary on
// 127.0.0.1 with stories260K, real TLS with a throwaway CA made here by Debian's
// openssl CLI. Authentication (no / wrong token -> UNAUTHENTICATED, health open),
// tenant isolation (every RPC on another tenant's session answers exactly like an
// unknown id), per-tenant quotas, mTLS, SIGHUP reload of tokens and certificates with
// a stream running, edge validation (invalid UTF-8, garbage, long ids, oversize), and
// the no-stall test (a 4 MB text while 8 streams run).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "proto/echokv/v1/echokv.grpc.pb.h"
#include "server/doors/auth.h"
#include "tests/testing/test_data.h"

namespace echokv::server {
namespace {

namespace pb = ::echokv::v1;
using ::echokv::testing::MakeTempDir;
using ::echokv::testing::WriteFileOrDie;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream b;
  b << in.rdbuf();
  return b.str();
}

// Runs a shell command; its stdout.
std::string Sh(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  EXPECT_EQ(rc, 0) << cmd;
  return out;
}

// A throwaway CA with a server certificate (localhost, 127.0.0.1) and a client one.
struct Certs {
  std::string dir;
  std::string Path(const std::string& name) const { return dir + "/" + name; }
  std::string Pem(const std::string& name) const { return ReadFile(Path(name)); }
};

void Leaf(const Certs& c, const std::string& name, const std::string& cn, const std::string& ext) {
  const std::string d = c.dir;
  Sh(absl::StrCat("cd ", d, " && openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ", name,
                  ".key -out ", name, ".csr -subj /CN=", cn, " 2>/dev/null && printf '", ext, "\\n' > ", name,
                  ".ext && openssl x509 -req -in ", name, ".csr -CA ca.pem -CAkey ca.key -CAcreateserial -out ", name,
                  ".pem -days 2 -extfile ", name, ".ext 2>/dev/null"));
}

Certs MakeCerts() {
  Certs c{MakeTempDir("echokv_tls")};
  Sh(absl::StrCat("cd ", c.dir, " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ",
                  "-keyout ca.key -out ca.pem -days 2 -subj /CN=echokv-test-ca 2>/dev/null"));
  Leaf(c, "server", "localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1");
  Leaf(c, "client", "client", "extendedKeyUsage=clientAuth");
  return c;
}

std::string TokenLine(const std::string& tenant, const std::string& token, const std::string& quotas = "") {
  return absl::StrCat(tenant, " ", DigestHex(Sha256(token)), " ", quotas, "\n");
}

// A running echokv-server.
class Server {
 public:
  explicit Server(std::vector<std::string> extra) {
    const std::optional<std::string> data_dir = ::echokv::testing::TestDataDir();
    if (!data_dir.has_value()) return;
    const std::string data = *data_dir;
    dir_ = MakeTempDir("echokv_security");
    const std::string port_file = dir_ + "/ports";
    log_ = dir_ + "/server.log";
    std::vector<std::string> args = {ECHOKV_SERVER_BIN, "--model", data + "/models/stories260K", "--host",
                                     "127.0.0.1", "--port", "0", "--metrics-port", "0", "--port-file", port_file,
                                     "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    for (int i = 0; i < 1200 && port_ == 0; ++i) {
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
        exit_status_ = st;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~Server() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool ok() const { return port_ > 0; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string log() const { return ReadFile(log_); }
  int exit_status() const { return exit_status_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::string Metrics() const {
    return Sh(absl::StrCat("curl -s --max-time 5 http://127.0.0.1:", metrics_port_, "/metrics"));
  }
  // Resident set size of the server process, in bytes.
  int64_t RssBytes() const {
    std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
    }
    return -1;
  }

  std::shared_ptr<grpc::Channel> Plain() const {
    return grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
  }
  // A channel whose streams take little data ahead of the reader (no BDP growth): a
  // stream the client does not read stops the server's writes within a few KB.
  static grpc::ChannelArguments SlowArgs() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return args;
  }
  std::shared_ptr<grpc::Channel> SlowReader() const {
    return grpc::CreateCustomChannel(address(), grpc::InsecureChannelCredentials(), SlowArgs());
  }
  std::shared_ptr<grpc::Channel> Tls(const Certs& c, bool client_cert, bool slow_reader = false) const {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = c.Pem("ca.pem");
    if (client_cert) {
      o.pem_private_key = c.Pem("client.key");
      o.pem_cert_chain = c.Pem("client.pem");
    }
    grpc::ChannelArguments args = slow_reader ? SlowArgs() : grpc::ChannelArguments();
    args.SetSslTargetNameOverride("localhost");
    // A fresh connection per channel, so each one sees the current server certificate.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return grpc::CreateCustomChannel(address(), grpc::SslCredentials(o), args);
  }

 private:
  std::string dir_, log_;
  pid_t pid_ = -1;
  int port_ = 0;
  int metrics_port_ = 0;
  int exit_status_ = -1;
};

#define ECHOKV_REQUIRE_SERVER(s)                                    \
  if (!::echokv::testing::TestDataDir().has_value()) {              \
    GTEST_SKIP() << "ECHOKV_TEST_DATA is not set";                  \
  }                                                                 \
  ASSERT_TRUE((s).ok()) << "echokv-server did not start:\n" << (s).log()

std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token, int seconds = 60) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return ctx;
}

// Creates a session from `text`; its id (or the failed status).
grpc::Status CreateSession(pb::EchoKV::Stub* stub, const std::string& token, const std::string& text,
                           std::string* id) {
  auto ctx = Ctx(token);
  pb::CreateSessionRequest req;
  req.mutable_input()->set_text(text);
  req.mutable_compression()->set_policy("snapkv");
  req.mutable_compression()->set_budget(16);
  auto reader = stub->CreateSession(ctx.get(), req);
  pb::SessionProgress msg;
  while (reader->Read(&msg)) {
    if (msg.has_session()) *id = msg.session().id();
  }
  return reader->Finish();
}

// Reads a whole Generate stream: its status, the number of token messages.
grpc::Status GenerateAll(pb::EchoKV::Stub* stub, const std::string& token, const std::string& id, int max_tokens,
                         int* messages = nullptr) {
  auto ctx = Ctx(token);
  pb::GenerateRequest req;
  req.set_session_id(id);
  req.set_max_tokens(max_tokens);
  auto reader = stub->Generate(ctx.get(), req);
  pb::GenerateResponse msg;
  int n = 0;
  while (reader->Read(&msg)) ++n;
  if (messages != nullptr) *messages = n;
  return reader->Finish();
}

grpc::Status ServerInfo(grpc::Channel* ch, const std::string& token) {
  auto stub = pb::EchoKV::NewStub(std::shared_ptr<grpc::Channel>(ch, [](grpc::Channel*) {}));
  auto ctx = Ctx(token, 20);
  pb::ServerInfo info;
  return stub->GetServerInfo(ctx.get(), pb::GetServerInfoRequest(), &info);
}

bool HealthServing(const std::shared_ptr<grpc::Channel>& ch) {
  auto stub = grpc::health::v1::Health::NewStub(ch);
  grpc::ClientContext ctx;  // no token: probes send none
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("echokv.v1.EchoKV");
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status s = stub->Check(&ctx, req, &resp);
  return s.ok() && resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

const char kStory[] = "Once upon a time there was a little dog. The dog liked to run in the park with his friend.";

// ---------------------------------------------------------------------------------

TEST(StartupTest, RefusesToStartOpenWithoutInsecure) {
  Server s({});
  if (!::echokv::testing::TestDataDir().has_value()) GTEST_SKIP() << "ECHOKV_TEST_DATA is not set";
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(WIFEXITED(s.exit_status()) && WEXITSTATUS(s.exit_status()) == 2) << s.exit_status();
  EXPECT_THAT(s.log(), HasSubstr("refusing to start without authentication"));
}

grpc::Status RawCall(grpc::Channel* ch, const std::string& method, const std::string& bytes,
                     const std::string& token = "");

TEST(StartupTest, InsecureSaysSoLoudlyAndReflectionIsOffByDefault) {
  Server s({"--insecure"});
  ECHOKV_REQUIRE_SERVER(s);
  EXPECT_THAT(s.log(), HasSubstr("INSECURE: --insecure given: NO AUTHENTICATION"));
  auto ch = s.Plain();
  EXPECT_TRUE(ServerInfo(ch.get(), "").ok());
  const std::string reflection = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  EXPECT_EQ(RawCall(ch.get(), reflection, "").error_code(), grpc::StatusCode::UNIMPLEMENTED);
  Server with({"--insecure", "--reflection"});
  ASSERT_TRUE(with.ok());
  // Registered: the call reaches the reflection service (which answers an empty
  // request with an error of its own, or not at all before the deadline).
  EXPECT_NE(RawCall(with.Plain().get(), reflection, "").error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

TEST(StartupTest, BadTokensFileNamesTheLine) {
  const std::string dir = MakeTempDir("echokv_tokens");
  WriteFileOrDie(dir + "/tokens", TokenLine("a", "x") + "b nothex\n");
  Server s({"--auth_tokens_file", dir + "/tokens"});
  if (!::echokv::testing::TestDataDir().has_value()) GTEST_SKIP() << "ECHOKV_TEST_DATA is not set";
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.log(), HasSubstr(dir + "/tokens:2: tenant 'b'"));
}

// Plaintext port with a tokens file: the service checks the token itself.
TEST(AuthTest, NoTokenOrWrongTokenIsUnauthenticatedAndHealthIsOpen) {
  const std::string dir = MakeTempDir("echokv_tokens");
  WriteFileOrDie(dir + "/tokens", TokenLine("alice", "tokA") + TokenLine("bob", "tokB"));
  Server s({"--auth_tokens_file", dir + "/tokens"});
  ECHOKV_REQUIRE_SERVER(s);
  auto ch = s.Plain();
  auto stub = pb::EchoKV::NewStub(ch);
  EXPECT_EQ(ServerInfo(ch.get(), "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ServerInfo(ch.get(), "tokB-wrong").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", "Basic dG9rQQ==");
    pb::ServerInfo info;
    EXPECT_EQ(stub->GetServerInfo(ctx.get(), pb::GetServerInfoRequest(), &info).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  std::string id;
  EXPECT_EQ(CreateSession(stub.get(), "", kStory, &id).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(GenerateAll(stub.get(), "nope", std::string(32, 'a'), 4).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(HealthServing(ch));
  EXPECT_TRUE(ServerInfo(ch.get(), "tokA").ok());
  ASSERT_TRUE(CreateSession(stub.get(), "tokA", kStory, &id).ok());
  EXPECT_TRUE(GenerateAll(stub.get(), "tokA", id, 4).ok());
  // Refusals are counted like every other request.
  EXPECT_THAT(s.Metrics(), HasSubstr("echokv_requests_total{code=\"UNAUTHENTICATED\",method=\"GetServerInfo\"} 3"));
  EXPECT_THAT(s.log(), Not(HasSubstr("INSECURE")));
}

// Tenant B tries every RPC on tenant A's session: each answers exactly as for an id
// that does not exist (code and message, with the id swapped), and A's session is
// untouched.
TEST(TenantIsolationTest, EveryRpcOnAnotherTenantsSessionLooksUnknown) {
  const std::string dir = MakeTempDir("echokv_tokens");
  WriteFileOrDie(dir + "/tokens", TokenLine("alice", "tokA") + TokenLine("bob", "tokB"));
  Server s({"--auth_tokens_file", dir + "/tokens"});
  ECHOKV_REQUIRE_SERVER(s);
  auto stub = pb::EchoKV::NewStub(s.Plain());
  std::string a;
  ASSERT_TRUE(CreateSession(stub.get(), "tokA", kStory, &a).ok());
  const std::string unknown(32, 'f');
  ASSERT_NE(a, unknown);

  // Each probe returns (code, message) for a session id as tenant bob.
  using Probe = std::function<grpc::Status(const std::string&)>;
  const std::vector<std::pair<std::string, Probe>> probes = {
      {"GetSession",
       [&](const std::string& id) {
         auto ctx = Ctx("tokB");
         pb::GetSessionRequest r;
         r.set_session_id(id);
         pb::Session out;
         return stub->GetSession(ctx.get(), r, &out);
       }},
      {"AppendToSession",
       [&](const std::string& id) {
         auto ctx = Ctx("tokB");
         pb::AppendToSessionRequest r;
         r.set_session_id(id);
         r.mutable_input()->set_text(" and then");
         auto reader = stub->AppendToSession(ctx.get(), r);
         pb::SessionProgress m;
         while (reader->Read(&m)) {
         }
         return reader->Finish();
       }},
      {"Generate", [&](const std::string& id) { return GenerateAll(stub.get(), "tokB", id, 4); }},
      {"ForkSession",
       [&](const std::string& id) {
         auto ctx = Ctx("tokB");
         pb::ForkSessionRequest r;
         r.set_session_id(id);
         pb::Session out;
         return stub->ForkSession(ctx.get(), r, &out);
       }},
      {"InspectCache",
       [&](const std::string& id) {
         auto ctx = Ctx("tokB");
         pb::InspectCacheRequest r;
         r.set_session_id(id);
         pb::InspectCacheResponse out;
         return stub->InspectCache(ctx.get(), r, &out);
       }},
      {"ExportSession",
       [&](const std::string& id) {
         auto ctx = Ctx("tokB");
         pb::ExportSessionRequest r;
         r.set_session_id(id);
         auto reader = stub->ExportSession(ctx.get(), r);
         pb::SessionSnapshotChunk m;
         while (reader->Read(&m)) {
         }
         return reader->Finish();
       }},
      {"DeleteSession",
       [&](const std::string& id) {
         auto ctx = Ctx("tokB");
         pb::DeleteSessionRequest r;
         r.set_session_id(id);
         pb::DeleteSessionResponse out;
         return stub->DeleteSession(ctx.get(), r, &out);
       }},
  };
  for (const auto& [name, probe] : probes) {
    const grpc::Status foreign = probe(a);
    const grpc::Status missing = probe(unknown);
    EXPECT_EQ(foreign.error_code(), missing.error_code()) << name;
    EXPECT_EQ(absl::StrReplaceAll(foreign.error_message(), {{a, unknown}}), missing.error_message()) << name;
    if (name != "ExportSession") {  // not implemented yet: UNIMPLEMENTED for every caller
      EXPECT_EQ(foreign.error_code(), grpc::StatusCode::NOT_FOUND) << name << ": " << foreign.error_message();
    }
  }
  // ListSessions: bob sees nothing, alice sees her session, unchanged by bob's tries.
  {
    auto ctx = Ctx("tokB");
    pb::ListSessionsResponse out;
    ASSERT_TRUE(stub->ListSessions(ctx.get(), pb::ListSessionsRequest(), &out).ok());
    EXPECT_EQ(out.sessions_size(), 0);
  }
  {
    auto ctx = Ctx("tokA");
    pb::ListSessionsResponse out;
    ASSERT_TRUE(stub->ListSessions(ctx.get(), pb::ListSessionsRequest(), &out).ok());
    ASSERT_EQ(out.sessions_size(), 1);
    EXPECT_EQ(out.sessions(0).id(), a);
  }
  EXPECT_TRUE(GenerateAll(stub.get(), "tokA", a, 4).ok());
}

TEST(QuotaTest, SessionsAndBytesPerTenant) {
  const std::string dir = MakeTempDir("echokv_tokens");
  WriteFileOrDie(dir + "/tokens", TokenLine("alice", "tokA", "max_sessions=2") +
                                      TokenLine("carol", "tokC", "max_kv_bytes=1000") + TokenLine("bob", "tokB"));
  Server s({"--auth_tokens_file", dir + "/tokens"});
  ECHOKV_REQUIRE_SERVER(s);
  auto stub = pb::EchoKV::NewStub(s.Plain());
  std::string id;
  ASSERT_TRUE(CreateSession(stub.get(), "tokA", kStory, &id).ok());
  ASSERT_TRUE(CreateSession(stub.get(), "tokA", kStory, &id).ok());
  const grpc::Status third = CreateSession(stub.get(), "tokA", kStory, &id);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.error_message(), HasSubstr("max_sessions (2 for tenant 'alice')"));
  // Other tenants are not affected by alice's quota.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(CreateSession(stub.get(), "tokB", kStory, &id).ok());
  const grpc::Status big = CreateSession(stub.get(), "tokC", kStory, &id);
  EXPECT_EQ(big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(big.error_message(), HasSubstr("max_kv_bytes (1000 for tenant 'carol')"));
}

// A stream that the client never reads holds its slot (flow control stops the
// server's writes): the tenant's max_streams=1 refuses a second one, other tenants
// still get slots, and cancelling frees it.
TEST(QuotaTest, StreamsPerTenant) {
  const std::string dir = MakeTempDir("echokv_tokens");
  WriteFileOrDie(dir + "/tokens", TokenLine("alice", "tokA", "max_streams=1") + TokenLine("bob", "tokB"));
  Server s({"--auth_tokens_file", dir + "/tokens"});
  ECHOKV_REQUIRE_SERVER(s);
  auto stub = pb::EchoKV::NewStub(s.Plain());
  auto slow = pb::EchoKV::NewStub(s.SlowReader());
  std::string a, b;
  ASSERT_TRUE(CreateSession(stub.get(), "tokA", kStory, &a).ok());
  ASSERT_TRUE(CreateSession(stub.get(), "tokB", kStory, &b).ok());
  auto held_ctx = Ctx("tokA");
  pb::GenerateRequest req;
  req.set_session_id(a);
  req.set_max_tokens(400);
  req.set_ignore_eos(true);
  req.mutable_sampling()->set_logprobs(true);
  req.mutable_sampling()->set_top_logprobs(20);  // big messages: the flow-control window fills
  auto held = slow->Generate(held_ctx.get(), req);
  pb::GenerateResponse first;
  ASSERT_TRUE(held->Read(&first));  // the stream runs
  const grpc::Status second = GenerateAll(stub.get(), "tokA", a, 4);
  EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << second.error_message();
  EXPECT_THAT(second.error_message(), HasSubstr("max_streams (1 for tenant 'alice')"));
  EXPECT_TRUE(GenerateAll(stub.get(), "tokB", b, 4).ok());
  EXPECT_THAT(s.Metrics(), HasSubstr("echokv_tenant_streams_in_flight{tenant=\"alice\"} 1"));
  held_ctx->TryCancel();
  pb::GenerateResponse rest;
  while (held->Read(&rest)) {
  }
  held->Finish();
  // The slot comes back once the server has seen the cancel.
  grpc::Status again;
  for (int i = 0; i < 100; ++i) {
    again = GenerateAll(stub.get(), "tokA", a, 4);
    if (again.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(again.ok()) << again.error_message();
}

// mTLS: no client certificate -> the handshake fails; with one, the token is still
// required (AuthMetadataProcessor), and health needs no token.
TEST(TlsTest, MutualTlsRefusesAClientWithoutACertificate) {
  const Certs c = MakeCerts();
  const std::string dir = MakeTempDir("echokv_tokens");
  WriteFileOrDie(dir + "/tokens", TokenLine("alice", "tokA"));
  Server s({"--auth_tokens_file", dir + "/tokens", "--tls_cert", c.Path("server.pem"), "--tls_key",
            c.Path("server.key"), "--tls_client_ca", c.Path("ca.pem")});
  ECHOKV_REQUIRE_SERVER(s);
  const grpc::Status no_cert = ServerInfo(s.Tls(c, false).get(), "tokA");
  EXPECT_EQ(no_cert.error_code(), grpc::StatusCode::UNAVAILABLE) << no_cert.error_message();
  EXPECT_FALSE(ServerInfo(s.Plain().get(), "tokA").ok());  // plaintext is not spoken
  auto ch = s.Tls(c, true);
  EXPECT_TRUE(ServerInfo(ch.get(), "tokA").ok());
  EXPECT_EQ(ServerInfo(ch.get(), "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ServerInfo(ch.get(), "tokX").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(HealthServing(ch));
  auto stub = pb::EchoKV::NewStub(ch);
  std::string id;
  ASSERT_TRUE(CreateSession(stub.get(), "tokA", kStory, &id).ok());
  EXPECT_TRUE(GenerateAll(stub.get(), "tokA", id, 8).ok());
  // echokv-cli with the same credentials (exit 0), and without the token (exit 1).
  const std::string tok = MakeTempDir("echokv_cli") + "/token";
  WriteFileOrDie(tok, "tokA\n");
  const std::string cli = absl::StrCat(ECHOKV_CLI_BIN, " --server localhost:", s.port(), " --tls_ca ", c.Path("ca.pem"),
                                       " --tls_cert ", c.Path("client.pem"), " --tls_key ", c.Path("client.key"));
  EXPECT_EQ(std::system((cli + " --token_file " + tok + " list >/dev/null 2>&1").c_str()), 0);
  const int no_token = std::system((cli + " list >/dev/null 2>&1").c_str());
  EXPECT_TRUE(WIFEXITED(no_token) && WEXITSTATUS(no_token) == 1) << no_token;
  // Refused by the processor before any handler: counted all the same.
  EXPECT_THAT(s.Metrics(), HasSubstr("echokv_requests_total{code=\"UNAUTHENTICATED\",method=\"GetServerInfo\"} 2"));
}

// SIGHUP while a stream runs: the new tokens apply to new calls, the old token stops
// working, the certificate files are picked up for new connections, and the stream
// (authenticated before) finishes normally.
TEST(ReloadTest, SighupReloadsTokensAndCertificatesWhileAStreamRuns) {
  Certs c = MakeCerts();
  const std::string dir = MakeTempDir("echokv_tokens");
  WriteFileOrDie(dir + "/tokens", TokenLine("alice", "old-token"));
  Server s({"--auth_tokens_file", dir + "/tokens", "--tls_cert", c.Path("server.pem"), "--tls_key",
            c.Path("server.key"), "--tls_refresh_interval", "1s"});
  ECHOKV_REQUIRE_SERVER(s);
  auto ch = s.Tls(c, false, /*slow_reader=*/true);
  auto stub = pb::EchoKV::NewStub(ch);
  std::string id;
  ASSERT_TRUE(CreateSession(stub.get(), "old-token", kStory, &id).ok());
  auto stream_ctx = Ctx("old-token", 120);
  pb::GenerateRequest req;
  req.set_session_id(id);
  req.set_max_tokens(400);
  req.set_ignore_eos(true);
  req.mutable_sampling()->set_logprobs(true);
  req.mutable_sampling()->set_top_logprobs(20);
  auto stream = stub->Generate(stream_ctx.get(), req);
  pb::GenerateResponse msg;
  ASSERT_TRUE(stream->Read(&msg));
  const std::string old_pem = c.Pem("server.pem");

  // New token and a new server certificate, then SIGHUP.
  WriteFileOrDie(dir + "/tokens", TokenLine("alice", "new-token"));
  Leaf(c, "server2", "localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1");
  Sh(absl::StrCat("cd ", c.dir, " && cp server2.key server.key.tmp && cp server2.pem server.pem.tmp && ",
                  "mv server.key.tmp server.key && mv server.pem.tmp server.pem"));
  const std::string new_pem = c.Pem("server.pem");
  ASSERT_NE(new_pem, old_pem);
  ASSERT_EQ(kill(s.pid(), SIGHUP), 0);
  bool token_swapped = false, cert_swapped = false;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline && !(token_swapped && cert_swapped)) {
    auto fresh = s.Tls(c, false);  // a new connection: a new handshake
    auto fresh_stub = pb::EchoKV::NewStub(fresh);
    auto ctx = Ctx("new-token", 20);
    pb::ServerInfo info;
    const grpc::Status st = fresh_stub->GetServerInfo(ctx.get(), pb::GetServerInfoRequest(), &info);
    token_swapped = st.ok() && ServerInfo(fresh.get(), "old-token").error_code() == grpc::StatusCode::UNAUTHENTICATED;
    if (st.ok()) {
      std::vector<grpc::string_ref> pem = ctx->auth_context()->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
      cert_swapped = !pem.empty() && std::string(pem[0].data(), pem[0].size()) == new_pem;
    }
    if (!(token_swapped && cert_swapped)) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(token_swapped);
  EXPECT_TRUE(cert_swapped);
  EXPECT_THAT(s.log(), HasSubstr("SIGHUP: reloaded 1 tenant(s)"));
  // The stream started before the reload runs to its end.
  int n = 1;
  pb::GenerateResponse last;
  while (stream->Read(&msg)) {
    ++n;
    last = msg;
  }
  const grpc::Status done = stream->Finish();
  EXPECT_TRUE(done.ok()) << done.error_message();
  EXPECT_TRUE(last.has_final());
  EXPECT_EQ(last.final().generated_tokens(), 400);
  // A broken tokens file on SIGHUP keeps the current tenants.
  WriteFileOrDie(dir + "/tokens", "garbage\n");
  ASSERT_EQ(kill(s.pid(), SIGHUP), 0);
  for (int i = 0; i < 100 && s.log().find("tokens file not reloaded") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_THAT(s.log(), HasSubstr("tokens file not reloaded"));
  EXPECT_TRUE(ServerInfo(s.Tls(c, false).get(), "new-token").ok());
}

// ---------------------------------------------------------------------------------
// Edge validation: raw bytes through a generic stub.

grpc::Status RawCall(grpc::Channel* ch, const std::string& method, const std::string& bytes,
                     const std::string& token) {
  grpc::GenericStub stub(std::shared_ptr<grpc::Channel>(ch, [](grpc::Channel*) {}));
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer req(&slice, 1), resp;
  std::promise<grpc::Status> done;
  const std::string path = method.front() == '/' ? method : "/echokv.v1.EchoKV/" + method;
  stub.UnaryCall(&ctx, path, grpc::StubOptions(), &req, &resp,
                 [&](grpc::Status s) { done.set_value(s); });
  return done.get_future().get();
}

TEST(EdgeTest, InvalidUtf8GarbageLongIdsAndOversizeGetOurCodes) {
  Server s({"--insecure"});
  ECHOKV_REQUIRE_SERVER(s);
  auto ch = s.Plain();
  // input.text (field 1 of CreateSessionRequest, Input.text field 1) = "ok\xc3\x28".
  const std::string bad_text = std::string("\x0a\x06\x0a\x04ok\xc3\x28", 8);
  grpc::Status st = RawCall(ch.get(), "CreateSession", bad_text);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("input.text: not valid UTF-8"));
  // session_id = "\xff\xfe" in GetSession.
  st = RawCall(ch.get(), "GetSession", std::string("\x0a\x02\xff\xfe", 4));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("session_id: not valid UTF-8"));
  // A chat message's content in Compress.
  // input.chat.messages[0].content = "\x80" in Compress.
  st = RawCall(ch.get(), "Compress", std::string("\x0a\x07\x1a\x05\x0a\x03\x12\x01\x80", 9));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("input.chat.messages[0].content: not valid UTF-8"));
  // Garbage bytes.
  st = RawCall(ch.get(), "Generate", std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("is not a valid echokv.v1.GenerateRequest message"));
  // Ids that break the grammar, 10 KB and 3 MB: INVALID_ARGUMENT with a short message.
  auto stub = pb::EchoKV::NewStub(ch);
  for (size_t len : {size_t{10} << 10, size_t{3} << 20}) {
    auto ctx = Ctx("");
    pb::GetSessionRequest r;
    r.set_session_id(std::string(len, 'x'));
    pb::Session out;
    st = stub->GetSession(ctx.get(), r, &out);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << len;
    EXPECT_LT(st.error_message().size(), 200u);
    EXPECT_THAT(st.error_message(), HasSubstr("malformed"));
  }
  // Over the receive limit (max_request_bytes + 64 KiB): gRPC refuses it itself.
  {
    auto ctx = Ctx("");
    pb::CompressRequest big;
    big.mutable_input()->set_text(std::string(6 << 20, 'a'));
    pb::CompressResponse out;
    st = stub->Compress(ctx.get(), big, &out);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  }
  // All counted.
  const std::string metrics = s.Metrics();
  EXPECT_THAT(metrics, HasSubstr("echokv_requests_total{code=\"INVALID_ARGUMENT\",method=\"CreateSession\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("echokv_requests_total{code=\"INVALID_ARGUMENT\",method=\"GetSession\"} 3"));
  EXPECT_THAT(metrics, HasSubstr("echokv_requests_total{code=\"INVALID_ARGUMENT\",method=\"Generate\"} 1"));
}

// ---------------------------------------------------------------------------------
// No request can stall the engine: a 4 MB text (just under max_request_bytes) sent
// while 8 streams run is refused without freezing them, and memory comes back.

TEST(NoStallTest, FourMegabyteTextWhileEightStreamsRun) {
  Server s({"--insecure", "--max-new-tokens", "4096"});
  ECHOKV_REQUIRE_SERVER(s);
  auto ch = s.Plain();
  auto stub = pb::EchoKV::NewStub(ch);
  std::vector<std::string> ids(8);
  for (auto& id : ids) ASSERT_TRUE(CreateSession(stub.get(), "", kStory, &id).ok());
  const int64_t rss_before = s.RssBytes();

  std::atomic<bool> big_done{false};
  Clock::time_point big_start, big_end;
  std::vector<std::vector<Clock::time_point>> arrivals(8);
  std::vector<grpc::Status> results(8);
  std::vector<std::thread> streams;
  std::atomic<int> started{0};
  for (int i = 0; i < 8; ++i) {
    streams.emplace_back([&, i] {
      // Generations of 400 tokens (the model's context is 512) one after another, until
      // the big request is over and 200 more tokens came.
      int after = 0;
      bool counted = false;
      while (after < 200) {
        auto ctx = Ctx("", 300);
        pb::GenerateRequest req;
        req.set_session_id(ids[i]);
        req.set_max_tokens(400);
        req.set_ignore_eos(true);
        auto reader = stub->Generate(ctx.get(), req);
        pb::GenerateResponse msg;
        while (reader->Read(&msg)) {
          arrivals[i].push_back(Clock::now());
          if (!counted) {
            counted = true;
            ++started;
          }
          if (big_done.load()) ++after;
        }
        results[i] = reader->Finish();
        if (!results[i].ok()) {
          if (!counted) ++started;  // never block the main thread
          return;
        }
      }
    });
  }
  while (started.load() < 8) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the streams settle
  grpc::Status big_status;
  std::string text;
  while (text.size() < 4000000) text += "Once upon a time there was a little dog who liked to run. ";
  text.resize(4000000);
  {
    auto ctx = Ctx("", 120);
    pb::CreateSessionRequest req;
    req.mutable_input()->set_text(text);
    big_start = Clock::now();
    auto reader = stub->CreateSession(ctx.get(), req);
    pb::SessionProgress m;
    while (reader->Read(&m)) {
    }
    big_status = reader->Finish();
    big_end = Clock::now();
  }
  big_done = true;
  for (auto& t : streams) t.join();
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(results[i].ok()) << "stream " << i << ": " << results[i].error_message();
  EXPECT_EQ(big_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(big_status.error_message(), HasSubstr("exceed max_context_tokens"));

  // Each stream's gaps during the big request stay within a generous factor of its own
  // median gap (the unfixed server froze every stream for 7-17 s).
  for (int i = 0; i < 8; ++i) {
    const auto& t = arrivals[i];
    ASSERT_GT(t.size(), 50u) << "stream " << i;
    std::vector<double> gaps;
    for (size_t k = 1; k < t.size(); ++k) gaps.push_back(std::chrono::duration<double>(t[k] - t[k - 1]).count());
    std::vector<double> sorted = gaps;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    const double median = sorted[sorted.size() / 2];
    double worst = 0;
    for (size_t k = 1; k < t.size(); ++k) {
      if (t[k] >= big_start && t[k - 1] <= big_end) worst = std::max(worst, gaps[k - 1]);
    }
    const double bound = std::max(100 * median, 1.5);
    EXPECT_LT(worst, bound) << "stream " << i << ": median gap " << median << " s";
  }
  // Memory returns: the refused text leaves no lasting growth (the unfixed server kept
  // +884 MiB).
  const int64_t rss_after = s.RssBytes();
#if defined(__SANITIZE_ADDRESS__)
  // Under ASan (scripts/test.sh --sanitize) freed blocks wait in the allocator's
  // quarantine (256 MiB by default) instead of going back: the server measured +241 MiB
  // there. The unfixed server's +884 MiB still fails this bound.
  constexpr int64_t kAllocatorSlack = int64_t{256} << 20;
#else
  constexpr int64_t kAllocatorSlack = 0;
#endif
  EXPECT_LT(rss_after - rss_before, (int64_t{128} << 20) + kAllocatorSlack) << rss_before << " -> " << rss_after;
}

}  // namespace
}  // namespace echokv::server
