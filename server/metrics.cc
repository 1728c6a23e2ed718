#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <httplib.h>

#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace echokv::server {
namespace {

prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

// An engine step: ~0.1 ms for a tiny model's single stream, tens of ms for a batch of a
// real one, seconds for a long prefill chunk.
prometheus::Histogram::BucketBoundaries StepBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
}

}  // namespace

struct Metrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();

  prometheus::Family<prometheus::Gauge>& retained_bytes = prometheus::BuildGauge()
      .Name("echokv_session_retained_kv_bytes")
      .Help("KV bytes held by the compact caches of all live sessions")
      .Register(*registry);
  prometheus::Family<prometheus::Gauge>& full_bytes = prometheus::BuildGauge()
      .Name("echokv_session_full_kv_bytes")
      .Help("KV bytes full (uncompressed) caches of the live sessions would hold")
      .Register(*registry);
  prometheus::Family<prometheus::Gauge>& saved_bytes = prometheus::BuildGauge()
      .Name("echokv_kv_bytes_saved")
      .Help("Full-equivalent minus retained KV bytes of the live sessions")
      .Register(*registry);
  prometheus::Family<prometheus::Counter>& evicted_bytes = prometheus::BuildCounter()
      .Name("echokv_kv_evicted_bytes_total")
      .Help("KV bytes dropped by compressions")
      .Register(*registry);
  prometheus::Family<prometheus::Histogram>& lookahead = prometheus::BuildHistogram()
      .Name("echokv_lookahead_seconds")
      .Help("Total lookahead time per compression (bootstrap + round1 + repair + round2) "
            "of lookahead policies that evicted")
      .Register(*registry);
  prometheus::Family<prometheus::Histogram>& phase = prometheus::BuildHistogram()
      .Name("echokv_compression_phase_seconds")
      .Help("Seconds per compression phase")
      .Register(*registry);
  prometheus::Family<prometheus::Histogram>& ratio = prometheus::BuildHistogram()
      .Name("echokv_compression_ratio")
      .Help("Retained / full KV bytes of each compression result")
      .Register(*registry);
  prometheus::Family<prometheus::Histogram>& retained_mass = prometheus::BuildHistogram()
      .Name("echokv_retained_attention_mass")
      .Help("Share of the probe queries' attention mass on the kept entries (mean over layers and KV groups) "
            "of each compression that evicted and measured it")
      .Register(*registry);
  prometheus::Family<prometheus::Histogram>& prefill = prometheus::BuildHistogram()
      .Name("echokv_prefill_seconds")
      .Help("Prefill seconds per compression request")
      .Register(*registry);
  prometheus::Family<prometheus::Histogram>& ttft = prometheus::BuildHistogram()
      .Name("echokv_time_to_first_token_seconds")
      .Help("Generate admission to first token")
      .Register(*registry);
  prometheus::Family<prometheus::Histogram>& itl = prometheus::BuildHistogram()
      .Name("echokv_inter_token_latency_seconds")
      .Help("Seconds between two tokens of one stream")
      .Register(*registry);
  prometheus::Family<prometheus::Histogram>& step = prometheus::BuildHistogram()
      .Name("echokv_engine_step_seconds")
      .Help("Wall time of one engine step that ran work: one batched decode of every ready stream and "
            "lookahead row, prefill slices, policy phases")
      .Register(*registry);
  prometheus::Family<prometheus::Histogram>& step_rows = prometheus::BuildHistogram()
      .Name("echokv_engine_step_decode_rows")
      .Help("Rows of one engine step's batched decode (streams and lookahead rows; 0 when the step only "
            "prefilled, ran a policy phase or sampled new streams' first tokens)")
      .Register(*registry);
  prometheus::Family<prometheus::Counter>& prompt_tokens = prometheus::BuildCounter()
      .Name("echokv_prompt_tokens_total")
      .Help("Tokens prefilled")
      .Register(*registry);
  prometheus::Family<prometheus::Counter>& generated_tokens = prometheus::BuildCounter()
      .Name("echokv_generated_tokens_total")
      .Help("Tokens generated")
      .Register(*registry);
  prometheus::Family<prometheus::Gauge>& active_sessions = prometheus::BuildGauge()
      .Name("echokv_sessions_active")
      .Help("Live sessions")
      .Register(*registry);
  prometheus::Family<prometheus::Counter>& created_sessions = prometheus::BuildCounter()
      .Name("echokv_sessions_created_total")
      .Help("Sessions created (including forks)")
      .Register(*registry);
  prometheus::Family<prometheus::Counter>& expired_sessions = prometheus::BuildCounter()
      .Name("echokv_sessions_expired_total")
      .Help("Sessions removed after idling beyond their TTL")
      .Register(*registry);
  prometheus::Family<prometheus::Counter>& rejected_sessions = prometheus::BuildCounter()
      .Name("echokv_sessions_rejected_total")
      .Help("Session admissions refused, by the limit that refused them")
      .Register(*registry);
  prometheus::Family<prometheus::Counter>& requests = prometheus::BuildCounter()
      .Name("echokv_requests_total")
      .Help("Finished RPCs by method and gRPC status code")
      .Register(*registry);
  prometheus::Family<prometheus::Counter>& http_requests = prometheus::BuildCounter()
      .Name("echokv_http_requests_total")
      .Help("Finished HTTP API requests by route and HTTP status (499: the client left mid-stream)")
      .Register(*registry);
  prometheus::Family<prometheus::Gauge>& queue_depth = prometheus::BuildGauge()
      .Name("echokv_engine_queue_depth")
      .Help("Tasks and prefill jobs waiting for the engine thread")
      .Register(*registry);
  prometheus::Family<prometheus::Gauge>& active_generations = prometheus::BuildGauge()
      .Name("echokv_active_generations")
      .Help("Generate streams being decoded")
      .Register(*registry);
  prometheus::Family<prometheus::Gauge>& streams = prometheus::BuildGauge()
      .Name("echokv_streams_in_flight")
      .Help("Streaming RPCs (and Compress) in flight")
      .Register(*registry);
  // Tenants come from the tokens file only (bounded); none with --insecure.
  prometheus::Family<prometheus::Gauge>& tenant_streams = prometheus::BuildGauge()
      .Name("echokv_tenant_streams_in_flight")
      .Help("Stream slots held per tenant (streaming calls, Compress and HTTP completions)")
      .Register(*registry);

  prometheus::Family<prometheus::Counter>& tls_reload_failures = prometheus::BuildCounter()
      .Name("echokv_tls_reload_failures_total")
      .Help("Re-reads of the TLS files that found them unusable (empty, damaged, key not of the certificate); "
            "the last good certificate and key stay in use")
      .Register(*registry);
  prometheus::Counter& tls_reload_failures_c = tls_reload_failures.Add({});

  prometheus::Family<prometheus::Gauge>& hot_bytes = prometheus::BuildGauge()
      .Name("echokv_hot_kv_bytes")
      .Help("Hot-tier (compact cache) KV bytes of all sessions: what max_kv_bytes counts")
      .Register(*registry);
  prometheus::Family<prometheus::Gauge>& cold_bytes = prometheus::BuildGauge()
      .Name("echokv_cold_kv_bytes")
      .Help("Cold-tier (exact history) KV bytes of tiered sessions, by where they are held")
      .Register(*registry);
  prometheus::Family<prometheus::Histogram>& state_write = prometheus::BuildHistogram()
      .Name("echokv_state_write_seconds")
      .Help("Durable state writes (--state_dir): seconds per write, fsyncs included, by result")
      .Register(*registry);
  prometheus::Family<prometheus::Counter>& restored = prometheus::BuildCounter()
      .Name("echokv_sessions_restored_total")
      .Help("Sessions restored from --state_dir at start")
      .Register(*registry);
  prometheus::Family<prometheus::Counter>& state_errors = prometheus::BuildCounter()
      .Name("echokv_state_errors_total")
      .Help("Saved sessions refused (at start or when loaded), by kind")
      .Register(*registry);

  prometheus::Family<prometheus::Counter>& state_write_failures = prometheus::BuildCounter()
      .Name("echokv_state_write_failures_total")
      .Help("Durable state writes (--state_dir: turns, updates, imports, deletes) that failed; the client got "
            "the error and nothing changed")
      .Register(*registry);
  prometheus::Family<prometheus::Gauge>& state_writable = prometheus::BuildGauge()
      .Name("echokv_state_dir_writable")
      .Help("1 while --state_dir takes new files (its write probe passes or only finds the disk full), 0 while "
            "it cannot be written (health NOT_SERVING)")
      .Register(*registry);

  // Unlabelled series, created once.
  prometheus::Counter& state_write_failures_c = state_write_failures.Add({});
  prometheus::Gauge& state_writable_g = state_writable.Add({});
  prometheus::Gauge& hot_bytes_g = hot_bytes.Add({});
  prometheus::Gauge& cold_memory_g = cold_bytes.Add({{"where", "memory"}});
  prometheus::Gauge& cold_total_g = cold_bytes.Add({{"where", "all"}});
  prometheus::Counter& restored_c = restored.Add({});
  prometheus::Gauge& retained_bytes_g = retained_bytes.Add({});
  prometheus::Gauge& full_bytes_g = full_bytes.Add({});
  prometheus::Gauge& saved_bytes_g = saved_bytes.Add({});
  prometheus::Counter& evicted_bytes_c = evicted_bytes.Add({});
  prometheus::Histogram& prefill_h = prefill.Add({}, SecondsBuckets());
  prometheus::Histogram& ttft_h = ttft.Add({}, SecondsBuckets());
  prometheus::Histogram& itl_h = itl.Add({}, SecondsBuckets());
  prometheus::Histogram& step_h = step.Add({}, StepBuckets());
  prometheus::Histogram& step_rows_h =
      step_rows.Add({}, prometheus::Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 32, 64, 128, 256});
  prometheus::Counter& prompt_tokens_c = prompt_tokens.Add({});
  prometheus::Counter& generated_tokens_c = generated_tokens.Add({});
  prometheus::Gauge& active_sessions_g = active_sessions.Add({});
  prometheus::Counter& created_sessions_c = created_sessions.Add({});
  prometheus::Counter& expired_sessions_c = expired_sessions.Add({});
  prometheus::Gauge& queue_depth_g = queue_depth.Add({});
  prometheus::Gauge& active_generations_g = active_generations.Add({});
  prometheus::Gauge& streams_g = streams.Add({});
  std::unique_ptr<HttpListener> endpoint;  // null when not serving; destroyed first
};

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Metrics::~Metrics() = default;

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& bind_address,
                                                         const HttpOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->state_writable_g.Set(1);  // until a state dir's probe says otherwise
  Metrics* metrics = new Metrics(std::move(impl));
  std::unique_ptr<Metrics> owned(metrics);
  if (!bind_address.empty()) {
    const size_t colon = bind_address.rfind(':');
    int port = -1;
    if (colon == std::string::npos || !absl::SimpleAtoi(bind_address.substr(colon + 1), &port)) {
      return absl::InvalidArgumentError(absl::StrCat("metrics address must be host:port, not '", bind_address, "'"));
    }
    // Only GET /metrics is served: a request with a body is refused before it is read.
    HttpOptions http = options;
    http.gate = [](const HttpRequestHead& head) -> std::optional<HttpEarlyReply> {
      if (head.content_length <= 0 && !head.chunked) return std::nullopt;
      return HttpEarlyReply{413, "text/plain", "only GET /metrics is served here (no request body)\n", {}};
    };
    absl::StatusOr<std::unique_ptr<HttpListener>> listener = HttpListener::Start(
        bind_address.substr(0, colon), port, http, [metrics](httplib::Server& server) {
          server.Get("/metrics", [metrics](const httplib::Request&, httplib::Response& res) {
            res.set_content(metrics->Render(), "text/plain; version=0.0.4; charset=utf-8");
          });
          server.set_error_handler([](const httplib::Request&, httplib::Response& res) {
            if (res.status == 404) res.set_content("only GET /metrics is served here\n", "text/plain");
          });
        });
    if (!listener.ok()) {
      return absl::Status(listener.status().code(), absl::StrCat("metrics: ", listener.status().message()));
    }
    metrics->impl_->endpoint = std::move(*listener);
  }
  return owned;
}

int Metrics::port() const {
  return impl_->endpoint == nullptr ? 0 : impl_->endpoint->port();
}

void Metrics::OnRequest(absl::string_view method, absl::string_view code) {
  impl_->requests.Add({{"method", std::string(method)}, {"code", std::string(code)}}).Increment();
}

void Metrics::OnHttpRequest(absl::string_view route, int status) {
  impl_->http_requests.Add({{"route", std::string(route)}, {"code", std::to_string(status)}}).Increment();
}

void Metrics::OnStreamDelta(int delta) { impl_->streams_g.Increment(delta); }

void Metrics::OnStreamSlot(absl::string_view tenant, int delta) {
  OnStreamDelta(delta);
  if (!tenant.empty()) OnTenantStreamDelta(tenant, delta);
}

void Metrics::OnTenantStreamDelta(absl::string_view tenant, int delta) {
  impl_->tenant_streams.Add({{"tenant", std::string(tenant)}}).Increment(delta);
}

void Metrics::OnTlsReloadFailure() { impl_->tls_reload_failures_c.Increment(); }

std::string Metrics::Render() const {
  prometheus::TextSerializer serializer;
  return serializer.Serialize(impl_->registry->Collect());
}

void Metrics::OnCompression(const CompressionStats& stats) {
  for (const compression::PhaseTime& p : stats.phases) {
    impl_->phase.Add({{"policy", stats.policy}, {"phase", p.phase}}, SecondsBuckets()).Observe(p.seconds);
  }
  if (stats.lookahead_policy && stats.evicted) {
    impl_->lookahead.Add({{"policy", stats.policy}}, SecondsBuckets()).Observe(stats.lookahead_seconds);
  }
  impl_->ratio
      .Add({{"policy", stats.policy}},
           prometheus::Histogram::BucketBoundaries{0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0})
      .Observe(stats.ratio);
  if (stats.evicted && stats.retained_mass >= 0) {
    impl_->retained_mass
        .Add({{"policy", stats.policy}},
             prometheus::Histogram::BucketBoundaries{0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 1.0})
        .Observe(stats.retained_mass);
  }
  impl_->prefill_h.Observe(stats.prefill_seconds);
  impl_->prompt_tokens_c.Increment(static_cast<double>(stats.prompt_tokens));
  impl_->evicted_bytes_c.Increment(static_cast<double>(stats.evicted_kv_bytes));
}

void Metrics::OnFirstToken(double seconds) { impl_->ttft_h.Observe(seconds); }
void Metrics::OnInterToken(double seconds) { impl_->itl_h.Observe(seconds); }
void Metrics::OnStep(double seconds, int decode_rows) {
  impl_->step_h.Observe(seconds);
  impl_->step_rows_h.Observe(decode_rows);
}
void Metrics::OnGeneratedTokens(int64_t n) { impl_->generated_tokens_c.Increment(static_cast<double>(n)); }
void Metrics::OnSessionCreated() { impl_->created_sessions_c.Increment(); }
void Metrics::OnSessionExpired() { impl_->expired_sessions_c.Increment(); }
void Metrics::OnSessionRejected(absl::string_view limit) {
  impl_->rejected_sessions.Add({{"limit", std::string(limit)}}).Increment();
}

void Metrics::OnStateWrite(double seconds, bool ok) {
  impl_->state_write.Add({{"result", ok ? "ok" : "error"}}, SecondsBuckets()).Observe(seconds);
  if (!ok) impl_->state_write_failures_c.Increment();
}
void Metrics::OnStateDirWritable(bool writable) { impl_->state_writable_g.Set(writable ? 1 : 0); }
void Metrics::OnStateError(absl::string_view kind) {
  impl_->state_errors.Add({{"kind", std::string(kind)}}).Increment();
}
void Metrics::OnSessionsRestored(int64_t count) { impl_->restored_c.Increment(static_cast<double>(count)); }

void Metrics::OnGauges(const EngineGauges& g) {
  impl_->hot_bytes_g.Set(static_cast<double>(g.retained_kv_bytes));
  impl_->cold_memory_g.Set(static_cast<double>(g.cold_memory_bytes));
  impl_->cold_total_g.Set(static_cast<double>(g.cold_kv_bytes));
  impl_->retained_bytes_g.Set(static_cast<double>(g.retained_kv_bytes));
  impl_->full_bytes_g.Set(static_cast<double>(g.full_kv_bytes));
  impl_->saved_bytes_g.Set(static_cast<double>(g.full_kv_bytes - g.retained_kv_bytes));
  impl_->active_sessions_g.Set(g.live_sessions);
  impl_->queue_depth_g.Set(g.queue_depth);
  impl_->active_generations_g.Set(g.active_generations);
}

}  // namespace echokv::server
