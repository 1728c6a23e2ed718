// llama.cpp's llama-server as the peer of echokv-bench-server: start it on a GGUF file
// of the same weights (bench/llamacpp_compare.sh converts them) and stream completions
// from its HTTP API (POST /completion, `stream: true`, the prompt as token ids,
// `cache_prompt: false`), timing each streamed token on the client side as the gRPC
// side does. Plain POSIX sockets and HTTP/1.1: no HTTP client library for a loopback
// benchmark.
//
//   ECHOKV_ASSIGN_OR_RETURN(LlamaServer s, StartLlamaServer({bin, gguf, /*parallel=*/16, ...}, "/tmp/d"));
//   PeerStream r = StreamLlamaCompletion(s.port, prompt_ids, /*n_predict=*/64, start);
//   StopLlamaServer(s);
#ifndef ECHOKV_BENCH_LLAMA_SERVER_PEER_H_
#define ECHOKV_BENCH_LLAMA_SERVER_PEER_H_

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace echokv::bench {

struct LlamaServerOptions {
  std::string binary;       // llama-server
  std::string gguf;         // -m
  int parallel = 1;         // --parallel (slots), with --cont-batching
  int ctx_per_slot = 512;   // -c is ctx_per_slot * parallel (llama-server splits it over the slots)
  int threads = 2;          // -t and -tb
};

struct LlamaServer {
  pid_t pid = -1;
  int port = 0;
  std::string log_path;
};

// Starts llama-server on a free loopback port and waits (up to 120 s) until GET /health
// answers 200. Its output goes to `dir`/llama-server.log.
absl::StatusOr<LlamaServer> StartLlamaServer(const LlamaServerOptions& options, const std::string& dir);

// SIGTERM, then waits; returns the exit status (128 + signal when killed).
int StopLlamaServer(const LlamaServer& server);

// One streamed completion, measured from `origin` (the moment the client decided to
// send) to each server-sent event that carries token ids.
struct PeerStream {
  absl::Status status;
  int tokens = 0;
  double ttft_s = 0;                  // origin -> first token (includes the prompt's prefill)
  std::vector<double> inter_token_s;  // gaps between successive tokens
};
PeerStream StreamLlamaCompletion(int port, const std::vector<int>& prompt, int n_predict,
                                 std::chrono::steady_clock::time_point origin);

}  // namespace echokv::bench

#endif  // ECHOKV_BENCH_LLAMA_SERVER_PEER_H_
