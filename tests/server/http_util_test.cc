// HttpListener (server/http_util.h): idle connections do not block requests (the pool
// grows), a capped pool still serves once idle peers time out, a taken port is refused
// (SO_REUSEADDR, not httplib's SO_REUSEPORT), options are validated, Stop() is
// idempotent. Waits have generous ceilings that only guard against hangs.
#include "server/http_util.h"

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <vector>

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

TEST(HttpListener, CappedPoolServesOnceIdlePeersTimeOut) {
  HttpOptions o;
  o.max_threads = 1;
  o.keep_alive_timeout = absl::Seconds(1);
  std::unique_ptr<HttpListener> l = StartHello(o);
  ASSERT_NE(l, nullptr);
  const int fd = IdleConnection(l->port());
  EXPECT_TRUE(Hello(l->port()));  // queued behind the idle peer until its 1 s keep-alive ends
  close(fd);
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
