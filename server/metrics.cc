#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace echokv::server {
namespace {

prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

// A minimal HTTP/1.0 endpoint for GET /metrics on its own thread. prometheus-cpp's
// Exposer (civetweb) cannot be used in this process: civetweb starts its threads with
// 100 KiB stacks, smaller than the static TLS that LibTorch and friends need, so
// pthread_create fails ("Cannot create threads"). One connection at a time is
// plenty for a scraper.
class HttpEndpoint {
 public:
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Listen(const std::string& address,
                                                              std::function<std::string()> render) {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) return absl::InvalidArgumentError("metrics address must be host:port");
    const std::string host = address.substr(0, colon);
    const int port = std::atoi(address.c_str() + colon + 1);
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::UnavailableError("metrics: socket() failed");
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (host.empty() || inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
      if (!host.empty() && host != "0.0.0.0" && host != "localhost") {
        close(fd);
        return absl::InvalidArgumentError(absl::StrCat("metrics: not an IPv4 address: ", host));
      }
      addr.sin_addr.s_addr = host == "localhost" ? htonl(INADDR_LOOPBACK) : htonl(INADDR_ANY);
    }
    socklen_t len = sizeof(addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      const std::string err = std::strerror(errno);
      close(fd);
      return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", address, ": ", err));
    }
    auto ep = std::unique_ptr<HttpEndpoint>(new HttpEndpoint(fd, ntohs(addr.sin_port), std::move(render)));
    ep->thread_ = std::thread([raw = ep.get()] { raw->Serve(); });
    return ep;
  }
  ~HttpEndpoint() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    close(fd_);
  }
  int port() const { return port_; }

 private:
  HttpEndpoint(int fd, int port, std::function<std::string()> render)
      : fd_(fd), port_(port), render_(std::move(render)) {}

  void Serve() {
    while (!stop_.load()) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      timeval tv{2, 0};
      setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      std::string req;
      char buf[2048];
      while (req.find("\r\n\r\n") == std::string::npos && req.size() < 16384) {
        const ssize_t n = recv(c, buf, sizeof(buf), 0);
        if (n <= 0) break;
        req.append(buf, static_cast<size_t>(n));
      }
      std::string status = "200 OK";
      std::string body;
      if (req.rfind("GET /metrics ", 0) == 0 || req.rfind("GET /metrics?", 0) == 0) {
        body = render_();
      } else {
        status = "404 Not Found";
        body = "only GET /metrics is served here\n";
      }
      const std::string head = absl::StrCat("HTTP/1.0 ", status,
                                            "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                                            "Content-Length: ", body.size(), "\r\nConnection: close\r\n\r\n");
      const std::string out = head + body;
      size_t sent = 0;
      while (sent < out.size()) {
        const ssize_t n = send(c, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
      }
      close(c);
    }
  }

  int fd_;                                  // listening socket
  int port_;                                // bound port
  std::function<std::string()> render_;     // the exposition text
  std::atomic<bool> stop_{false};           // set by the destructor
  std::thread thread_;                      // runs Serve()
};

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

  // Unlabelled series, created once.
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
  prometheus::Counter& prompt_tokens_c = prompt_tokens.Add({});
  prometheus::Counter& generated_tokens_c = generated_tokens.Add({});
  prometheus::Gauge& active_sessions_g = active_sessions.Add({});
  prometheus::Counter& created_sessions_c = created_sessions.Add({});
  prometheus::Counter& expired_sessions_c = expired_sessions.Add({});
  prometheus::Gauge& queue_depth_g = queue_depth.Add({});
  prometheus::Gauge& active_generations_g = active_generations.Add({});
  prometheus::Gauge& streams_g = streams.Add({});
  std::unique_ptr<HttpEndpoint> endpoint;  // null when not serving; destroyed first
};

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Metrics::~Metrics() = default;

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& bind_address) {
  auto impl = std::make_unique<Impl>();
  Metrics* metrics = new Metrics(std::move(impl));
  std::unique_ptr<Metrics> owned(metrics);
  if (!bind_address.empty()) {
    ECHOKV_ASSIGN_OR_RETURN(metrics->impl_->endpoint,
                            HttpEndpoint::Listen(bind_address, [metrics] { return metrics->Render(); }));
  }
  return owned;
}

int Metrics::port() const {
  return impl_->endpoint == nullptr ? 0 : impl_->endpoint->port();
}

void Metrics::OnRequest(absl::string_view method, absl::string_view code) {
  impl_->requests.Add({{"method", std::string(method)}, {"code", std::string(code)}}).Increment();
}

void Metrics::OnStreamDelta(int delta) { impl_->streams_g.Increment(delta); }

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
  impl_->prefill_h.Observe(stats.prefill_seconds);
  impl_->prompt_tokens_c.Increment(static_cast<double>(stats.prompt_tokens));
  impl_->evicted_bytes_c.Increment(static_cast<double>(stats.evicted_kv_bytes));
}

void Metrics::OnFirstToken(double seconds) { impl_->ttft_h.Observe(seconds); }
void Metrics::OnInterToken(double seconds) { impl_->itl_h.Observe(seconds); }
void Metrics::OnGeneratedTokens(int64_t n) { impl_->generated_tokens_c.Increment(static_cast<double>(n)); }
void Metrics::OnSessionCreated() { impl_->created_sessions_c.Increment(); }
void Metrics::OnSessionExpired() { impl_->expired_sessions_c.Increment(); }
void Metrics::OnSessionRejected(absl::string_view limit) {
  impl_->rejected_sessions.Add({{"limit", std::string(limit)}}).Increment();
}

void Metrics::OnStateWrite(double seconds, bool ok) {
  impl_->state_write.Add({{"result", ok ? "ok" : "error"}}, SecondsBuckets()).Observe(seconds);
}
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
