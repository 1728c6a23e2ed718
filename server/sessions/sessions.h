// The session layer (docs/ARCHITECTURE.md "Layers"): the one set of session use-cases
// both doors call, over the engine's port (server/engine/engine.h, EnginePort), and the
// stream slots both doors share. A door parses and authenticates a request, calls one
// method here and formats what comes back; it never sequences engine calls itself.
//
//   Sessions sessions(engine.get(), metrics.get(), {.stream_reserve = 8, .stream_quota = quota_of});
//   if (absl::Status s = sessions.AcquireStream(caller.tenant); !s.ok()) return Reply(s);
//   CompletionRequest c;  c.caller = caller;  c.session = CompletionRequest::Session::kContinue;
//   c.session_id = id;  c.input = whole_conversation;  c.generate.max_tokens = 64;
//   std::shared_ptr<Completion> run = sessions.Complete(std::move(c), sink, on_session, done);
//   ... the client leaves: run->Abandon();  ... the end: sessions.ReleaseStream(caller.tenant);
//
// Every method returns at once; its callbacks follow the engine's rules (engine.h): they
// run on the engine thread or an edge thread and must not block.
#ifndef ECHOKV_SERVER_SESSIONS_SESSIONS_H_
#define ECHOKV_SERVER_SESSIONS_SESSIONS_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/engine/stats.h"
#include "server/sessions/stream_slots.h"

namespace echokv::server {

struct SessionsOptions {
  int stream_reserve = 0;  // StreamSlots' fair-share reserve
  // A tenant's own max_streams quota (0 = none); empty: no tenant has one.
  std::function<int(const std::string& tenant)> stream_quota;
};

// A completion (the HTTP door's chat and text completions): one generation on a session
// that is created for it, or one that it continues.
struct CompletionRequest {
  enum class Session {
    kStateless,  // a temporary session, deleted when the generation ends
    kNew,        // a new session that outlives the reply (deleted again if it fails)
    kContinue,   // `session_id`: the input is appended with the reply, in one unit
  };
  Caller caller;
  Session session = Session::kStateless;
  std::string session_id;                 // kContinue
  // kStateless, kNew: how the session is created (CreateRequest's fields).
  compression::CompressionConfig config;
  std::optional<MemoryMode> memory;
  std::optional<absl::Duration> ttl;
  // The prompt. kContinue: chat input is the whole conversation (only what follows the
  // session's stored messages is appended: InputSpec::whole_conversation); "" text
  // appends nothing (the generation continues where the session ends).
  InputSpec input;
  // Sampling, stops, max_tokens; caller, session_id, commit and input are set here.
  GenerateParams generate;
};

// A completion in flight (Sessions::Complete).
class Completion {
 public:
  // The client did not get the whole reply (it left, or the server stops): the
  // generation is cancelled (a continued session is rolled back by the engine) and a
  // session this completion created is deleted, even when its generation had finished.
  void Abandon();
  CancelFlag cancel() const { return cancel_; }

 private:
  friend class Sessions;
  // The generation ended: whether the session this completion created goes (stateless:
  // always; new: unless the generation succeeded and the reply was not abandoned).
  void Ended(bool ok);
  void DeleteCreated() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  EnginePort* engine_ = nullptr;
  Caller caller_;
  CompletionRequest::Session mode_ = CompletionRequest::Session::kStateless;
  CancelFlag cancel_ = std::make_shared<std::atomic<bool>>(false);
  absl::Mutex mu_;
  std::string created_ ABSL_GUARDED_BY(mu_);  // the session this completion created
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;
  bool deleted_ ABSL_GUARDED_BY(mu_) = false;
};

// A session as GetSession answers it: its metadata and stats and, when asked, every
// token it holds.
struct SessionView {
  SessionInfo info;
  std::optional<std::vector<int>> tokens;
};

class Sessions {
 public:
  // `engine` and `observer` (may be null) must outlive this.
  Sessions(EnginePort* engine, EngineObserver* observer, SessionsOptions options);

  const ServerFacts& facts() const { return engine_->facts(); }
  StoreTotals Totals() const { return engine_->Totals(); }
  StoreTotals TotalsOf(const std::string& tenant) const { return engine_->TotalsOf(tenant); }
  // A stream's reader caught up: the engine may run it again.
  void Wake() { engine_->Wake(); }
  EngineHealth Health() const { return engine_->Health(); }

  // Stream slots (StreamSlots: max_concurrent_streams, the tenant's max_streams, the
  // fair-share reserve), one per streaming call of either door and per Compress:
  // RESOURCE_EXHAUSTED naming the limit, nothing claimed.
  absl::Status AcquireStream(const std::string& tenant);
  void ReleaseStream(const std::string& tenant);
  int streams_in_flight() const { return slots_.in_flight(); }

  // The use-cases (engine.h has each one's contract).
  void Create(CreateRequest request, CancelFlag cancel, ProgressFn progress, DoneFn<SessionInfo> done);
  void Append(AppendRequest request, CancelFlag cancel, ProgressFn progress, DoneFn<SessionInfo> done);
  void Generate(GenerateParams params, CancelFlag cancel, StreamSink sink, DoneFn<GenerateSummary> done);
  void Fork(Caller caller, std::string session_id, std::optional<absl::Duration> ttl, DoneFn<SessionInfo> done);
  void Compress(Caller caller, InputSpec input, compression::CompressionConfig config, CancelFlag cancel,
                DoneFn<CompressOutcome> done);
  // The session and, with include_tokens, every token it holds (read just after the
  // metadata).
  void Get(Caller caller, std::string session_id, bool include_tokens, DoneFn<SessionView> done);
  void List(Caller caller, DoneFn<std::vector<SessionInfo>> done);
  void Delete(Caller caller, std::string session_id, DoneFn<int64_t> done);
  void Inspect(Caller caller, std::string session_id, bool include_positions, DoneFn<CacheInspection> done);
  void Export(Caller caller, std::string session_id, CancelFlag cancel, ExportSink sink, DoneFn<int64_t> done);
  std::unique_ptr<SessionImport> BeginImport(Caller caller, bool keep_id, std::optional<absl::Duration> ttl);

  // A completion as one call: creates the session it runs on (kStateless, kNew) or
  // continues one (kContinue: one engine job, the input appended with the reply, the
  // conversation checked against the session's under its claim), then generates.
  // `on_session` runs once, with the session's id, before the first delta (not at all
  // when creating it fails); `done` runs once, after the temporary session of a
  // stateless completion (or the new one of a failed completion) is scheduled for
  // deletion. Cancel through the returned handle.
  std::shared_ptr<Completion> Complete(CompletionRequest request, StreamSink sink,
                                       std::function<void(const std::string& session_id)> on_session,
                                       DoneFn<GenerateSummary> done);

 private:
  EnginePort* engine_;         // not owned
  EngineObserver* observer_;   // not owned; may be null
  SessionsOptions options_;
  StreamSlots slots_;
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_SESSIONS_SESSIONS_H_
