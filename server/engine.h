// The engine of echokv-server: ONE thread owns the model, the tokenizer and every
// session's compact KV cache (DESIGN.md rule 7). gRPC threads hand it work through a
// mutex + condvar queue; results come back through callbacks that run ON THE ENGINE
// THREAD and must not block (a reactor queues a write and returns).
//
// Scheduling: each loop iteration runs the queued quick tasks, reaps idle sessions,
// runs one decode step of every active generation (round robin: fair interleaving),
// then at most one prefill/compression job; while that job runs, every prefill chunk
// and policy step runs the quick tasks and one more decode round, so a long
// compression never starves the streams.
//
// This header is torch-free (plain structs) so service.cc compiles fast.
//
//   ECHOKV_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, &metrics));
//   auto cancel = std::make_shared<std::atomic<bool>>(false);
//   engine->CreateSession(std::move(input), cfg, std::nullopt, cancel,
//                         [](const ProgressEvent& p) { /* queue a message */ },
//                         [](absl::StatusOr<SessionInfo> s) { /* finish the RPC */ });
#ifndef ECHOKV_SERVER_ENGINE_H_
#define ECHOKV_SERVER_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "compression/config.h"
#include "compression/report.h"
#include "model/chat_template.h"
#include "model/sampler.h"
#include "server/stats.h"

namespace echokv::server {

// Admission limits (flags of echokv-server). Messages of rejections name these fields.
struct EngineLimits {
  int64_t max_context_tokens = 0;           // 0 = the model's max_position_embeddings
  int max_new_tokens = 1024;                // Generate max_tokens upper bound
  int max_sessions = 256;
  int64_t max_kv_bytes = int64_t{8} << 30;  // sum of the retained caches of all sessions
  absl::Duration session_ttl = absl::Minutes(30);       // default idle expiry
  absl::Duration max_session_ttl = absl::Hours(24);     // largest ttl a client may ask
  int max_concurrent_streams = 64;          // streaming RPCs + Compress in flight
  int64_t max_request_bytes = int64_t{4} << 20;  // input bytes before tokenizing
  absl::Status Validate() const;            // names the bad field
};

struct EngineConfig {
  std::string model_dir;
  std::string device = "cpu";
  std::string dtype = "float32";
  int threads = 0;                          // LibTorch intra-op threads; 0 = default
  compression::CompressionConfig default_compression;
  EngineLimits limits;
  int prefill_chunk = 256;                  // tokens per prefill chunk
  absl::Status Validate() const;
};

// The context of a request, converted from the proto at the edge.
struct InputSpec {
  enum class Kind { kNone, kText, kTokens, kChat };
  Kind kind = Kind::kNone;
  std::string text;                          // kText
  std::vector<int> tokens;                   // kTokens
  std::vector<model::ChatMessage> chat;      // kChat
  bool add_generation_prompt = true;         // kChat
  std::optional<bool> add_special_tokens;    // kText; unset = per-RPC default
};

// Model and server facts for GetServerInfo (immutable after Create).
struct ServerFacts {
  std::string version;
  std::string model_type;
  std::string model_name;         // basename of the model directory
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int hidden_size = 0;
  int vocab_size = 0;
  int max_context = 0;
  std::string tokenizer_kind;
  bool chat_template = false;
  int64_t kv_bytes_per_token = 0;
  std::string device;
  std::string dtype;
  std::vector<std::string> policies;
  compression::CompressionConfig default_compression;
  EngineLimits limits;            // max_context_tokens resolved
};

struct SessionInfo {
  std::string id;
  int64_t tokens_seen = 0;
  int64_t retained_entries = 0;
  int64_t retained_kv_bytes = 0;
  int64_t full_kv_bytes = 0;       // full cache of tokens_seen tokens
  compression::CompressionConfig config;  // workspace resolved
  compression::CompressionReport last_report;
  absl::Time created;
  absl::Time last_used;
  absl::Duration ttl;
  bool busy = false;
};

struct ProgressEvent {
  std::string phase;   // "tokenize", "prefill" or a policy phase
  int64_t done = 0;
  int64_t total = 0;
  double elapsed_seconds = 0;
};

struct GenerateParams {
  std::string session_id;
  int max_tokens = 128;
  model::SamplingParams sampling;
  std::vector<std::string> stop;   // stop strings
  std::vector<int> stop_ids;
  bool ignore_eos = false;
  bool commit = false;
};

struct GenerateDelta {
  std::string text;      // complete UTF-8 characters only
  std::vector<int> ids;  // the tokens sampled since the previous delta
};

enum class FinishReason { kLength, kEos, kStopToken, kStopString };

struct GenerateSummary {
  FinishReason reason = FinishReason::kLength;
  int64_t prompt_tokens = 0;
  int generated_tokens = 0;
  double time_to_first_token_seconds = 0;
  double tokens_per_second = 0;
  double total_seconds = 0;
  std::optional<SessionInfo> session;  // commit=true
};

struct GroupCache {
  int64_t retained = 0;
  std::vector<int64_t> positions;  // when asked
  int64_t kv_bytes = 0;
};
struct LayerCacheInfo {
  std::vector<GroupCache> groups;
  int64_t retained = 0;
  int64_t kv_bytes = 0;
};
struct CacheInspection {
  SessionInfo session;
  std::vector<LayerCacheInfo> layers;
  int64_t total_retained_entries = 0;
  int64_t total_kv_bytes = 0;
  int64_t full_equivalent_kv_bytes = 0;
  int64_t position_bytes = 0;
};

struct CompressOutcome {
  std::vector<LayerCacheInfo> layers;  // positions always filled
  compression::CompressionReport report;
  int64_t context_tokens = 0;
};

using CancelFlag = std::shared_ptr<std::atomic<bool>>;
template <typename T>
using DoneFn = std::function<void(absl::StatusOr<T>)>;
using ProgressFn = std::function<void(const ProgressEvent&)>;
using DeltaFn = std::function<void(GenerateDelta)>;

class Engine {
 public:
  // Loads the model and tokenizer and starts the engine thread. `observer` (may be
  // null) receives plain stats; it must outlive the engine and be thread-safe.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineConfig& config,
                                                        EngineObserver* observer);
  ~Engine();  // Shutdown() + join
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ServerFacts& facts() const;

  // Every method below returns at once; `done` runs exactly once on the engine thread
  // (or inline with UNAVAILABLE after Shutdown). Progress/delta callbacks run on the
  // engine thread before `done`. A set cancel flag stops the work within one decode
  // step or prefill chunk with CANCELLED and leaves every session as it was.
  void CreateSession(InputSpec input, compression::CompressionConfig config,
                     std::optional<absl::Duration> ttl, CancelFlag cancel, ProgressFn progress,
                     DoneFn<SessionInfo> done);
  void AppendToSession(std::string session_id, InputSpec input, CancelFlag cancel,
                       ProgressFn progress, DoneFn<SessionInfo> done);
  void Generate(GenerateParams params, CancelFlag cancel, DeltaFn on_delta,
                DoneFn<GenerateSummary> done);
  void Compress(InputSpec input, compression::CompressionConfig config, CancelFlag cancel,
                DoneFn<CompressOutcome> done);
  void ForkSession(std::string session_id, std::optional<absl::Duration> ttl,
                   DoneFn<SessionInfo> done);
  void GetSession(std::string session_id, DoneFn<SessionInfo> done);
  void ListSessions(DoneFn<std::vector<SessionInfo>> done);
  void DeleteSession(std::string session_id, DoneFn<int64_t> done);  // freed bytes
  void InspectCache(std::string session_id, bool include_positions,
                    DoneFn<CacheInspection> done);

  // Cancels every running and queued job (they finish with CANCELLED).
  void CancelAll();
  // Stops accepting work (UNAVAILABLE), cancels everything, joins the thread.
  void Shutdown();
  // Tasks waiting in the queue (for metrics and tests).
  int QueueDepth() const;

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;  // torch-owning state; lives in engine.cc
};

// 32 lowercase hex characters from 128 bits of the OS CSPRNG (getrandom).
absl::StatusOr<std::string> NewSessionId();

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_ENGINE_H_
