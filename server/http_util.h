// HTTP plumbing shared by echokv-server's two HTTP listeners (the OpenAI-compatible
// API, server/openai_server.h, and Prometheus /metrics, server/metrics.h), both on
// cpp-httplib (Debian libcpp-httplib-dev):
//
//   - an elastic thread pool: a connection holds a worker for its whole life (httplib
//     is thread-per-connection), so a fixed pool lets idle keep-alive connections
//     starve real requests (the old /metrics thread served one connection at a time:
//     each idle connection stalled scrapes for 2 s). The pool grows on demand up to
//     `max_threads` and shrinks back when idle; beyond the cap, connections queue.
//   - read / write / keep-alive timeouts, so an idle or stalled peer lets go of its
//     worker within a bound;
//   - binding "host:port" with port 0 = any free port, "[::]" / "::" / IPv4 hosts.
//
//   ECHOKV_ASSIGN_OR_RETURN(auto listener, HttpListener::Start("0.0.0.0", 0, HttpOptions{},
//       [&](httplib::Server& s) { s.Get("/metrics", handler); }));
//   int port = listener->port();
//   listener->Stop();  // or the destructor
#ifndef ECHOKV_SERVER_HTTP_UTIL_H_
#define ECHOKV_SERVER_HTTP_UTIL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace echokv::server {

struct HttpOptions {
  // Worker threads at most (one per open connection; created on demand, ended after
  // idling `thread_idle`). Connections beyond the cap wait in a queue.
  int max_threads = 64;
  // Reading one request (line, headers, body) may stall this long between packets.
  absl::Duration read_timeout = absl::Seconds(10);
  // A write may wait this long for the peer to take data (a stalled streaming reader
  // is dropped after it).
  absl::Duration write_timeout = absl::Seconds(10);
  // An idle keep-alive connection is closed after this (whole seconds, >= 1: httplib's
  // granularity).
  absl::Duration keep_alive_timeout = absl::Seconds(5);
  // Largest request body; larger ones get 413 before the body is read.
  int64_t max_body_bytes = int64_t{1} << 20;
  // SO_SNDBUF of every connection (accepted sockets inherit the listener's); 0 = the
  // kernel's autotuning (up to net.ipv4.tcp_wmem's max). A small buffer makes a stalled
  // streaming reader hold the engine back sooner (EngineLimits::max_stream_backlog).
  int send_buffer_bytes = 0;
  // Extra workers (above 1) exit after idling this long.
  absl::Duration thread_idle = absl::Seconds(30);
  absl::Status Validate() const;  // names the bad field
};

// "[::]" -> "::", "[::1]" -> "::1"; other hosts unchanged ("" -> "0.0.0.0").
std::string NormalizeHttpHost(const std::string& host);

// One httplib::Server listening on its own accept thread.
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

  int port() const { return port_; }
  // Closes the listening socket, ends chunked streams at their next step and joins
  // every worker (handlers blocked on the engine must be released first, e.g. by
  // Engine::Shutdown; an idle keep-alive connection ends within keep_alive_timeout).
  // Idempotent.
  void Stop();

 private:
  HttpListener(std::unique_ptr<httplib::Server> server, int port);

  std::unique_ptr<httplib::Server> server_;  // routes and sockets
  int port_;                                  // the bound port
  std::thread thread_;                        // runs listen_after_bind()
  std::atomic<bool> stopped_{false};          // Stop() ran
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_HTTP_UTIL_H_
