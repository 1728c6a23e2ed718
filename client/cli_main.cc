// echokv-cli: a command-line client of echokv-server (synchronous gRPC API).
//
//   echokv-cli --server localhost:50051 info
//   echokv-cli create --file story.txt --policy echokv --budget 64      # progress on stderr
//   echokv-cli generate SESSION --max-tokens 64                         # streams to stdout
//   echokv-cli inspect SESSION --positions
//   echokv-cli --token_file ~/.echokv-token --tls_ca ca.pem --server echokv:50051 list
//   echokv-cli --server localhost:50051 --tls_ca ca.pem --tls_server_name echokv.ns.svc health
//   echokv-cli drain --pod echokv-2 --replicas 2 --peer '{pod}.echokv-headless.ns.svc.cluster.local:50051'
//
// Exit status: 0 on success, 1 when the server returns an error (printed as
// "CODE: message"), 2 for a usage error. `health` exits 0 only when SERVING.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/arg_parser.h"
#include "client/cli_util.h"
#include "client/drain.h"
#include "proto/echokv/v1/echokv.grpc.pb.h"

namespace echokv::client {
namespace {

namespace v1 = ::echokv::v1;

constexpr int kExitOk = 0;
constexpr int kExitRpcError = 1;
constexpr int kExitUsage = 2;
constexpr char kDefaultServer[] = "localhost:50051";

// Everything a subcommand needs besides its own flags.
struct Globals {
  std::optional<std::string> server;  // HOST:PORT
  std::optional<double> timeout;      // seconds; per call deadline
  CredentialFlags credential_flags;   // --token, --token_file, --tls_*
  Credentials credentials;            // loaded from credential_flags by ParseOrFail
};

// The global flags, accepted before the command and among its flags.
void AddGlobalFlags(ArgParser& parser, Globals& globals) {
  parser.AddString("server", &globals.server, "HOST:PORT of echokv-server");
  parser.AddDouble("timeout", &globals.timeout, "deadline of each call, seconds");
  parser.AddString("token", &globals.credential_flags.token,
                   "bearer token (visible in ps: prefer --token_file or $ECHOKV_TOKEN)");
  parser.AddString("token-file", &globals.credential_flags.token_file, "file holding the bearer token");
  parser.AddString("tls-ca", &globals.credential_flags.tls_ca, "PEM CA bundle: connect with TLS");
  parser.AddString("tls-cert", &globals.credential_flags.tls_cert, "PEM client certificate (mutual TLS)");
  parser.AddString("tls-key", &globals.credential_flags.tls_key, "PEM private key of --tls_cert");
  parser.AddString("tls-server-name", &globals.credential_flags.tls_server_name,
                   "name to verify in the server's certificate (default: --server's host)");
}

// A usage error (exit 2) as opposed to an error from the server (exit 1).
struct UsageError {
  std::string message;
};

class Cli {
 public:
  Cli(const Globals& globals) : globals_(globals) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);  // InspectCache with positions can be large
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (globals.credentials.tls) {
      grpc::SslCredentialsOptions o;
      o.pem_root_certs = globals.credentials.root_pem;
      o.pem_cert_chain = globals.credentials.cert_pem;
      o.pem_private_key = globals.credentials.key_pem;
      creds = grpc::SslCredentials(o);
      if (!globals.credentials.server_name.empty()) args.SetSslTargetNameOverride(globals.credentials.server_name);
    }
    channel_ = grpc::CreateCustomChannel(globals.server.value_or(kDefaultServer), creds, args);
    stub_ = v1::EchoKV::NewStub(channel_);
  }

  // Sets the --timeout deadline (if any) and the bearer token (if any) on `context`.
  void ApplyDeadline(grpc::ClientContext* context) const {
    if (!globals_.credentials.bearer.empty()) {
      context->AddMetadata("authorization", "Bearer " + globals_.credentials.bearer);
    }
    if (globals_.timeout.has_value()) {
      context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(*globals_.timeout)));
    }
  }

  // A channel to another server with the same credentials (no server name override:
  // `address`'s own host is verified).
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address) const {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (globals_.credentials.tls) {
      grpc::SslCredentialsOptions o;
      o.pem_root_certs = globals_.credentials.root_pem;
      o.pem_cert_chain = globals_.credentials.cert_pem;
      o.pem_private_key = globals_.credentials.key_pem;
      creds = grpc::SslCredentials(o);
    }
    return grpc::CreateCustomChannel(address, creds, args);
  }

  v1::EchoKV::Stub& stub() { return *stub_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  const Globals& globals() const { return globals_; }

 private:
  Globals globals_;                        // --server, --timeout
  std::shared_ptr<grpc::Channel> channel_; // to the server
  std::unique_ptr<v1::EchoKV::Stub> stub_; // on channel_
};

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "echokv-cli: %s\n", DescribeStatus(status).c_str());
  return kExitRpcError;
}
int Fail(const grpc::Status& status) { return Fail(FromGrpcStatus(status)); }

int UsageFail(const std::string& message, const ArgParser& parser) {
  std::fprintf(stderr, "echokv-cli: %s\n%s(add --help for every flag)\n", message.c_str(),
               parser.Usage().substr(0, parser.Usage().find('\n') + 1).c_str());
  return kExitUsage;
}

// Parses `args` with `parser`, which also accepts the global flags; requires exactly
// `num_positional` positional words (e.g. SESSION). Returns an exit code on failure.
std::optional<int> ParseOrFail(ArgParser& parser, Globals& globals,
                               const std::vector<std::string>& args, size_t num_positional,
                               std::vector<std::string>* positional) {
  AddGlobalFlags(parser, globals);
  std::optional<bool> help;
  parser.AddBool("help", &help, "this help");
  if (absl::Status s = parser.Parse(args, positional); !s.ok()) {
    return UsageFail(std::string(s.message()), parser);
  }
  if (help.value_or(false)) {
    std::fputs(parser.Usage().c_str(), stdout);
    return kExitOk;
  }
  absl::StatusOr<Credentials> creds = LoadCredentials(globals.credential_flags, std::getenv("ECHOKV_TOKEN"));
  if (!creds.ok()) return UsageFail(std::string(creds.status().message()), parser);
  globals.credentials = std::move(*creds);
  if (positional->size() != num_positional) {
    return UsageFail(absl::StrCat("expected ", num_positional, " argument(s), got ",
                                  positional->size(),
                                  positional->empty() ? "" : absl::StrCat(": ", absl::StrJoin(*positional, " "))),
                     parser);
  }
  return std::nullopt;
}

void AddInputFlags(ArgParser& parser, InputSpec* spec) {
  parser.AddString("text", &spec->text, "input text");
  parser.AddString("file", &spec->file, "read the input text from this file");
  parser.AddString("chat", &spec->chat_file,
                   "JSON file: [{\"role\": \"user\", \"content\": \"...\"}, ...]");
  parser.AddString("ids", &spec->ids, "token ids, comma separated: 1,2,3");
  parser.AddBool("add-special-tokens", &spec->add_special_tokens,
                 "prepend BOS to text (default: yes for create, no for append)");
}

void AddCompressionFlags(ArgParser& parser, CompressionFlags* flags) {
  parser.AddString("policy", &flags->policy,
                   "full|streamingllm|h2o|snapkv|pyramidkv|laq|echokv (default: server's)");
  parser.AddInt("budget", &flags->budget, "B: entries kept per layer and KV group");
  parser.AddInt("lookahead", &flags->lookahead, "T: lookahead tokens, even (laq, echokv)");
  parser.AddInt("workspace", &flags->workspace, "B1 >= B: EchoKV workspace");
  parser.AddInt("window", &flags->window, "w: most recent tokens always kept (echokv)");
  parser.AddString("bootstrap", &flags->bootstrap, "proposals|snapkv (echokv ablation)");
  parser.AddBool("repair", &flags->repair, "echokv repair round (--no-repair to ablate)");
  parser.AddString("cache-dtype", &flags->cache_dtype, "float32|int8: storage of the retained tier (default: server's)");
  parser.AddDouble("target-mass", &flags->target_mass,
                   "(0, 1]: keep per layer the fewest entries holding this attention mass, at most --budget (echokv, snapkv)");
}

// Drains a SessionProgress stream: progress on stderr, returns the final Session.
int ReadSessionStream(grpc::ClientReader<v1::SessionProgress>& reader, bool show_progress,
                      v1::Session* session) {
  ProgressBar bar(stderr, isatty(STDERR_FILENO) != 0);
  v1::SessionProgress message;
  bool got_session = false;
  while (reader.Read(&message)) {
    switch (message.event_case()) {
      case v1::SessionProgress::kProgress:
        if (show_progress) bar.Update(message.progress());
        break;
      case v1::SessionProgress::kSession:
        *session = message.session();
        got_session = true;
        break;
      case v1::SessionProgress::EVENT_NOT_SET:
        break;
    }
  }
  bar.Finish();
  grpc::Status status = reader.Finish();
  if (!status.ok()) return Fail(status);
  if (!got_session) {
    return Fail(absl::InternalError("the stream ended without a Session message"));
  }
  return kExitOk;
}

int PrintSession(const v1::Session& session, bool id_only) {
  if (id_only) {
    std::printf("%s\n", session.id().c_str());
  } else {
    std::fputs(FormatSession(session).c_str(), stdout);
  }
  return kExitOk;
}

// ------------------------------------------------------------------ subcommands

int RunInfo(Globals globals, const std::vector<std::string>& args) {
  ArgParser parser("info");
  std::vector<std::string> pos;
  if (auto rc = ParseOrFail(parser, globals, args, 0, &pos)) return *rc;
  Cli cli(globals);
  grpc::ClientContext context;
  cli.ApplyDeadline(&context);
  v1::ServerInfo info;
  grpc::Status status = cli.stub().GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
  if (!status.ok()) return Fail(status);
  std::fputs(FormatServerInfo(info).c_str(), stdout);
  return kExitOk;
}

int RunHealth(Globals globals, const std::vector<std::string>& args) {
  ArgParser parser("health [--service NAME]");
  std::optional<std::string> service;
  parser.AddString("service", &service, "service name (default \"\": the whole server)");
  std::vector<std::string> pos;
  if (auto rc = ParseOrFail(parser, globals, args, 0, &pos)) return *rc;
  Cli cli(globals);
  absl::StatusOr<std::string> state = CheckHealth(
      cli.channel(), service.value_or(""), absl::Seconds(globals.timeout.value_or(5.0)));
  if (!state.ok()) return Fail(state.status());
  std::printf("%s\n", state->c_str());
  return *state == "SERVING" ? kExitOk : kExitRpcError;
}

int RunCreate(Globals globals, const std::vector<std::string>& args) {
  ArgParser parser(
      "create (--text T | --file PATH | --chat FILE.json | --ids 1,2,3) [compression flags] "
      "[--ttl SECONDS] [--id-only] [--no-progress]");
  InputSpec input_spec;
  CompressionFlags compression_flags;
  std::optional<int64_t> ttl;
  std::optional<bool> id_only, progress;
  AddInputFlags(parser, &input_spec);
  AddCompressionFlags(parser, &compression_flags);
  parser.AddInt("ttl", &ttl, "idle expiry in seconds (default: server's)");
  parser.AddBool("id-only", &id_only, "print only the session id on stdout");
  parser.AddBool("progress", &progress, "progress bar on stderr (default on)");
  std::vector<std::string> pos;
  if (auto rc = ParseOrFail(parser, globals, args, 0, &pos)) return *rc;

  v1::CreateSessionRequest request;
  absl::StatusOr<v1::Input> input = BuildInput(input_spec);
  if (!input.ok()) return UsageFail(std::string(input.status().message()), parser);
  *request.mutable_input() = *std::move(input);
  absl::StatusOr<v1::CompressionConfig> compression = BuildCompression(compression_flags);
  if (!compression.ok()) return UsageFail(std::string(compression.status().message()), parser);
  *request.mutable_compression() = *std::move(compression);
  if (ttl.has_value()) request.set_ttl_seconds(*ttl);

  Cli cli(globals);
  grpc::ClientContext context;
  cli.ApplyDeadline(&context);
  std::unique_ptr<grpc::ClientReader<v1::SessionProgress>> reader =
      cli.stub().CreateSession(&context, request);
  v1::Session session;
  if (int rc = ReadSessionStream(*reader, progress.value_or(true), &session); rc != kExitOk) {
    return rc;
  }
  return PrintSession(session, id_only.value_or(false));
}

int RunAppend(Globals globals, const std::vector<std::string>& args) {
  ArgParser parser(
      "append SESSION (--text T | --file PATH | --chat FILE.json | --ids 1,2,3) [--no-progress]");
  InputSpec input_spec;
  std::optional<bool> progress;
  AddInputFlags(parser, &input_spec);
  parser.AddBool("progress", &progress, "progress bar on stderr (default on)");
  std::vector<std::string> pos;
  if (auto rc = ParseOrFail(parser, globals, args, 1, &pos)) return *rc;

  v1::AppendToSessionRequest request;
  request.set_session_id(pos[0]);
  absl::StatusOr<v1::Input> input = BuildInput(input_spec);
  if (!input.ok()) return UsageFail(std::string(input.status().message()), parser);
  *request.mutable_input() = *std::move(input);

  Cli cli(globals);
  grpc::ClientContext context;
  cli.ApplyDeadline(&context);
  std::unique_ptr<grpc::ClientReader<v1::SessionProgress>> reader =
      cli.stub().AppendToSession(&context, request);
  v1::Session session;
  if (int rc = ReadSessionStream(*reader, progress.value_or(true), &session); rc != kExitOk) {
    return rc;
  }
  return PrintSession(session, /*id_only=*/false);
}

int RunGenerate(Globals globals, const std::vector<std::string>& args) {
  ArgParser parser("generate SESSION [--max-tokens N] [sampling flags] [--stop S]... [--commit]");
  std::optional<int64_t> max_tokens, top_k, seed;
  std::optional<double> temperature, top_p;
  std::vector<std::string> stop, stop_ids;
  std::optional<bool> commit, ignore_eos, quiet;
  parser.AddInt("max-tokens", &max_tokens, "tokens to generate (default: server's)");
  parser.AddDouble("temperature", &temperature, ">= 0; 0 = greedy (default)");
  parser.AddDouble("top-p", &top_p, "nucleus sampling mass in (0, 1]");
  parser.AddInt("top-k", &top_k, "keep the k most likely tokens; 0 = no cut");
  parser.AddInt("seed", &seed, "sampling seed (default 0)");
  parser.AddStringList("stop", &stop, "stop string (repeatable; not printed)");
  parser.AddStringList("stop-token-ids", &stop_ids, "extra stop token ids: 1,2");
  parser.AddBool("ignore-eos", &ignore_eos, "keep going past EOS");
  parser.AddBool("commit", &commit, "append the generated tokens to the session");
  parser.AddBool("quiet", &quiet, "no statistics on stderr");
  std::vector<std::string> pos;
  if (auto rc = ParseOrFail(parser, globals, args, 1, &pos)) return *rc;

  v1::GenerateRequest request;
  request.set_session_id(pos[0]);
  if (max_tokens.has_value()) {
    if (*max_tokens < INT32_MIN || *max_tokens > INT32_MAX) {
      return UsageFail("--max-tokens does not fit a 32-bit integer", parser);
    }
    request.set_max_tokens(static_cast<int32_t>(*max_tokens));
  }
  v1::SamplingParams* sampling = request.mutable_sampling();
  if (temperature.has_value()) sampling->set_temperature(static_cast<float>(*temperature));
  if (top_p.has_value()) sampling->set_top_p(static_cast<float>(*top_p));
  if (top_k.has_value()) {
    if (*top_k < INT32_MIN || *top_k > INT32_MAX) {
      return UsageFail("--top-k does not fit a 32-bit integer", parser);
    }
    sampling->set_top_k(static_cast<int32_t>(*top_k));
  }
  if (seed.has_value()) {
    if (*seed < 0) return UsageFail("--seed must be >= 0", parser);
    sampling->set_seed(static_cast<uint64_t>(*seed));
  }
  for (const std::string& s : stop) request.add_stop(s);
  for (const std::string& list : stop_ids) {
    absl::StatusOr<std::vector<int32_t>> ids = ParseIdList(list);
    if (!ids.ok()) {
      return UsageFail(absl::StrCat("--stop-token-ids: ", ids.status().message()), parser);
    }
    for (int32_t id : *ids) request.add_stop_token_ids(id);
  }
  request.set_ignore_eos(ignore_eos.value_or(false));
  request.set_commit(commit.value_or(false));

  Cli cli(globals);
  grpc::ClientContext context;
  cli.ApplyDeadline(&context);
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      cli.stub().Generate(&context, request);
  v1::GenerateResponse message;
  std::optional<v1::GenerateResponse::Final> final_message;
  while (reader->Read(&message)) {
    if (!message.text().empty()) {
      std::fwrite(message.text().data(), 1, message.text().size(), stdout);
      std::fflush(stdout);
    }
    if (message.has_final()) final_message = message.final();
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  grpc::Status status = reader->Finish();
  if (!status.ok()) return Fail(status);
  if (!final_message.has_value()) {
    return Fail(absl::InternalError("the stream ended without a final message"));
  }
  if (!quiet.value_or(false)) {
    const v1::GenerateResponse::Final& f = *final_message;
    std::fprintf(stderr,
                 "finish: %s; %d tokens generated after %lld prompt tokens; time to first token "
                 "%.1f ms; %.1f tokens/s; total %.3f s\n",
                 v1::GenerateResponse::Final::FinishReason_Name(f.finish_reason()).c_str(),
                 f.generated_tokens(), static_cast<long long>(f.prompt_tokens()),
                 1e3 * f.time_to_first_token_seconds(), f.tokens_per_second(), f.total_seconds());
    if (f.has_session()) std::fputs(FormatSession(f.session()).c_str(), stderr);
  }
  return kExitOk;
}

int RunInspect(Globals globals, const std::vector<std::string>& args) {
  ArgParser parser("inspect SESSION [--positions]");
  std::optional<bool> positions;
  parser.AddBool("positions", &positions, "print the retained original positions");
  std::vector<std::string> pos;
  if (auto rc = ParseOrFail(parser, globals, args, 1, &pos)) return *rc;
  v1::InspectCacheRequest request;
  request.set_session_id(pos[0]);
  request.set_include_positions(positions.value_or(false));
  Cli cli(globals);
  grpc::ClientContext context;
  cli.ApplyDeadline(&context);
  v1::InspectCacheResponse response;
  grpc::Status status = cli.stub().InspectCache(&context, request, &response);
  if (!status.ok()) return Fail(status);
  std::fputs(FormatInspect(response, positions.value_or(false)).c_str(), stdout);
  return kExitOk;
}

int RunGet(Globals globals, const std::vector<std::string>& args) {
  ArgParser parser("get SESSION");
  std::vector<std::string> pos;
  if (auto rc = ParseOrFail(parser, globals, args, 1, &pos)) return *rc;
  v1::GetSessionRequest request;
  request.set_session_id(pos[0]);
  Cli cli(globals);
  grpc::ClientContext context;
  cli.ApplyDeadline(&context);
  v1::Session session;
  grpc::Status status = cli.stub().GetSession(&context, request, &session);
  if (!status.ok()) return Fail(status);
  return PrintSession(session, /*id_only=*/false);
}

int RunList(Globals globals, const std::vector<std::string>& args) {
  ArgParser parser("list");
  std::vector<std::string> pos;
  if (auto rc = ParseOrFail(parser, globals, args, 0, &pos)) return *rc;
  Cli cli(globals);
  grpc::ClientContext context;
  cli.ApplyDeadline(&context);
  v1::ListSessionsResponse response;
  grpc::Status status = cli.stub().ListSessions(&context, v1::ListSessionsRequest(), &response);
  if (!status.ok()) return Fail(status);
  std::fputs(FormatSessionList(response).c_str(), stdout);
  return kExitOk;
}

int RunFork(Globals globals, const std::vector<std::string>& args) {
  ArgParser parser("fork SESSION [--ttl SECONDS] [--id-only]");
  std::optional<int64_t> ttl;
  std::optional<bool> id_only;
  parser.AddInt("ttl", &ttl, "idle expiry of the fork (default: the source's)");
  parser.AddBool("id-only", &id_only, "print only the new session id");
  std::vector<std::string> pos;
  if (auto rc = ParseOrFail(parser, globals, args, 1, &pos)) return *rc;
  v1::ForkSessionRequest request;
  request.set_session_id(pos[0]);
  if (ttl.has_value()) request.set_ttl_seconds(*ttl);
  Cli cli(globals);
  grpc::ClientContext context;
  cli.ApplyDeadline(&context);
  v1::Session session;
  grpc::Status status = cli.stub().ForkSession(&context, request, &session);
  if (!status.ok()) return Fail(status);
  return PrintSession(session, id_only.value_or(false));
}

int RunDelete(Globals globals, const std::vector<std::string>& args) {
  ArgParser parser("delete SESSION");
  std::vector<std::string> pos;
  if (auto rc = ParseOrFail(parser, globals, args, 1, &pos)) return *rc;
  v1::DeleteSessionRequest request;
  request.set_session_id(pos[0]);
  Cli cli(globals);
  grpc::ClientContext context;
  cli.ApplyDeadline(&context);
  v1::DeleteSessionResponse response;
  grpc::Status status = cli.stub().DeleteSession(&context, request, &response);
  if (!status.ok()) return Fail(status);
  std::printf("deleted %s (freed %s)\n", pos[0].c_str(),
              FormatBytes(response.freed_kv_bytes()).c_str());
  return kExitOk;
}

int RunCompress(Globals globals, const std::vector<std::string>& args) {
  ArgParser parser(
      "compress (--text T | --file PATH | --chat FILE.json | --ids 1,2,3) [compression flags] "
      "[--positions]");
  InputSpec input_spec;
  CompressionFlags compression_flags;
  std::optional<bool> positions;
  AddInputFlags(parser, &input_spec);
  AddCompressionFlags(parser, &compression_flags);
  parser.AddBool("positions", &positions, "print the kept original positions");
  std::vector<std::string> pos;
  if (auto rc = ParseOrFail(parser, globals, args, 0, &pos)) return *rc;
  v1::CompressRequest request;
  absl::StatusOr<v1::Input> input = BuildInput(input_spec);
  if (!input.ok()) return UsageFail(std::string(input.status().message()), parser);
  *request.mutable_input() = *std::move(input);
  absl::StatusOr<v1::CompressionConfig> compression = BuildCompression(compression_flags);
  if (!compression.ok()) return UsageFail(std::string(compression.status().message()), parser);
  *request.mutable_compression() = *std::move(compression);
  Cli cli(globals);
  grpc::ClientContext context;
  cli.ApplyDeadline(&context);
  v1::CompressResponse response;
  grpc::Status status = cli.stub().Compress(&context, request, &response);
  if (!status.ok()) return Fail(status);
  // Reuse the InspectCache table: the same per layer/group shape, no session.
  v1::InspectCacheResponse as_inspect;
  *as_inspect.mutable_layers() = response.layers();
  as_inspect.set_total_retained_entries(response.report().retained_entries());
  as_inspect.set_total_kv_bytes(response.report().retained_kv_bytes());
  as_inspect.set_full_equivalent_kv_bytes(response.report().full_kv_bytes());
  *as_inspect.mutable_last_report() = response.report();
  std::string table = FormatInspect(as_inspect, positions.value_or(false));
  // Drop the (empty) session header: everything before the table's first blank line.
  if (size_t cut = table.find("\n\n"); cut != std::string::npos) table = table.substr(cut + 2);
  std::printf("context %lld tokens\n%s", static_cast<long long>(response.context_tokens()),
              table.c_str());
  return kExitOk;
}

int RunExport(Globals globals, const std::vector<std::string>& args) {
  ArgParser parser("export SESSION > snapshot.echokv");
  std::vector<std::string> pos;
  if (auto rc = ParseOrFail(parser, globals, args, 1, &pos)) return *rc;
  if (isatty(STDOUT_FILENO) != 0) {
    return UsageFail("export writes binary bytes: redirect stdout to a file", parser);
  }
  v1::ExportSessionRequest request;
  request.set_session_id(pos[0]);
  Cli cli(globals);
  grpc::ClientContext context;  // no deadline: a snapshot can be large (Ctrl-C cancels)
  auto reader = cli.stub().ExportSession(&context, request);
  v1::SessionSnapshotChunk chunk;
  int64_t total = 0;
  while (reader->Read(&chunk)) {
    if (std::fwrite(chunk.data().data(), 1, chunk.data().size(), stdout) != chunk.data().size()) {
      context.TryCancel();
      reader->Finish();
      return Fail(absl::DataLossError("export: writing stdout failed"));
    }
    total += static_cast<int64_t>(chunk.data().size());
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return Fail(status);
  if (std::fflush(stdout) != 0) return Fail(absl::DataLossError("export: writing stdout failed"));
  std::fprintf(stderr, "exported %s (%s)\n", pos[0].c_str(), FormatBytes(total).c_str());
  return kExitOk;
}

int RunImport(Globals globals, const std::vector<std::string>& args) {
  ArgParser parser("import [--keep-id] [--ttl SECONDS] [--id-only] < snapshot.echokv");
  std::optional<bool> keep_id;
  std::optional<int64_t> ttl;
  std::optional<bool> id_only;
  parser.AddBool("keep-id", &keep_id, "keep the snapshot's session id (error when taken)");
  parser.AddInt("ttl", &ttl, "idle expiry of the imported session (default: the snapshot's)");
  parser.AddBool("id-only", &id_only, "print only the new session id");
  std::vector<std::string> pos;
  if (auto rc = ParseOrFail(parser, globals, args, 0, &pos)) return *rc;
  if (isatty(STDIN_FILENO) != 0) return UsageFail("import reads a snapshot from stdin: redirect it", parser);
  Cli cli(globals);
  grpc::ClientContext context;
  v1::Session session;
  auto writer = cli.stub().ImportSession(&context, &session);
  v1::ImportSessionRequest header;
  header.mutable_header()->set_keep_id(keep_id.value_or(false));
  if (ttl.has_value()) header.mutable_header()->set_ttl_seconds(*ttl);
  bool open = writer->Write(header);
  std::string buffer(1 << 20, '\0');
  while (open) {
    const size_t n = std::fread(buffer.data(), 1, buffer.size(), stdin);
    if (n == 0) break;
    v1::ImportSessionRequest data;
    data.set_data(buffer.data(), n);
    open = writer->Write(data);
  }
  if (std::ferror(stdin) != 0) {
    context.TryCancel();
    writer->Finish();
    return Fail(absl::DataLossError("import: reading stdin failed"));
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (!status.ok()) return Fail(status);
  return PrintSession(session, id_only.value_or(false));
}

int RunDrain(Globals globals, const std::vector<std::string>& args) {
  ArgParser parser(
      "drain --pod NAME (--replicas N | --statefulset NAME --kube-dir DIR [--kube-api URL])\n"
      "      (--peer '{pod}.HEADLESS:PORT' | --peers POD=HOST:PORT,...) [--token-dir DIR] [--deadline SECONDS]\n"
      "  moves every session of --server (this pod) to the pods that remain when this pod's ordinal is at or\n"
      "  above the StatefulSet's replicas (a scale-down); a session goes to the first of its owner's ordinal,\n"
      "  ordinal/2, ordinal/4, ..., 0 that remains, keeping its id (docs/DEPLOY.md \"Drain\")");
  std::optional<std::string> pod, statefulset, kube_dir, kube_api, peer, peers, token_dir;
  std::optional<int64_t> replicas;
  std::optional<double> deadline;
  std::optional<bool> dry_run;
  parser.AddString("pod", &pod, "this pod's name, <statefulset>-<ordinal> (the chart passes $POD_NAME)");
  parser.AddInt("replicas", &replicas, "the StatefulSet's spec.replicas (instead of asking the API)");
  parser.AddString("statefulset", &statefulset, "read spec.replicas of this StatefulSet from the Kubernetes API");
  parser.AddString("kube-dir", &kube_dir, "token, ca.crt and namespace of the pod's ServiceAccount");
  parser.AddString("kube-api", &kube_api, "API URL (default https://$KUBERNETES_SERVICE_HOST:$..._PORT)");
  parser.AddString("peer", &peer, "address of another pod, {pod} replaced by its name");
  parser.AddString("peers", &peers, "or explicit addresses: POD=HOST:PORT,...");
  parser.AddString("token-dir", &token_dir, "one tenant token per file: drain every tenant (default: --token)");
  parser.AddDouble("deadline", &deadline, "seconds after which no new session is moved");
  parser.AddBool("dry-run", &dry_run, "print the moves only");
  std::vector<std::string> pos;
  if (auto rc = ParseOrFail(parser, globals, args, 0, &pos)) return *rc;
  if (!pod.has_value()) return UsageFail("--pod is required", parser);
  if (replicas.has_value() == statefulset.has_value()) {
    return UsageFail("give exactly one of --replicas and --statefulset", parser);
  }
  if (!peer.has_value() && !peers.has_value()) return UsageFail("--peer or --peers is required", parser);
  DrainConfig config;
  config.pod = *pod;
  config.peer = peer.value_or("");
  if (peers.has_value()) {
    absl::StatusOr<std::map<std::string, std::string>> map = ParsePeerMap(*peers);
    if (!map.ok()) return UsageFail(std::string(map.status().message()), parser);
    config.peer_map = std::move(*map);
  }
  if (deadline.has_value()) config.deadline = absl::Now() + absl::Seconds(*deadline);
  if (globals.timeout.has_value()) config.call_timeout = absl::Seconds(*globals.timeout);
  config.dry_run = dry_run.value_or(false);
  if (absl::StatusOr<std::pair<std::string, int>> self = SplitOrdinal(*pod); !self.ok()) {
    return UsageFail(std::string(self.status().message()), parser);
  } else if (statefulset.has_value() && self->first != *statefulset) {
    return UsageFail(absl::StrCat("--pod ", *pod, " is not a pod of StatefulSet ", *statefulset), parser);
  }
  if (replicas.has_value()) {
    config.replicas = static_cast<int>(*replicas);
  } else {
    if (!kube_dir.has_value()) return UsageFail("--statefulset needs --kube-dir", parser);
    absl::StatusOr<KubeApi> api = KubeApiFromDir(*kube_dir, kube_api.value_or(""));
    if (!api.ok()) return UsageFail(std::string(api.status().message()), parser);
    absl::StatusOr<int> n = FetchReplicas(*api, *statefulset, config.call_timeout);
    if (!n.ok()) {
      // Without the count the drain cannot tell a scale-down from a rolling update:
      // leave the sessions on the pod's volume (they come back with the pod).
      std::fprintf(stderr, "echokv-cli drain: %s; nothing moved\n", DescribeStatus(n.status()).c_str());
      return kExitRpcError;
    }
    config.replicas = *n;
  }
  std::vector<std::string> tokens;
  if (token_dir.has_value()) {
    absl::StatusOr<std::vector<std::string>> t = ReadTokenDir(*token_dir);
    if (!t.ok()) return UsageFail(std::string(t.status().message()), parser);
    tokens = std::move(*t);
  } else {
    tokens.push_back(globals.credentials.bearer);
  }
  Cli cli(globals);
  absl::StatusOr<DrainReport> report =
      Drain(config, cli.channel(), [&cli](const std::string& address) { return cli.ChannelTo(address); }, tokens);
  if (!report.ok()) return Fail(report.status());
  if (!report->scaled_away) {
    std::fprintf(stderr, "echokv-cli drain: %s is within the %d replica(s): its sessions stay on its volume\n",
                 pod->c_str(), config.replicas);
    return kExitOk;
  }
  for (const std::string& line : report->lines) std::printf("%s\n", line.c_str());
  for (const std::string& line : report->left) std::fprintf(stderr, "left %s\n", line.c_str());
  std::fprintf(stderr, "echokv-cli drain: %s (ordinal >= %d replicas): %d moved, %d deleted meanwhile, %zu left\n",
               pod->c_str(), config.replicas, report->moved, report->gone, report->left.size());
  return report->left.empty() ? kExitOk : kExitRpcError;
}

using Command = std::function<int(Globals, const std::vector<std::string>&)>;

const std::map<std::string, std::pair<Command, const char*>>& Commands() {
  static const auto* commands = new std::map<std::string, std::pair<Command, const char*>>{
      {"info", {RunInfo, "model, device, policies, defaults and limits"}},
      {"health", {RunHealth, "grpc.health.v1 check; exit 0 when SERVING"}},
      {"create", {RunCreate, "new session from text / file / chat / ids (progress on stderr)"}},
      {"append", {RunAppend, "prefill more input into a session and re-compress"}},
      {"generate", {RunGenerate, "stream a generation from a session to stdout"}},
      {"inspect", {RunInspect, "per layer/group retained entries and bytes; --positions"}},
      {"get", {RunGet, "one session's figures"}},
      {"list", {RunList, "every live session"}},
      {"fork", {RunFork, "copy a session"}},
      {"delete", {RunDelete, "free a session"}},
      {"compress", {RunCompress, "stateless: which positions a policy keeps (nothing stored)"}},
      {"export", {RunExport, "write a session's snapshot to stdout (ExportSession)"}},
      {"import", {RunImport, "recreate a session from a snapshot on stdin (ImportSession)"}},
      {"drain", {RunDrain, "scale-down: move every session to the pods that remain"}},
  };
  return *commands;
}

void PrintUsage(FILE* out) {
  std::fprintf(out,
               "usage: echokv-cli [--server HOST:PORT] [--timeout SECONDS] [--token T | --token_file F]\n"
               "                  [--tls_ca CA.pem [--tls_cert C.pem --tls_key C.key] [--tls_server_name NAME]]\n"
               "                  COMMAND [flags]\n"
               "  --server defaults to $ECHOKV_SERVER or %s; the token to $ECHOKV_TOKEN\n\ncommands:\n",
               kDefaultServer);
  for (const auto& [name, entry] : Commands()) {
    std::fprintf(out, "  %-9s %s\n", name.c_str(), entry.second);
  }
  std::fprintf(out, "\n`echokv-cli COMMAND --help` lists a command's flags.\n");
}

int Main(int argc, char** argv) {
  Globals globals;
  if (const char* env = std::getenv("ECHOKV_SERVER"); env != nullptr && *env != '\0') {
    globals.server = env;
  }
  // Global flags come before the command (they are accepted after it as well).
  std::vector<std::string> args(argv + 1, argv + argc);
  size_t i = 0;
  ArgParser global_parser("COMMAND");
  AddGlobalFlags(global_parser, globals);
  while (i < args.size() && args[i].rfind("--", 0) == 0) {
    if (args[i] == "--help" || args[i] == "-h") {
      PrintUsage(stdout);
      return kExitOk;
    }
    // A global flag and its value (when given as a separate word).
    const bool has_inline_value = args[i].find('=') != std::string::npos;
    const size_t words = has_inline_value ? 1 : 2;
    std::vector<std::string> flag(args.begin() + i,
                                  args.begin() + std::min(args.size(), i + words));
    std::vector<std::string> ignored;
    if (absl::Status s = global_parser.Parse(flag, &ignored); !s.ok()) {
      std::fprintf(stderr, "echokv-cli: %s\n", std::string(s.message()).c_str());
      PrintUsage(stderr);
      return kExitUsage;
    }
    i += words;
  }
  if (i >= args.size()) {
    PrintUsage(stderr);
    return kExitUsage;
  }
  const std::string command = args[i];
  auto it = Commands().find(command);
  if (it == Commands().end()) {
    std::fprintf(stderr, "echokv-cli: unknown command '%s'\n", command.c_str());
    PrintUsage(stderr);
    return kExitUsage;
  }
  return it->second.first(globals, std::vector<std::string>(args.begin() + i + 1, args.end()));
}

}  // namespace
}  // namespace echokv::client

int main(int argc, char** argv) { return echokv::client::Main(argc, argv); }
