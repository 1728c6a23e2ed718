// HTTP plumbing shared by echokv-server's two HTTP listeners (the OpenAI-compatible
// API, server/doors/http/openai_server.h, and Prometheus /metrics, server/metrics.h), both on
// cpp-httplib (Debian libcpp-httplib-dev) for parsing, routing and writing responses,
// behind a front of our own (docs/SECURITY.md, "Limits on an unauthenticated HTTP
// client"):
//
//   - one poll thread accepts every connection and reads each request's line and
//     headers itself, non-blocking, against a deadline for the whole head
//     (`header_timeout`, counted from the head's first byte or from accept; a byte a
//     second does not restart it) and a size cap (`max_header_bytes`, 431 beyond);
//     a connection holds no worker until its head is complete, and an idle keep-alive
//     connection goes back to the poll thread (closed after `keep_alive_timeout`), so
//     slow or idle peers cannot occupy workers (slowloris, idle scrapers);
//   - `gate` sees the complete head before any byte of the body is read and may answer
//     it at once (authentication: 401 without reading a 17 MiB body); a declared body
//     over `max_body_bytes` gets 413 there too; a refused connection is closed after
//     a short linger that discards what the client still sends (so it sees the answer);
//     the body then has one total deadline of its own (`body_timeout`);
//   - connections are capped per peer address and in total; at a cap the oldest
//     connection of that peer (then of anyone) still waiting for its head is dropped
//     for the new one, else the new one is closed, so a trickling peer can never shut
//     out a client that sends its request at once;
//   - complete requests run on an elastic worker pool (grows on demand up to
//     `max_threads`, shrinks when idle; beyond the cap, requests queue) with httplib's
//     request processing; bodies and writes keep per-operation timeouts.
//
//   ECHOKV_ASSIGN_OR_RETURN(auto listener, HttpListener::Start("0.0.0.0", 0, HttpOptions{},
//       [&](httplib::Server& s) { s.Get("/metrics", handler); }));
//   int port = listener->port();
//   listener->Stop();  // or the destructor
#ifndef ECHOKV_SERVER_DOORS_HTTP_HTTP_UTIL_H_
#define ECHOKV_SERVER_DOORS_HTTP_HTTP_UTIL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/doors/http/http_head.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace echokv::server {

// An answer the front writes itself (then closes the connection).
struct HttpEarlyReply {
  int status = 400;
  std::string content_type = "text/plain";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

struct HttpOptions {
  // Worker threads at most (one per request being served or stream being written;
  // created on demand, ended after idling `thread_idle`). Requests beyond wait.
  int max_threads = 64;
  // The request line and headers must arrive whole within this of their first byte
  // (of accept for a new connection): one total, not per read.
  absl::Duration header_timeout = absl::Seconds(10);
  // Largest request line + headers; 431 beyond.
  int max_header_bytes = 32 << 10;
  // Open connections at most, in total and from one peer address (accepted, waiting
  // for a head, being served, idle keep-alive, lingering after a refusal).
  int max_connections = 512;
  int max_connections_per_peer = 256;
  // Reading a body may stall this long between packets (heads: header_timeout).
  absl::Duration read_timeout = absl::Seconds(10);
  // A request's body must arrive whole within this of its head (one total, like the
  // head's; then the request fails and the connection is closed). Only callers the
  // gate let through reach their body.
  absl::Duration body_timeout = absl::Seconds(120);
  // A write may wait this long for the peer to take data (a stalled streaming reader
  // is dropped after it).
  absl::Duration write_timeout = absl::Seconds(10);
  // An idle keep-alive connection is closed after this.
  absl::Duration keep_alive_timeout = absl::Seconds(5);
  // Largest request body; a larger Content-Length gets 413 before the body is read.
  int64_t max_body_bytes = int64_t{1} << 20;
  // SO_SNDBUF of every connection (accepted sockets inherit the listener's); 0 = the
  // kernel's autotuning (up to net.ipv4.tcp_wmem's max). A small buffer makes a stalled
  // streaming reader hold the engine back sooner (EngineLimits::max_stream_backlog).
  int send_buffer_bytes = 0;
  // Extra workers (above 1) exit after idling this long.
  absl::Duration thread_idle = absl::Seconds(30);
  // Runs on the poll thread for every complete head, before the body is read: an
  // answer refuses the request (the body is never read), nullopt lets it through.
  // Must be quick (no I/O, no engine calls). Empty: everything passes.
  std::function<std::optional<HttpEarlyReply>(const HttpRequestHead&)> gate;
  absl::Status Validate() const;  // names the bad field
};

// "[::]" -> "::", "[::1]" -> "::1"; other hosts unchanged ("" -> "0.0.0.0").
std::string NormalizeHttpHost(const std::string& host);

// Counters of one listener (tests, logs).
struct HttpFrontStats {
  int open = 0;                 // connections open now
  int64_t header_timeouts = 0;  // closed: head not complete within header_timeout
  int64_t evicted = 0;          // closed at a connection cap for a newer one
  int64_t refused = 0;          // closed at once at a connection cap
  int64_t gated = 0;            // answered by the gate (or 413/431/400) before the body
};

// One httplib::Server behind the front described above.
class HttpListener {
 public:
  // Builds a server with `options`, lets `routes` register its handlers, binds
  // host:port (0 = a free port; listen backlog 128) and starts serving.
  // UNAVAILABLE when the address cannot be bound; INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<HttpListener>> Start(const std::string& host, int port,
                                                             const HttpOptions& options,
                                                             const std::function<void(httplib::Server&)>& routes);
  ~HttpListener();  // Stop()
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  int port() const;
  HttpFrontStats stats() const;
  // Closes the listening socket and every connection that is not being served, lets
  // every request in progress finish (a chunked stream's provider should end itself:
  // OpenAiServer writes an error event and [DONE]), then joins the workers (handlers
  // blocked on the engine must be released first, e.g. by Engine::Shutdown).
  // Idempotent.
  void Stop();

  class Impl;

 private:
  explicit HttpListener(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_DOORS_HTTP_HTTP_UTIL_H_
