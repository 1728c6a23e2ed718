// Engine internals shared by the engine's source files (not part of its API): the
// Impl class that engine.cc's loop and the other engine_*.cc files define the members
// of, and the job record they pass around.
//
//   engine.cc          the loop: Step (schedule -> run -> outputs), completions, reaping
//   engine_input.cc    input checks, tokenization, chat encoding, session info
//   engine_persist.cc  durable sessions: snapshots, cold-tier room, restore on start
//   engine_admit.cc    the one admission point (Admit) and the admissions of create / append /
//                      generate / compress / fork (engine thread)
//   engine_api.cc      Engine's public methods (any thread) and ImportSession
#ifndef ECHOKV_SERVER_ENGINE_ENGINE_IMPL_H_
#define ECHOKV_SERVER_ENGINE_ENGINE_IMPL_H_

#include "server/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <exception>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/errors.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "server/engine/generation.h"
#include "server/engine/persistence.h"
#include "server/engine/runner.h"
#include "server/engine/scheduler.h"
#include "server/engine/session_data.h"
#include "server/state/store.h"
#include "server/state/snapshot.h"
#include "server/engine/turn_job.h"
#include "server/engine/worker_pool.h"

namespace echokv::server {
namespace engine_internal {

// A chat message with only a role and content (the other fields empty).
inline model::ChatMessage MakeMessage(std::string role, std::string content) {
  model::ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

inline CancelFlag OrFreshFlag(CancelFlag cancel) {
  return cancel != nullptr ? std::move(cancel) : std::make_shared<std::atomic<bool>>(false);
}

inline bool IsLookaheadPolicy(compression::PolicyKind kind) {
  return kind == compression::PolicyKind::kLaq || kind == compression::PolicyKind::kEchoKv;
}

// A prefill / compression job with what its completion needs.
struct ActiveJob {
  uint64_t id = 0;
  std::unique_ptr<TurnJob> turn;
  CancelFlag cancel;                                      // never null
  Caller caller;
  std::string session_id;                                 // append / commit
  std::optional<SessionStore::Reservation> reservation;   // create; compress (bytes only)
  std::optional<absl::Duration> ttl;                      // create
  DoneFn<SessionInfo> session_done;                       // create / append
  DoneFn<CompressOutcome> compress_done;                  // compress
  std::unique_ptr<Stream> stream;                         // commit: the finished stream
  std::unique_ptr<Stream> then_generate;                  // append of GenerateParams::input: its stream
  GenerateSummary summary;                                // commit
  std::vector<model::ChatMessage> new_messages;           // chat input / the committed reply
  std::optional<std::string> tools_json;                  // chat input: the tools now in use
  absl::Time admitted;
  // Durable sessions: the turn is written before it is acknowledged.
  bool persist_started = false;
  bool persisted = false;
  absl::Status persist_status;
};

// Forwards the state store's reports to the engine's observer.
class StateObserverAdapter : public state::StateObserver {
 public:
  explicit StateObserverAdapter(EngineObserver* observer) : observer_(observer) {}
  void OnWrite(const state::WriteStats& w) override {
    if (observer_ != nullptr) observer_->OnStateWrite(absl::ToDoubleSeconds(w.duration), w.code == absl::StatusCode::kOk);
  }
  void OnStateError(state::ErrorKind kind) override {
    if (observer_ != nullptr) observer_->OnStateError(state::ErrorKindName(kind));
  }

 private:
  EngineObserver* observer_;  // not owned; may be null
};


}  // namespace engine_internal

// GenerateParams::input once its append turn is done: the session's state with the
// prompt, held by the stream and committed with the reply as one unit. Dropped
// uncommitted (the stream failed or was cancelled), the append turn rolls its cold-tier
// entries back, and the committed session never saw the prompt.
struct PendingPrompt {
  std::unique_ptr<TurnJob> turn;                  // the append turn, not yet Committed()
  std::shared_ptr<SessionData> data;              // the session with the prompt
  SessionInfo meta;                               // as it would be committed
  int64_t tokens_before = 0;                      // the committed session's tokens
  std::vector<model::ChatMessage> new_messages;   // chat input
  std::optional<std::string> tools_json;          // chat input: the tools now in use
};

using engine_internal::ActiveJob;
using engine_internal::IsLookaheadPolicy;
using engine_internal::MakeMessage;
using engine_internal::OrFreshFlag;
using engine_internal::StateObserverAdapter;

class Engine::Impl {
 public:
  // What chat input adds to a session: the whole conversation's tokens (the session's
  // tokens must be their prefix; the rest is new) and, as a fallback when they are
  // not, the tokens of the text the render adds after the previous one.
  struct ChatEncoding {
    std::vector<int> full;
    std::vector<int> suffix;
  };
  EngineConfig config;
  ServerFacts facts;
  EngineObserver* observer = nullptr;  // not owned; may be null
  const Clock* clock = nullptr;        // not owned
  std::shared_ptr<const model::Transformer> model;
  std::shared_ptr<const model::Tokenizer> tokenizer;
  std::optional<model::ChatTemplate> chat;  // unset: chat input unsupported
  std::string chat_error;                   // why chat is unsupported
  int64_t bytes_per_token = 0;              // full-cache KV bytes of one token
  int64_t int8_bytes_per_token = 0;         // the same in int8 rows with their scales
  bool int8_cache_ok = false;               // the model computes on the CPU in float32
  std::vector<int> eos_ids;                 // the tokenizer's and the model's
  std::unique_ptr<SessionStore> store;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Runner> runner;
  std::unique_ptr<WorkerPool> edge;
  // Durable sessions: the store, its observer, and one I/O thread (writes in order).
  std::unique_ptr<StateObserverAdapter> state_observer;
  std::unique_ptr<state::StateStore> durable;
  // The state dir's write probe (MaybeProbeStateDir); before `io`, whose tasks use them.
  std::atomic<bool> state_writable{true};
  std::atomic<bool> state_probe_running{false};
  std::atomic<int64_t> next_state_probe_ns{0};
  std::unique_ptr<WorkerPool> io;
  // Export / import streams (they wait on slow readers, so not on the I/O thread).
  std::unique_ptr<WorkerPool> transfer;
  absl::Mutex fingerprint_mu;
  std::optional<state::ModelFingerprint> fingerprint ABSL_GUARDED_BY(fingerprint_mu);  // computed once

  mutable absl::Mutex mu;
  std::deque<std::function<void()>> inbox ABSL_GUARDED_BY(mu);  // admissions and quick tasks
  bool accepting ABSL_GUARDED_BY(mu) = true;  // false once Shutdown begins
  bool stop ABSL_GUARDED_BY(mu) = false;      // the thread should exit
  bool wake ABSL_GUARDED_BY(mu) = false;      // something became runnable
  std::vector<std::weak_ptr<std::atomic<bool>>> cancels ABSL_GUARDED_BY(mu);  // for CancelAll
  std::atomic<int> work_items{0};             // jobs + streams on the engine thread
  std::atomic<int64_t> last_progress_ns{0};   // clock time of the last completed step or idle wait
  std::thread thread;

  // ---- engine thread only ----
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<ActiveJob>> jobs;
  uint64_t next_work_id = 1;
  absl::Time next_reap = absl::InfinitePast();

  // Queues `task` for the engine thread; false after Shutdown.
  bool Post(std::function<void()> task, const CancelFlag& cancel = nullptr) {
    absl::MutexLock lock(&mu);
    if (!accepting) return false;
    if (cancel != nullptr) {
      cancels.erase(std::remove_if(cancels.begin(), cancels.end(), [](const auto& w) { return w.expired(); }),
                    cancels.end());
      cancels.push_back(cancel);
    }
    inbox.push_back(std::move(task));
    return true;
  }

  void Loop();
  void Step();
  bool HasRunnableWork();
  void RunInbox();
  void Reap();
  void DropCancelled();
  void DrainOnShutdown();
  void ReportGauges();
  void Heartbeat() { last_progress_ns.store(absl::ToUnixNanos(clock->Now())); }

  // Durable sessions.
  absl::Status OpenDurableState();
  bool NeedsPersist(const ActiveJob& j) const {
    // GenerateParams::input's append is written with the reply, in its commit.
    return durable != nullptr && j.turn->spec().kind != TurnKind::kCompress && j.then_generate == nullptr;
  }
  void StartPersist(ActiveJob& j);
  SessionInfo BuildMeta(const ActiveJob& j, const SessionData& data) const;
  // The session's tensors, loaded from disk first when they were spilled or restored.
  absl::StatusOr<std::shared_ptr<SessionData>> SessionDataFor(const std::string& id, const std::string& tenant);
  // Drops idle saved sessions' tensors until `bytes` more cold bytes fit in memory.
  absl::Status MakeColdRoom(int64_t bytes, const std::string& except);
  void ForgetOnDisk(const std::string& id);
  // A failed state store call: logs `s` whole (paths and all) and returns what the
  // client sees: the same code, "<doing> failed: <cause>" with the cause named without
  // the server's paths (the errno's text, the refused kind, else the message with the
  // state dir replaced by "<state_dir>"). A failed write (`write`) that is not a full
  // disk also probes the state dir at once (MaybeProbeStateDir).
  absl::Status StateFailure(const absl::Status& s, absl::string_view doing, bool write);
  // With a state dir: every 10 s (every 1 s while it is unwritable, at once with `now`)
  // a write probe on the I/O thread (StateStore::ProbeWritable) decides state_writable:
  // false while the probe fails with anything but a full disk. Thread-safe.
  void MaybeProbeStateDir(bool now = false);
  // The model's fingerprint (snapshots carry it), computed on first use.
  absl::StatusOr<state::ModelFingerprint> Fingerprint();
  // A scratch store for moving a session that lives in memory only; removed by the
  // returned cleanup (the directory and its files).
  struct ScratchStore {
    std::string dir;
    std::unique_ptr<state::StateStore> store;
    ~ScratchStore();
  };
  absl::StatusOr<std::unique_ptr<ScratchStore>> MakeScratchStore();
  // Streams `exporter` to `sink` (a transfer thread), waiting while its reader lags.
  void StreamExport(state::SnapshotExporter& exporter, const CancelFlag& cancel, const ExportSink& sink,
                    const DoneFn<int64_t>& done);
  void ProcessCompletions(const std::vector<uint64_t>& failed_streams, const std::vector<uint64_t>& finished_streams,
                          const std::vector<uint64_t>& failed_jobs);

  // Completion paths.
  void FinishStream(std::unique_ptr<Stream> s);
  void FailStream(Stream& s, absl::Status status);
  void CompleteJob(ActiveJob& j);
  void FailJob(ActiveJob& j, absl::Status status);
  void ReportCompression(const TurnJob& t);

  // ---- The one admission point (engine_admit.cc; docs/ARCHITECTURE.md "Admission") ----
  // Every job that brings a new session (create, fork, import, restore) or holds KV
  // bytes while it runs without one (compress) asks Admit, which applies the same rules
  // in the same order: the engine still accepts work (else UNAVAILABLE, kUnavailable);
  // cold bytes that count in memory get room first (MakeColdRoom spills idle saved
  // sessions); then the store's limits and the tenant's quotas (max_sessions for a new
  // session, max_kv_bytes, max_cold_bytes: RESOURCE_EXHAUSTED, kLimitReached naming the
  // limit). A refusal by a limit counts in the observer's rejections (not at restore,
  // which nobody asked for). Any thread: the store is thread-safe. Appends and commits
  // create nothing: they claim their session (kBusy when another mutation holds it) and
  // their growth is checked, by the same limits and kinds, when they commit
  // (SessionStore::Commit).
  enum class Admission { kCreate, kFork, kImport, kRestore, kCompress };
  struct AdmitRequest {
    Admission what = Admission::kCreate;
    std::string tenant;
    int64_t hot_bytes = 0;
    int64_t cold_bytes = 0;
    bool cold_in_memory = false;     // the cold bytes count against max_cold_bytes
    std::optional<std::string> id;   // import with keep_id, restore: this id (ALREADY_EXISTS when taken)
    std::string spare;               // a session MakeColdRoom leaves loaded (fork: the source)
  };
  absl::StatusOr<SessionStore::Reservation> Admit(const AdmitRequest& req);
  // The admission estimate of a new cache of `n` tokens: at most min(n, budget) entries
  // per layer and group stay hot (all n for the full policy).
  int64_t HotEstimate(int64_t n, const compression::CompressionConfig& c) const {
    const int64_t per_token = c.cache_dtype == kernels::KvDtype::kInt8 ? int8_bytes_per_token : bytes_per_token;
    return (c.policy == compression::PolicyKind::kFull ? n : std::min<int64_t>(n, c.budget)) * per_token;
  }

  // A job's start, shared by create / append / compress: the turn started from `spec`
  // (the caller undoes its claim or reservation on an error), then a job holding it with
  // a fresh id and the caller's cancel flag, caller and admission time.
  absl::StatusOr<std::unique_ptr<ActiveJob>> StartJob(TurnSpec spec, CancelFlag cancel, Caller caller,
                                                      absl::Time admitted);
  // The ids a generation of a session stops at: the model's end-of-sequence ids, and for
  // a chat session (`chat_session`: it holds messages) the template's end-of-turn ids.
  std::vector<int> StopIds(bool chat_session) const;

  // Admissions (engine thread).
  void AdmitCreate(std::shared_ptr<CreateRequest> req, CancelFlag cancel, ProgressFn progress,
                   DoneFn<SessionInfo> done, std::vector<int> tokens, absl::Time admitted);
  // `then` (GenerateParams::input): the stream that starts from the appended state,
  // which stays uncommitted (PendingPrompt); `done` is unused then.
  void AdmitAppend(std::shared_ptr<AppendRequest> req, CancelFlag cancel, ProgressFn progress,
                   DoneFn<SessionInfo> done, std::vector<int> tokens, std::optional<ChatEncoding> chat_enc,
                   absl::Time admitted, std::unique_ptr<Stream> then = nullptr);
  // The append's edge work (any thread but the engine's): claims the session, checks and
  // tokenizes the input; `fail` answers errors there, `admit` runs on the engine thread.
  // A whole conversation (InputSpec::whole_conversation) is cut to what it adds here;
  // when it adds nothing, `nothing_new` runs instead (on the edge thread, the claim
  // released); null: that is an INVALID_ARGUMENT.
  void EdgeAppend(std::shared_ptr<AppendRequest> req, CancelFlag cancel, ProgressFn progress, absl::Time admitted,
                  std::function<void(absl::Status)> fail,
                  std::function<void(std::vector<int>, std::optional<ChatEncoding>)> admit,
                  std::function<void()> nothing_new);
  // A finished append of GenerateParams::input: its stream begins (engine thread).
  void StartPromptedStream(ActiveJob& j);
  void AdmitGenerate(std::unique_ptr<Stream> s);
  // Compress's job: admitted for its bytes (Admission::kCompress), released when it ends.
  void AdmitCompress(Caller caller, compression::CompressionConfig config, CancelFlag cancel,
                     DoneFn<CompressOutcome> done, std::vector<int> tokens, absl::Time admitted);
  // ForkSession on the engine thread: admitted as a new session of the source's bytes.
  void AdmitFork(Caller caller, std::string session_id, std::optional<absl::Duration> ttl,
                 std::shared_ptr<DoneFn<SessionInfo>> done);

  absl::StatusOr<ChatEncoding> EncodeConversation(const std::vector<model::ChatMessage>& previous,
                                                  const std::vector<model::ChatMessage>& added,
                                                  const std::string& tools_json, bool add_generation_prompt) const;
  // What a committed assistant reply adds to a chat session: the tokens the template
  // gives the conversation up to the end of the reply's turn (the common token prefix of
  // the conversation rendered as ending with the reply and as continuing with another
  // user turn, so a trailing end-of-conversation text (Phi-3.5's eos) is left out).
  absl::StatusOr<ChatEncoding> EncodeReply(const std::vector<model::ChatMessage>& previous,
                                           const model::ChatMessage& reply, const std::string& tools_json) const;
  // The new tokens of `enc` for a session holding `held`.
  std::vector<int> NewChatTokens(const ChatEncoding& enc, const std::vector<int>& held) const;
  void StartCommit(std::unique_ptr<Stream> s, GenerateSummary summary, std::vector<int> tokens,
                   std::vector<model::ChatMessage> reply);
  absl::Status CheckRequestBytes(const InputSpec& input) const;
  absl::StatusOr<std::vector<int>> Tokenize(const InputSpec& input, bool default_special, int64_t max_tokens,
                                            int64_t held) const;
  absl::Status CheckTtl(const std::optional<absl::Duration>& ttl) const;
  // The settings every new session must satisfy, however it arrives (CreateSession,
  // ImportSession): the ttl (CheckTtl) and the compression config ("compression.<field>
  // ..."). INVALID_ARGUMENT naming the field.
  absl::Status CheckSessionSettings(const std::optional<absl::Duration>& ttl,
                                    const compression::CompressionConfig& config) const;
  // Every id in [0, vocab_size): INVALID_ARGUMENT "<field>[i] = x is outside the
  // vocabulary [0, V)" (input.tokens.ids of a request, the tokens of a snapshot).
  absl::Status CheckTokenIds(absl::Span<const int> ids, absl::string_view field) const;
  // ImportSession's admission check of a parsed snapshot, the rules of CreateSession
  // (CheckSessionSettings on the ttl that will apply and the saved config; CheckTokenIds
  // and max_context_tokens on the token history). INVALID_ARGUMENT "snapshot: ...".
  absl::Status CheckImport(const state::SavedSession& saved, const SessionInfo& incoming,
                           const std::optional<absl::Duration>& ttl) const;
  SessionInfo MetaFor(const SessionData& data, const compression::CompressionReport& report, MemoryMode memory) const;
  // Per layer and group: entries, bytes, positions (when asked) and the retained
  // attention mass of `report` (the compression that made these cells; -1 without one);
  // bytes per entry as `dtype` stores them (int8 rows count their scales).
  std::vector<LayerCacheInfo> Layers(const model::KvCells& cells, bool positions,
                                     const compression::CompressionReport* report,
                                     kernels::KvDtype dtype) const;
  std::function<void(const std::string&, int64_t, int64_t)> ProgressAdapter(ProgressFn progress,
                                                                            absl::Time admitted) const;
  // Counts a refusal by a limit (ErrorInfo::limit) in the observer's rejections.
  void Reject(const absl::Status& s) {
    const ErrorInfo info = ErrorInfoOf(s);
    if (observer != nullptr && info.kind == ErrorKind::kLimitReached && !info.limit.empty()) {
      observer->OnSessionRejected(info.limit);
    }
  }
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_ENGINE_ENGINE_IMPL_H_
