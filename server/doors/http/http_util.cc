#include "server/doors/http/http_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace echokv::server {
namespace {

// A refused connection's answer is followed by this long of reading and discarding
// what the client still sends, so it reads the answer instead of a reset.
constexpr absl::Duration kLinger = absl::Seconds(2);
constexpr size_t kReadChunk = 16 << 10;

// A worker pool whose workers are started on demand (a queued job and no idle worker)
// up to `max_threads`, and exit after idling `idle` (one always stays).
class ElasticPool {
 public:
  ElasticPool(int max_threads, absl::Duration idle)
      : max_threads_(max_threads), idle_(absl::ToChronoMilliseconds(idle)) {}
  ~ElasticPool() { Shutdown(); }

  void Enqueue(std::function<void()> fn) {
    std::unique_lock<std::mutex> lock(mu_);
    ReapLocked();
    jobs_.push_back(std::move(fn));
    if (static_cast<int>(jobs_.size()) > waiting_ && threads_ < max_threads_) {
      ++threads_;
      auto it = workers_.emplace(workers_.end());
      *it = std::thread([this, it] { Work(it); });  // waits for mu_ before touching `it`
    } else {
      cv_.notify_one();
    }
  }

  // Runs every queued job, then joins the workers.
  void Shutdown() {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (shut_) return;
      shut_ = true;
      cv_.notify_all();
    }
    // No Enqueue after Shutdown (the front has stopped): the list is ours.
    for (std::thread& t : workers_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  using Worker = std::list<std::thread>::iterator;

  void Work(Worker self) {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (!jobs_.empty()) {
        std::function<void()> fn = std::move(jobs_.front());
        jobs_.pop_front();
        lock.unlock();
        fn();
        fn = nullptr;
        lock.lock();
        continue;
      }
      if (shut_) break;
      ++waiting_;
      const bool woke = cv_.wait_for(lock, idle_, [this] { return !jobs_.empty() || shut_; });
      --waiting_;
      if (!woke && threads_ > 1) break;
    }
    --threads_;
    if (!shut_) exited_.push_back(self);  // joined by the next Enqueue (or Shutdown)
  }

  void ReapLocked() {
    for (Worker it : exited_) {
      if (it->joinable()) it->join();
      workers_.erase(it);
    }
    exited_.clear();
  }

  const int max_threads_;
  const std::chrono::milliseconds idle_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;  // requests waiting for a worker
  std::list<std::thread> workers_;          // every worker not yet joined
  std::vector<Worker> exited_;              // workers that ended (idle), to join
  int threads_ = 0;                         // workers running
  int waiting_ = 0;                         // workers idle in wait_for
  bool shut_ = false;                       // Shutdown() called
};

// httplib's request processing (protected) on a stream of ours; the listening socket
// httplib bound.
class Server : public httplib::Server {
 public:
  int listening_socket() const { return svr_sock_; }
  int TakeListeningSocket() { return svr_sock_.exchange(INVALID_SOCKET); }
  bool Process(httplib::Stream& stream, bool close_connection, bool& connection_closed) {
    return process_request(stream, close_connection, connection_closed, nullptr);
  }
};

int PollMs(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d + absl::Microseconds(999)), 1 << 30));
}

std::string PeerAddress(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof(buf));
  } else if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
      inet_ntop(AF_INET, &in6.sin6_addr.s6_addr[12], buf, sizeof(buf));  // one peer, either family
    } else {
      inet_ntop(AF_INET6, &in6.sin6_addr, buf, sizeof(buf));
    }
  }
  return buf;
}

int PeerPort(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return 0;
}

const char* Reason(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

std::string Serialize(const HttpEarlyReply& r) {
  std::string out = absl::StrCat("HTTP/1.1 ", r.status, " ", Reason(r.status), "\r\n");
  for (const auto& [k, v] : r.headers) absl::StrAppend(&out, k, ": ", v, "\r\n");
  absl::StrAppend(&out, "Content-Type: ", r.content_type, "\r\nContent-Length: ", r.body.size(),
                  "\r\nConnection: close\r\n\r\n", r.body);
  return out;
}

}  // namespace

absl::Status HttpOptions::Validate() const {
  if (max_threads < 1) return absl::InvalidArgumentError("threads must be >= 1");
  if (header_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("header_timeout must be > 0");
  if (max_header_bytes < 1024) return absl::InvalidArgumentError("max_header_bytes must be >= 1024");
  if (max_connections < 1) return absl::InvalidArgumentError("max_connections must be >= 1");
  if (max_connections_per_peer < 1) return absl::InvalidArgumentError("max_connections_per_peer must be >= 1");
  if (read_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("read_timeout must be > 0");
  if (body_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("body_timeout must be > 0");
  if (write_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("write_timeout must be > 0");
  if (keep_alive_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError("keep_alive_timeout must be >= 1s");
  }
  if (max_body_bytes < 1) return absl::InvalidArgumentError("max_body_bytes must be >= 1");
  if (send_buffer_bytes < 0) return absl::InvalidArgumentError("send_buffer_bytes must be >= 0");
  if (thread_idle <= absl::ZeroDuration()) return absl::InvalidArgumentError("thread_idle must be > 0");
  return absl::OkStatus();
}

std::string NormalizeHttpHost(const std::string& host) {
  if (host.empty()) return "0.0.0.0";
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') return host.substr(1, host.size() - 2);
  return host;
}

class HttpListener::Impl {
 public:
  // One client connection: held by the poll thread while it waits for a head (or
  // lingers after a refusal), by one worker while a request is served.
  struct Conn {
    int fd = -1;
    std::string peer;
    int peer_port = 0;
    std::string buf;      // bytes read and not yet consumed, from `pos`
    size_t pos = 0;
    size_t scanned = 0;   // head search resumes here (relative to pos)
    bool linger = false;  // refused: discard input until EOF or `deadline`
    bool started = false; // a byte of the next head arrived (header_timeout runs)
    absl::Time deadline;  // head / keep-alive / linger deadline
    uint64_t seq = 0;     // accept order (the oldest is evicted first)
    size_t available() const { return buf.size() - pos; }
    void Compact() {
      if (pos > 0 && (pos >= buf.size() || pos > kReadChunk)) {
        buf.erase(0, pos);
        scanned -= std::min(scanned, pos);
        pos = 0;
      }
    }
  };

  // httplib::Stream over a Conn whose head is already buffered: reads serve the
  // buffer first, then the socket with read_timeout per read and `read_deadline` for
  // all of them (the body's total); writes wait up to write_timeout for room.
  class ConnStream : public httplib::Stream {
   public:
    ConnStream(Conn* c, absl::Duration read_timeout, absl::Time read_deadline, absl::Duration write_timeout)
        : c_(c), read_ms_(PollMs(read_timeout)), read_deadline_(read_deadline), write_ms_(PollMs(write_timeout)) {}
    bool is_readable() const override { return c_->available() > 0 || WaitReadable(); }
    bool is_writable() const override {
      if (!Wait(POLLOUT, write_ms_)) return false;
      // A peer that closed (EOF or reset) is gone even though a write would not fail yet.
      char b;
      const ssize_t n = recv(c_->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
      return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
    }
    ssize_t read(char* ptr, size_t size) override {
      if (c_->available() == 0) {
        c_->Compact();
        if (!WaitReadable()) return -1;
        char chunk[kReadChunk];
        ssize_t n;
        do {
          n = recv(c_->fd, chunk, sizeof(chunk), 0);
        } while (n < 0 && errno == EINTR);
        if (n <= 0) return n < 0 ? -1 : 0;
        c_->buf.append(chunk, static_cast<size_t>(n));
      }
      const size_t n = std::min(size, c_->available());
      std::memcpy(ptr, c_->buf.data() + c_->pos, n);
      c_->pos += n;
      return static_cast<ssize_t>(n);
    }
    ssize_t write(const char* ptr, size_t size) override {
      if (!Wait(POLLOUT, write_ms_)) return -1;
      ssize_t n;
      do {
        n = send(c_->fd, ptr, size, MSG_NOSIGNAL);
      } while (n < 0 && errno == EINTR);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
      return n;
    }
    void get_remote_ip_and_port(std::string& ip, int& port) const override {
      ip = c_->peer;
      port = c_->peer_port;
    }
    void get_local_ip_and_port(std::string& ip, int& port) const override {
      sockaddr_storage a{};
      socklen_t len = sizeof(a);
      if (getsockname(c_->fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
        ip = PeerAddress(a);
        port = PeerPort(a);
      }
    }
    socket_t socket() const override { return c_->fd; }

   private:
    // Waits for the next read: up to read_timeout, cut to what is left of the deadline;
    // false past the deadline even when bytes are there (a steady trickle ends too).
    bool WaitReadable() const {
      const absl::Duration left = read_deadline_ - absl::Now();
      if (left <= absl::ZeroDuration()) return false;
      return Wait(POLLIN, std::min(read_ms_, std::max(1, PollMs(left))));
    }
    bool Wait(short events, int ms) const {
      pollfd p{c_->fd, events, 0};
      int r;
      do {
        r = poll(&p, 1, ms);
      } while (r < 0 && errno == EINTR);
      return r > 0 && (p.revents & (events | POLLHUP | POLLERR)) != 0 && !((p.revents & POLLNVAL) != 0);
    }
    Conn* c_;
    int read_ms_;
    absl::Time read_deadline_;
    int write_ms_;
  };

  Impl(std::unique_ptr<Server> server, int port, const HttpOptions& options)
      : server_(std::move(server)), port_(port), options_(options),
        pool_(options.max_threads, options.thread_idle) {}

  ~Impl() { Stop(); }

  bool Begin() {
    listen_fd_ = server_->listening_socket();
    fcntl(listen_fd_, F_SETFL, fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return false;
    front_ = std::thread([this] { Front(); });
    return true;
  }

  void Stop() {
    if (stopped_.exchange(true)) return;
    Wake();
    if (front_.joinable()) front_.join();
    // Requests in progress finish (their connections close after); then the workers end.
    pool_.Shutdown();
    (void)server_->TakeListeningSocket();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& c : returned_) CloseCounted(c.get());
      returned_.clear();
    }
    if (wake_fd_ >= 0) close(wake_fd_);
    wake_fd_ = -1;
  }

  int port() const { return port_; }

  HttpFrontStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    HttpFrontStats s = stats_;
    s.open = total_;
    return s;
  }

 private:
  void Wake() {
    if (wake_fd_ < 0) return;
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }

  // Closes a connection and forgets it in the counts.
  void CloseCounted(Conn* c) {
    if (c->fd < 0) return;
    close(c->fd);
    c->fd = -1;
    std::lock_guard<std::mutex> lock(mu_);
    --total_;
    auto it = per_peer_.find(c->peer);
    if (it != per_peer_.end() && --it->second <= 0) per_peer_.erase(it);
  }

  // Writes `reply` (best effort: it is small and the socket buffer empty) and lingers.
  void Refuse(Conn* c, const HttpEarlyReply& reply) {
    {
      // Counted before the answer goes out: a client that has read it sees the count.
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.gated;
    }
    const std::string out = Serialize(reply);
    (void)send(c->fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    shutdown(c->fd, SHUT_WR);
    c->linger = true;
    c->buf.clear();
    c->pos = 0;
    c->deadline = absl::Now() + kLinger;
  }

  void Front() {
    std::list<std::unique_ptr<Conn>> held;  // connections on this thread
    std::vector<pollfd> fds;
    std::vector<std::list<std::unique_ptr<Conn>>::iterator> order;
    uint64_t next_seq = 0;
    while (!stopped_.load()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& c : returned_) held.push_back(std::move(c));
        returned_.clear();
      }
      // A returned connection may hold the next head already (pipelining).
      const absl::Time now = absl::Now();
      absl::Time next = now + absl::Seconds(1);
      for (auto it = held.begin(); it != held.end();) {
        Conn* c = it->get();
        if (!c->linger && c->available() > 0 && TryDispatch(c)) {
          it = held.erase(it);
          continue;
        }
        if (c->fd < 0) {
          it = held.erase(it);
          continue;
        }
        if (now >= c->deadline) {
          if (!c->linger && c->started) {
            {
              std::lock_guard<std::mutex> lock(mu_);
              ++stats_.header_timeouts;
            }
            const std::string out = Serialize(HttpEarlyReply{408, "text/plain", "request head not complete in time\n", {}});
            (void)send(c->fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
          }
          CloseCounted(c);
          it = held.erase(it);
          continue;
        }
        next = std::min(next, c->deadline);
        ++it;
      }
      fds.clear();
      order.clear();
      fds.push_back(pollfd{wake_fd_, POLLIN, 0});
      fds.push_back(pollfd{listen_fd_, POLLIN, 0});
      for (auto it = held.begin(); it != held.end(); ++it) {
        fds.push_back(pollfd{(*it)->fd, POLLIN, 0});
        order.push_back(it);
      }
      int r = poll(fds.data(), fds.size(), PollMs(next - absl::Now()));
      if (r < 0 && errno != EINTR) break;
      if (r <= 0) continue;
      if (fds[0].revents != 0) {
        uint64_t v;
        (void)!::read(wake_fd_, &v, sizeof(v));
      }
      if (stopped_.load()) break;
      for (size_t i = 0; i < order.size(); ++i) {
        if (fds[i + 2].revents == 0) continue;
        auto it = order[i];
        Conn* c = it->get();
        if (c->fd < 0) continue;
        if (!ReadSome(c)) {
          CloseCounted(c);
          continue;
        }
        if (!c->linger && TryDispatch(c)) it->reset(new Conn());  // moved to a worker; fd -1 reaped above
      }
      if ((fds[1].revents & POLLIN) != 0) Accept(&held, &next_seq);
    }
    for (auto& c : held) CloseCounted(c.get());
    // Closed here; httplib's copy is cleared only after the workers end (a chunked
    // stream stops at once when it reads "shutting down", before its last event).
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
  }

  // Reads what is there; false: closed, failed, or the linger saw EOF.
  bool ReadSome(Conn* c) {
    char chunk[kReadChunk];
    // At most 1 MiB per wakeup: a fast sender cannot keep the poll thread to itself.
    for (int reads = 0; reads < 64; ++reads) {
      const ssize_t n = recv(c->fd, chunk, sizeof(chunk), MSG_DONTWAIT);
      if (n == 0) return false;
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      if (c->linger) continue;  // discarded
      if (!c->started) {
        c->started = true;
        c->deadline = absl::Now() + options_.header_timeout;
      }
      c->buf.append(chunk, static_cast<size_t>(n));
      if (c->available() > static_cast<size_t>(options_.max_header_bytes) + kReadChunk) return true;
      if (static_cast<size_t>(n) < sizeof(chunk)) return true;
    }
    return true;
  }

  // The head complete: gate it and hand it to a worker (true: the Conn was moved out
  // of `c`, whose fd is then -1), or refuse it. Incomplete: false.
  bool TryDispatch(Conn* c) {
    if (!c->started) {
      c->started = true;
      c->deadline = absl::Now() + options_.header_timeout;
    }
    const absl::string_view data(c->buf.data() + c->pos, c->available());
    const size_t from = c->scanned >= 2 ? c->scanned - 2 : 0;
    const size_t end = HttpHeadEnd(data, from);
    if (end == absl::string_view::npos) {
      c->scanned = data.size();
      if (data.size() > static_cast<size_t>(options_.max_header_bytes)) {
        Refuse(c, HttpEarlyReply{431, "text/plain",
                                 absl::StrCat("request line and headers exceed ", options_.max_header_bytes, " bytes\n"),
                                 {}});
      }
      return false;
    }
    if (end > static_cast<size_t>(options_.max_header_bytes)) {
      Refuse(c, HttpEarlyReply{431, "text/plain",
                               absl::StrCat("request line and headers exceed ", options_.max_header_bytes, " bytes\n"),
                               {}});
      return false;
    }
    HttpRequestHead head;
    head.peer = c->peer;
    if (absl::Status parsed = ParseHttpHead(data.substr(0, end), &head); !parsed.ok()) {
      Refuse(c, HttpEarlyReply{400, "text/plain", absl::StrCat(parsed.message(), "\n"), {}});
      return false;
    }
    if (options_.gate) {
      if (std::optional<HttpEarlyReply> reply = options_.gate(head); reply.has_value()) {
        Refuse(c, *reply);
        return false;
      }
    }
    if (head.content_length > options_.max_body_bytes) {
      Refuse(c, HttpEarlyReply{413, "text/plain",
                               absl::StrCat("the request body exceeds ", options_.max_body_bytes, " bytes\n"), {}});
      return false;
    }
    auto owned = std::make_unique<Conn>(std::move(*c));
    c->fd = -1;
    owned->scanned = 0;
    Conn* raw = owned.release();
    pool_.Enqueue([this, raw] { Serve(std::unique_ptr<Conn>(raw)); });
    return true;
  }

  // One request on a worker; the connection then returns to the poll thread.
  void Serve(std::unique_ptr<Conn> c) {
    ConnStream stream(c.get(), options_.read_timeout, absl::Now() + options_.body_timeout, options_.write_timeout);
    bool closed = false;
    const bool ok = server_->Process(stream, /*close_connection=*/stopped_.load(), closed);
    if (!ok || closed || stopped_.load()) {
      CloseCounted(c.get());
      return;
    }
    c->Compact();
    c->scanned = 0;
    c->started = c->available() > 0;
    c->deadline = absl::Now() + (c->started ? options_.header_timeout : options_.keep_alive_timeout);
    {
      std::lock_guard<std::mutex> lock(mu_);
      returned_.push_back(std::move(c));
    }
    Wake();
  }

  void Accept(std::list<std::unique_ptr<Conn>>* held, uint64_t* next_seq) {
    while (true) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // EAGAIN, or out of descriptors (retried at the next poll)
      }
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->peer = PeerAddress(addr);
      c->peer_port = PeerPort(addr);
      c->seq = (*next_seq)++;
      c->deadline = absl::Now() + options_.header_timeout;
      int peer_count = 0, total = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = per_peer_.find(c->peer);
        peer_count = it == per_peer_.end() ? 0 : it->second;
        total = total_;
      }
      bool admitted = true;
      if (peer_count >= options_.max_connections_per_peer) admitted = Evict(held, &c->peer);
      if (admitted && total >= options_.max_connections) admitted = Evict(held, nullptr);
      if (!admitted) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          ++stats_.refused;  // before the close a client sees
        }
        close(fd);
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++total_;
        ++per_peer_[c->peer];
      }
      held->push_back(std::move(c));
    }
  }

  // Closes the oldest held connection (of `peer`, if given) that is not being served.
  bool Evict(std::list<std::unique_ptr<Conn>>* held, const std::string* peer) {
    Conn* oldest = nullptr;
    for (auto& c : *held) {
      if (c->fd < 0 || (peer != nullptr && c->peer != *peer)) continue;
      if (oldest == nullptr || c->seq < oldest->seq) oldest = c.get();
    }
    if (oldest == nullptr) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.evicted;  // before the close a client sees
    }
    CloseCounted(oldest);
    return true;
  }

  std::unique_ptr<Server> server_;  // routes; its listening socket is ours to poll
  const int port_;
  const HttpOptions options_;
  ElasticPool pool_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::thread front_;
  std::atomic<bool> stopped_{false};
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Conn>> returned_;  // from workers, to the poll thread
  std::map<std::string, int> per_peer_;          // open connections per peer address
  int total_ = 0;                                // open connections
  HttpFrontStats stats_;
};

HttpListener::HttpListener(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpListener::~HttpListener() { Stop(); }

int HttpListener::port() const { return impl_->port(); }
HttpFrontStats HttpListener::stats() const { return impl_->stats(); }
void HttpListener::Stop() { impl_->Stop(); }

absl::StatusOr<std::unique_ptr<HttpListener>> HttpListener::Start(
    const std::string& host, int port, const HttpOptions& options,
    const std::function<void(httplib::Server&)>& routes) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (port < 0 || port > 65535) return absl::InvalidArgumentError(absl::StrCat("port ", port, " is out of range"));
  auto server = std::make_unique<Server>();
  server->set_keep_alive_max_count(1000000);
  server->set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  const int sndbuf = options.send_buffer_bytes;
  server->set_socket_options([sndbuf](int sock) {
    // SO_REUSEADDR, not httplib's default SO_REUSEPORT (which would let a second server
    // bind the same port and silently share its connections).
    const int one = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (sndbuf > 0) setsockopt(sock, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
  });
  routes(*server);
  const std::string h = NormalizeHttpHost(host);
  int bound = -1;
  if (port == 0) {
    bound = server->bind_to_any_port(h);
  } else if (server->bind_to_port(h, port)) {
    bound = port;
  }
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port,
                                               " (address in use, or not an address of this host)"));
  }
  // httplib listens with a backlog of 5: a burst of connections would see SYNs dropped
  // and a 1 s retransmit. listen() again only raises the backlog.
  ::listen(server->listening_socket(), 128);
  auto impl = std::make_unique<Impl>(std::move(server), bound, options);
  if (!impl->Begin()) return absl::InternalError("http: cannot create the front's eventfd");
  return std::unique_ptr<HttpListener>(new HttpListener(std::move(impl)));
}

}  // namespace echokv::server
