#include "server/http_util.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace echokv::server {
namespace {

// httplib::TaskQueue whose workers are started on demand (a queued connection and no
// idle worker) up to `max_threads`, and exit after idling `idle` (one always stays).
// httplib runs each connection's whole keep-alive loop as one task, so idle
// connections occupy workers: growing keeps them from blocking real requests.
class ElasticPool : public httplib::TaskQueue {
 public:
  ElasticPool(int max_threads, absl::Duration idle)
      : max_threads_(max_threads), idle_(absl::ToChronoMilliseconds(idle)) {}
  ~ElasticPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
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

  void shutdown() override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (shut_) return;
      shut_ = true;
      cv_.notify_all();
    }
    // No enqueue after shutdown (httplib stops accepting first): the list is ours.
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
    if (!shut_) exited_.push_back(self);  // joined by the next enqueue (or shutdown)
  }

  // Joins workers that have exited (they hold no lock once listed).
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
  std::deque<std::function<void()>> jobs_;  // accepted connections waiting for a worker
  std::list<std::thread> workers_;          // every worker not yet joined
  std::vector<Worker> exited_;              // workers that ended (idle), to join
  int threads_ = 0;                         // workers running
  int waiting_ = 0;                         // workers idle in wait_for
  bool shut_ = false;                       // shutdown() called
};

// Exposes the listening socket so its backlog can be raised (httplib listens with 5).
class Server : public httplib::Server {
 public:
  int listening_socket() const { return svr_sock_; }
};

int64_t WholeSeconds(absl::Duration d) { return absl::ToInt64Seconds(d); }

}  // namespace

absl::Status HttpOptions::Validate() const {
  if (max_threads < 1) return absl::InvalidArgumentError("threads must be >= 1");
  if (read_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("read_timeout must be > 0");
  if (write_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("write_timeout must be > 0");
  if (keep_alive_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError("keep_alive_timeout must be >= 1s (whole seconds)");
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

HttpListener::HttpListener(std::unique_ptr<httplib::Server> server, int port)
    : server_(std::move(server)), port_(port) {}

HttpListener::~HttpListener() { Stop(); }

absl::StatusOr<std::unique_ptr<HttpListener>> HttpListener::Start(
    const std::string& host, int port, const HttpOptions& options,
    const std::function<void(httplib::Server&)>& routes) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (port < 0 || port > 65535) return absl::InvalidArgumentError(absl::StrCat("port ", port, " is out of range"));
  auto server = std::make_unique<Server>();
  const int64_t read_us = absl::ToInt64Microseconds(options.read_timeout);
  const int64_t write_us = absl::ToInt64Microseconds(options.write_timeout);
  server->set_read_timeout(read_us / 1000000, read_us % 1000000);
  server->set_write_timeout(write_us / 1000000, write_us % 1000000);
  server->set_keep_alive_timeout(WholeSeconds(options.keep_alive_timeout));
  server->set_keep_alive_max_count(1000);  // httplib closes after 5 requests by default
  server->set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  const int max_threads = options.max_threads;
  const absl::Duration idle = options.thread_idle;
  server->new_task_queue = [max_threads, idle] { return new ElasticPool(max_threads, idle); };
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
  // httplib listens with a backlog of 5: a burst of connections (a scraper's pool, a
  // client reconnecting) would see SYNs dropped and a 1 s retransmit. listen() again
  // only raises the backlog.
  ::listen(server->listening_socket(), 128);
  Server* raw = server.get();
  auto listener = std::unique_ptr<HttpListener>(new HttpListener(std::move(server), bound));
  auto ended = std::make_shared<std::atomic<bool>>(false);
  listener->thread_ = std::thread([raw, ended] {
    raw->listen_after_bind();
    ended->store(true);
  });
  // stop() is a no-op until the accept loop runs: wait for it so Stop() cannot hang.
  while (!raw->is_running() && !ended->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return listener;
}

void HttpListener::Stop() {
  if (stopped_.exchange(true)) return;
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace echokv::server
