// echokv-server: loads one model and serves echokv.v1.EchoKV (gRPC, callback API),
// grpc.health.v1.Health, Prometheus metrics, (with --http_port) the OpenAI-compatible
// HTTP API and (with --reflection) server reflection.
//
//   echokv-server --model /models/stories260K --auth_tokens_file /etc/echokv/tokens
//       --tls_cert server.pem --tls_key server.key [--tls_client_ca clients.pem] --http_port 8080
//   echokv-server --model DIR --insecure --host 127.0.0.1 --port 0 --http_port 0 --port_file /tmp/ports
//   echokv-server --insecure      # $ECHOKV_MODEL, else the embedded stories260K (models/)
//     (port 0 picks a free port; the port file gets "GRPC_PORT\nMETRICS_PORT\nHTTP_PORT\n",
//     0 for a door that is off)
//
// Without --auth_tokens_file the server refuses to start unless --insecure is given
// (docs/SECURITY.md). SIGHUP re-reads the tokens file (running calls go on); the TLS
// files are re-read every --tls_refresh_interval. SIGTERM / SIGINT: health ->
// NOT_SERVING, stop accepting, let in-flight calls finish until --shutdown-grace, then
// cancel what is left; exit 0. A second signal cancels at once. Signals are taken by
// sigwait on the main thread, never in a handler.
#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/blas_env.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/default_model.h"
#include "common/flag_names.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "compression/config.h"
#include "server/doors/auth.h"
#include "server/engine/engine.h"
#include "server/doors/grpc/grpc_auth.h"
#include "server/metrics.h"
#include "server/doors/http/openai_server.h"
#include "server/doors/grpc/service.h"
#include "server/sessions/stream_slots.h"

ABSL_FLAG(std::string, model, "",
          "The model: a .gguf file or a Hugging Face directory (config.json, *.safetensors, tokenizer); "
          "default $ECHOKV_MODEL, else SmolLM2-135M-Instruct.Q4_1.gguf in $ECHOKV_MODELS / the models "
          "folder (scripts/setup.sh fetches it), else the embedded stories260K (a 260K-parameter "
          "TinyStories Llama, for smoke tests)");
ABSL_FLAG(std::string, host, "0.0.0.0", "Address to serve gRPC on");
ABSL_FLAG(int, port, 50051, "gRPC port; 0 picks a free port");
ABSL_FLAG(std::string, port_file, "",
          "When set, write the bound gRPC, metrics and HTTP ports (one per line; 0 = off) here");
ABSL_FLAG(std::string, metrics_host, "", "Address for /metrics; default --host");
ABSL_FLAG(int, metrics_port, 9090, "Prometheus /metrics port; 0 picks a free port, -1 disables");
ABSL_FLAG(int, metrics_threads, 64,
          "Most /metrics connections served at once (workers start on demand; idle ones end)");
ABSL_FLAG(int, http_port, -1,
          "OpenAI-compatible HTTP API port (/v1/chat/completions, /v1/completions, /v1/models); "
          "0 picks a free port, -1 disables");
ABSL_FLAG(std::string, http_host, "", "Address for the HTTP API; default --host");
ABSL_FLAG(int, http_threads, 128,
          "Most HTTP API connections served at once (each request or stream holds one; workers start on "
          "demand, idle ones end)");
ABSL_FLAG(absl::Duration, http_read_timeout, absl::Seconds(30), "HTTP API: longest stall while reading a request");
ABSL_FLAG(absl::Duration, http_body_timeout, absl::Seconds(120),
          "HTTP API: a request body must arrive whole within this of its headers (one total)");
ABSL_FLAG(absl::Duration, http_write_timeout, absl::Seconds(60),
          "HTTP API: longest a client may leave a response unread before it is dropped (and its generation "
          "cancelled)");
ABSL_FLAG(absl::Duration, http_keep_alive_timeout, absl::Seconds(5),
          "HTTP API: an idle keep-alive connection is closed after this (whole seconds)");
ABSL_FLAG(absl::Duration, http_header_timeout, absl::Seconds(10),
          "HTTP API: a request's line and headers must arrive whole within this (one total, not per read; "
          "408 and close beyond)");
ABSL_FLAG(int, http_max_connections, 512, "HTTP API: open connections at most (the oldest waiting for its "
          "headers is dropped for a new one)");
ABSL_FLAG(int, http_max_connections_per_peer, 256,
          "HTTP API: open connections at most from one client address (the same rule per address)");
ABSL_FLAG(int, http_send_buffer_bytes, 0,
          "HTTP API: SO_SNDBUF of each connection; 0 = kernel autotuning. Smaller: a stalled streaming client "
          "holds its generation back sooner");
ABSL_FLAG(int64_t, http_max_body_bytes, 0,
          "HTTP API: largest request body (413 beyond); 0 = 4 x --max_request_bytes + 1 MiB (JSON overhead)");
ABSL_FLAG(std::string, served_model_name, "",
          "The model id of the HTTP API (GET /v1/models; requests' `model`); default the --model directory's "
          "name. The alias \"echokv\" is always accepted too");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(std::string, dtype, "float32", "float32, bfloat16 or float16");
ABSL_FLAG(std::string, weights, "float32",
          "float32 (exact, default) or native: a GGUF file's Q4_0/Q4_1/Q8_0 matrices kept as stored, decode on "
          "them (CPU float32 only)");
ABSL_FLAG(int, threads, 0, "Compute threads (OpenBLAS for batched products, OpenMP for decode); 0 = $ECHOKV_THREADS or all cores");
ABSL_FLAG(int, prefill_chunk, 256, "Tokens per prefill model call");
ABSL_FLAG(int64_t, max_step_tokens, 256,
          "Tokens per engine step: one per decoding stream plus prefill tokens of waiting jobs (a smaller "
          "budget lowers inter-token latency while a long prefill runs)");
ABSL_FLAG(std::string, default_memory, "",
          "Session memory mode when a request sets none: tiered or evict; default tiered with --state_dir, "
          "else evict");
ABSL_FLAG(std::string, state_dir, "",
          "Keep sessions on disk here (survive restarts; docs/SESSION_MEMORY.md §4); empty = memory only");
ABSL_FLAG(std::string, fsync, "always",
          "always: a mutation is acknowledged only once its bytes are durable; none: never fsync");
ABSL_FLAG(std::string, chat_template, "",
          "Chat template for chat input: a Jinja file, or builtin:NAME (chatml, qwen2, qwen2.5, mistral, "
          "llama2); default: the model's own (tokenizer_config.json / chat_template.jinja)");
ABSL_FLAG(std::string, replica_id, "",
          "This replica's name (a DNS label, e.g. the pod name): new session ids are '<replica_id>.<hex>'");
ABSL_FLAG(absl::Duration, stuck_after, absl::Seconds(30),
          "Health turns NOT_SERVING when work is waiting and no engine step completed for this long");
ABSL_FLAG(std::string, default_policy, "echokv", "Compression policy when a request sets none");
ABSL_FLAG(int, default_budget, 512, "Default budget B (entries per layer and KV group)");
ABSL_FLAG(std::string, default_cache_dtype, "float32",
          "Storage of a session's retained tier when a request sets none: float32 or int8 (int8 rows with a "
          "float32 scale per token and KV group, 0.27x the bytes at head_dim 64; CPU float32 only)");
ABSL_FLAG(int, default_lookahead, 8, "Default lookahead T (even)");
ABSL_FLAG(int, default_workspace, 0, "Default workspace B1; 0 = the policy's default");
ABSL_FLAG(int, default_window, 0, "Default EchoKV stage-2 window w");
ABSL_FLAG(int64_t, max_context_tokens, 0, "Most tokens a session may hold; 0 = the model's context");
ABSL_FLAG(int, max_new_tokens, echokv::server::kDefaultMaxNewTokens, "Largest max_tokens of a Generate");
ABSL_FLAG(int, max_sessions, 256, "Live sessions at most");
ABSL_FLAG(int64_t, max_kv_bytes, int64_t{8} << 30, "Hot (retained) KV bytes of all sessions together");
ABSL_FLAG(int64_t, max_cold_bytes, int64_t{8} << 30,
          "Cold-tier (exact history) bytes of tiered sessions held in memory, all together");
ABSL_FLAG(absl::Duration, session_ttl, absl::Minutes(30), "Default idle expiry of a session");
ABSL_FLAG(absl::Duration, max_session_ttl, absl::Hours(24), "Largest ttl a client may ask for");
ABSL_FLAG(int, max_concurrent_streams, 64, "Streaming calls (and Compress) in flight at most");
ABSL_FLAG(int64_t, max_request_bytes, int64_t{4} << 20, "Input bytes of one request (before tokenizing)");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(10),
          "On SIGTERM/SIGINT: how long in-flight calls may run before they are cancelled");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "Tenants and the SHA-256 of their bearer tokens, one per line (docs/SECURITY.md); re-read on SIGHUP. "
          "Required unless --insecure");
ABSL_FLAG(bool, insecure, false, "Serve without authentication (no --auth_tokens_file): anyone who can connect "
          "may use every session");
ABSL_FLAG(bool, reflection, false, "Serve gRPC server reflection");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require client certificates signed by it (mutual TLS)");
ABSL_FLAG(absl::Duration, tls_refresh_interval, absl::Seconds(60),
          "How often the TLS files are re-read (new certificates apply to new connections)");
ABSL_FLAG(int, max_streams_per_connection, 100, "HTTP/2 concurrent streams one connection may open");
ABSL_FLAG(absl::Duration, max_connection_idle, absl::Hours(1),
          "Close a connection without calls for this long (GOAWAY; clients reconnect); 0 = never");
ABSL_FLAG(absl::Duration, max_connection_age, absl::ZeroDuration(),
          "Close connections this old (GOAWAY, then --max_connection_age_grace for running calls); 0 = never");
ABSL_FLAG(absl::Duration, max_connection_age_grace, absl::Minutes(5),
          "With --max_connection_age: how long running calls may finish before the connection is cut");

namespace echokv::server {
namespace {

// Linking grpc++_reflection registers its plugin with every ServerBuilder at static
// initialization; this option takes it out again unless --reflection.
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                                    return p->name() == "proto_server_reflection";
                                  }),
                   plugins->end());
  }
};

absl::StatusOr<EngineConfig> ConfigFromFlags() {
  EngineConfig c;
  // --model, else $ECHOKV_MODEL, else the embedded stories260K (common/default_model.h).
  ECHOKV_ASSIGN_OR_RETURN(c.model_dir, ResolveModelDir(absl::GetFlag(FLAGS_model)));
  c.device = absl::GetFlag(FLAGS_device);
  c.dtype = absl::GetFlag(FLAGS_dtype);
  c.weights = absl::GetFlag(FLAGS_weights);
  c.threads = absl::GetFlag(FLAGS_threads);
  c.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  c.max_step_tokens = absl::GetFlag(FLAGS_max_step_tokens);
  c.replica_id = absl::GetFlag(FLAGS_replica_id);
  c.stuck_after = absl::GetFlag(FLAGS_stuck_after);
  c.state_dir = absl::GetFlag(FLAGS_state_dir);
  c.chat_template = absl::GetFlag(FLAGS_chat_template);
  if (const std::string f = absl::GetFlag(FLAGS_fsync); f == "always" || f == "none") {
    c.fsync_always = f == "always";
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--fsync must be always or none, got '", f, "'"));
  }
  if (const std::string m = absl::GetFlag(FLAGS_default_memory); !m.empty()) {
    absl::StatusOr<MemoryMode> mode = ParseMemoryMode(m);
    if (!mode.ok()) return absl::InvalidArgumentError(absl::StrCat("--default_memory: ", mode.status().message()));
    c.default_memory = *mode;
  } else {
    // With a state dir the cold tier lives on disk; without one a CPU server must not
    // hold full caches in RAM behind the user's back.
    c.default_memory = c.state_dir.empty() ? MemoryMode::kEvict : MemoryMode::kTiered;
  }
  absl::StatusOr<compression::PolicyKind> policy = compression::ParsePolicyKind(absl::GetFlag(FLAGS_default_policy));
  if (!policy.ok()) return absl::InvalidArgumentError(absl::StrCat("--default_policy: ", policy.status().message()));
  c.default_compression.policy = *policy;
  c.default_compression.budget = absl::GetFlag(FLAGS_default_budget);
  c.default_compression.lookahead = absl::GetFlag(FLAGS_default_lookahead);
  if (absl::GetFlag(FLAGS_default_workspace) > 0) c.default_compression.workspace = absl::GetFlag(FLAGS_default_workspace);
  c.default_compression.stage2_window = absl::GetFlag(FLAGS_default_window);
  if (const std::string d = absl::GetFlag(FLAGS_default_cache_dtype);
      !kernels::ParseKvDtype(d, &c.default_compression.cache_dtype) ||
      c.default_compression.cache_dtype == kernels::KvDtype::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat("--default_cache_dtype must be float32 or int8, got '", d, "'"));
  }
  EngineLimits& l = c.limits;
  l.max_context_tokens = absl::GetFlag(FLAGS_max_context_tokens);
  l.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  l.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  l.max_kv_bytes = absl::GetFlag(FLAGS_max_kv_bytes);
  l.max_cold_bytes = absl::GetFlag(FLAGS_max_cold_bytes);
  l.session_ttl = absl::GetFlag(FLAGS_session_ttl);
  l.max_session_ttl = std::max(absl::GetFlag(FLAGS_max_session_ttl), l.session_ttl);
  l.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  l.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  if (absl::Status s = c.Validate(); !s.ok()) return absl::InvalidArgumentError(absl::StrCat("flags: ", s.message()));
  return c;
}

// The thread that sigwaits for the shutdown signals (Run's).
pthread_t g_signal_thread;

// A shutdown signal delivered to a thread that does not block it goes on to the
// sigwaiting thread, where it stays pending until sigwait takes it (pthread_kill is
// async-signal-safe).
void ForwardSignal(int sig) { pthread_kill(g_signal_thread, sig); }

int Run() {
  // Block the shutdown signals here; threads started from now on inherit the mask, so
  // only the sigwait below sees them. Threads that exist already do not block them
  // (OpenBLAS starts its team when the library loads, before main): a SIGTERM the kernel
  // hands to one of those would kill the process with the default action (exit -15, no
  // drain; seen in about one start in three of server_outside_ops_test), so a handler
  // forwards it to this thread instead.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  g_signal_thread = pthread_self();
  struct sigaction forward {};
  forward.sa_handler = ForwardSignal;
  sigemptyset(&forward.sa_mask);
  forward.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &forward, nullptr);

  absl::StatusOr<EngineConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    ECHOKV_LOG(ERROR) << config.status().message();
    return 2;
  }
  // Authentication: a tokens file, or an explicit --insecure; never silently open.
  std::unique_ptr<TokenStore> tokens;
  const std::string tokens_path = absl::GetFlag(FLAGS_auth_tokens_file);
  if (!tokens_path.empty() && absl::GetFlag(FLAGS_insecure)) {
    ECHOKV_LOG(ERROR) << "--auth_tokens_file and --insecure contradict each other: choose one";
    return 2;
  }
  if (tokens_path.empty() && !absl::GetFlag(FLAGS_insecure)) {
    ECHOKV_LOG(ERROR) << "refusing to start without authentication: pass --auth_tokens_file=FILE (docs/SECURITY.md) "
                         "or, to serve without any access control, --insecure";
    return 2;
  }
  if (!tokens_path.empty()) {
    absl::StatusOr<std::unique_ptr<TokenStore>> loaded = TokenStore::Load(tokens_path);
    if (!loaded.ok()) {
      ECHOKV_LOG(ERROR) << loaded.status().message();
      return 2;
    }
    tokens = std::move(*loaded);
  }
  TlsFiles tls;
  tls.cert = absl::GetFlag(FLAGS_tls_cert);
  tls.key = absl::GetFlag(FLAGS_tls_key);
  tls.client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  tls.refresh_seconds = static_cast<int>(absl::ToInt64Seconds(absl::GetFlag(FLAGS_tls_refresh_interval)));
  if (absl::Status s = ValidateTlsFiles(tls); !s.ok()) {
    ECHOKV_LOG(ERROR) << s.message();
    return 2;
  }
  if (absl::GetFlag(FLAGS_max_streams_per_connection) < 1) {
    ECHOKV_LOG(ERROR) << "--max_streams_per_connection must be >= 1";
    return 2;
  }
  const std::string host = absl::GetFlag(FLAGS_host);
  std::string metrics_address;
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    const std::string mhost = absl::GetFlag(FLAGS_metrics_host).empty() ? host : absl::GetFlag(FLAGS_metrics_host);
    metrics_address = absl::StrCat(mhost, ":", absl::GetFlag(FLAGS_metrics_port));
  }
  HttpOptions metrics_http;
  metrics_http.max_threads = absl::GetFlag(FLAGS_metrics_threads);
  metrics_http.read_timeout = absl::Seconds(5);
  metrics_http.body_timeout = absl::Seconds(5);
  metrics_http.write_timeout = absl::Seconds(10);
  metrics_http.keep_alive_timeout = absl::Seconds(2);
  metrics_http.header_timeout = absl::Seconds(5);
  metrics_http.max_connections = 256;
  metrics_http.max_connections_per_peer = 128;
  if (absl::Status s = metrics_http.Validate(); !s.ok()) {
    ECHOKV_LOG(ERROR) << "--metrics_" << s.message();
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create(metrics_address, metrics_http);
  if (!metrics.ok()) {
    ECHOKV_LOG(ERROR) << metrics.status().message();
    return 1;
  }
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*config, metrics->get());
  if (!engine.ok()) {
    ECHOKV_LOG(ERROR) << "cannot start the engine: " << engine.status().message();
    return 1;
  }
  if (tokens != nullptr) (*engine)->SetTenantQuotas(tokens->Quotas());
  const int reserve =
      DefaultStreamReserve(config->limits.max_concurrent_streams, tokens != nullptr ? tokens->tenant_count() : 1);
  // The session layer: both doors' use-cases and their shared stream slots.
  SessionsOptions sessions_options;
  sessions_options.stream_reserve = reserve;
  if (tokens != nullptr) {
    const TokenStore* store = tokens.get();
    sessions_options.stream_quota = [store](const std::string& tenant) { return store->QuotaOf(tenant).max_streams; };
  }
  Sessions sessions(engine->get(), metrics->get(), std::move(sessions_options));
  EchoKvService service(&sessions, metrics->get(), tokens.get());

  // On a TLS port gRPC's AuthMetadataProcessor checks every call's token before any
  // handler runs; gRPC 1.51 cannot run one on a plaintext port, where the service
  // checks the same token itself (CallerFromGrpc).
  std::shared_ptr<grpc::AuthMetadataProcessor> processor;
  if (tokens != nullptr && tls.enabled()) processor = std::make_shared<TokenAuthProcessor>(tokens.get(), metrics->get());
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = ServerCredentialsFor(tls, processor, metrics->get());
  if (!creds.ok()) {
    ECHOKV_LOG(ERROR) << creds.status().message();
    return 2;
  }

  grpc::EnableDefaultHealthCheckService(true);
  if (absl::GetFlag(FLAGS_reflection)) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!absl::GetFlag(FLAGS_reflection)) builder.SetOption(std::make_unique<WithoutReflection>());
  int port = 0;
  builder.AddListeningPort(absl::StrCat(host, ":", absl::GetFlag(FLAGS_port)), *creds, &port);
  builder.RegisterService(&service);
  // A message larger than this is refused by gRPC itself (RESOURCE_EXHAUSTED "Received
  // message larger than max"): max_request_bytes of input plus room for the other fields.
  const int64_t max_message = std::min<int64_t>(config->limits.max_request_bytes + (1 << 16), INT32_MAX);
  builder.SetMaxReceiveMessageSize(static_cast<int>(max_message));
  // HTTP/2 hardening (docs/SECURITY.md): per-connection stream cap, keepalive
  // enforcement (a client pinging more often than every 10 s without data gets GOAWAY
  // after 2 strikes), our own pings find dead peers that hold stream slots, and
  // connection idle / age limits.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, absl::GetFlag(FLAGS_max_streams_per_connection));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  auto millis = [](absl::Duration d) { return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), INT32_MAX)); };
  if (absl::GetFlag(FLAGS_max_connection_idle) > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, millis(absl::GetFlag(FLAGS_max_connection_idle)));
  }
  if (absl::GetFlag(FLAGS_max_connection_age) > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, millis(absl::GetFlag(FLAGS_max_connection_age)));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               millis(absl::GetFlag(FLAGS_max_connection_age_grace)));
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    ECHOKV_LOG(ERROR) << "cannot listen on " << host << ":" << absl::GetFlag(FLAGS_port);
    return 1;
  }
  // The HTTP door shares the session layer (and so its stream slots) with the gRPC door.
  std::unique_ptr<OpenAiServer> http;
  if (absl::GetFlag(FLAGS_http_port) >= 0) {
    OpenAiConfig hc;
    hc.host = absl::GetFlag(FLAGS_http_host).empty() ? host : absl::GetFlag(FLAGS_http_host);
    hc.port = absl::GetFlag(FLAGS_http_port);
    hc.model_name = absl::GetFlag(FLAGS_served_model_name);
    hc.http.max_threads = absl::GetFlag(FLAGS_http_threads);
    hc.http.read_timeout = absl::GetFlag(FLAGS_http_read_timeout);
    hc.http.body_timeout = absl::GetFlag(FLAGS_http_body_timeout);
    hc.http.write_timeout = absl::GetFlag(FLAGS_http_write_timeout);
    hc.http.keep_alive_timeout = absl::GetFlag(FLAGS_http_keep_alive_timeout);
    hc.http.header_timeout = absl::GetFlag(FLAGS_http_header_timeout);
    hc.http.max_connections = absl::GetFlag(FLAGS_http_max_connections);
    hc.http.max_connections_per_peer = absl::GetFlag(FLAGS_http_max_connections_per_peer);
    hc.http.send_buffer_bytes = absl::GetFlag(FLAGS_http_send_buffer_bytes);
    hc.http.max_body_bytes = absl::GetFlag(FLAGS_http_max_body_bytes) > 0
                                 ? absl::GetFlag(FLAGS_http_max_body_bytes)
                                 : 4 * config->limits.max_request_bytes + (int64_t{1} << 20);
    if (absl::Status s = hc.http.Validate(); !s.ok()) {
      ECHOKV_LOG(ERROR) << "--http_" << s.message();
      return 2;
    }
    hc.tokens = tokens.get();
    absl::StatusOr<std::unique_ptr<OpenAiServer>> started =
        OpenAiServer::Start(&sessions, (*engine)->tokenizer(), metrics->get(), hc);
    if (!started.ok()) {
      ECHOKV_LOG(ERROR) << started.status().message();
      return 1;
    }
    http = std::move(*started);
  }
  const int http_port = http != nullptr ? http->port() : 0;
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  // Register the named service too ("" is the whole server); SetServingStatus(false)
  // on shutdown flips every registered name.
  health->SetServingStatus("echokv.v1.EchoKV", true);
  health->SetServingStatus(true);
  const int metrics_port = (*metrics)->port();
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp);
      out << port << "\n" << metrics_port << "\n" << http_port << "\n";
      if (!out) {
        ECHOKV_LOG(ERROR) << "cannot write --port_file " << path;
        return 1;
      }
    }
    std::rename(tmp.c_str(), path.c_str());  // readers never see half a file
  }
  ECHOKV_LOG(INFO) << "echokv-server listening on " << host << ":" << port << (tls.enabled() ? " (TLS" : " (plaintext")
                   << (tls.client_ca.empty() ? "" : ", client certificates required") << "), metrics on port "
                   << metrics_port << ", HTTP API " << (http != nullptr ? absl::StrCat("on port ", http_port) : "off");
  if (tokens != nullptr) {
    ECHOKV_LOG(INFO) << "authentication: " << tokens->tenant_count() << " tenant(s) from " << tokens_path
                     << "; the health service needs no token" << (tls.enabled() ? "" : "; tokens travel in plaintext");
  } else {
    for (int i = 0; i < 3; ++i) {
      ECHOKV_LOG(WARNING) << "INSECURE: --insecure given: NO AUTHENTICATION. Anyone who can reach " << host << ":"
                          << port << " may list, read, continue and delete every session.";
    }
  }

  // Health that means something: the named service follows the engine (NOT_SERVING
  // while work waits and no step completes); "" is the process, up until shutdown.
  std::atomic<bool> watching{true};
  std::thread watchdog([&] {
    bool serving = true;
    while (watching.load()) {
      const EngineHealth h = (*engine)->Health();
      if (h.serving != serving) {
        serving = h.serving;
        health->SetServingStatus("echokv.v1.EchoKV", serving);
        if (serving) {
          ECHOKV_LOG(INFO) << "engine recovered: serving again";
        } else if (!h.state_writable) {
          ECHOKV_LOG(ERROR) << "the state dir cannot be written; health NOT_SERVING";
        } else {
          ECHOKV_LOG(ERROR) << "engine stuck: no step for " << h.seconds_since_step << " s with " << h.queued
                            << " request(s) waiting; health NOT_SERVING";
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  });

  int sig = 0;
  while (true) {
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig != SIGHUP) break;
    // SIGHUP: re-read the tokens file; calls already authenticated run on.
    if (tokens == nullptr) {
      ECHOKV_LOG(INFO) << "SIGHUP: no --auth_tokens_file to reload";
    } else if (absl::Status s = tokens->Reload(); !s.ok()) {
      ECHOKV_LOG(ERROR) << "SIGHUP: tokens file not reloaded, the previous tenants stay: " << s.message();
    } else {
      (*engine)->SetTenantQuotas(tokens->Quotas());
      ECHOKV_LOG(INFO) << "SIGHUP: reloaded " << tokens->tenant_count() << " tenant(s) from " << tokens_path;
    }
    if (tls.enabled()) {
      ECHOKV_LOG(INFO) << "SIGHUP: TLS files are re-read every " << tls.refresh_seconds << " s on their own";
    }
  }
  watching.store(false);
  watchdog.join();
  ECHOKV_LOG(INFO) << "signal " << sig << ": shutting down (grace " << absl::GetFlag(FLAGS_shutdown_grace) << ")";
  health->SetServingStatus(false);
  if (http != nullptr) http->Drain();  // new HTTP requests: 503
  const absl::Duration grace = absl::GetFlag(FLAGS_shutdown_grace);
  const absl::Time deadline = absl::Now() + grace;
  // Shutdown sends GOAWAY, stops accepting and waits for calls, and also for every
  // connection to close: an idle client that does not answer the GOAWAY's ping (a
  // Python channel between calls), a TCP connection that never spoke HTTP/2 or a
  // health Watch held it until the client gave up (4.6-7 s) or the deadline (the whole
  // grace). So once none of our calls is left, main cuts the remaining connections
  // (grpc_server_cancel_all_calls, what Shutdown itself does at the deadline), again
  // every 20 ms until Shutdown returns: the first cut may come before Shutdown began.
  std::atomic<bool> stopped{false};
  std::thread stopper([&server, &stopped, deadline] {
    server->Shutdown(absl::ToChronoTime(deadline));
    stopped.store(true);
  });
  // Let in-flight calls finish; cancel what remains shortly before the deadline (or
  // at once on a second signal) so the engine has time to unwind.
  const absl::Time cancel_at = deadline - std::min(grace / 5, absl::Seconds(1));
  bool cancelled = false;
  auto wait_a_little = [&] {
    struct timespec ts = {0, 20 * 1000 * 1000};
    const int got = sigtimedwait(&signals, nullptr, &ts);
    if (!cancelled && ((got > 0 && got != SIGHUP) || absl::Now() >= cancel_at)) {
      ECHOKV_LOG(INFO) << "cancelling " << sessions.streams_in_flight() << " in-flight call(s)";
      (*engine)->CancelAll();
      cancelled = true;
    }
  };
  while (!stopped.load()) {
    wait_a_little();
    if (service.calls_in_flight() == 0) grpc_server_cancel_all_calls(server->c_server());
  }
  stopper.join();
  while (sessions.streams_in_flight() > 0 && !cancelled) wait_a_little();  // HTTP streams
  (*engine)->Shutdown();
  if (http != nullptr) http->Stop();  // after the engine released every waiting handler
  ECHOKV_LOG(INFO) << "echokv-server stopped";
  return 0;
}

}  // namespace
}  // namespace echokv::server

int main(int argc, char** argv) {
  echokv::ConfigureBlasWorkersOrReexec(argv);
  absl::SetProgramUsageMessage("echokv-server [--model DIR] [--port 50051] [--metrics-port 9090] ...");
  echokv::DashedFlagArgs dashed(argc, argv);  // --port-file as well as --port_file
  std::vector<char*> args = absl::ParseCommandLine(dashed.argc(), dashed.argv());
  if (args.size() > 1) {
    std::fprintf(stderr, "echokv-server: unexpected argument '%s' (see --help)\n", args[1]);
    return 2;
  }
  echokv::InitLogging(argv[0]);
  return echokv::server::Run();
}
