// The engine of echokv-server (docs/ARCHITECTURE.md "Engine"): ONE thread owns the
// model and every session's tensors (docs/DESIGN.md rule 7) and runs a loop of Step()s:
//
//   inbox (admissions, quick tasks) -> Scheduler::Schedule -> run the plan (one batched
//   decode for every ready stream + lookahead rows, prefill slices within a token
//   budget, bounded policy phases) -> outputs (deltas, completions) -> reap
//
// Requests are validated and tokenized on a small pool of edge threads first (bounded
// work per request, never on the engine thread); sessions' metadata lives in a
// thread-safe SessionStore. Results come back through callbacks that run on the engine
// thread (or an edge thread for early errors) and must not block.
//
// This header is torch-free (plain structs) so service.cc compiles fast.
//
//   ECHOKV_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, &metrics));
//   auto cancel = std::make_shared<std::atomic<bool>>(false);
//   engine->CreateSession(std::move(request), cancel,
//                         [](const ProgressEvent& p) { /* queue a message */ },
//                         [](absl::StatusOr<SessionInfo> s) { /* finish the RPC */ });
#ifndef ECHOKV_SERVER_ENGINE_ENGINE_H_
#define ECHOKV_SERVER_ENGINE_ENGINE_H_

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
#include "server/engine/clock.h"
#include "server/engine/session_store.h"
#include "server/engine/stats.h"

namespace echokv::model {
class Transformer;
class Tokenizer;
}  // namespace echokv::model
namespace echokv::state {
class FileOps;
}  // namespace echokv::state

namespace echokv::server {

// --max_new_tokens' default: the largest max_tokens of a Generate / HTTP completion.
inline constexpr int kDefaultMaxNewTokens = 1024;

// Admission limits (flags of echokv-server). Messages of rejections name these fields.
struct EngineLimits {
  int64_t max_context_tokens = 0;           // 0 = the model's max_position_embeddings
  int max_new_tokens = kDefaultMaxNewTokens;  // Generate max_tokens upper bound
  int max_sessions = 256;
  int64_t max_kv_bytes = int64_t{8} << 30;  // hot bytes of all sessions together
  int64_t max_cold_bytes = int64_t{8} << 30;  // cold tiers held in memory, together
  absl::Duration session_ttl = absl::Minutes(30);       // default idle expiry
  absl::Duration max_session_ttl = absl::Hours(24);     // largest ttl a client may ask
  int max_concurrent_streams = 64;          // streaming RPCs + Compress in flight
  int64_t max_request_bytes = int64_t{4} << 20;  // input bytes before tokenizing
  int max_stream_backlog = 16;              // unread deltas before a stream is skipped
  absl::Status Validate() const;            // names the bad field
};

struct EngineConfig {
  std::string model_dir;
  std::string device = "cpu";
  std::string dtype = "float32";
  std::string weights = "float32";          // model::DeviceOptions::weights: float32 | native
  int threads = 0;                          // compute threads; 0 = default
  compression::CompressionConfig default_compression;
  MemoryMode default_memory = MemoryMode::kEvict;
  EngineLimits limits;
  int prefill_chunk = 256;                  // tokens per prefill call
  int64_t max_step_tokens = 256;            // decode rows + prefill tokens per step
  int edge_threads = 2;                     // tokenization / validation workers
  std::string replica_id;                   // session id prefix ("" = none)
  // The engine counts as stuck (health NOT_SERVING) when work is waiting and no step
  // has completed for this long.
  absl::Duration stuck_after = absl::Seconds(30);
  // Chat template override: a Jinja file or "builtin:NAME" ("" = the model's own).
  std::string chat_template;
  // Durable sessions (docs/SESSION_MEMORY.md §4): "" = in memory only.
  std::string state_dir;
  bool fsync_always = true;                 // --fsync always|none
  int save_full_every = 32;                 // tiered: a superseding segment every N turns
  state::FileOps* state_file_ops = nullptr;  // tests: fault injection (not owned)
  absl::Status Validate() const;
};

// The context of a request, converted from the proto at the edge.
struct InputSpec {
  enum class Kind { kNone, kText, kTokens, kChat };
  Kind kind = Kind::kNone;
  std::string text;                          // kText
  std::vector<int> tokens;                   // kTokens
  std::vector<model::ChatMessage> chat;      // kChat
  std::string tools_json;                    // kChat: tool definitions (JSON array; "" = none)
  bool add_generation_prompt = true;         // kChat
  // kChat, appended to a session: `chat` is the whole conversation (OpenAI clients
  // resend it every time), which must begin with the session's stored messages; only
  // the messages after them are appended. Checked under the session's claim: a
  // conversation that differs fails with kConversationMismatch naming the first
  // message that differs ("input.chat[3]"), one that adds nothing after the assistant's
  // last reply with kInvalidArgument ("input.chat"); one that adds nothing otherwise
  // appends nothing (e.g. a session created with the question and the generation prompt).
  bool whole_conversation = false;
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
  MemoryMode default_memory = MemoryMode::kEvict;
  EngineLimits limits;            // max_context_tokens resolved
  std::string replica_id;
  bool durable = false;           // sessions survive restarts (--state_dir)
};

// SessionInfo, a session's metadata and stats: server/engine/session_store.h.

struct ProgressEvent {
  std::string phase;   // "tokenize", "prefill" or a policy phase
  int64_t done = 0;
  int64_t total = 0;
  double elapsed_seconds = 0;
};

// Who is calling: every session belongs to the tenant that created it.
struct Caller {
  std::string tenant;  // "" when the server runs open (--insecure)
};

struct CreateRequest {
  Caller caller;
  InputSpec input;
  compression::CompressionConfig config;  // server defaults applied, not yet validated
  std::optional<MemoryMode> memory;       // unset = the server default
  std::optional<absl::Duration> ttl;
};

struct AppendRequest {
  Caller caller;
  std::string session_id;
  InputSpec input;
};

struct GenerateParams {
  Caller caller;
  std::string session_id;
  int max_tokens = 128;
  model::SamplingParams sampling;
  std::vector<std::string> stop;   // stop strings
  std::vector<int> stop_ids;
  bool ignore_eos = false;
  bool commit = false;
  // Set: the input is appended to the session first, in one unit with the generation
  // (commit must be true): the session changes only when the generation completes and
  // its commit succeeds; refused, failed or cancelled at any point, the session is
  // exactly as it was (the HTTP door's continued sessions). Tokenized like
  // AppendToSession's input.
  std::optional<InputSpec> input;
  // max_tokens is an upper bound: it is lowered to the room the context has left
  // (at least 1) instead of refused.
  bool fit_max_tokens = false;
};

struct GenerateDelta {
  std::string text;      // complete UTF-8 characters only
  std::vector<int> ids;  // the tokens sampled since the previous delta
  // sampling.logprobs: one per id, in order (raw log-softmax; top alternatives).
  std::vector<model::SampledToken> logprobs;
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
  double retained_mass = -1;       // CompressionReport::retained_mass of the last compression
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
  int64_t cold_kv_bytes = 0;
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

// Where a stream's output goes. `backlog` (may be empty) reports how many deltas the
// reader has not taken yet (queued or being written, however they are grouped into
// messages: the gRPC reactor merges the deltas queued behind a write in flight); at
// EngineLimits::max_stream_backlog the scheduler skips the stream until the reader
// catches up (the reactor calls Engine::Wake then).
struct StreamSink {
  std::function<void(GenerateDelta)> on_delta;
  std::function<int()> backlog;
};

// Where an ExportSession stream goes: chunks of the snapshot, in order. `backlog` (may
// be empty) reports what the reader has not taken; the exporter waits while it is high.
struct ExportSink {
  std::function<void(std::string)> on_chunk;
  std::function<int()> backlog;
};

// An ImportSession in progress: Feed the snapshot's bytes in order (each `done` runs
// once the bytes are consumed; read the next chunk then), then Finish. Dropping it
// without Finish creates nothing.
class SessionImport {
 public:
  virtual ~SessionImport() = default;
  virtual void Feed(std::string chunk, std::function<void(absl::Status)> done) = 0;
  virtual void Finish(DoneFn<SessionInfo> done) = 0;
};

// Engine health for the gRPC health service and the watchdog.
struct EngineHealth {
  bool serving = true;             // false: stuck, or the state dir cannot be written
  bool state_writable = true;      // false: --state_dir's write probe fails (not a full disk)
  double seconds_since_step = 0;   // since the last completed step (0 when idle)
  int queued = 0;                  // requests and jobs waiting
};

// What the session layer (server/sessions/sessions.h) needs of the engine: its
// use-cases, facts and live totals. Engine is the one implementation; the session
// layer's tests run against a fake. The contract of each method is Engine's (below).
class EnginePort {
 public:
  virtual ~EnginePort() = default;
  virtual const ServerFacts& facts() const = 0;
  virtual void CreateSession(CreateRequest request, CancelFlag cancel, ProgressFn progress,
                             DoneFn<SessionInfo> done) = 0;
  virtual void AppendToSession(AppendRequest request, CancelFlag cancel, ProgressFn progress,
                               DoneFn<SessionInfo> done) = 0;
  virtual void Generate(GenerateParams params, CancelFlag cancel, StreamSink sink, DoneFn<GenerateSummary> done) = 0;
  virtual void Compress(Caller caller, InputSpec input, compression::CompressionConfig config, CancelFlag cancel,
                        DoneFn<CompressOutcome> done) = 0;
  virtual void ForkSession(Caller caller, std::string session_id, std::optional<absl::Duration> ttl,
                           DoneFn<SessionInfo> done) = 0;
  virtual void GetSession(Caller caller, std::string session_id, DoneFn<SessionInfo> done) = 0;
  virtual void ListSessions(Caller caller, DoneFn<std::vector<SessionInfo>> done) = 0;
  virtual void DeleteSession(Caller caller, std::string session_id, DoneFn<int64_t> done) = 0;
  virtual void InspectCache(Caller caller, std::string session_id, bool include_positions,
                            DoneFn<CacheInspection> done) = 0;
  virtual void ExportSession(Caller caller, std::string session_id, CancelFlag cancel, ExportSink sink,
                             DoneFn<int64_t> done) = 0;
  virtual std::unique_ptr<SessionImport> BeginImport(Caller caller, bool keep_id,
                                                     std::optional<absl::Duration> ttl) = 0;
  virtual void SessionTokens(Caller caller, std::string session_id, DoneFn<std::vector<int>> done) = 0;
  virtual StoreTotals Totals() const = 0;
  virtual StoreTotals TotalsOf(const std::string& tenant) const = 0;
  virtual void Wake() = 0;
  virtual EngineHealth Health() const = 0;
};

class Engine final : public EnginePort {
 public:
  // Loads the model and tokenizer and starts the engine thread. `observer` (may be
  // null) receives plain stats; it must outlive the engine and be thread-safe.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineConfig& config,
                                                        EngineObserver* observer);
  // The test seam: an engine over an already loaded model and tokenizer (shared, so
  // several engines or a test can use one model) and an injected clock.
  // config.model_dir names the model in facts only.
  static absl::StatusOr<std::unique_ptr<Engine>> CreateWithModel(
      const EngineConfig& config, std::shared_ptr<const model::Transformer> model,
      std::shared_ptr<const model::Tokenizer> tokenizer, std::optional<model::ChatTemplate> chat,
      EngineObserver* observer, const Clock* clock);
  ~Engine() override;  // Shutdown() + join
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ServerFacts& facts() const override;
  // The model's tokenizer (immutable, thread-safe const methods); the HTTP API reads
  // token pieces from it for logprobs.
  const model::Tokenizer& tokenizer() const;

  // Every method below returns at once; `done` runs exactly once (on the engine thread,
  // or on an edge thread for an early error; inline with UNAVAILABLE after Shutdown).
  // Progress/delta callbacks run on the engine thread before `done`. A set cancel flag
  // stops the work within one step with CANCELLED and leaves every session as it was.
  void CreateSession(CreateRequest request, CancelFlag cancel, ProgressFn progress, DoneFn<SessionInfo> done) override;
  void AppendToSession(AppendRequest request, CancelFlag cancel, ProgressFn progress, DoneFn<SessionInfo> done) override;
  void Generate(GenerateParams params, CancelFlag cancel, StreamSink sink, DoneFn<GenerateSummary> done) override;
  void Compress(Caller caller, InputSpec input, compression::CompressionConfig config, CancelFlag cancel,
                DoneFn<CompressOutcome> done) override;
  void ForkSession(Caller caller, std::string session_id, std::optional<absl::Duration> ttl,
                   DoneFn<SessionInfo> done) override;
  void GetSession(Caller caller, std::string session_id, DoneFn<SessionInfo> done) override;
  void ListSessions(Caller caller, DoneFn<std::vector<SessionInfo>> done) override;
  void DeleteSession(Caller caller, std::string session_id, DoneFn<int64_t> done) override;  // freed bytes
  void InspectCache(Caller caller, std::string session_id, bool include_positions,
                    DoneFn<CacheInspection> done) override;

  // A self-describing snapshot of the session's committed state (the state format of
  // docs/ARCHITECTURE.md), streamed in chunks; `done` gets the total bytes.
  void ExportSession(Caller caller, std::string session_id, CancelFlag cancel, ExportSink sink,
                     DoneFn<int64_t> done) override;
  // Recreates a session from an ExportSession stream (this server's model only:
  // FAILED_PRECONDITION otherwise) under a new id of this replica, or the snapshot's own
  // id with keep_id (ALREADY_EXISTS when taken). Owned by the caller's tenant.
  std::unique_ptr<SessionImport> BeginImport(Caller caller, bool keep_id, std::optional<absl::Duration> ttl) override;

  // Every token the session holds, in order (its committed state).
  void SessionTokens(Caller caller, std::string session_id, DoneFn<std::vector<int>> done) override;

  // Live totals (thread-safe, no engine round trip): of every session, or of one
  // tenant's.
  StoreTotals Totals() const override;
  StoreTotals TotalsOf(const std::string& tenant) const override;
  // Each tenant's own quotas (sessions, hot and cold bytes; the tokens file), replacing
  // the previous ones; thread-safe. Tenants without an entry have none.
  void SetTenantQuotas(absl::flat_hash_map<std::string, TenantQuota> quotas);
  // Wakes the engine thread (a stream's reader caught up).
  void Wake() override;
  EngineHealth Health() const override;
  // Cancels every running and queued job (they finish with CANCELLED).
  void CancelAll();
  // Stops accepting work (UNAVAILABLE), cancels everything, joins the threads.
  void Shutdown();
  // Requests and jobs waiting (for metrics and tests).
  int QueueDepth() const;

  class Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;  // torch-owning state; lives in engine.cc
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_ENGINE_ENGINE_H_
