// The engine loop: inbox -> schedule -> run -> outputs -> reap (engine.h). The pieces
// live in their own files: SessionStore (bookkeeping), Scheduler (what runs), Runner
// (batched decode rows), TurnJob (prefill + compression state machines), Stream
// (sampling and deltas), WorkerPool (edge threads for validation and tokenization).
#include "server/engine.h"

#include <ATen/ATen.h>

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
#include "common/logging.h"
#include "common/status_macros.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "server/generation.h"
#include "server/persistence.h"
#include "server/runner.h"
#include "server/scheduler.h"
#include "server/session_data.h"
#include "server/state/store.h"
#include "server/state/snapshot.h"
#include "server/turn_job.h"
#include "server/worker_pool.h"

#ifndef ECHOKV_VERSION
#define ECHOKV_VERSION "0.0.0"
#endif

namespace echokv::server {

absl::Status EngineLimits::Validate() const {
  if (max_context_tokens < 0) return absl::InvalidArgumentError("max_context_tokens must be >= 0 (0 = model max)");
  if (max_new_tokens < 1) return absl::InvalidArgumentError("max_new_tokens must be >= 1");
  if (max_sessions < 1) return absl::InvalidArgumentError("max_sessions must be >= 1");
  if (max_kv_bytes < 1) return absl::InvalidArgumentError("max_kv_bytes must be >= 1");
  if (max_cold_bytes < 0) return absl::InvalidArgumentError("max_cold_bytes must be >= 0");
  if (session_ttl <= absl::ZeroDuration()) return absl::InvalidArgumentError("session_ttl must be > 0");
  if (max_session_ttl < session_ttl) return absl::InvalidArgumentError("max_session_ttl must be >= session_ttl");
  if (max_concurrent_streams < 1) return absl::InvalidArgumentError("max_concurrent_streams must be >= 1");
  if (max_request_bytes < 1) return absl::InvalidArgumentError("max_request_bytes must be >= 1");
  if (max_stream_backlog < 1) return absl::InvalidArgumentError("max_stream_backlog must be >= 1");
  return absl::OkStatus();
}

absl::Status EngineConfig::Validate() const {
  if (model_dir.empty()) return absl::InvalidArgumentError("model: a model directory is required");
  if (prefill_chunk < 1) return absl::InvalidArgumentError("prefill_chunk must be >= 1");
  if (max_step_tokens < 1) return absl::InvalidArgumentError("max_step_tokens must be >= 1");
  if (edge_threads < 1) return absl::InvalidArgumentError("edge_threads must be >= 1");
  if (stuck_after <= absl::ZeroDuration()) return absl::InvalidArgumentError("stuck_after must be > 0");
  if (save_full_every < 1) return absl::InvalidArgumentError("save_full_every must be >= 1");
  if (!replica_id.empty() && !IsValidSessionId(absl::StrCat(replica_id, ".", std::string(32, '0')))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replica_id must be a DNS label ([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?), got ", EscapedIdPrefix(replica_id)));
  }
  if (absl::Status s = default_compression.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("default compression: ", s.message()));
  }
  return limits.Validate();
}

namespace {

CancelFlag OrFreshFlag(CancelFlag cancel) {
  return cancel != nullptr ? std::move(cancel) : std::make_shared<std::atomic<bool>>(false);
}

bool IsLookaheadPolicy(compression::PolicyKind kind) {
  return kind == compression::PolicyKind::kLaq || kind == compression::PolicyKind::kEchoKv;
}

// The limit a RESOURCE_EXHAUSTED message names first ("max_sessions (...", ...).
std::string LimitName(const absl::Status& s) {
  const std::string msg(s.message());
  const size_t end = msg.find_first_of(" (");
  return msg.substr(0, end);
}

// A prefill / compression job with what its completion needs.
struct ActiveJob {
  uint64_t id = 0;
  std::unique_ptr<TurnJob> turn;
  CancelFlag cancel;                                      // never null
  Caller caller;
  std::string session_id;                                 // append / commit
  std::optional<SessionStore::Reservation> reservation;   // create
  std::optional<absl::Duration> ttl;                      // create
  DoneFn<SessionInfo> session_done;                       // create / append
  DoneFn<CompressOutcome> compress_done;                  // compress
  std::unique_ptr<Stream> stream;                         // commit: the finished stream
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

}  // namespace

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
  std::vector<int> eos_ids;                 // the tokenizer's and the model's
  std::unique_ptr<SessionStore> store;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Runner> runner;
  std::unique_ptr<WorkerPool> edge;
  // Durable sessions: the store, its observer, and one I/O thread (writes in order).
  std::unique_ptr<StateObserverAdapter> state_observer;
  std::unique_ptr<state::StateStore> durable;
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
    return durable != nullptr && j.turn->spec().kind != TurnKind::kCompress;
  }
  void StartPersist(ActiveJob& j);
  SessionMeta BuildMeta(const ActiveJob& j, const SessionData& data) const;
  // The session's tensors, loaded from disk first when they were spilled or restored.
  absl::StatusOr<std::shared_ptr<SessionData>> SessionDataFor(const std::string& id, const std::string& tenant);
  // Drops idle saved sessions' tensors until `bytes` more cold bytes fit in memory.
  absl::Status MakeColdRoom(int64_t bytes, const std::string& except);
  void ForgetOnDisk(const std::string& id);
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

  // Admissions (engine thread).
  void AdmitCreate(std::shared_ptr<CreateRequest> req, CancelFlag cancel, ProgressFn progress,
                   DoneFn<SessionInfo> done, std::vector<int> tokens, absl::Time admitted);
  void AdmitAppend(std::shared_ptr<AppendRequest> req, CancelFlag cancel, ProgressFn progress,
                   DoneFn<SessionInfo> done, std::vector<int> tokens, std::optional<ChatEncoding> chat_enc,
                   absl::Time admitted);
  void AdmitGenerate(std::unique_ptr<Stream> s);

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
  SessionInfo Info(const SessionMeta& m) const;
  SessionMeta MetaFor(const SessionData& data, const compression::CompressionReport& report, MemoryMode memory) const;
  std::vector<LayerCacheInfo> Layers(const model::KvCells& cells, bool positions) const;
  std::function<void(const std::string&, int64_t, int64_t)> ProgressAdapter(ProgressFn progress,
                                                                            absl::Time admitted) const;
  void Reject(const absl::Status& s) {
    if (observer != nullptr && absl::IsResourceExhausted(s)) observer->OnSessionRejected(LimitName(s));
  }
};

// ------------------------------------------------------------------------------
// Helpers

absl::Status Engine::Impl::CheckTtl(const std::optional<absl::Duration>& ttl) const {
  if (!ttl.has_value()) return absl::OkStatus();
  if (*ttl <= absl::ZeroDuration() || *ttl > config.limits.max_session_ttl) {
    return absl::InvalidArgumentError(absl::StrCat("ttl_seconds must be in [1, ",
                                                   absl::ToInt64Seconds(config.limits.max_session_ttl),
                                                   "] (max_session_ttl), got ", absl::ToInt64Seconds(*ttl)));
  }
  return absl::OkStatus();
}

SessionInfo Engine::Impl::Info(const SessionMeta& m) const {
  SessionInfo info;
  info.id = m.id;
  info.memory = m.memory;
  info.tokens_seen = m.tokens_seen;
  info.retained_entries = m.retained_entries;
  info.retained_kv_bytes = m.hot_bytes;
  info.full_kv_bytes = m.full_bytes;
  info.cold_kv_bytes = m.cold_bytes;
  info.config = m.config;
  info.last_report = m.last_report;
  info.created = m.created;
  info.last_used = m.last_used;
  info.ttl = m.ttl;
  info.busy = m.busy;
  info.messages = m.messages;
  info.tools_json = m.tools_json;
  return info;
}

SessionMeta Engine::Impl::MetaFor(const SessionData& data, const compression::CompressionReport& report,
                                  MemoryMode memory) const {
  SessionMeta m;
  m.memory = memory;
  m.config = report.config;
  m.last_report = report;
  m.tokens_seen = static_cast<int64_t>(data.tokens.size());
  m.retained_entries = data.hot.cells().TotalEntries();
  m.hot_bytes = data.hot.KvBytes();
  m.full_bytes = data.hot.FullEquivalentKvBytes(m.tokens_seen);
  if (data.cold != nullptr) {
    m.cold_bytes = data.cold->FullEquivalentKvBytes(data.cold_len);
    m.cold_in_memory = true;
  }
  return m;
}

std::vector<LayerCacheInfo> Engine::Impl::Layers(const model::KvCells& cells, bool positions) const {
  const int64_t row = bytes_per_token / std::max(1, facts.num_layers * facts.num_kv_heads);
  std::vector<LayerCacheInfo> out;
  for (int l = 0; l < cells.num_layers(); ++l) {
    LayerCacheInfo layer;
    layer.retained = cells.size(l);
    for (int g = 0; g < cells.num_kv_heads(); ++g) {
      GroupCache gc;
      gc.retained = static_cast<int64_t>(cells.positions(l, g).size());
      if (positions) gc.positions = cells.positions(l, g);
      gc.kv_bytes = gc.retained * row;
      layer.kv_bytes += gc.kv_bytes;
      layer.groups.push_back(std::move(gc));
    }
    out.push_back(std::move(layer));
  }
  return out;
}

std::function<void(const std::string&, int64_t, int64_t)> Engine::Impl::ProgressAdapter(ProgressFn progress,
                                                                                        absl::Time admitted) const {
  if (!progress) return nullptr;
  const Clock* c = clock;
  return [progress, admitted, c](const std::string& phase, int64_t done, int64_t total) {
    progress(ProgressEvent{phase, done, total, absl::ToDoubleSeconds(c->Now() - admitted)});
  };
}

absl::Status Engine::Impl::CheckRequestBytes(const InputSpec& input) const {
  int64_t bytes = static_cast<int64_t>(input.text.size() + input.tools_json.size()) +
                  static_cast<int64_t>(input.tokens.size()) * 4;
  for (const auto& m : input.chat) {
    bytes += static_cast<int64_t>(m.content.size() + m.role.size() + m.name.size() + m.tool_call_id.size());
    for (const auto& c : m.tool_calls) bytes += static_cast<int64_t>(c.id.size() + c.name.size() + c.arguments_json.size());
  }
  if (bytes > config.limits.max_request_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("input: ", bytes, " bytes exceed max_request_bytes (",
                                                   config.limits.max_request_bytes, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> Engine::Impl::Tokenize(const InputSpec& input, bool default_special,
                                                       int64_t max_tokens, int64_t held) const {
  ECHOKV_RETURN_IF_ERROR(CheckRequestBytes(input));
  const int64_t max_ctx = facts.limits.max_context_tokens;
  auto too_long = [&](int64_t n, bool at_least) {
    return absl::InvalidArgumentError(absl::StrCat("input: ", at_least ? "at least " : "", n, " tokens",
                                                   held > 0 ? absl::StrCat(" + ", held, " in the session") : "",
                                                   " exceed max_context_tokens (", max_ctx, ")"));
  };
  std::vector<int> ids;
  switch (input.kind) {
    case InputSpec::Kind::kNone:
      return absl::InvalidArgumentError("input: one of text, tokens or chat is required");
    case InputSpec::Kind::kText: {
      if (input.text.empty()) return absl::InvalidArgumentError("input.text: empty");
      model::EncodeOptions eo;
      eo.add_special_tokens = input.add_special_tokens.value_or(default_special);
      eo.parse_special = false;  // user text: special-token strings stay plain text
      // Bounded work: tokenization stops as soon as the text cannot fit (#12).
      ECHOKV_ASSIGN_OR_RETURN(model::BoundedEncoding enc, tokenizer->EncodeAtMost(input.text, eo, max_tokens));
      if (enc.exceeded) return too_long(enc.at_least, true);
      ids = std::move(enc.ids);
      break;
    }
    case InputSpec::Kind::kTokens: {
      if (input.tokens.empty()) return absl::InvalidArgumentError("input.tokens: empty");
      const int v = facts.vocab_size;
      for (size_t i = 0; i < input.tokens.size(); ++i) {
        if (input.tokens[i] < 0 || input.tokens[i] >= v) {
          return absl::InvalidArgumentError(absl::StrCat("input.tokens.ids[", i, "] = ", input.tokens[i],
                                                         " is outside the vocabulary [0, ", v, ")"));
        }
      }
      ids = input.tokens;
      break;
    }
    case InputSpec::Kind::kChat: {
      if (input.chat.empty()) return absl::InvalidArgumentError("input.chat: no messages");
      if (!chat.has_value()) {
        return absl::UnimplementedError(absl::StrCat("input.chat: this model has no usable chat template (",
                                                     chat_error, "); send text or tokens instead"));
      }
      absl::StatusOr<ChatEncoding> r = EncodeConversation({}, input.chat, input.tools_json, input.add_generation_prompt);
      if (!r.ok()) return r.status();
      ids = std::move(r->full);
      break;
    }
  }
  if (ids.empty()) return absl::InvalidArgumentError("input: no tokens after tokenization");
  if (static_cast<int64_t>(ids.size()) > max_tokens) return too_long(static_cast<int64_t>(ids.size()), false);
  return ids;
}

absl::StatusOr<Engine::Impl::ChatEncoding> Engine::Impl::EncodeConversation(
    const std::vector<model::ChatMessage>& previous, const std::vector<model::ChatMessage>& added,
    const std::string& tools_json, bool add_generation_prompt) const {
  auto fail = [](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("input.chat: ", s.message()));
  };
  std::vector<model::ChatMessage> all = previous;
  all.insert(all.end(), added.begin(), added.end());
  absl::StatusOr<std::string> full_text = chat->Render(all, tools_json, add_generation_prompt);
  if (!full_text.ok()) return fail(full_text.status());
  ChatEncoding enc;
  absl::StatusOr<std::vector<int>> full = model::EncodeRenderedChat(*full_text, *tokenizer);
  if (!full.ok()) return fail(full.status());
  enc.full = std::move(*full);
  if (previous.empty()) {
    // A session without a conversation yet (text or token input before): the new
    // messages' render, without the template's leading BOS in the middle of a session.
    std::string text = *full_text;
    const std::string& bos = chat->bos_token();
    if (!bos.empty() && text.compare(0, bos.size(), bos) == 0) text.erase(0, bos.size());
    absl::StatusOr<std::vector<int>> suffix = model::EncodeRenderedChat(text, *tokenizer);
    if (!suffix.ok()) return fail(suffix.status());
    enc.suffix = std::move(*suffix);
    return enc;
  }
  absl::StatusOr<std::string> prev_text = chat->Render(previous, tools_json, false);
  if (!prev_text.ok()) return fail(prev_text.status());
  size_t common = 0;
  while (common < prev_text->size() && common < full_text->size() && (*prev_text)[common] == (*full_text)[common]) {
    ++common;
  }
  absl::StatusOr<std::vector<int>> suffix = model::EncodeRenderedChat(full_text->substr(common), *tokenizer);
  if (!suffix.ok()) return fail(suffix.status());
  enc.suffix = std::move(*suffix);
  return enc;
}

absl::StatusOr<Engine::Impl::ChatEncoding> Engine::Impl::EncodeReply(const std::vector<model::ChatMessage>& previous,
                                                                   const model::ChatMessage& reply,
                                                                   const std::string& tools_json) const {
  std::vector<model::ChatMessage> all = previous;
  all.push_back(reply);
  ECHOKV_ASSIGN_OR_RETURN(std::string ended, chat->Render(all, tools_json, false));
  ECHOKV_ASSIGN_OR_RETURN(std::vector<int> ended_ids, model::EncodeRenderedChat(ended, *tokenizer));
  ChatEncoding enc;
  enc.full = std::move(ended_ids);
  all.push_back(model::ChatMessage{"user", "next"});
  absl::StatusOr<std::string> continued = chat->Render(all, tools_json, true);
  if (continued.ok()) {
    absl::StatusOr<std::vector<int>> next_ids = model::EncodeRenderedChat(*continued, *tokenizer);
    if (next_ids.ok()) {
      size_t common = 0;
      while (common < enc.full.size() && common < next_ids->size() && enc.full[common] == (*next_ids)[common]) {
        ++common;
      }
      enc.full.resize(common);
    }
  }
  return enc;
}

std::vector<int> Engine::Impl::NewChatTokens(const ChatEncoding& enc, const std::vector<int>& held) const {
  if (!held.empty() && enc.full.size() > held.size() && std::equal(held.begin(), held.end(), enc.full.begin())) {
    return std::vector<int>(enc.full.begin() + held.size(), enc.full.end());
  }
  // The session is not a prefix of the re-rendered conversation (a template that
  // renders earlier turns differently once later ones exist, an assistant turn left
  // open, text input before): append what the render adds after the previous render.
  ECHOKV_LOG(WARNING) << "chat append: the session is not a prefix of the whole conversation's tokens; appending "
                         "the rendered suffix (" << enc.suffix.size() << " tokens)";
  return enc.suffix;
}

// ------------------------------------------------------------------------------
// Engine thread

bool Engine::Impl::HasRunnableWork() {
  for (const auto& j : jobs) {
    if (j->turn->next() != JobView::Next::kWaiting || (j->cancel->load() && !j->persist_started)) return true;
    if (j->turn->done() && (!j->persist_started || j->persisted)) return true;
  }
  for (const auto& s : streams) {
    if (s->cancelled() || s->ready(config.limits.max_stream_backlog)) return true;
  }
  return false;
}

void Engine::Impl::Loop() {
  while (true) {
    bool stopping = false;
    {
      absl::MutexLock lock(&mu);
      if (inbox.empty() && !stop && !wake && !HasRunnableWork()) {
        mu.AwaitWithTimeout(absl::Condition(
                                +[](Impl* impl) ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl->mu) {
                                  return !impl->inbox.empty() || impl->stop || impl->wake;
                                },
                                this),
                            absl::Milliseconds(200));
      }
      stopping = stop;
      wake = false;
    }
    Heartbeat();  // an idle engine is not a stuck one
    RunInbox();
    if (stopping) {
      DrainOnShutdown();
      return;
    }
    Reap();
    DropCancelled();
    Step();
    Heartbeat();
    work_items.store(static_cast<int>(jobs.size() + streams.size()));
    ReportGauges();
  }
}

void Engine::Impl::RunInbox() {
  std::deque<std::function<void()>> batch;
  {
    absl::MutexLock lock(&mu);
    batch.swap(inbox);
  }
  for (auto& task : batch) task();
}

void Engine::Impl::Reap() {
  const absl::Time now = clock->Now();
  if (now < next_reap) return;
  next_reap = now + absl::Milliseconds(200);
  for (const std::string& id : store->ReapExpired()) {
    ForgetOnDisk(id);
    if (observer != nullptr) observer->OnSessionExpired();
    ECHOKV_LOG(INFO) << "a session expired (idle beyond its ttl)";
  }
}

void Engine::Impl::DropCancelled() {
  for (auto it = streams.begin(); it != streams.end();) {
    if ((*it)->cancelled()) {
      FailStream(**it, absl::CancelledError("generation cancelled"));
      it = streams.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = jobs.begin(); it != jobs.end();) {
    // A turn whose write started is past the point of no return: it completes.
    if ((*it)->cancel->load() && !(*it)->persist_started) {
      FailJob(**it, absl::CancelledError("cancelled"));
      it = jobs.erase(it);
    } else {
      ++it;
    }
  }
}

void Engine::Impl::Step() {
  std::vector<StreamView> stream_views;
  stream_views.reserve(streams.size());
  for (const auto& s : streams) stream_views.push_back({s->id(), s->ready(config.limits.max_stream_backlog)});
  std::vector<JobView> job_views;
  job_views.reserve(jobs.size());
  for (const auto& j : jobs) job_views.push_back({j->id, j->turn->next(), j->turn->prefill_remaining()});
  const Plan plan = scheduler->Schedule(stream_views, job_views);
  if (plan.empty()) {
    ProcessCompletions({}, {}, {});  // e.g. a durable write came back
    return;
  }

  auto find_stream = [&](uint64_t id) -> Stream* {
    for (auto& s : streams) {
      if (s->id() == id) return s.get();
    }
    return nullptr;
  };
  auto find_job = [&](uint64_t id) -> ActiveJob* {
    for (auto& j : jobs) {
      if (j->id == id) return j.get();
    }
    return nullptr;
  };
  std::vector<uint64_t> failed_streams;
  std::vector<uint64_t> failed_jobs;

  // 1. One batched decode for every planned stream's pending token and lookahead row.
  std::vector<Runner::Row> rows;
  std::vector<Stream*> row_streams;  // null for job rows
  std::vector<ActiveJob*> row_jobs;  // null for stream rows
  for (uint64_t id : plan.decode_streams) {
    Stream* s = find_stream(id);
    if (s == nullptr || s->pending_token() < 0) continue;  // a fresh stream samples stored logits
    rows.push_back({s->pending_token(), s->cache(), false});
    row_streams.push_back(s);
    row_jobs.push_back(nullptr);
  }
  for (uint64_t id : plan.decode_jobs) {
    ActiveJob* j = find_job(id);
    if (j == nullptr) continue;
    std::optional<compression::CompressionTask::DecodeRequest> req = j->turn->pending_decode();
    if (!req.has_value()) continue;
    rows.push_back({req->token, req->view, true});
    row_streams.push_back(nullptr);
    row_jobs.push_back(j);
  }
  std::vector<absl::StatusOr<compression::LookaheadDecoder::Step>> results = runner->Decode(rows);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (row_streams[i] != nullptr) {
      if (results[i].ok()) {
        row_streams[i]->SetLogits(std::move(results[i]->logits));
      } else {
        FailStream(*row_streams[i], results[i].status());
        failed_streams.push_back(row_streams[i]->id());
      }
    } else {
      absl::Status s = results[i].ok() ? row_jobs[i]->turn->SupplyDecode(std::move(*results[i])) : results[i].status();
      if (!s.ok()) {
        FailJob(*row_jobs[i], s);
        failed_jobs.push_back(row_jobs[i]->id);
      }
    }
  }

  // 2. Outputs: sample, stop, deltas.
  std::vector<uint64_t> finished_streams;
  for (uint64_t id : plan.decode_streams) {
    if (std::find(failed_streams.begin(), failed_streams.end(), id) != failed_streams.end()) continue;
    Stream* s = find_stream(id);
    if (s == nullptr) continue;
    absl::StatusOr<bool> finished;
    try {
      finished = s->Emit(clock->Now(), observer);
    } catch (const std::exception& e) {
      finished = absl::InternalError(absl::StrCat("generation failed: ", e.what()));
    }
    if (!finished.ok()) {
      FailStream(*s, finished.status());
      failed_streams.push_back(id);
    } else if (*finished) {
      finished_streams.push_back(id);
    }
  }

  // 3. Prefill slices, oldest job first; 4. bounded policy phases.
  for (const Plan::PrefillSlice& slice : plan.prefill) {
    ActiveJob* j = find_job(slice.job);
    if (j == nullptr || std::find(failed_jobs.begin(), failed_jobs.end(), slice.job) != failed_jobs.end()) continue;
    if (absl::Status s = j->turn->Prefill(slice.tokens); !s.ok()) {
      FailJob(*j, s);
      failed_jobs.push_back(slice.job);
    }
  }
  for (uint64_t id : plan.phase_jobs) {
    ActiveJob* j = find_job(id);
    if (j == nullptr || std::find(failed_jobs.begin(), failed_jobs.end(), id) != failed_jobs.end()) continue;
    if (absl::Status s = j->turn->RunPhase(); !s.ok()) {
      FailJob(*j, s);
      failed_jobs.push_back(id);
    }
  }

  ProcessCompletions(failed_streams, finished_streams, failed_jobs);
}

// Failed work already answered; finished streams and jobs answer now. Durable turns are
// written first (on the I/O thread) and answered once the write came back.
void Engine::Impl::ProcessCompletions(const std::vector<uint64_t>& failed_streams,
                                      const std::vector<uint64_t>& finished_streams,
                                      const std::vector<uint64_t>& failed_jobs) {
  auto has = [](const std::vector<uint64_t>& v, uint64_t id) { return std::find(v.begin(), v.end(), id) != v.end(); };
  std::vector<std::unique_ptr<Stream>> done_streams;
  for (auto it = streams.begin(); it != streams.end();) {
    const uint64_t id = (*it)->id();
    const bool failed = has(failed_streams, id);
    const bool finished = has(finished_streams, id);
    if (failed || finished) {
      if (finished) done_streams.push_back(std::move(*it));
      it = streams.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = jobs.begin(); it != jobs.end();) {
    ActiveJob& j = **it;
    if (has(failed_jobs, j.id)) {
      it = jobs.erase(it);
      continue;
    }
    if (!j.turn->done()) {
      ++it;
      continue;
    }
    if (NeedsPersist(j) && !j.persist_started) StartPersist(j);
    if (j.persist_started && !j.persisted) {
      ++it;  // its write is in flight
      continue;
    }
    std::unique_ptr<ActiveJob> owned = std::move(*it);
    it = jobs.erase(it);
    if (owned->persist_started && !owned->persist_status.ok()) {
      FailJob(*owned, owned->persist_status);
    } else {
      CompleteJob(*owned);
    }
  }
  for (auto& s : done_streams) FinishStream(std::move(s));
}

void Engine::Impl::FailStream(Stream& s, absl::Status status) {
  if (s.params().commit) store->Release(s.params().session_id);
  s.Finish(std::move(status));
}

void Engine::Impl::FinishStream(std::unique_ptr<Stream> s) {
  GenerateSummary summary = s->Summary(clock->Now());
  if (observer != nullptr) observer->OnGeneratedTokens(static_cast<int64_t>(s->generated().size()));
  if (!s->params().commit) {
    s->Finish(std::move(summary));
    return;
  }
  // Commit: the generated tokens and the end-of-turn token that stopped them
  // (EOS / stop id) enter the session, as the conversation format requires.
  std::vector<int> tokens = s->generated();
  if (s->stop_token() >= 0) tokens.push_back(s->stop_token());
  const std::string& id = s->params().session_id;
  const std::string& tenant = s->params().caller.tenant;
  if (tokens.empty()) {
    store->Release(id);
    absl::StatusOr<SessionMeta> meta = store->Get(id, tenant, true);
    if (meta.ok()) summary.session = Info(*meta);
    s->Finish(std::move(summary));
    return;
  }
  absl::StatusOr<SessionMeta> meta = store->Get(id, tenant, false);
  if (!meta.ok()) return FailStream(*s, meta.status());
  if (meta->messages.empty() || !chat.has_value()) {
    return StartCommit(std::move(s), std::move(summary), std::move(tokens), {});
  }
  // A chat session: the reply enters the session as the template renders it (the whole
  // conversation re-rendered and tokenized, off the engine thread), so the session stays
  // exactly the tokens of render(conversation); the sampled ids are the fallback.
  std::vector<model::ChatMessage> reply = {model::ChatMessage{"assistant", s->text()}};
  struct Pending {
    std::unique_ptr<Stream> stream;
    GenerateSummary summary;
    std::vector<int> sampled;
    std::vector<model::ChatMessage> reply;
    std::vector<model::ChatMessage> previous;
    std::string tools;
    absl::StatusOr<ChatEncoding> enc = absl::UnknownError("not encoded");
  };
  auto pending = std::make_shared<Pending>();
  pending->stream = std::move(s);
  pending->summary = std::move(summary);
  pending->sampled = std::move(tokens);
  pending->reply = std::move(reply);
  pending->previous = meta->messages;
  pending->tools = meta->tools_json;
  edge->Submit([this, pending](bool shutting_down) {
    if (!shutting_down) pending->enc = EncodeReply(pending->previous, pending->reply[0], pending->tools);
    auto resume = [this, pending] {
      std::vector<int> commit = pending->sampled;
      if (pending->enc.ok()) {
        pending->enc->suffix = pending->sampled;  // the fallback: what was sampled
        absl::StatusOr<std::shared_ptr<SessionData>> data =
            SessionDataFor(pending->stream->params().session_id, pending->stream->params().caller.tenant);
        if (data.ok()) commit = NewChatTokens(*pending->enc, (*data)->tokens);
      } else {
        ECHOKV_LOG(WARNING) << "committing a chat reply: " << pending->enc.status().message()
                            << "; the sampled ids enter the session";
      }
      StartCommit(std::move(pending->stream), std::move(pending->summary), std::move(commit), pending->reply);
    };
    if (!Post(resume)) {
      // Shutting down: the engine drains; the stream is answered by the drain below.
      pending->stream->Finish(absl::CancelledError("the server is shutting down"));
    }
  });
}

void Engine::Impl::StartCommit(std::unique_ptr<Stream> s, GenerateSummary summary, std::vector<int> tokens,
                               std::vector<model::ChatMessage> reply) {
  const std::string id = s->params().session_id;
  const std::string tenant = s->params().caller.tenant;
  absl::StatusOr<SessionMeta> meta = store->Get(id, tenant, false);
  absl::StatusOr<std::shared_ptr<SessionData>> data = SessionDataFor(id, tenant);
  if (!meta.ok() || !data.ok()) {
    FailStream(*s, meta.ok() ? data.status() : meta.status());
    return;
  }
  const int64_t max_ctx = facts.limits.max_context_tokens;
  if (meta->tokens_seen + static_cast<int64_t>(tokens.size()) > max_ctx) {
    FailStream(*s, absl::InvalidArgumentError(absl::StrCat("commit: the session holds ", meta->tokens_seen,
                                                            " tokens; the reply adds ", tokens.size(),
                                                            ", beyond max_context_tokens (", max_ctx, ")")));
    return;
  }
  auto j = std::make_unique<ActiveJob>();
  j->id = next_work_id++;
  j->cancel = std::make_shared<std::atomic<bool>>(false);  // the generation is over; the commit completes
  j->caller = s->params().caller;
  j->session_id = id;
  j->admitted = clock->Now();
  TurnSpec spec;
  spec.kind = TurnKind::kCommit;
  spec.tokens = std::move(tokens);
  spec.config = meta->config;
  spec.memory = meta->memory;
  spec.base = *data;
  spec.prefill_chunk = config.prefill_chunk;
  absl::StatusOr<std::unique_ptr<TurnJob>> turn = TurnJob::Start(model.get(), std::move(spec));
  if (!turn.ok()) {
    FailStream(*s, turn.status());
    return;
  }
  j->turn = std::move(*turn);
  j->summary = std::move(summary);
  j->new_messages = std::move(reply);  // a chat session remembers the reply
  j->stream = std::move(s);
  jobs.push_back(std::move(j));
}

void Engine::Impl::ReportCompression(const TurnJob& t) {
  if (observer == nullptr) return;
  const compression::CompressionReport& r = t.report();
  CompressionStats st;
  st.policy = std::string(compression::PolicyName(r.config.policy));
  st.phases = r.phases;
  st.evicted = r.evicted;
  st.lookahead_policy = IsLookaheadPolicy(r.config.policy);
  st.lookahead_seconds =
      r.SecondsOf("bootstrap") + r.SecondsOf("round1") + r.SecondsOf("repair") + r.SecondsOf("round2");
  st.prefill_seconds = r.SecondsOf("prefill");
  st.prompt_tokens = static_cast<int64_t>(t.spec().tokens.size());
  st.evicted_kv_bytes = std::max<int64_t>(0, r.full_kv_bytes - r.retained_kv_bytes);
  st.ratio = r.full_kv_bytes > 0 ? static_cast<double>(r.retained_kv_bytes) / r.full_kv_bytes : 1.0;
  observer->OnCompression(st);
}

void Engine::Impl::CompleteJob(ActiveJob& j) {
  TurnJob& t = *j.turn;
  ReportCompression(t);
  switch (t.spec().kind) {
    case TurnKind::kCompress: {
      CompressOutcome out;
      out.report = t.report();
      out.context_tokens = static_cast<int64_t>(t.spec().tokens.size());
      model::KvCells cells(facts.num_layers, facts.num_kv_heads);
      for (int l = 0; l < facts.num_layers; ++l) {
        at::Tensor idx = t.kept()[l].to(at::kCPU, at::kLong).contiguous();
        std::vector<int64_t> all(static_cast<size_t>(out.context_tokens));
        for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
        (void)cells.AppendAll(l, all);
        std::vector<std::vector<int64_t>> per_group(facts.num_kv_heads);
        for (int g = 0; g < facts.num_kv_heads; ++g) {
          per_group[g].assign(idx.data_ptr<int64_t>() + g * idx.size(1),
                              idx.data_ptr<int64_t>() + (g + 1) * idx.size(1));
        }
        (void)cells.Select(l, per_group);
      }
      out.layers = Layers(cells, /*positions=*/true);
      j.compress_done(std::move(out));
      return;
    }
    case TurnKind::kCreate: {
      std::shared_ptr<SessionData> data = t.TakeSessionData();
      SessionMeta meta = BuildMeta(j, *data);
      const std::string id = j.reservation->id;
      if (absl::Status s = store->Insert(*j.reservation, meta, std::move(data)); !s.ok()) {
        Reject(s);
        ForgetOnDisk(id);  // written, never acknowledged
        j.session_done(s);
        return;
      }
      t.Committed();
      if (observer != nullptr) observer->OnSessionCreated();
      absl::StatusOr<SessionMeta> now = store->Get(id, j.caller.tenant, false);
      j.session_done(now.ok() ? absl::StatusOr<SessionInfo>(Info(*now)) : now.status());
      return;
    }
    case TurnKind::kAppend:
    case TurnKind::kCommit: {
      std::shared_ptr<SessionData> data = t.TakeSessionData();
      SessionMeta meta = BuildMeta(j, *data);
      absl::Status s = store->Commit(j.session_id, meta, std::move(data));
      if (!s.ok()) {
        Reject(s);
        FailJob(j, s);
        return;
      }
      t.Committed();
      absl::StatusOr<SessionMeta> now = store->Get(j.session_id, j.caller.tenant, false);
      absl::StatusOr<SessionInfo> info =
          now.ok() ? absl::StatusOr<SessionInfo>(Info(*now)) : absl::StatusOr<SessionInfo>(now.status());
      if (t.spec().kind == TurnKind::kAppend) {
        j.session_done(std::move(info));
      } else {
        if (info.ok()) j.summary.session = *info;
        j.stream->Finish(std::move(j.summary));
      }
      return;
    }
  }
}

void Engine::Impl::FailJob(ActiveJob& j, absl::Status status) {
  if (j.cancel->load() && !absl::IsCancelled(status)) {
    status = absl::CancelledError(absl::StrCat("cancelled: ", status.message()));
  }
  if (j.turn != nullptr) j.turn->Abort();
  const TurnKind kind = j.turn != nullptr ? j.turn->spec().kind : TurnKind::kCreate;
  switch (kind) {
    case TurnKind::kCreate:
      if (j.reservation.has_value()) store->Unreserve(*j.reservation);
      j.reservation.reset();
      if (j.session_done) j.session_done(std::move(status));
      break;
    case TurnKind::kAppend:
      store->Release(j.session_id);
      j.session_done(std::move(status));
      break;
    case TurnKind::kCommit:
      store->Release(j.session_id);
      j.stream->Finish(std::move(status));
      break;
    case TurnKind::kCompress:
      j.compress_done(std::move(status));
      break;
  }
}

void Engine::Impl::DrainOnShutdown() {
  for (auto& s : streams) FailStream(*s, absl::CancelledError("the server is shutting down"));
  streams.clear();
  for (auto& j : jobs) FailJob(*j, absl::CancelledError("the server is shutting down"));
  jobs.clear();
  work_items.store(0);
  ReportGauges();
}

void Engine::Impl::ReportGauges() {
  if (observer == nullptr) return;
  const StoreTotals t = store->Totals();
  EngineGauges g;
  g.live_sessions = t.sessions;
  g.retained_kv_bytes = t.hot_bytes;
  g.full_kv_bytes = t.full_bytes;
  g.cold_kv_bytes = t.cold_bytes;
  g.cold_memory_bytes = t.cold_memory_bytes;
  {
    absl::MutexLock lock(&mu);
    g.queue_depth = static_cast<int>(inbox.size());
  }
  g.queue_depth += static_cast<int>(jobs.size()) + (edge != nullptr ? edge->queued() : 0);
  g.active_generations = static_cast<int>(streams.size());
  observer->OnGauges(g);
}

// ------------------------------------------------------------------------------
// Durable sessions

SessionMeta Engine::Impl::BuildMeta(const ActiveJob& j, const SessionData& data) const {
  const TurnJob& t = *j.turn;
  SessionMeta meta = MetaFor(data, t.report(), t.spec().memory);
  meta.tenant = j.caller.tenant;
  const absl::Time now = clock->Now();
  meta.last_used = now;
  if (t.spec().kind == TurnKind::kCreate) {
    meta.id = j.reservation->id;
    meta.created = now;
    meta.ttl = j.ttl.value_or(config.limits.session_ttl);
    meta.messages = j.new_messages;
    meta.tools_json = j.tools_json.value_or("");
  } else {
    meta.id = j.session_id;
    absl::StatusOr<SessionMeta> old = store->Get(j.session_id, j.caller.tenant, false);  // claimed: present
    if (old.ok()) {
      meta.created = old->created;
      meta.ttl = old->ttl;
      meta.messages = old->messages;
      meta.tools_json = old->tools_json;
    }
    if (j.tools_json.has_value()) meta.tools_json = *j.tools_json;
    meta.messages.insert(meta.messages.end(), j.new_messages.begin(), j.new_messages.end());
  }
  return meta;
}

void Engine::Impl::StartPersist(ActiveJob& j) {
  j.persist_started = true;
  SessionData* data = j.turn->mutable_result();
  const TurnSpec& spec = j.turn->spec();
  const int64_t before = spec.base != nullptr ? static_cast<int64_t>(spec.base->tokens.size()) : 0;
  // Every few turns a tiered session writes one superseding segment (bounded files).
  const bool full = data->cold != nullptr && data->segments_since_full >= config.save_full_every;
  if (full) data->segments_since_full = 0;
  absl::StatusOr<TurnRecord> rec = EncodeTurn(BuildMeta(j, *data), *data, before, full);
  if (!rec.ok()) {
    j.persisted = true;
    j.persist_status = rec.status();
    return;
  }
  auto record = std::make_shared<TurnRecord>(std::move(*rec));
  const uint64_t job_id = j.id;
  io->Submit([this, record, job_id](bool shutting_down) {
    absl::Status status = shutting_down ? absl::UnavailableError("server is shutting down")
                                        : durable->WriteTurn(record->meta, record->segment);
    if (!status.ok()) {
      ECHOKV_LOG(ERROR) << "saving a turn of a session failed: " << status.message();
      status = absl::Status(status.code(), absl::StrCat("saving the session state: ", status.message()));
    }
    Post([this, job_id, status] {
      for (auto& job : jobs) {
        if (job->id == job_id) {
          job->persisted = true;
          job->persist_status = status;
        }
      }
    });
  });
}

void Engine::Impl::ForgetOnDisk(const std::string& id) {
  if (durable == nullptr || !durable->Contains(id)) return;
  io->Submit([this, id](bool) {
    if (absl::Status s = durable->DeleteSession(id); !s.ok() && !absl::IsNotFound(s)) {
      ECHOKV_LOG(ERROR) << "removing a saved session failed: " << s.message();
    }
  });
}

absl::Status Engine::Impl::MakeColdRoom(int64_t bytes, const std::string& except) {
  const int64_t limit = config.limits.max_cold_bytes;
  StoreTotals t = store->Totals();
  if (t.cold_memory_bytes + bytes <= limit) return absl::OkStatus();
  if (durable != nullptr) {
    for (const std::string& id : store->SpillCandidates(except)) {
      if (!durable->Contains(id)) continue;
      store->ReplaceData(id, nullptr, /*cold_in_memory=*/false);  // saved on disk: reloads on use
      t = store->Totals();
      if (t.cold_memory_bytes + bytes <= limit) return absl::OkStatus();
    }
  }
  return absl::ResourceExhaustedError(absl::StrCat("max_cold_bytes (", limit, ") would be exceeded: cold tiers in memory hold ",
                                                   t.cold_memory_bytes, " bytes and this needs ", bytes, " more"));
}

absl::StatusOr<std::shared_ptr<SessionData>> Engine::Impl::SessionDataFor(const std::string& id,
                                                                          const std::string& tenant) {
  ECHOKV_ASSIGN_OR_RETURN(std::shared_ptr<SessionData> data, store->Data(id, tenant, /*touch=*/false));
  if (data != nullptr) return data;
  if (durable == nullptr) return absl::InternalError(absl::StrCat("session ", EscapedIdPrefix(id), " has no state"));
  ECHOKV_ASSIGN_OR_RETURN(SessionMeta meta, store->Get(id, tenant, false));
  absl::StatusOr<std::unique_ptr<state::SessionReader>> reader = durable->OpenSession(id);
  if (!reader.ok()) {
    ECHOKV_LOG(ERROR) << "loading a saved session failed: " << reader.status().message();
    return reader.status();
  }
  if (meta.memory == MemoryMode::kTiered) ECHOKV_RETURN_IF_ERROR(MakeColdRoom(meta.cold_bytes, id));
  ECHOKV_ASSIGN_OR_RETURN(data, LoadSessionData(**reader, *model));
  store->ReplaceData(id, data, /*cold_in_memory=*/data->cold != nullptr);
  return data;
}

absl::Status Engine::Impl::OpenDurableState() {
  absl::StatusOr<state::ModelFingerprint> fp = Fingerprint();
  if (!fp.ok()) return absl::Status(fp.status().code(), absl::StrCat("--state_dir: ", fp.status().message()));
  state::StoreOptions so;
  so.dir = config.state_dir;
  so.model = *fp;
  so.fsync = config.fsync_always ? state::FsyncPolicy::kAlways : state::FsyncPolicy::kNone;
  so.file_ops = config.state_file_ops;
  state_observer = std::make_unique<StateObserverAdapter>(observer);
  so.observer = state_observer.get();
  absl::StatusOr<std::unique_ptr<state::StateStore>> opened = state::StateStore::Create(so);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(), absl::StrCat("--state_dir: ", opened.status().message()));
  }
  durable = std::move(*opened);
  io = std::make_unique<WorkerPool>(1);
  const state::RecoveryResult found = durable->OpenAll();
  for (const state::StateError& e : found.errors) {
    ECHOKV_LOG(ERROR) << "saved session " << EscapedIdPrefix(e.session_id) << " refused ("
                      << state::ErrorKindName(e.kind) << "): " << e.status.message() << "; its files are left untouched";
  }
  int64_t restored = 0;
  for (const state::SessionManifest& m : found.sessions) {
    absl::StatusOr<SessionMeta> meta = MetaFromManifest(m, *model);
    if (!meta.ok()) {
      ECHOKV_LOG(ERROR) << "saved session " << EscapedIdPrefix(m.meta.id) << " refused (bad_manifest): "
                        << meta.status().message();
      if (observer != nullptr) observer->OnStateError("bad_manifest");
      continue;
    }
    meta->last_used = clock->Now();  // the idle timer restarts with the process
    absl::StatusOr<SessionStore::Reservation> r =
        store->ReserveId(meta->id, meta->tenant, meta->hot_bytes, meta->cold_bytes, /*cold_in_memory=*/false);
    absl::Status s = r.ok() ? store->Insert(*r, *meta, nullptr) : r.status();
    if (!s.ok()) {
      ECHOKV_LOG(ERROR) << "saved session " << EscapedIdPrefix(m.meta.id) << " not restored: " << s.message();
      continue;
    }
    ++restored;
  }
  if (observer != nullptr) observer->OnSessionsRestored(restored);
  ECHOKV_LOG(INFO) << "state dir " << config.state_dir << ": restored " << restored << " session(s), refused "
                   << found.errors.size() << ", fsync " << (config.fsync_always ? "always" : "none");
  facts.durable = true;
  return absl::OkStatus();
}

absl::StatusOr<state::ModelFingerprint> Engine::Impl::Fingerprint() {
  absl::MutexLock lock(&fingerprint_mu);
  if (!fingerprint.has_value()) {
    ECHOKV_ASSIGN_OR_RETURN(state::ModelFingerprint fp, FingerprintModelDir(config.model_dir));
    fingerprint = fp;
  }
  return *fingerprint;
}

Engine::Impl::ScratchStore::~ScratchStore() {
  store.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

absl::StatusOr<std::unique_ptr<Engine::Impl::ScratchStore>> Engine::Impl::MakeScratchStore() {
  ECHOKV_ASSIGN_OR_RETURN(state::ModelFingerprint fp, Fingerprint());
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/echokv-transfer-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create a scratch directory ", pattern, ": ", std::strerror(errno)));
  }
  auto scratch = std::make_unique<ScratchStore>();
  scratch->dir = pattern;
  state::StoreOptions so;
  so.dir = pattern;
  so.model = fp;
  so.fsync = state::FsyncPolicy::kNone;  // scratch: gone with the transfer
  ECHOKV_ASSIGN_OR_RETURN(scratch->store, state::StateStore::Create(so));
  return scratch;
}

void Engine::Impl::StreamExport(state::SnapshotExporter& exporter, const CancelFlag& cancel, const ExportSink& sink,
                                const DoneFn<int64_t>& done) {
  constexpr int kMaxBacklog = 4;  // chunks of 1 MiB the reader may lag behind
  int64_t total = 0;
  std::string chunk;
  while (true) {
    while (sink.backlog && sink.backlog() >= kMaxBacklog && !cancel->load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (cancel->load()) return done(absl::CancelledError("export cancelled"));
    absl::StatusOr<bool> more = exporter.Next(&chunk);
    if (!more.ok()) return done(more.status());
    if (!*more) break;
    total += static_cast<int64_t>(chunk.size());
    sink.on_chunk(std::move(chunk));
    chunk.clear();
  }
  done(total);
}

// ------------------------------------------------------------------------------
// Admissions (engine thread)

void Engine::Impl::AdmitCreate(std::shared_ptr<CreateRequest> req, CancelFlag cancel, ProgressFn progress,
                               DoneFn<SessionInfo> done, std::vector<int> tokens, absl::Time admitted) {
  const MemoryMode memory = req->memory.value_or(config.default_memory);
  const int64_t n = static_cast<int64_t>(tokens.size());
  // Admission estimate: at most min(L, B) entries per layer and group stay hot.
  const int64_t keep = req->config.policy == compression::PolicyKind::kFull ? n : std::min<int64_t>(n, req->config.budget);
  const int64_t cold = memory == MemoryMode::kTiered ? n * bytes_per_token : 0;
  if (memory == MemoryMode::kTiered) (void)MakeColdRoom(cold, "");  // spill idle saved sessions first
  absl::StatusOr<SessionStore::Reservation> r =
      store->Reserve(req->caller.tenant, keep * bytes_per_token, cold, memory == MemoryMode::kTiered);
  if (!r.ok()) {
    Reject(r.status());
    return done(r.status());
  }
  TurnSpec spec;
  spec.kind = TurnKind::kCreate;
  spec.tokens = std::move(tokens);
  spec.config = req->config;
  spec.memory = memory;
  spec.prefill_chunk = config.prefill_chunk;
  spec.progress = ProgressAdapter(progress, admitted);
  absl::StatusOr<std::unique_ptr<TurnJob>> turn = TurnJob::Start(model.get(), std::move(spec));
  if (!turn.ok()) {
    store->Unreserve(*r);
    return done(turn.status());
  }
  auto j = std::make_unique<ActiveJob>();
  j->id = next_work_id++;
  j->turn = std::move(*turn);
  j->cancel = std::move(cancel);
  j->caller = req->caller;
  j->reservation = *r;
  j->ttl = req->ttl;
  if (req->input.kind == InputSpec::Kind::kChat) {
    j->new_messages = req->input.chat;
    j->tools_json = req->input.tools_json;
  }
  j->session_done = std::move(done);
  j->admitted = admitted;
  jobs.push_back(std::move(j));
}

void Engine::Impl::AdmitAppend(std::shared_ptr<AppendRequest> req, CancelFlag cancel, ProgressFn progress,
                               DoneFn<SessionInfo> done, std::vector<int> tokens,
                               std::optional<ChatEncoding> chat_enc, absl::Time admitted) {
  // The session was claimed on the edge; it cannot have changed since.
  absl::StatusOr<SessionMeta> meta = store->Get(req->session_id, req->caller.tenant, false);
  absl::StatusOr<std::shared_ptr<SessionData>> data = SessionDataFor(req->session_id, req->caller.tenant);
  if (!meta.ok() || !data.ok()) {
    store->Release(req->session_id);
    return done(meta.ok() ? data.status() : meta.status());
  }
  if (chat_enc.has_value()) {
    tokens = NewChatTokens(*chat_enc, (*data)->tokens);
    const int64_t max_ctx = facts.limits.max_context_tokens;
    absl::Status bad;
    if (tokens.empty()) {
      bad = absl::InvalidArgumentError("input.chat: the messages add no tokens to the conversation");
    } else if (meta->tokens_seen + static_cast<int64_t>(tokens.size()) > max_ctx) {
      bad = absl::InvalidArgumentError(absl::StrCat("input: ", tokens.size(), " tokens + ", meta->tokens_seen,
                                                    " in the session exceed max_context_tokens (", max_ctx, ")"));
    }
    if (!bad.ok()) {
      store->Release(req->session_id);
      return done(bad);
    }
  }
  TurnSpec spec;
  spec.kind = TurnKind::kAppend;
  spec.tokens = std::move(tokens);
  spec.config = meta->config;
  spec.memory = meta->memory;
  spec.base = *data;
  spec.prefill_chunk = config.prefill_chunk;
  spec.progress = ProgressAdapter(progress, admitted);
  absl::StatusOr<std::unique_ptr<TurnJob>> turn = TurnJob::Start(model.get(), std::move(spec));
  if (!turn.ok()) {
    store->Release(req->session_id);
    return done(turn.status());
  }
  auto j = std::make_unique<ActiveJob>();
  j->id = next_work_id++;
  j->turn = std::move(*turn);
  j->cancel = std::move(cancel);
  j->caller = req->caller;
  j->session_id = req->session_id;
  j->session_done = std::move(done);
  j->admitted = admitted;
  if (req->input.kind == InputSpec::Kind::kChat) {
    j->new_messages = req->input.chat;
    if (!req->input.tools_json.empty()) j->tools_json = req->input.tools_json;
  }
  jobs.push_back(std::move(j));
}

void Engine::Impl::AdmitGenerate(std::unique_ptr<Stream> s) {
  const GenerateParams& p = s->params();
  absl::StatusOr<SessionMeta> meta =
      p.commit ? store->Claim(p.session_id, p.caller.tenant) : store->Get(p.session_id, p.caller.tenant, true);
  if (!meta.ok()) return s->Finish(meta.status());
  // Positions: the last sampled token is never fed back, so without commit a session
  // of n tokens can sample max_context - n + 1 more (llama2.c's run.c does the same).
  // A commit feeds every generated token (and the end-of-turn id) back: n + max_tokens
  // must fit.
  const int64_t max_ctx = facts.limits.max_context_tokens;
  const int64_t room = p.commit ? max_ctx - meta->tokens_seen : max_ctx - meta->tokens_seen + 1;
  if (p.max_tokens > room) {
    if (p.commit) store->Release(p.session_id);
    return s->Finish(absl::InvalidArgumentError(absl::StrCat(
        "max_tokens: the session holds ", meta->tokens_seen, " tokens; ", p.max_tokens, " more",
        p.commit ? " (committed)" : "", " exceed max_context_tokens (", max_ctx, "): at most ", std::max<int64_t>(room, 0))));
  }
  absl::StatusOr<std::shared_ptr<SessionData>> data = SessionDataFor(p.session_id, p.caller.tenant);
  if (!data.ok()) {
    if (p.commit) store->Release(p.session_id);
    return s->Finish(data.status());
  }
  // A chat session's turn also ends at the template's end-of-turn token.
  std::vector<int> stops = eos_ids;
  if (!meta->messages.empty() && chat.has_value()) {
    for (int id : model::EndOfTurnIds(*chat, *tokenizer)) {
      if (std::find(stops.begin(), stops.end(), id) == stops.end()) stops.push_back(id);
    }
  }
  try {
    s->Begin((*data)->hot.Clone(), (*data)->last_logits, (*data)->tokens, std::move(stops), tokenizer.get());
  } catch (const std::exception& e) {
    if (p.commit) store->Release(p.session_id);
    return s->Finish(absl::InternalError(absl::StrCat("copying the session cache: ", e.what())));
  }
  streams.push_back(std::move(s));
}

// ------------------------------------------------------------------------------
// Public API

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config, EngineObserver* observer) {
  ECHOKV_RETURN_IF_ERROR(config.Validate());
  model::DeviceOptions dev;
  dev.device = config.device;
  dev.dtype = config.dtype;
  dev.num_threads = config.threads;
  ECHOKV_RETURN_IF_ERROR(dev.Validate());
  ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<model::Transformer> model, model::Transformer::Load(config.model_dir, dev));
  ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<model::Tokenizer> tokenizer, model::LoadTokenizer(config.model_dir));
  std::optional<model::ChatTemplate> chat;
  std::optional<std::string> chat_override;
  if (!config.chat_template.empty()) chat_override = config.chat_template;
  absl::StatusOr<model::ChatTemplate> loaded = model::LoadChatTemplate(config.model_dir, chat_override);
  if (!loaded.ok() && chat_override.has_value()) {
    return absl::Status(loaded.status().code(), absl::StrCat("--chat_template: ", loaded.status().message()));
  }
  std::string chat_error;
  if (loaded.ok()) {
    chat = *loaded;
  } else {
    chat_error = std::string(loaded.status().message());
    ECHOKV_LOG(INFO) << "chat input disabled: " << chat_error;
  }
  ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                          CreateWithModel(config, std::move(model), std::move(tokenizer), chat, observer, RealClock()));
  engine->impl_->chat_error = chat_error;
  return engine;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::CreateWithModel(const EngineConfig& config,
                                                               std::shared_ptr<const model::Transformer> model,
                                                               std::shared_ptr<const model::Tokenizer> tokenizer,
                                                               std::optional<model::ChatTemplate> chat,
                                                               EngineObserver* observer, const Clock* clock) {
  ECHOKV_RETURN_IF_ERROR(config.Validate());
  if (model == nullptr || tokenizer == nullptr || clock == nullptr) {
    return absl::InvalidArgumentError("CreateWithModel: model, tokenizer and clock are required");
  }
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->observer = observer;
  impl->clock = clock;
  impl->model = std::move(model);
  impl->tokenizer = std::move(tokenizer);
  impl->chat = std::move(chat);
  if (!impl->chat.has_value()) impl->chat_error = "no chat template";
  const model::ModelConfig& mc = impl->model->config();
  try {
    impl->bytes_per_token = impl->model->NewCache().FullEquivalentKvBytes(1);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cache shape: ", e.what()));
  }
  impl->eos_ids = impl->tokenizer->eos_ids();
  for (int id : mc.eos_token_ids) {
    if (std::find(impl->eos_ids.begin(), impl->eos_ids.end(), id) == impl->eos_ids.end()) impl->eos_ids.push_back(id);
  }
  ServerFacts& f = impl->facts;
  f.version = ECHOKV_VERSION;
  f.model_type = std::string(model::ModelTypeName(mc.type));
  {
    std::string dir = config.model_dir;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    const size_t slash = dir.find_last_of('/');
    f.model_name = slash == std::string::npos ? dir : dir.substr(slash + 1);
  }
  f.num_layers = mc.num_layers;
  f.num_heads = mc.num_heads;
  f.num_kv_heads = mc.num_kv_heads;
  f.head_dim = mc.head_dim;
  f.hidden_size = mc.hidden_size;
  f.vocab_size = mc.vocab_size;
  f.max_context = mc.max_position_embeddings;
  f.tokenizer_kind = std::string(impl->tokenizer->kind());
  f.chat_template = impl->chat.has_value();
  f.kv_bytes_per_token = impl->bytes_per_token;
  f.device = impl->model->device_options().device;
  f.dtype = impl->model->device_options().dtype;
  for (compression::PolicyKind k : compression::AllPolicies()) f.policies.emplace_back(compression::PolicyName(k));
  f.default_compression = config.default_compression;
  f.default_memory = config.default_memory;
  f.limits = config.limits;
  if (f.limits.max_context_tokens == 0) f.limits.max_context_tokens = mc.max_position_embeddings;
  f.replica_id = config.replica_id;

  SessionLimits sl;
  sl.max_sessions = config.limits.max_sessions;
  sl.max_kv_bytes = config.limits.max_kv_bytes;
  sl.max_cold_bytes = config.limits.max_cold_bytes;
  impl->store = std::make_unique<SessionStore>(sl, clock, config.replica_id);
  SchedulerOptions so;
  so.max_step_tokens = config.max_step_tokens;
  so.min_prefill_tokens = std::min<int64_t>(16, config.max_step_tokens);
  ECHOKV_RETURN_IF_ERROR(so.Validate());
  impl->scheduler = std::make_unique<Scheduler>(so);
  impl->runner = std::make_unique<Runner>(impl->model.get());
  impl->edge = std::make_unique<WorkerPool>(config.edge_threads);
  impl->transfer = std::make_unique<WorkerPool>(2);
  if (!config.state_dir.empty()) ECHOKV_RETURN_IF_ERROR(impl->OpenDurableState());
  impl->Heartbeat();
  Impl* raw = impl.get();
  std::unique_ptr<Engine> engine(new Engine(std::move(impl)));
  raw->thread = std::thread([raw] { raw->Loop(); });
  ECHOKV_LOG(INFO) << "engine ready: " << f.model_type << " " << f.model_name << ", " << f.num_layers
                   << " layers, device " << f.device << " " << f.dtype << ", default memory "
                   << MemoryModeName(config.default_memory);
  return engine;
}

const ServerFacts& Engine::facts() const { return impl_->facts; }
const model::Tokenizer& Engine::tokenizer() const { return *impl_->tokenizer; }

void Engine::CreateSession(CreateRequest request, CancelFlag cancel, ProgressFn progress, DoneFn<SessionInfo> done) {
  Impl* impl = impl_.get();
  cancel = OrFreshFlag(std::move(cancel));
  const absl::Time admitted = impl->clock->Now();
  auto req = std::make_shared<CreateRequest>(std::move(request));
  impl->edge->Submit([impl, req, cancel, progress, done, admitted](bool shutting_down) {
    if (shutting_down) return done(absl::UnavailableError("server is shutting down"));
    if (cancel->load()) return done(absl::CancelledError("cancelled before it started"));
    if (absl::Status s = impl->CheckTtl(req->ttl); !s.ok()) return done(s);
    if (absl::Status s = req->config.Validate(); !s.ok()) {
      return done(absl::InvalidArgumentError(absl::StrCat("compression.", s.message())));
    }
    if (progress) progress(ProgressEvent{"tokenize", 0, 1, absl::ToDoubleSeconds(impl->clock->Now() - admitted)});
    absl::StatusOr<std::vector<int>> tokens =
        impl->Tokenize(req->input, /*default_special=*/true, impl->facts.limits.max_context_tokens, 0);
    if (!tokens.ok()) return done(tokens.status());
    auto ids = std::make_shared<std::vector<int>>(std::move(*tokens));
    if (!impl->Post([impl, req, cancel, progress, done, ids, admitted] {
          impl->AdmitCreate(req, cancel, progress, done, std::move(*ids), admitted);
        }, cancel)) {
      done(absl::UnavailableError("server is shutting down"));
    }
  });
}

void Engine::AppendToSession(AppendRequest request, CancelFlag cancel, ProgressFn progress, DoneFn<SessionInfo> done) {
  Impl* impl = impl_.get();
  cancel = OrFreshFlag(std::move(cancel));
  const absl::Time admitted = impl->clock->Now();
  auto req = std::make_shared<AppendRequest>(std::move(request));
  impl->edge->Submit([impl, req, cancel, progress, done, admitted](bool shutting_down) {
    if (shutting_down) return done(absl::UnavailableError("server is shutting down"));
    if (cancel->load()) return done(absl::CancelledError("cancelled before it started"));
    if (!IsValidSessionId(req->session_id)) {
      return done(absl::InvalidArgumentError(
          absl::StrCat("session_id ", EscapedIdPrefix(req->session_id), " is malformed")));
    }
    // Claim first: the tokens count against the session's room, and no other mutation
    // may slip in between.
    absl::StatusOr<SessionMeta> meta = impl->store->Claim(req->session_id, req->caller.tenant);
    if (!meta.ok()) return done(meta.status());
    if (progress) progress(ProgressEvent{"tokenize", 0, 1, absl::ToDoubleSeconds(impl->clock->Now() - admitted)});
    const int64_t room = impl->facts.limits.max_context_tokens - meta->tokens_seen;
    std::vector<int> ids;
    std::optional<Engine::Impl::ChatEncoding> enc;
    if (req->input.kind == InputSpec::Kind::kChat && impl->chat.has_value() && !req->input.chat.empty()) {
      // The whole conversation is rendered; the engine keeps what the session lacks.
      absl::Status s = impl->CheckRequestBytes(req->input);
      absl::StatusOr<Engine::Impl::ChatEncoding> e = absl::UnknownError("");
      if (s.ok()) {
        const std::string& tools = req->input.tools_json.empty() ? meta->tools_json : req->input.tools_json;
        e = impl->EncodeConversation(meta->messages, req->input.chat, tools, req->input.add_generation_prompt);
        s = e.status();
      }
      if (!s.ok()) {
        impl->store->Release(req->session_id);
        return done(s);
      }
      enc = std::move(*e);
    } else {
      absl::StatusOr<std::vector<int>> tokens =
          impl->Tokenize(req->input, /*default_special=*/false, room, meta->tokens_seen);
      if (!tokens.ok()) {
        impl->store->Release(req->session_id);
        return done(tokens.status());
      }
      ids = std::move(*tokens);
    }
    auto ids_ptr = std::make_shared<std::vector<int>>(std::move(ids));
    auto enc_ptr = std::make_shared<std::optional<Engine::Impl::ChatEncoding>>(std::move(enc));
    if (!impl->Post([impl, req, cancel, progress, done, ids_ptr, enc_ptr, admitted] {
          impl->AdmitAppend(req, cancel, progress, done, std::move(*ids_ptr), std::move(*enc_ptr), admitted);
        }, cancel)) {
      impl->store->Release(req->session_id);
      done(absl::UnavailableError("server is shutting down"));
    }
  });
}

void Engine::Generate(GenerateParams params, CancelFlag cancel, StreamSink sink, DoneFn<GenerateSummary> done) {
  Impl* impl = impl_.get();
  cancel = OrFreshFlag(std::move(cancel));
  const EngineLimits& limits = impl->facts.limits;
  auto fail = [&](absl::Status s) { done(std::move(s)); };
  if (!IsValidSessionId(params.session_id)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("session_id ", EscapedIdPrefix(params.session_id), " is malformed")));
  }
  if (params.max_tokens < 1 || params.max_tokens > limits.max_new_tokens) {
    return fail(absl::InvalidArgumentError(absl::StrCat("max_tokens must be in [1, ", limits.max_new_tokens,
                                                        "] (max_new_tokens), got ", params.max_tokens)));
  }
  if (absl::Status s = params.sampling.Validate(); !s.ok()) {
    return fail(absl::InvalidArgumentError(absl::StrCat("sampling.", s.message())));
  }
  if (params.stop.size() > 16) return fail(absl::InvalidArgumentError("stop: at most 16 stop strings"));
  for (size_t i = 0; i < params.stop.size(); ++i) {
    if (params.stop[i].empty() || params.stop[i].size() > 256) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("stop[", i, "] must be 1..256 bytes, got ", params.stop[i].size())));
    }
  }
  for (size_t i = 0; i < params.stop_ids.size(); ++i) {
    if (params.stop_ids[i] < 0 || params.stop_ids[i] >= impl->facts.vocab_size) {
      return fail(absl::InvalidArgumentError(absl::StrCat("stop_token_ids[", i, "] = ", params.stop_ids[i],
                                                          " is outside the vocabulary")));
    }
  }
  struct Pending {
    GenerateParams params;
    CancelFlag cancel;
    StreamSink sink;
    DoneFn<GenerateSummary> done;
    absl::Time admitted;
  };
  auto pending = std::make_shared<Pending>(
      Pending{std::move(params), cancel, std::move(sink), std::move(done), impl->clock->Now()});
  if (!impl->Post(
          [impl, pending] {
            impl->AdmitGenerate(std::make_unique<Stream>(impl->next_work_id++, std::move(pending->params),
                                                         std::move(pending->cancel), std::move(pending->sink),
                                                         std::move(pending->done), pending->admitted));
          },
          cancel)) {
    pending->done(absl::UnavailableError("server is shutting down"));
  }
}

void Engine::Compress(Caller caller, InputSpec input, compression::CompressionConfig config, CancelFlag cancel,
                      DoneFn<CompressOutcome> done) {
  Impl* impl = impl_.get();
  cancel = OrFreshFlag(std::move(cancel));
  const absl::Time admitted = impl->clock->Now();
  auto in = std::make_shared<InputSpec>(std::move(input));
  impl->edge->Submit([impl, caller, in, config, cancel, done, admitted](bool shutting_down) {
    if (shutting_down) return done(absl::UnavailableError("server is shutting down"));
    if (cancel->load()) return done(absl::CancelledError("cancelled before it started"));
    if (absl::Status s = config.Validate(); !s.ok()) {
      return done(absl::InvalidArgumentError(absl::StrCat("compression.", s.message())));
    }
    absl::StatusOr<std::vector<int>> tokens =
        impl->Tokenize(*in, /*default_special=*/true, impl->facts.limits.max_context_tokens, 0);
    if (!tokens.ok()) return done(tokens.status());
    auto ids = std::make_shared<std::vector<int>>(std::move(*tokens));
    if (!impl->Post([impl, caller, config, cancel, done, ids, admitted] {
          TurnSpec spec;
          spec.kind = TurnKind::kCompress;
          spec.tokens = std::move(*ids);
          spec.config = config;
          spec.prefill_chunk = impl->config.prefill_chunk;
          absl::StatusOr<std::unique_ptr<TurnJob>> turn = TurnJob::Start(impl->model.get(), std::move(spec));
          if (!turn.ok()) return done(turn.status());
          auto j = std::make_unique<ActiveJob>();
          j->id = impl->next_work_id++;
          j->turn = std::move(*turn);
          j->cancel = cancel;
          j->caller = caller;
          j->compress_done = done;
          j->admitted = admitted;
          impl->jobs.push_back(std::move(j));
        }, cancel)) {
      done(absl::UnavailableError("server is shutting down"));
    }
  });
}

void Engine::ForkSession(Caller caller, std::string session_id, std::optional<absl::Duration> ttl,
                         DoneFn<SessionInfo> done) {
  Impl* impl = impl_.get();
  if (!IsValidSessionId(session_id)) {
    return done(absl::InvalidArgumentError(absl::StrCat("session_id ", EscapedIdPrefix(session_id), " is malformed")));
  }
  if (absl::Status s = impl->CheckTtl(ttl); !s.ok()) return done(s);
  auto d = std::make_shared<DoneFn<SessionInfo>>(std::move(done));
  if (!impl->Post([impl, caller, session_id, ttl, d] {
        // A read of the source: allowed while it is busy; sees its committed state.
        absl::StatusOr<SessionMeta> meta = impl->store->Get(session_id, caller.tenant, true);
        if (!meta.ok()) return (*d)(meta.status());
        absl::StatusOr<std::shared_ptr<SessionData>> src = impl->SessionDataFor(session_id, caller.tenant);
        if (!src.ok()) return (*d)(src.status());
        absl::StatusOr<SessionStore::Reservation> r =
            impl->store->Reserve(caller.tenant, meta->hot_bytes, meta->cold_bytes, meta->cold_in_memory);
        if (!r.ok()) {
          impl->Reject(r.status());
          return (*d)(r.status());
        }
        auto data = std::make_shared<SessionData>();
        try {
          const SessionData& from = **src;
          data->hot = from.hot.Clone();
          data->last_logits = from.last_logits.clone();
          data->tokens = from.tokens;
          if (from.cold != nullptr) {
            absl::StatusOr<model::KvCache> cold = from.cold->ClonePrefix(from.cold_len);
            if (!cold.ok()) {
              impl->store->Unreserve(*r);
              return (*d)(cold.status());
            }
            data->cold = std::make_shared<model::KvCache>(std::move(*cold));
            data->cold_len = from.cold_len;
            data->window_queries = from.window_queries;    // never modified in place
            data->window_positions = from.window_positions;
            data->h2o_scores = from.h2o_scores;
          }
        } catch (const std::exception& e) {
          impl->store->Unreserve(*r);
          return (*d)(absl::InternalError(absl::StrCat("fork: ", e.what())));
        }
        SessionMeta copy = *meta;
        copy.id = r->id;
        copy.tenant = caller.tenant;
        copy.created = copy.last_used = impl->clock->Now();
        copy.ttl = ttl.value_or(meta->ttl);
        copy.busy = false;
        data->segments_since_full = 0;
        auto reservation = std::make_shared<SessionStore::Reservation>(*r);
        // Answers once the fork is in the store (and on disk first when durable).
        auto finish = [impl, caller, reservation, copy, data, d](absl::Status written) {
          if (!written.ok()) {
            impl->store->Unreserve(*reservation);
            return (*d)(written);
          }
          if (absl::Status s = impl->store->Insert(*reservation, copy, data); !s.ok()) {
            impl->Reject(s);
            impl->ForgetOnDisk(reservation->id);
            return (*d)(s);
          }
          if (impl->observer != nullptr) impl->observer->OnSessionCreated();
          absl::StatusOr<SessionMeta> now = impl->store->Get(reservation->id, caller.tenant, false);
          (*d)(now.ok() ? absl::StatusOr<SessionInfo>(impl->Info(*now)) : now.status());
        };
        if (impl->durable == nullptr) return finish(absl::OkStatus());
        absl::StatusOr<TurnRecord> rec = EncodeTurn(copy, *data, 0, /*full=*/true);
        if (!rec.ok()) return finish(rec.status());
        auto record = std::make_shared<TurnRecord>(std::move(*rec));
        impl->io->Submit([impl, record, finish](bool shutting_down) {
          absl::Status st = shutting_down ? absl::UnavailableError("server is shutting down")
                                          : impl->durable->WriteTurn(record->meta, record->segment);
          if (!impl->Post([finish, st] { finish(st); })) finish(absl::UnavailableError("server is shutting down"));
        });
      })) {
    (*d)(absl::UnavailableError("server is shutting down"));
  }
}

void Engine::GetSession(Caller caller, std::string session_id, DoneFn<SessionInfo> done) {
  if (!IsValidSessionId(session_id)) {
    return done(absl::InvalidArgumentError(absl::StrCat("session_id ", EscapedIdPrefix(session_id), " is malformed")));
  }
  absl::StatusOr<SessionMeta> meta = impl_->store->Get(session_id, caller.tenant, /*touch=*/true);
  if (!meta.ok()) return done(meta.status());
  done(impl_->Info(*meta));
}

void Engine::ListSessions(Caller caller, DoneFn<std::vector<SessionInfo>> done) {
  std::vector<SessionInfo> out;
  for (const SessionMeta& m : impl_->store->List(caller.tenant)) out.push_back(impl_->Info(m));
  done(std::move(out));
}

void Engine::DeleteSession(Caller caller, std::string session_id, DoneFn<int64_t> done) {
  if (!IsValidSessionId(session_id)) {
    return done(absl::InvalidArgumentError(absl::StrCat("session_id ", EscapedIdPrefix(session_id), " is malformed")));
  }
  absl::StatusOr<int64_t> freed = impl_->store->Delete(session_id, caller.tenant);
  Impl* impl = impl_.get();
  if (!freed.ok() || impl->durable == nullptr || !impl->durable->Contains(session_id)) return done(std::move(freed));
  // Answered only once the files are gone, like every other mutation: an acknowledged delete
  // must not come back after a crash (the writer may still be busy with other sessions' turns).
  impl->io->Submit([impl, session_id, bytes = *freed, done = std::move(done)](bool) {
    absl::Status s = impl->durable->DeleteSession(session_id);
    if (!s.ok() && !absl::IsNotFound(s)) {
      ECHOKV_LOG(ERROR) << "removing a saved session failed: " << s.message();
      return done(absl::Status(s.code(), absl::StrCat("removing the saved session: ", s.message())));
    }
    done(bytes);
  });
}

void Engine::InspectCache(Caller caller, std::string session_id, bool include_positions,
                          DoneFn<CacheInspection> done) {
  Impl* impl = impl_.get();
  if (!IsValidSessionId(session_id)) {
    return done(absl::InvalidArgumentError(absl::StrCat("session_id ", EscapedIdPrefix(session_id), " is malformed")));
  }
  auto d = std::make_shared<DoneFn<CacheInspection>>(std::move(done));
  if (!impl->Post([impl, caller, session_id, include_positions, d] {
        absl::StatusOr<SessionMeta> meta = impl->store->Get(session_id, caller.tenant, true);
        if (!meta.ok()) return (*d)(meta.status());
        absl::StatusOr<std::shared_ptr<SessionData>> data = impl->SessionDataFor(session_id, caller.tenant);
        if (!data.ok()) return (*d)(data.status());
        const model::KvCache& hot = (*data)->hot;
        CacheInspection out;
        out.session = impl->Info(*meta);
        out.layers = impl->Layers(hot.cells(), include_positions);
        for (const LayerCacheInfo& l : out.layers) out.total_retained_entries += l.retained * impl->facts.num_kv_heads;
        out.total_kv_bytes = hot.KvBytes();
        out.full_equivalent_kv_bytes = hot.FullEquivalentKvBytes(meta->tokens_seen);
        out.position_bytes = hot.PositionBytes();
        out.cold_kv_bytes = meta->cold_bytes;
        (*d)(std::move(out));
      })) {
    (*d)(absl::UnavailableError("server is shutting down"));
  }
}

void Engine::ExportSession(Caller caller, std::string session_id, CancelFlag cancel, ExportSink sink,
                           DoneFn<int64_t> done) {
  Impl* impl = impl_.get();
  if (!IsValidSessionId(session_id)) {
    return done(absl::InvalidArgumentError(absl::StrCat("session_id ", EscapedIdPrefix(session_id), " is malformed")));
  }
  cancel = OrFreshFlag(std::move(cancel));
  auto sink_ptr = std::make_shared<ExportSink>(std::move(sink));
  auto d = std::make_shared<DoneFn<int64_t>>(std::move(done));
  if (!impl->Post([impl, caller, session_id, cancel, sink_ptr, d] {
        // A read of the committed state: allowed while a mutation runs.
        absl::StatusOr<SessionMeta> meta = impl->store->Get(session_id, caller.tenant, /*touch=*/true);
        if (!meta.ok()) return (*d)(meta.status());
        if (impl->durable != nullptr && impl->durable->Contains(session_id)) {
          // Saved sessions stream straight from their files.
          return impl->transfer->Submit([impl, session_id, cancel, sink_ptr, d](bool shutting_down) {
            if (shutting_down) return (*d)(absl::UnavailableError("server is shutting down"));
            absl::StatusOr<std::unique_ptr<state::SnapshotExporter>> exporter = impl->durable->Export(session_id);
            if (!exporter.ok()) return (*d)(exporter.status());
            impl->StreamExport(**exporter, cancel, *sink_ptr, *d);
          });
        }
        // In memory only: one superseding segment of the whole state, through a scratch
        // store, in the same format.
        absl::StatusOr<std::shared_ptr<SessionData>> data = impl->SessionDataFor(session_id, caller.tenant);
        if (!data.ok()) return (*d)(data.status());
        absl::StatusOr<TurnRecord> rec = EncodeTurn(*meta, **data, 0, /*full=*/true);
        if (!rec.ok()) return (*d)(rec.status());
        auto record = std::make_shared<TurnRecord>(std::move(*rec));
        impl->transfer->Submit([impl, record, cancel, sink_ptr, d](bool shutting_down) {
          if (shutting_down) return (*d)(absl::UnavailableError("server is shutting down"));
          absl::StatusOr<std::unique_ptr<Impl::ScratchStore>> scratch = impl->MakeScratchStore();
          if (!scratch.ok()) return (*d)(scratch.status());
          if (absl::Status s = (*scratch)->store->WriteTurn(record->meta, record->segment); !s.ok()) return (*d)(s);
          absl::StatusOr<std::unique_ptr<state::SnapshotExporter>> exporter =
              (*scratch)->store->Export(record->meta.id);
          if (!exporter.ok()) return (*d)(exporter.status());
          impl->StreamExport(**exporter, cancel, *sink_ptr, *d);
        });
      })) {
    (*d)(absl::UnavailableError("server is shutting down"));
  }
}

namespace {

// ImportSession: bytes go to an importer on a transfer thread (in order: one task at a
// time per import), into the durable store or a scratch store; Finish admits the
// session under the store's limits.
class SessionImportImpl : public SessionImport {
 public:
  SessionImportImpl(Engine::Impl* impl, Caller caller, bool keep_id, std::optional<absl::Duration> ttl)
      : impl_(impl), caller_(std::move(caller)), keep_id_(keep_id), ttl_(ttl) {}

  void Feed(std::string chunk, std::function<void(absl::Status)> done) override;
  void Finish(DoneFn<SessionInfo> done) override;

 private:
  absl::Status Start();
  absl::StatusOr<SessionInfo> Complete();

  Engine::Impl* impl_;                                       // not owned; outlives the call
  Caller caller_;
  bool keep_id_;
  std::optional<absl::Duration> ttl_;
  std::unique_ptr<Engine::Impl::ScratchStore> scratch_;      // in-memory servers only
  std::unique_ptr<state::SnapshotImporter> importer_;        // created on the first chunk
};

}  // namespace

std::unique_ptr<SessionImport> Engine::BeginImport(Caller caller, bool keep_id, std::optional<absl::Duration> ttl) {
  return std::make_unique<SessionImportImpl>(impl_.get(), std::move(caller), keep_id, ttl);
}

namespace {

absl::Status SessionImportImpl::Start() {
  if (importer_ != nullptr) return absl::OkStatus();
  if (impl_->durable != nullptr) {
    importer_ = impl_->durable->BeginImport();
    return absl::OkStatus();
  }
  ECHOKV_ASSIGN_OR_RETURN(scratch_, impl_->MakeScratchStore());
  importer_ = scratch_->store->BeginImport();
  return absl::OkStatus();
}

void SessionImportImpl::Feed(std::string chunk, std::function<void(absl::Status)> done) {
  auto bytes = std::make_shared<std::string>(std::move(chunk));
  impl_->transfer->Submit([this, bytes, done](bool shutting_down) {
    if (shutting_down) return done(absl::UnavailableError("server is shutting down"));
    absl::Status s = Start();
    if (s.ok()) s = importer_->Feed(*bytes);
    done(s);
  });
}

void SessionImportImpl::Finish(DoneFn<SessionInfo> done) {
  impl_->transfer->Submit([this, done](bool shutting_down) {
    if (shutting_down) return done(absl::UnavailableError("server is shutting down"));
    done(Complete());
  });
}

absl::StatusOr<SessionInfo> SessionImportImpl::Complete() {
  ECHOKV_RETURN_IF_ERROR(Start());
  const state::SessionManifest* parsed = importer_->manifest();
  if (parsed == nullptr) {
    // Let the importer name what is missing (a truncated stream).
    absl::StatusOr<state::SessionManifest> m = importer_->Finish();
    return m.ok() ? absl::InternalError("import: the snapshot ended before its manifest") : m.status();
  }
  ECHOKV_ASSIGN_OR_RETURN(SessionMeta incoming, MetaFromManifest(*parsed, *impl_->model));
  const bool in_memory = impl_->durable == nullptr;
  const bool cold_in_memory = in_memory && incoming.memory == MemoryMode::kTiered;
  absl::StatusOr<SessionStore::Reservation> r =
      keep_id_ ? impl_->store->ReserveId(incoming.id, caller_.tenant, incoming.hot_bytes, incoming.cold_bytes,
                                         cold_in_memory)
               : impl_->store->Reserve(caller_.tenant, incoming.hot_bytes, incoming.cold_bytes, cold_in_memory);
  if (!r.ok()) {
    impl_->Reject(r.status());
    return r.status();
  }
  const absl::Time now = impl_->clock->Now();
  absl::StatusOr<state::SessionManifest> committed =
      importer_->Finish(r->id, [this, now](state::SessionMeta& m) {
        m.tenant = caller_.tenant;
        m.last_used = now;
        if (ttl_.has_value()) m.ttl = *ttl_;
        return absl::OkStatus();
      });
  if (!committed.ok()) {
    impl_->store->Unreserve(*r);
    return committed.status();
  }
  absl::StatusOr<SessionMeta> meta = MetaFromManifest(*committed, *impl_->model);
  std::shared_ptr<SessionData> data;
  if (meta.ok() && in_memory) {
    // Load it now: the scratch store goes away with this import.
    absl::StatusOr<std::unique_ptr<state::SessionReader>> reader = scratch_->store->OpenSession(r->id);
    absl::StatusOr<std::shared_ptr<SessionData>> loaded =
        reader.ok() ? LoadSessionData(**reader, *impl_->model) : reader.status();
    if (!loaded.ok()) {
      impl_->store->Unreserve(*r);
      return loaded.status();
    }
    data = std::move(*loaded);
    meta->cold_in_memory = data->cold != nullptr;
  }
  if (!meta.ok()) {
    impl_->store->Unreserve(*r);
    impl_->ForgetOnDisk(r->id);
    return meta.status();
  }
  meta->last_used = now;
  if (absl::Status s = impl_->store->Insert(*r, *meta, std::move(data)); !s.ok()) {
    impl_->Reject(s);
    impl_->ForgetOnDisk(r->id);
    return s;
  }
  if (impl_->observer != nullptr) impl_->observer->OnSessionCreated();
  ECHOKV_ASSIGN_OR_RETURN(SessionMeta now_meta, impl_->store->Get(r->id, caller_.tenant, false));
  return impl_->Info(now_meta);
}

}  // namespace

void Engine::SessionTokens(Caller caller, std::string session_id, DoneFn<std::vector<int>> done) {
  Impl* impl = impl_.get();
  if (!IsValidSessionId(session_id)) {
    return done(absl::InvalidArgumentError(absl::StrCat("session_id ", EscapedIdPrefix(session_id), " is malformed")));
  }
  auto d = std::make_shared<DoneFn<std::vector<int>>>(std::move(done));
  if (!impl->Post([impl, caller, session_id, d] {
        absl::StatusOr<std::shared_ptr<SessionData>> data = impl->SessionDataFor(session_id, caller.tenant);
        if (!data.ok()) return (*d)(data.status());
        (*d)((*data)->tokens);
      })) {
    (*d)(absl::UnavailableError("server is shutting down"));
  }
}

StoreTotals Engine::Totals() const { return impl_->store->Totals(); }

void Engine::SetTenantQuotas(absl::flat_hash_map<std::string, TenantQuota> quotas) {
  impl_->store->SetTenantQuotas(std::move(quotas));
}

void Engine::Wake() {
  absl::MutexLock lock(&impl_->mu);
  impl_->wake = true;
}

EngineHealth Engine::Health() const {
  EngineHealth h;
  {
    absl::MutexLock lock(&impl_->mu);
    h.queued = static_cast<int>(impl_->inbox.size());
  }
  h.queued += impl_->work_items.load() + impl_->edge->queued();
  const absl::Time last = absl::FromUnixNanos(impl_->last_progress_ns.load());
  h.seconds_since_step = std::max(0.0, absl::ToDoubleSeconds(impl_->clock->Now() - last));
  h.serving = !(h.queued > 0 && impl_->clock->Now() - last > impl_->config.stuck_after);
  return h;
}

void Engine::CancelAll() {
  absl::MutexLock lock(&impl_->mu);
  for (const auto& w : impl_->cancels) {
    if (auto c = w.lock()) c->store(true);
  }
}

void Engine::Shutdown() {
  {
    absl::MutexLock lock(&impl_->mu);
    if (!impl_->accepting && !impl_->thread.joinable()) return;
    impl_->accepting = false;
    impl_->stop = true;
    for (const auto& w : impl_->cancels) {
      if (auto c = w.lock()) c->store(true);
    }
  }
  // Edge work still queued answers UNAVAILABLE; writes in flight finish (queued ones
  // are refused); then the engine drains.
  impl_->edge->Shutdown();
  impl_->transfer->Shutdown();
  if (impl_->io != nullptr) impl_->io->Shutdown();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int Engine::QueueDepth() const {
  absl::MutexLock lock(&impl_->mu);
  return static_cast<int>(impl_->inbox.size()) + impl_->work_items.load() + impl_->edge->queued();
}

}  // namespace echokv::server
