// HttpListener (server/doors/http/http_util.h): idle connections do not block requests and hold no
// worker, a trickled head is closed at one total deadline, the gate answers before the
// body, the connection caps evict the oldest waiting peer, a taken port is refused
// (SO_REUSEADDR, not httplib's SO_REUSEPORT), options are validated, Stop() is
// idempotent. Waits have generous ceilings that only guard against hangs.
#include "server/doors/http/http_util.h"

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <poll.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace echokv::server {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;

std::unique_ptr<HttpListener> StartHello(const HttpOptions& options, int port = 0) {
  absl::StatusOr<std::unique_ptr<HttpListener>> l =
      HttpListener::Start("127.0.0.1", port, options, [](httplib::Server& s) {
        s.Get("/hello", [](const httplib::Request&, httplib::Response& res) { res.set_content("hi", "text/plain"); });
      });
  EXPECT_THAT(l, IsOk());
  return l.ok() ? std::move(*l) : nullptr;
}

// A connected TCP socket that never sends anything.
int IdleConnection(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

bool Hello(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(60);
  client.set_read_timeout(60);  // hang guard
  httplib::Result r = client.Get("/hello");
  return r && r->status == 200 && r->body == "hi";
}

TEST(HttpListener, IdleConnectionsDoNotBlockRequests) {
  HttpOptions o;
  o.max_threads = 64;
  o.keep_alive_timeout = absl::Seconds(30);  // idle peers hold their workers throughout
  std::unique_ptr<HttpListener> l = StartHello(o);
  ASSERT_NE(l, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 30; ++i) idle.push_back(IdleConnection(l->port()));
  EXPECT_TRUE(Hello(l->port()));
  for (int fd : idle) close(fd);
  l->Stop();
  l->Stop();  // idempotent
}

// Idle peers hold no worker: one worker serves a request while 20 idle connections
// (10 never sent a byte, 10 finished a request and stay open) are held.
TEST(HttpListener, IdleConnectionsHoldNoWorker) {
  HttpOptions o;
  o.max_threads = 1;
  o.keep_alive_timeout = absl::Seconds(60);
  o.header_timeout = absl::Seconds(60);
  std::unique_ptr<HttpListener> l = StartHello(o);
  ASSERT_NE(l, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 10; ++i) idle.push_back(IdleConnection(l->port()));
  for (int i = 0; i < 10; ++i) {
    const int fd = IdleConnection(l->port());
    const std::string req = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
    char buf[512];
    ASSERT_GT(recv(fd, buf, sizeof(buf), 0), 0);
    idle.push_back(fd);
  }
  const absl::Time start = absl::Now();
  EXPECT_TRUE(Hello(l->port()));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // not queued behind a 60 s keep-alive
  for (int fd : idle) close(fd);
}

// A connection from another loopback address (127.0.0.x).
int IdleConnectionFrom(int port, int last_octet) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl((127u << 24) | static_cast<uint32_t>(last_octet));
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)), 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// Reads until the peer closes (or 60 s, a hang guard); returns what came.
std::string ReadToClose(int fd) {
  std::string got;
  char buf[4096];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 60000) <= 0) break;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

// The head deadline is one total: a byte every 100 ms does not extend it.
TEST(HttpListener, TricklingHeadIsClosedAtTheHeaderDeadline) {
  HttpOptions o;
  o.header_timeout = absl::Seconds(1);
  std::unique_ptr<HttpListener> l = StartHello(o);
  ASSERT_NE(l, nullptr);
  const int fd = IdleConnection(l->port());
  const absl::Time start = absl::Now();
  std::string head = "GET /hello HTTP/1.1\r\n";
  ASSERT_GT(send(fd, head.data(), head.size(), MSG_NOSIGNAL), 0);
  bool open = true;
  while (open && absl::Now() - start < absl::Seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    open = send(fd, "x", 1, MSG_NOSIGNAL) == 1;
    pollfd p{fd, POLLIN, 0};
    if (open && poll(&p, 1, 0) > 0) open = false;  // the 408, then the close
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_EQ(ReadToClose(fd).rfind("HTTP/1.1 408", 0), 0u);
  close(fd);
  EXPECT_EQ(l->stats().header_timeouts, 1);
  EXPECT_TRUE(Hello(l->port()));
}

// A body has one total deadline too: a byte every 100 ms (each read well within the
// 2 s read_timeout) no longer holds a worker for as long as the client likes.
TEST(HttpListener, TricklingBodyIsCutAtTheBodyDeadline) {
  HttpOptions o;
  o.read_timeout = absl::Seconds(2);
  o.body_timeout = absl::Seconds(1);
  std::atomic<int> handled{0};
  absl::StatusOr<std::unique_ptr<HttpListener>> l =
      HttpListener::Start("127.0.0.1", 0, o, [&](httplib::Server& s) {
        s.Post("/p", [&](const httplib::Request& req, httplib::Response& res) {
          ++handled;
          res.set_content(std::to_string(req.body.size()), "text/plain");
        });
      });
  ASSERT_THAT(l, IsOk());
  const int fd = IdleConnection((*l)->port());
  const std::string head = "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n";
  ASSERT_EQ(send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  const absl::Time start = absl::Now();
  bool open = true;
  int sent = 0;
  while (open && sent < 1000 && absl::Now() - start < absl::Seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    open = send(fd, "x", 1, MSG_NOSIGNAL) == 1;
    sent += open ? 1 : 0;
    pollfd p{fd, POLLIN, 0};
    if (open && poll(&p, 1, 0) > 0) open = false;  // an answer or the close
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_LT(sent, 100);
  close(fd);
  EXPECT_EQ(handled.load(), 0);
  // A body sent at once is well within the deadline.
  httplib::Client client("127.0.0.1", (*l)->port());
  client.set_read_timeout(60);
  httplib::Result r = client.Post("/p", std::string(1000, 'a'), "text/plain");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "1000");
}

// The gate sees the head before the body: its answer comes with no body byte sent.
TEST(HttpListener, GateAnswersBeforeTheBody) {
  HttpOptions o;
  o.gate = [](const HttpRequestHead& h) -> std::optional<HttpEarlyReply> {
    if (h.Header("authorization") == "Bearer ok") return std::nullopt;
    return HttpEarlyReply{401, "text/plain", "no\n", {{"WWW-Authenticate", "Bearer"}}};
  };
  o.max_body_bytes = 1000;
  absl::StatusOr<std::unique_ptr<HttpListener>> l =
      HttpListener::Start("127.0.0.1", 0, o, [](httplib::Server& s) {
        s.Post("/p", [](const httplib::Request& req, httplib::Response& res) {
          res.set_content(std::to_string(req.body.size()), "text/plain");
        });
      });
  ASSERT_THAT(l, IsOk());
  auto send_head = [&](const std::string& extra, int64_t length) {
    const int fd = IdleConnection((*l)->port());
    const std::string head = "POST /p HTTP/1.1\r\nHost: x\r\n" + extra +
                             "Content-Length: " + std::to_string(length) + "\r\n\r\n";
    EXPECT_EQ(send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
    return fd;
  };
  int fd = send_head("", 1 << 30);
  EXPECT_EQ(ReadToClose(fd).rfind("HTTP/1.1 401", 0), 0u);
  close(fd);
  fd = send_head("Authorization: Bearer ok\r\n", 1001);
  EXPECT_EQ(ReadToClose(fd).rfind("HTTP/1.1 413", 0), 0u);
  close(fd);
  httplib::Client client("127.0.0.1", (*l)->port());
  client.set_read_timeout(60);
  httplib::Result r = client.Post("/p", httplib::Headers{{"Authorization", "Bearer ok"}}, std::string(1000, 'a'),
                                  "text/plain");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "1000");
  EXPECT_EQ((*l)->stats().gated, 2);
}

// A head the front and httplib could read differently never reaches httplib: two
// Content-Length values (the old front took the last: 5 passed the 1000-byte limit while
// httplib read the first, 900000) are 400 before any body byte, with the rule named.
TEST(HttpListener, AmbiguousHeadsAreRefusedBeforeTheBody) {
  HttpOptions o;
  o.max_body_bytes = 1000;
  absl::StatusOr<std::unique_ptr<HttpListener>> l =
      HttpListener::Start("127.0.0.1", 0, o, [](httplib::Server& s) {
        s.Post("/p", [](const httplib::Request& req, httplib::Response& res) {
          res.set_content(std::to_string(req.body.size()), "text/plain");
        });
      });
  ASSERT_THAT(l, IsOk());
  for (const std::string& extra : {std::string("Content-Length: 900000\r\nContent-Length: 5\r\n"),
                                   std::string("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"),
                                   std::string("Content-Length : 5\r\n")}) {
    const int fd = IdleConnection((*l)->port());
    const std::string head = "POST /p HTTP/1.1\r\nHost: x\r\n" + extra + "\r\n";
    EXPECT_EQ(send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
    const std::string reply = ReadToClose(fd);
    EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
    EXPECT_NE(reply.find("malformed request head"), std::string::npos) << reply;
    close(fd);
  }
  EXPECT_EQ((*l)->stats().gated, 3);
}

// At the per-peer cap the oldest connection still waiting for its head gives way, so
// a client that sends its request at once always gets in; at the total cap likewise.
TEST(HttpListener, ConnectionCapsEvictTheOldestWaitingPeer) {
  HttpOptions o;
  o.max_connections_per_peer = 8;
  o.max_connections = 12;
  o.header_timeout = absl::Seconds(60);
  std::unique_ptr<HttpListener> l = StartHello(o);
  ASSERT_NE(l, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(IdleConnection(l->port()));
  EXPECT_TRUE(Hello(l->port()));
  // Poll until the front has seen every connection (accepts are asynchronous).
  for (int i = 0; i < 600 && l->stats().evicted < 13; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const HttpFrontStats s = l->stats();
  EXPECT_LE(s.open, 8);
  EXPECT_GE(s.evicted, 13);  // 21 connections from one peer, at most 8 kept
  EXPECT_EQ(ReadToClose(idle[0]), "");  // the oldest went first
  for (int fd : idle) close(fd);
}

// The total cap counts every peer: connections from 127.0.0.2..5 make room by closing
// the oldest waiting one, whoever it belongs to, and a request still gets in.
TEST(HttpListener, TotalCapEvictsAcrossPeers) {
  HttpOptions o;
  o.max_connections = 6;
  o.max_connections_per_peer = 100;
  o.header_timeout = absl::Seconds(60);
  std::unique_ptr<HttpListener> l = StartHello(o);
  ASSERT_NE(l, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 12; ++i) idle.push_back(IdleConnectionFrom(l->port(), 2 + i % 4));
  EXPECT_TRUE(Hello(l->port()));
  for (int i = 0; i < 600 && l->stats().evicted < 7; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_GE(l->stats().evicted, 7);  // 13 connections, at most 6 open
  EXPECT_LE(l->stats().open, 6);
  for (int fd : idle) close(fd);
}

TEST(HttpListener, TakenPortIsRefused) {
  std::unique_ptr<HttpListener> first = StartHello(HttpOptions{});
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<HttpListener>> second =
      HttpListener::Start("127.0.0.1", first->port(), HttpOptions{}, [](httplib::Server&) {});
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kUnavailable, "cannot listen"));
  EXPECT_TRUE(Hello(first->port()));
}

TEST(HttpListener, OptionsAreValidated) {
  auto start = [](HttpOptions o, int port = 0) {
    return HttpListener::Start("127.0.0.1", port, o, [](httplib::Server&) {}).status();
  };
  HttpOptions o;
  o.max_threads = 0;
  EXPECT_THAT(start(o), StatusIs(absl::StatusCode::kInvalidArgument, "threads"));
  o = HttpOptions{};
  o.keep_alive_timeout = absl::Milliseconds(500);
  EXPECT_THAT(start(o), StatusIs(absl::StatusCode::kInvalidArgument, "keep_alive_timeout"));
  o = HttpOptions{};
  o.read_timeout = absl::ZeroDuration();
  EXPECT_THAT(start(o), StatusIs(absl::StatusCode::kInvalidArgument, "read_timeout"));
  o = HttpOptions{};
  o.body_timeout = absl::ZeroDuration();
  EXPECT_THAT(start(o), StatusIs(absl::StatusCode::kInvalidArgument, "body_timeout"));
  o = HttpOptions{};
  o.header_timeout = absl::ZeroDuration();
  EXPECT_THAT(start(o), StatusIs(absl::StatusCode::kInvalidArgument, "header_timeout"));
  o = HttpOptions{};
  o.max_connections_per_peer = 0;
  EXPECT_THAT(start(o), StatusIs(absl::StatusCode::kInvalidArgument, "max_connections_per_peer"));
  EXPECT_THAT(start(HttpOptions{}, 70000), StatusIs(absl::StatusCode::kInvalidArgument, "port"));
}

TEST(NormalizeHttpHost, Brackets) {
  EXPECT_EQ(NormalizeHttpHost("[::]"), "::");
  EXPECT_EQ(NormalizeHttpHost("[::1]"), "::1");
  EXPECT_EQ(NormalizeHttpHost("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(NormalizeHttpHost(""), "0.0.0.0");
}

}  // namespace
}  // namespace echokv::server
