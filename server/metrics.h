// Prometheus metrics of echokv-server (docs/DESIGN.md rule 10): the engine reports plain
// stats (server/engine/stats.h) and the service reports request outcomes; this class turns
// them into prometheus-cpp families served at GET /metrics (cpp-httplib on its own
// port: a growing pool of workers and timeouts, server/doors/http/http_util.h). Every name
// starts with "echokv_"; label values are bounded (policy, phase, method, code,
// limit), never a session id.
//
//   ECHOKV_ASSIGN_OR_RETURN(auto metrics, Metrics::Create("0.0.0.0:0"));
//   int port = metrics->port();                       // the bound port
//   ECHOKV_ASSIGN_OR_RETURN(auto engine, Engine::Create(cfg, metrics.get()));
//   metrics->OnRequest("Generate", "OK");
#ifndef ECHOKV_SERVER_METRICS_H_
#define ECHOKV_SERVER_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/doors/http/http_util.h"
#include "server/engine/stats.h"

namespace echokv::server {

class Metrics : public EngineObserver {
 public:
  // Serves /metrics on `bind_address` ("host:port", host may be "[::]"; port 0 picks
  // a free port) with `options` (workers, timeouts). An empty address builds the
  // families without serving them (tests).
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& bind_address,
                                                         const HttpOptions& options = {});
  ~Metrics() override;

  int port() const;  // the bound port (0 when not serving)

  // One finished RPC: method name ("Generate") and gRPC code name ("OK", "NOT_FOUND").
  void OnRequest(absl::string_view method, absl::string_view code);
  // One finished HTTP API request: its route ("/v1/chat/completions") and HTTP status
  // (499: the client went away before the end of a streamed response).
  void OnHttpRequest(absl::string_view route, int status);
  // A stream slot taken or given back: streaming calls in flight (+1 / -1), and for an
  // authenticated tenant its own count.
  void OnStreamSlot(absl::string_view tenant, int delta) override;
  // Streaming RPCs in flight (+1 / -1).
  void OnStreamDelta(int delta);
  // Stream slots held by an authenticated tenant (+1 / -1); tenants come from the
  // tokens file, so the label is bounded.
  void OnTenantStreamDelta(absl::string_view tenant, int delta);
  // A re-read of the TLS files that found them unusable (the last good ones stay).
  void OnTlsReloadFailure();
  // The text exposition of every family (what /metrics serves).
  std::string Render() const;

  // EngineObserver
  void OnCompression(const CompressionStats& stats) override;
  void OnFirstToken(double seconds) override;
  void OnInterToken(double seconds) override;
  void OnGeneratedTokens(int64_t n) override;
  void OnSessionCreated() override;
  void OnSessionExpired() override;
  void OnSessionRejected(absl::string_view limit) override;
  void OnGauges(const EngineGauges& gauges) override;
  void OnStateWrite(double seconds, bool ok) override;
  void OnStep(double seconds, int decode_rows) override;
  void OnStateError(absl::string_view kind) override;
  void OnSessionsRestored(int64_t count) override;
  void OnStateDirWritable(bool writable) override;

 private:
  struct Impl;
  explicit Metrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;  // prometheus-cpp registry, families and exposer
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_METRICS_H_
