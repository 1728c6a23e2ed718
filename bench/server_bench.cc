// echokv-bench-server: N concurrent streaming clients against one echokv-server.
// Starts the server binary itself (on stories260K from $ECHOKV_TEST_DATA or --model),
// then for each N in --clients creates N sessions and streams N Generate calls at
// once, --rounds times (from one client thread and completion queue; --client_threads:
// one blocking thread per stream): aggregate tokens/s (all tokens / wall time of the round),
// p50/p99 time to first token (client side, from the Generate call to the first token;
// the sessions exist already, so this excludes prefill and compression) and
// inter-token latency (gap between streamed messages, shared by the ids in a message).
// Then, --rounds times, N clients at once each call CreateSession (prefill +
// compression) and then Generate: the TTFT from the CreateSession call to the first
// generated token, what a new conversation waits. Also the KV memory of one session
// with the policy vs the `full` policy (from GetSession / InspectCache figures).
// With --llama_server and --llama_model (the same weights as GGUF), llama.cpp's
// llama-server gets the same load in the same run, one server per level
// (--parallel N --cont-batching), streamed from its HTTP /completion endpoint with the
// same prompt ids and cache_prompt off: new requests on both sides, the prompt's prefill
// included (bench/llama_server_peer.h).
//
//   build/bin/echokv-bench-server                                    # stories260K
//   build/bin/echokv-bench-server --model DIR --clients 1,4,16 --max_tokens 64
//   build/bin/echokv-bench-server --model DIR --policy full --prompt_tokens 256 --server_threads 2
//       --llama_server PEER/build/bin/llama-server --llama_model PEER/models/m.gguf --llama_threads 2
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/barrier.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/llama_server_peer.h"
#include "client/cli_util.h"
#include "proto/echokv/v1/echokv.grpc.pb.h"

ABSL_FLAG(std::string, server_binary, "",
          "echokv-server to start; default: the one next to this binary");
ABSL_FLAG(std::string, model, "",
          "Model directory; default $ECHOKV_TEST_DATA/models/stories260K");
ABSL_FLAG(std::string, clients, "1,4,16", "Concurrent streaming clients, comma separated");
ABSL_FLAG(bool, client_threads, false,
          "Sessions created beforehand: one blocking client thread per stream (the bench before issue 14) "
          "instead of one thread reading every stream from a completion queue");
ABSL_FLAG(int, rounds, 3, "Generations per client per concurrency level");
ABSL_FLAG(int, max_tokens, 64, "Tokens per generation (EOS ignored)");
ABSL_FLAG(std::string, policy, "echokv", "Compression policy of the sessions");
ABSL_FLAG(int, budget, 64, "Budget B of the sessions");
ABSL_FLAG(int, lookahead, 8, "Lookahead T (laq, echokv)");
ABSL_FLAG(int, prompt_repeat, 4, "Times the built-in story paragraph is repeated as context");
ABSL_FLAG(int, server_threads, 0, "--threads of the server (0 = its default)");
ABSL_FLAG(int, prompt_tokens, 0,
          "> 0: the context is these many token ids (BOS, then (i * 7919 + 13) % 512: valid in any vocabulary of "
          ">= 512) instead of the story text; required with --llama_server, which is sent the same ids");
ABSL_FLAG(std::string, llama_server, "", "llama.cpp's llama-server binary: measure it beside echokv (optional)");
ABSL_FLAG(std::string, llama_model, "", "GGUF file of the same weights for --llama_server");
ABSL_FLAG(int, llama_threads, 2, "-t/-tb of llama-server");
ABSL_FLAG(int, llama_ctx_per_slot, 0,
          "context cells per llama-server slot (-c is this times N); 0 = prompt + max_tokens, rounded up to 256");

namespace echokv::bench {
namespace {

namespace v1 = ::echokv::v1;
using Clock = std::chrono::steady_clock;

constexpr char kStory[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park with her friends. One day she found a small red ball under a big tree, and she "
    "wanted to share it with everyone she knew. ";

// The started server: pid and the gRPC port it bound.
struct ServerProcess {
  pid_t pid = -1;
  int port = 0;
  std::string log_path;
};

std::string ExeDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

absl::StatusOr<ServerProcess> StartServer(const std::string& binary, const std::string& model,
                                          const std::string& dir, int threads, int streams) {
  ServerProcess server;
  const std::string port_file = dir + "/ports";
  server.log_path = dir + "/server.log";
  std::vector<std::string> args = {binary,
                                   "--model=" + model,
                                   "--insecure",  // loopback benchmark: no tokens
                                   "--host=127.0.0.1",
                                   "--port=0",
                                   "--metrics_port=-1",
                                   "--port_file=" + port_file,
                                   absl::StrCat("--max_concurrent_streams=", streams),
                                   absl::StrCat("--max_sessions=", 4 * streams + 16)};
  if (threads > 0) args.push_back(absl::StrCat("--threads=", threads));
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, server.log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  const int rc = posix_spawn(&server.pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", binary, ": ", std::strerror(rc)));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(server.pid, &status, WNOHANG) == server.pid) {
      return absl::InternalError(
          absl::StrCat("echokv-server exited before listening; see ", server.log_path));
    }
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) {
      server.port = port;
      return server;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  kill(server.pid, SIGKILL);
  waitpid(server.pid, nullptr, 0);
  return absl::DeadlineExceededError("echokv-server wrote no port file within 120 s");
}

int StopServer(const ServerProcess& server) {
  kill(server.pid, SIGTERM);
  int status = 0;
  waitpid(server.pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return std::nan("");
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * (values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(values.size() - 1, lo + 1);
  return values[lo] + (rank - lo) * (values[hi] - values[lo]);
}

absl::StatusOr<v1::Session> CreateSession(v1::EchoKV::Stub& stub, const v1::Input& input,
                                          const std::string& policy, int budget, int lookahead) {
  v1::CreateSessionRequest request;
  *request.mutable_input() = input;
  request.mutable_compression()->set_policy(policy);
  request.mutable_compression()->set_budget(budget);
  if (policy == "echokv" || policy == "laq") request.mutable_compression()->set_lookahead(lookahead);
  grpc::ClientContext context;
  auto reader = stub.CreateSession(&context, request);
  v1::SessionProgress message;
  std::optional<v1::Session> session;
  while (reader->Read(&message)) {
    if (message.has_session()) session = message.session();
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return client::FromGrpcStatus(status);
  if (!session.has_value()) return absl::InternalError("CreateSession sent no Session");
  return *session;
}

void DeleteSession(v1::EchoKV::Stub& stub, const std::string& id) {
  grpc::ClientContext context;
  v1::DeleteSessionRequest request;
  request.set_session_id(id);
  v1::DeleteSessionResponse response;
  stub.DeleteSession(&context, request, &response).IgnoreError();
}

// What one streamed generation measured (client side).
struct StreamResult {
  absl::Status status;
  int tokens = 0;
  double ttft_s = 0;                   // origin (the Generate call unless given) -> first token
  std::vector<double> inter_token_s;   // gaps between successive tokens
};

// One received message: its ids' share of the gap since the previous message (or the
// TTFT when it is the first with ids). Shared by the sync and the async readers.
void Record(const v1::GenerateResponse& message, Clock::time_point now, Clock::time_point* last,
            std::optional<Clock::time_point> origin, StreamResult* result) {
  const int n = message.token_ids_size();
  if (n == 0) return;
  const double gap = std::chrono::duration<double>(now - *last).count();
  // A message may carry several ids (the server holds back incomplete UTF-8 and merges
  // the deltas queued behind a write in flight): the gap is shared evenly by its ids, so
  // every token contributes one sample.
  if (result->tokens == 0) {
    result->ttft_s = origin.has_value() ? std::chrono::duration<double>(now - *origin).count() : gap;
    for (int i = 1; i < n; ++i) result->inter_token_s.push_back(0.0);
  } else {
    for (int i = 0; i < n; ++i) result->inter_token_s.push_back(gap / n);
  }
  result->tokens += n;
  *last = now;
}

v1::GenerateRequest BenchRequest(const std::string& session_id, int max_tokens) {
  v1::GenerateRequest request;
  request.set_session_id(session_id);
  request.set_max_tokens(max_tokens);
  request.set_ignore_eos(true);
  return request;
}

// Streams one Generate per session at once from this one thread (one completion queue,
// async reads): the measurement is the same as StreamOnce's (client-side time of each
// streamed message, tokens counted from the messages), without one blocked client
// thread per stream, whose wakeups competed with the server for the same cores.
std::vector<StreamResult> StreamAllAsync(v1::EchoKV::Stub& stub, const std::vector<std::string>& session_ids,
                                         int max_tokens) {
  struct Call {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientAsyncReader<v1::GenerateResponse>> reader;
    v1::GenerateResponse message;
    grpc::Status status;
    Clock::time_point last;
    enum class State { kStarting, kReading, kFinishing } state = State::kStarting;
    StreamResult result;
  };
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<Call>> calls;
  for (const std::string& id : session_ids) {
    auto call = std::make_unique<Call>();
    call->reader = stub.PrepareAsyncGenerate(&call->context, BenchRequest(id, max_tokens), &cq);
    calls.push_back(std::move(call));
  }
  for (auto& call : calls) {
    call->last = Clock::now();            // the Generate call: origin of the TTFT
    call->reader->StartCall(call.get());  // its completion starts the first Read
  }
  size_t open = calls.size();
  void* tag = nullptr;
  bool ok = false;
  while (open > 0 && cq.Next(&tag, &ok)) {
    Call* call = static_cast<Call*>(tag);
    switch (call->state) {
      case Call::State::kFinishing:
        call->result.status = client::FromGrpcStatus(call->status);
        --open;
        continue;
      case Call::State::kStarting:
        call->state = Call::State::kReading;
        break;
      case Call::State::kReading:
        if (ok) Record(call->message, Clock::now(), &call->last, std::nullopt, &call->result);
        break;
    }
    if (ok) {
      call->reader->Read(&call->message, call);
    } else {  // the stream ended (or never started): its status says which
      call->state = Call::State::kFinishing;
      call->reader->Finish(&call->status, call);
    }
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  std::vector<StreamResult> results;
  for (auto& call : calls) results.push_back(std::move(call->result));
  return results;
}

StreamResult StreamOnce(v1::EchoKV::Stub& stub, const std::string& session_id, int max_tokens,
                        std::optional<Clock::time_point> origin = std::nullopt) {
  StreamResult result;
  grpc::ClientContext context;
  const Clock::time_point start = Clock::now();
  auto reader = stub.Generate(&context, BenchRequest(session_id, max_tokens));
  v1::GenerateResponse message;
  Clock::time_point last = start;
  while (reader->Read(&message)) Record(message, Clock::now(), &last, origin, &result);
  result.status = client::FromGrpcStatus(reader->Finish());
  return result;
}

// A new conversation: CreateSession (prefill + compression), then Generate; the TTFT
// runs from the CreateSession call to the first generated token.
struct ColdResult {
  StreamResult stream;
  double create_s = 0;  // CreateSession call -> its stream finished (session ready)
  std::string session_id;
};

ColdResult CreateAndStreamOnce(v1::EchoKV::Stub& stub, const v1::Input& text, const std::string& policy,
                               int budget, int lookahead, int max_tokens) {
  ColdResult result;
  const Clock::time_point start = Clock::now();
  absl::StatusOr<v1::Session> session = CreateSession(stub, text, policy, budget, lookahead);
  result.create_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (!session.ok()) {
    result.stream.status = session.status();
    return result;
  }
  result.session_id = session->id();
  result.stream = StreamOnce(stub, session->id(), max_tokens, start);
  return result;
}

int Run() {
  const char* data = std::getenv("ECHOKV_TEST_DATA");
  std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) {
    if (data == nullptr || *data == '\0') {
      std::fprintf(stderr, "echokv-bench-server: give --model or set $ECHOKV_TEST_DATA\n");
      return 2;
    }
    model = absl::StrCat(data, "/models/stories260K");
  }
  std::string binary = absl::GetFlag(FLAGS_server_binary);
  if (binary.empty()) binary = ExeDir() + "/echokv-server";
  std::vector<int> levels;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_clients), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1 || n > 256) {
      std::fprintf(stderr, "echokv-bench-server: --clients entry '%s' is not in 1..256\n",
                   std::string(part).c_str());
      return 2;
    }
    levels.push_back(n);
  }
  const int max_level = *std::max_element(levels.begin(), levels.end());
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  const std::string policy = absl::GetFlag(FLAGS_policy);
  const int budget = absl::GetFlag(FLAGS_budget);
  const int lookahead = absl::GetFlag(FLAGS_lookahead);
  v1::Input text;  // the context every session starts from
  std::vector<int> prompt_ids;
  if (absl::GetFlag(FLAGS_prompt_tokens) > 0) {
    for (int i = 0; i < absl::GetFlag(FLAGS_prompt_tokens); ++i) prompt_ids.push_back(i == 0 ? 1 : (i * 7919 + 13) % 512);
    for (int id : prompt_ids) text.mutable_tokens()->add_ids(id);
  } else {
    for (int i = 0; i < absl::GetFlag(FLAGS_prompt_repeat); ++i) text.mutable_text()->append(kStory);
  }
  const std::string llama_server = absl::GetFlag(FLAGS_llama_server);
  if (!llama_server.empty() && (prompt_ids.empty() || absl::GetFlag(FLAGS_llama_model).empty())) {
    std::fprintf(stderr, "echokv-bench-server: --llama_server needs --llama_model and --prompt_tokens > 0\n");
    return 2;
  }

  char dir_template[] = "/tmp/echokv-bench-server.XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  absl::StatusOr<ServerProcess> server =
      // Twice the largest level: a finished stream's slot is released when its handler
      // ends, which on a loaded machine can lag the client's next round by a moment.
      StartServer(binary, model, dir_template, absl::GetFlag(FLAGS_server_threads), 2 * max_level + 4);
  if (!server.ok()) {
    std::fprintf(stderr, "echokv-bench-server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server->port),
                                           grpc::InsecureChannelCredentials(), channel_args);
  auto stub = v1::EchoKV::NewStub(channel);
  int exit_code = 0;
  auto fail = [&](const absl::Status& s) {
    std::fprintf(stderr, "echokv-bench-server: %s (server log: %s)\n",
                 client::DescribeStatus(s).c_str(), server->log_path.c_str());
    exit_code = 1;
  };

  do {
    absl::StatusOr<std::string> health = client::CheckHealth(channel, "", absl::Seconds(30));
    if (!health.ok() || *health != "SERVING") {
      fail(health.ok() ? absl::UnavailableError(*health) : health.status());
      break;
    }
    // ---- memory per session, with and without compression ----
    absl::StatusOr<v1::Session> full = CreateSession(*stub, text, "full", budget, lookahead);
    absl::StatusOr<v1::Session> compressed = CreateSession(*stub, text, policy, budget, lookahead);
    if (!full.ok() || !compressed.ok()) {
      fail(full.ok() ? compressed.status() : full.status());
      break;
    }
    v1::InspectCacheResponse inspect;
    {
      grpc::ClientContext context;
      v1::InspectCacheRequest request;
      request.set_session_id(compressed->id());
      grpc::Status s = stub->InspectCache(&context, request, &inspect);
      if (!s.ok()) {
        fail(client::FromGrpcStatus(s));
        break;
      }
    }
    std::printf("model %s, context %lld tokens, policy %s, budget %d, %d tokens per generation\n\n",
                model.c_str(), static_cast<long long>(full->tokens_seen()), policy.c_str(), budget,
                max_tokens);
    std::printf("| session memory | KV bytes retained | entries |\n|---|---:|---:|\n");
    std::printf("| full (no compression) | %s | %lld |\n",
                client::FormatBytes(full->retained_kv_bytes()).c_str(),
                static_cast<long long>(full->retained_entries()));
    std::printf("| %s, B = %d | %s (%.1f%% of full; InspectCache total %s) | %lld |\n\n",
                policy.c_str(), budget,
                client::FormatBytes(compressed->retained_kv_bytes()).c_str(),
                100.0 * compressed->retained_kv_bytes() / std::max<int64_t>(1, full->retained_kv_bytes()),
                client::FormatBytes(inspect.total_kv_bytes()).c_str(),
                static_cast<long long>(compressed->retained_entries()));
    DeleteSession(*stub, full->id());
    DeleteSession(*stub, compressed->id());

    // ---- concurrency levels ----
    std::printf("Sessions created beforehand: TTFT = Generate call -> first token (excludes prefill and "
                "compression).\n\n");
    std::printf("| clients | tokens/s (aggregate) | TTFT p50 | TTFT p99 | inter-token p50 | inter-token p99 |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|\n");
    std::string cold_table, peer_table;
    for (int n : levels) {
      std::vector<std::string> ids;
      for (int i = 0; i < n && exit_code == 0; ++i) {
        absl::StatusOr<v1::Session> s = CreateSession(*stub, text, policy, budget, lookahead);
        if (!s.ok()) {
          fail(s.status());
        } else {
          ids.push_back(s->id());
        }
      }
      if (exit_code != 0) break;
      std::vector<double> ttft, itl;
      int64_t tokens = 0;
      double wall_s = 0;
      for (int round = 0; round < rounds && exit_code == 0; ++round) {
        std::vector<StreamResult> results(n);
        Clock::time_point start;
        if (absl::GetFlag(FLAGS_client_threads)) {
          absl::Barrier* barrier = new absl::Barrier(n + 1);  // deleted by the last Block()
          std::vector<std::thread> threads;
          for (int i = 0; i < n; ++i) {
            threads.emplace_back([&, i] {
              if (barrier->Block()) delete barrier;
              results[i] = StreamOnce(*stub, ids[i], max_tokens);
            });
          }
          start = Clock::now();
          if (barrier->Block()) delete barrier;
          for (std::thread& t : threads) t.join();
        } else {
          start = Clock::now();
          results = StreamAllAsync(*stub, ids, max_tokens);
        }
        wall_s += std::chrono::duration<double>(Clock::now() - start).count();
        for (const StreamResult& r : results) {
          if (!r.status.ok()) {
            fail(r.status);
            break;
          }
          tokens += r.tokens;
          ttft.push_back(r.ttft_s);
          itl.insert(itl.end(), r.inter_token_s.begin(), r.inter_token_s.end());
        }
      }
      for (const std::string& id : ids) DeleteSession(*stub, id);
      if (exit_code != 0) break;
      std::printf("| %d | %.1f | %.2f ms | %.2f ms | %.3f ms | %.3f ms |\n", n, tokens / wall_s,
                  1e3 * Percentile(ttft, 50), 1e3 * Percentile(ttft, 99), 1e3 * Percentile(itl, 50),
                  1e3 * Percentile(itl, 99));
      std::fflush(stdout);

      // New conversations: N clients at once create their session and generate.
      std::vector<double> cold_ttft, create, cold_itl;
      int64_t cold_tokens = 0;
      double cold_wall_s = 0;
      for (int round = 0; round < rounds && exit_code == 0; ++round) {
        std::vector<ColdResult> results(n);
        absl::Barrier* barrier = new absl::Barrier(n + 1);  // deleted by the last Block()
        std::vector<std::thread> threads;
        for (int i = 0; i < n; ++i) {
          threads.emplace_back([&, i] {
            if (barrier->Block()) delete barrier;
            results[i] = CreateAndStreamOnce(*stub, text, policy, budget, lookahead, max_tokens);
          });
        }
        const Clock::time_point start = Clock::now();
        if (barrier->Block()) delete barrier;
        for (std::thread& t : threads) t.join();
        cold_wall_s += std::chrono::duration<double>(Clock::now() - start).count();
        for (const ColdResult& r : results) {
          if (!r.session_id.empty()) DeleteSession(*stub, r.session_id);
          if (!r.stream.status.ok()) {
            if (exit_code == 0) fail(r.stream.status);
            continue;
          }
          cold_ttft.push_back(r.stream.ttft_s);
          create.push_back(r.create_s);
          cold_tokens += r.stream.tokens;
          cold_itl.insert(cold_itl.end(), r.stream.inter_token_s.begin(), r.stream.inter_token_s.end());
        }
      }
      if (exit_code != 0) break;
      absl::StrAppendFormat(&cold_table, "| %d | %.1f | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %.3f ms | %.3f ms |\n",
                            n, cold_tokens / cold_wall_s, 1e3 * Percentile(cold_ttft, 50),
                            1e3 * Percentile(cold_ttft, 99), 1e3 * Percentile(create, 50),
                            1e3 * Percentile(create, 99), 1e3 * Percentile(cold_itl, 50),
                            1e3 * Percentile(cold_itl, 99));
      if (llama_server.empty()) continue;

      // The peer under the same load: N clients at once send the same prompt ids.
      LlamaServerOptions peer_options;
      peer_options.binary = llama_server;
      peer_options.gguf = absl::GetFlag(FLAGS_llama_model);
      peer_options.parallel = n;
      peer_options.threads = absl::GetFlag(FLAGS_llama_threads);
      peer_options.ctx_per_slot = absl::GetFlag(FLAGS_llama_ctx_per_slot) > 0
                                      ? absl::GetFlag(FLAGS_llama_ctx_per_slot)
                                      : (static_cast<int>(prompt_ids.size()) + max_tokens + 255) / 256 * 256;
      absl::StatusOr<LlamaServer> peer = StartLlamaServer(peer_options, dir_template);
      if (!peer.ok()) {
        fail(peer.status());
        break;
      }
      std::vector<double> peer_ttft, peer_itl;
      int64_t peer_tokens = 0;
      double peer_wall_s = 0;
      for (int round = 0; round < rounds && exit_code == 0; ++round) {
        std::vector<PeerStream> results(n);
        absl::Barrier* barrier = new absl::Barrier(n + 1);  // deleted by the last Block()
        std::vector<std::thread> threads;
        for (int i = 0; i < n; ++i) {
          threads.emplace_back([&, i] {
            if (barrier->Block()) delete barrier;
            results[i] = StreamLlamaCompletion(peer->port, prompt_ids, max_tokens, Clock::now());
          });
        }
        const Clock::time_point start = Clock::now();
        if (barrier->Block()) delete barrier;
        for (std::thread& t : threads) t.join();
        peer_wall_s += std::chrono::duration<double>(Clock::now() - start).count();
        for (const PeerStream& r : results) {
          if (!r.status.ok()) {
            if (exit_code == 0) fail(absl::Status(r.status.code(), absl::StrCat(r.status.message(), " (llama-server log: ",
                                                                               peer->log_path, ")")));
            continue;
          }
          peer_tokens += r.tokens;
          peer_ttft.push_back(r.ttft_s);
          peer_itl.insert(peer_itl.end(), r.inter_token_s.begin(), r.inter_token_s.end());
        }
      }
      // At the pinned llama.cpp commit llama-server aborts in its own SIGTERM cleanup
      // ("terminate called without an active exception", 128 + SIGABRT) after serving
      // everything: not a failure of the measurement.
      if (const int peer_rc = StopLlamaServer(*peer); peer_rc != 0 && peer_rc != 128 + SIGTERM &&
                                                      peer_rc != 128 + SIGABRT) {
        std::fprintf(stderr, "echokv-bench-server: llama-server exited with %d (log %s)\n", peer_rc,
                     peer->log_path.c_str());
      }
      if (exit_code != 0) break;
      const double echokv_tps = cold_tokens / cold_wall_s, peer_tps = peer_tokens / peer_wall_s;
      absl::StrAppendFormat(&peer_table,
                            "| %d | %.1f | %.1f | %.2fx | %.2f / %.2f ms | %.2f / %.2f ms | %.3f / %.3f ms | "
                            "%.3f / %.3f ms |\n",
                            n, echokv_tps, peer_tps, echokv_tps / peer_tps, 1e3 * Percentile(cold_ttft, 50),
                            1e3 * Percentile(cold_ttft, 99), 1e3 * Percentile(peer_ttft, 50),
                            1e3 * Percentile(peer_ttft, 99), 1e3 * Percentile(cold_itl, 50),
                            1e3 * Percentile(cold_itl, 99), 1e3 * Percentile(peer_itl, 50),
                            1e3 * Percentile(peer_itl, 99));
      std::fprintf(stderr, "level %d done (echokv %.1f tok/s, llama-server %.1f tok/s)\n", n, echokv_tps, peer_tps);
    }
    if (exit_code == 0) {
      std::printf("\nNew sessions: N clients at once call CreateSession (prefill + %s compression) then "
                  "Generate; TTFT = CreateSession call -> first generated token.\n\n",
                  policy.c_str());
      std::printf("| clients | tokens/s (aggregate, prefill included) | TTFT incl. CreateSession p50 | p99 | "
                  "CreateSession alone p50 | p99 | inter-token p50 | inter-token p99 |\n");
      std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n%s", cold_table.c_str());
    }
    if (exit_code == 0 && !peer_table.empty()) {
      std::printf("\nSide by side with llama.cpp's llama-server (%s, -t %d, --parallel N --cont-batching): N "
                  "clients at once send a new request with the same %zu prompt ids (cache_prompt off) and stream "
                  "%d tokens (greedy, EOS ignored); echokv = the new-session rounds above (policy %s). Aggregate "
                  "tokens/s include each request's prefill; ratio = echokv / llama-server.\n\n",
                  absl::GetFlag(FLAGS_llama_model).c_str(), absl::GetFlag(FLAGS_llama_threads), prompt_ids.size(),
                  max_tokens, policy.c_str());
      std::printf("| clients | echokv tok/s | llama-server tok/s | ratio | echokv TTFT p50 / p99 | llama-server TTFT "
                  "p50 / p99 | echokv inter-token p50 / p99 | llama-server inter-token p50 / p99 |\n");
      std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n%s", peer_table.c_str());
    }
  } while (false);

  const int server_rc = StopServer(*server);
  if (server_rc != 0) {
    std::fprintf(stderr, "echokv-bench-server: echokv-server exited with %d after SIGTERM\n",
                 server_rc);
    exit_code = 1;
  }
  if (exit_code == 0) {  // keep the server log for a failed run
    std::remove((std::string(dir_template) + "/ports").c_str());
    std::remove(server->log_path.c_str());
    rmdir(dir_template);
  }
  return exit_code;
}

}  // namespace
}  // namespace echokv::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "echokv-bench-server [--model DIR] [--clients 1,4,16] [--max_tokens 64] [--rounds 3]");
  absl::ParseCommandLine(argc, argv);
  return echokv::bench::Run();
}
