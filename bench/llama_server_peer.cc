#include "bench/llama_server_peer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace echokv::bench {
namespace {

using Clock = std::chrono::steady_clock;

// A connected loopback TCP socket, or -1.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// A port nobody listens on now (the kernel's pick; llama-server binds it right after).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

// The status code of GET `path`, or -1 when nothing answers.
int HttpGetStatus(int port, const std::string& path) {
  const int fd = Connect(port);
  if (fd < 0) return -1;
  int code = -1;
  if (SendAll(fd, absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"))) {
    char buf[256];
    const ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
    if (n > 12 && std::strncmp(buf, "HTTP/1.", 7) == 0) {
      buf[n] = '\0';
      code = std::atoi(buf + 9);
    }
  }
  close(fd);
  return code;
}

}  // namespace

absl::StatusOr<LlamaServer> StartLlamaServer(const LlamaServerOptions& options, const std::string& dir) {
  LlamaServer server;
  server.port = FreePort();
  if (server.port == 0) return absl::InternalError("no free loopback port for llama-server");
  server.log_path = dir + "/llama-server.log";
  std::vector<std::string> args = {options.binary,
                                   "-m", options.gguf,
                                   "--host", "127.0.0.1",
                                   "--port", absl::StrCat(server.port),
                                   "--parallel", absl::StrCat(options.parallel),
                                   "--cont-batching",
                                   "-t", absl::StrCat(options.threads),
                                   "-tb", absl::StrCat(options.threads),
                                   "-c", absl::StrCat(options.ctx_per_slot * options.parallel)};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, server.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  const int rc = posix_spawn(&server.pid, options.binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return absl::InternalError(absl::StrCat("cannot start ", options.binary, ": ", std::strerror(rc)));
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(server.pid, &status, WNOHANG) == server.pid) {
      return absl::InternalError(absl::StrCat("llama-server exited before serving; see ", server.log_path));
    }
    if (HttpGetStatus(server.port, "/health") == 200) return server;  // 503 while loading
    absl::SleepFor(absl::Milliseconds(50));
  }
  kill(server.pid, SIGKILL);
  waitpid(server.pid, nullptr, 0);
  return absl::DeadlineExceededError(absl::StrCat("llama-server not healthy within 120 s; see ", server.log_path));
}

int StopLlamaServer(const LlamaServer& server) {
  kill(server.pid, SIGTERM);
  int status = 0;
  waitpid(server.pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

PeerStream StreamLlamaCompletion(int port, const std::vector<int>& prompt, int n_predict, Clock::time_point origin) {
  PeerStream result;
  // Greedy (top-k 1, the only sampler), EOS ignored, no reuse of an earlier request's
  // prompt cache: every request prefills its prompt, as a new echokv session does.
  const std::string body = absl::StrCat(R"({"prompt":[)", absl::StrJoin(prompt, ","), R"(],"n_predict":)", n_predict,
                                        R"(,"stream":true,"ignore_eos":true,"cache_prompt":false,)",
                                        R"("return_tokens":true,"samplers":["top_k"],"top_k":1})");
  const int fd = Connect(port);
  if (fd < 0) {
    result.status = absl::UnavailableError(absl::StrCat("cannot connect to llama-server on port ", port));
    return result;
  }
  const std::string request = absl::StrCat("POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                                           "Content-Type: application/json\r\nContent-Length: ", body.size(),
                                           "\r\nConnection: close\r\n\r\n", body);
  if (!SendAll(fd, request)) {
    close(fd);
    result.status = absl::UnavailableError("sending the /completion request failed");
    return result;
  }
  std::string raw;         // bytes as received
  size_t raw_pos = 0;      // first unparsed byte of `raw` (after the headers)
  bool headers_done = false, chunked = false, finished = false;
  std::string events;      // the de-chunked event stream
  size_t event_pos = 0;
  Clock::time_point last = origin;
  char buf[16384];
  while (!finished) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
    const Clock::time_point now = Clock::now();
    if (!headers_done) {
      const size_t end = raw.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      const std::string head = raw.substr(0, end);
      if (head.compare(0, 12, "HTTP/1.1 200") != 0) {
        result.status = absl::InternalError(absl::StrCat("llama-server answered: ", head.substr(0, head.find('\r')),
                                                         " ", raw.substr(end + 4, 300)));
        close(fd);
        return result;
      }
      chunked = head.find("Transfer-Encoding: chunked") != std::string::npos;
      headers_done = true;
      raw_pos = end + 4;
    }
    if (chunked) {  // size line in hex, CRLF, data, CRLF; a zero size ends the body
      while (true) {
        const size_t line_end = raw.find("\r\n", raw_pos);
        if (line_end == std::string::npos) break;
        const size_t size = std::strtoul(raw.c_str() + raw_pos, nullptr, 16);
        if (size == 0) {
          finished = true;
          break;
        }
        if (raw.size() < line_end + 2 + size + 2) break;
        events.append(raw, line_end + 2, size);
        raw_pos = line_end + 2 + size + 2;
      }
    } else {
      events.append(raw, raw_pos, std::string::npos);
      raw_pos = raw.size();
    }
    // Server-sent events: "data: {json}" blocks separated by a blank line.
    for (size_t sep; (sep = events.find("\n\n", event_pos)) != std::string::npos; event_pos = sep + 2) {
      const std::string event = events.substr(event_pos, sep - event_pos);
      if (event.compare(0, 6, "data: ") != 0) continue;
      const nlohmann::json j = nlohmann::json::parse(event.substr(6), nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || j.contains("error")) {
        result.status = absl::InternalError(absl::StrCat("llama-server event: ", event.substr(0, 300)));
        finished = true;
        break;
      }
      const int k = j.contains("tokens") && j["tokens"].is_array() ? static_cast<int>(j["tokens"].size()) : 0;
      if (k > 0) {
        // As on the gRPC side: the gap is shared evenly by the ids of one event.
        const double gap = std::chrono::duration<double>(now - last).count();
        if (result.tokens == 0) {
          result.ttft_s = gap;
          for (int i = 1; i < k; ++i) result.inter_token_s.push_back(0.0);
        } else {
          for (int i = 0; i < k; ++i) result.inter_token_s.push_back(gap / k);
        }
        result.tokens += k;
        last = now;
      }
      if (j.value("stop", false)) finished = true;
    }
  }
  close(fd);
  if (result.status.ok() && result.tokens != n_predict) {
    result.status = absl::InternalError(absl::StrCat("llama-server streamed ", result.tokens, " tokens, expected ",
                                                     n_predict));
  }
  return result;
}

}  // namespace echokv::bench
