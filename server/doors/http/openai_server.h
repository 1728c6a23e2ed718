// echokv-server's second door: an OpenAI-compatible HTTP API on the same session layer
// (server/sessions/sessions.h) as the gRPC service (docs/API.md, "HTTP API"), on cpp-httplib with its own port behind the
// front of server/doors/http/http_util.h (head deadline, connection caps, a growing worker pool).
// Its gate checks the bearer token on the headers, before any body byte is read
// (docs/SECURITY.md, "Limits on an unauthenticated HTTP client").
//
//   POST /v1/chat/completions   chat, non-streaming or `stream: true` (server-sent events)
//   POST /v1/completions        legacy text completions, the same; a prompt list gives
//                               one choice per prompt (stateless requests only)
//   GET  /v1/models             the served model (and GET /v1/models/{id})
//   GET  /health                200 while serving, 503 when draining or the engine is stuck
//
// Sessions: a request naming a session (body `session_id` or header `x-echokv-session`)
// continues it (chat: only the messages after the session's stored conversation are
// appended; the reply is committed); "new" creates one that outlives the response;
// without one the request runs on a temporary session deleted afterwards. The response
// names the session in the `x-echokv-session` header and a `session_id` field.
//
// Threads: each connection runs on a pool worker, which blocks while the engine works
// (handlers wait on the engine's callbacks; a stream's worker writes its events).
// Nothing here runs on the engine thread except the callbacks, which only queue.
//
//   OpenAiConfig cfg;  cfg.host = "0.0.0.0";  cfg.port = 8080;
//   ECHOKV_ASSIGN_OR_RETURN(auto http, OpenAiServer::Start(&sessions, engine->tokenizer(), metrics.get(), cfg));
//   ... http->Drain();  engine->Shutdown();  http->Stop();
#ifndef ECHOKV_SERVER_DOORS_HTTP_OPENAI_SERVER_H_
#define ECHOKV_SERVER_DOORS_HTTP_OPENAI_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/doors/auth.h"
#include "server/sessions/sessions.h"
#include "server/doors/http/http_util.h"
#include "server/metrics.h"

namespace echokv::server {

struct OpenAiConfig {
  std::string host = "0.0.0.0";   // "[::]" and "::" bind IPv6 (and IPv4 where the OS allows)
  int port = 0;                   // 0 = a free port
  HttpOptions http;               // workers, timeouts, body limit
  std::string model_name;         // the served model id; "" = ServerFacts::model_name
  // The request `model` may also be this alias (always the one served model).
  std::string model_alias = "echokv";
  // Bearer tokens (the gRPC door's, server/doors/auth.h); must outlive the server. null =
  // no authentication (--insecure).
  const TokenStore* tokens = nullptr;
};

class OpenAiServer {
 public:
  // `sessions`, `tokenizer` (logprobs' token strings) and `metrics` (may be null) must
  // outlive the server. Every completion holds one of the session layer's stream slots
  // while it runs (shared with the gRPC door).
  static absl::StatusOr<std::unique_ptr<OpenAiServer>> Start(Sessions* sessions, const model::Tokenizer& tokenizer,
                                                             Metrics* metrics, const OpenAiConfig& config);
  ~OpenAiServer();  // Stop()
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  int port() const;
  const std::string& model_name() const;
  // Requests that arrive from now on get 503 (shutdown); in-flight ones continue.
  void Drain();
  // Completion requests in flight.
  int in_flight() const;
  // Stops listening and joins the workers; a stream still open ends with an error
  // event (503 server_error) and [DONE]. Handlers waiting on the engine must be
  // released first (Engine::CancelAll / Shutdown). Idempotent.
  void Stop();

  class Impl;

 private:
  explicit OpenAiServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_DOORS_HTTP_OPENAI_SERVER_H_
