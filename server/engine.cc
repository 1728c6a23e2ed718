#include "server/engine.h"

#include <ATen/ATen.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <exception>
#include <list>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "compression/pipeline.h"
#include "model/tokenizer.h"
#include "model/transformer.h"

#ifndef ECHOKV_VERSION
#define ECHOKV_VERSION "0.0.0"
#endif

namespace echokv::server {

absl::Status EngineLimits::Validate() const {
  if (max_context_tokens < 0) return absl::InvalidArgumentError("max_context_tokens must be >= 0 (0 = model max)");
  if (max_new_tokens < 1) return absl::InvalidArgumentError("max_new_tokens must be >= 1");
  if (max_sessions < 1) return absl::InvalidArgumentError("max_sessions must be >= 1");
  if (max_kv_bytes < 1) return absl::InvalidArgumentError("max_kv_bytes must be >= 1");
  if (session_ttl <= absl::ZeroDuration()) return absl::InvalidArgumentError("session_ttl must be > 0");
  if (max_session_ttl < session_ttl) {
    return absl::InvalidArgumentError("max_session_ttl must be >= session_ttl");
  }
  if (max_concurrent_streams < 1) return absl::InvalidArgumentError("max_concurrent_streams must be >= 1");
  if (max_request_bytes < 1) return absl::InvalidArgumentError("max_request_bytes must be >= 1");
  return absl::OkStatus();
}

absl::Status EngineConfig::Validate() const {
  if (model_dir.empty()) return absl::InvalidArgumentError("model: a model directory is required");
  if (prefill_chunk < 1) return absl::InvalidArgumentError("prefill_chunk must be >= 1");
  if (absl::Status s = default_compression.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("default compression: ", s.message()));
  }
  return limits.Validate();
}

absl::StatusOr<std::string> NewSessionId() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("getrandom failed: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(32, '0');
  for (int i = 0; i < 16; ++i) {
    id[2 * i] = kHex[bytes[i] >> 4];
    id[2 * i + 1] = kHex[bytes[i] & 15];
  }
  return id;
}

namespace {

// The caller's cancel flag, or a fresh one when it passed none.
CancelFlag OrFreshFlag(CancelFlag cancel) {
  return cancel != nullptr ? std::move(cancel) : std::make_shared<std::atomic<bool>>(false);
}

double SecondsSince(absl::Time t) { return absl::ToDoubleSeconds(absl::Now() - t); }

absl::Status NotFound(const std::string& id) {
  return absl::NotFoundError(
      absl::StrCat("session ", id, " not found (unknown, deleted or expired)"));
}

absl::Status Busy(const std::string& id) {
  return absl::FailedPreconditionError(absl::StrCat(
      "session ", id, " is busy: another mutation (append, generate with commit, delete) "
      "is in progress; retry when it finishes"));
}

bool IsLookaheadPolicy(compression::PolicyKind kind) {
  switch (kind) {
    case compression::PolicyKind::kLaq:
    case compression::PolicyKind::kEchoKv:
      return true;
    case compression::PolicyKind::kFull:
    case compression::PolicyKind::kStreamingLlm:
    case compression::PolicyKind::kH2o:
    case compression::PolicyKind::kSnapKv:
    case compression::PolicyKind::kPyramidKv:
      return false;
  }
  return false;
}

// The compact cache and state of one session (engine thread only).
struct Session {
  std::string id;
  model::KvCache cache;                        // compact cache, next_position = tokens_seen
  at::Tensor last_logits;                      // [V] float32 CPU: logits for the next token
  compression::CompressionConfig config;       // resolved; used for every re-compression
  compression::CompressionReport last_report;  // the latest compression
  int64_t tokens_seen = 0;                     // every token prefilled or committed
  absl::Time created;
  absl::Time last_used;                        // idle timer start
  absl::Duration ttl;                          // idle expiry
  bool busy = false;                           // a mutation holds the session
};

// A prefill + compression unit of work (create, append, commit, stateless compress).
struct PrefillJob {
  enum class Kind { kCreate, kAppend, kCommit, kCompress };
  Kind kind = Kind::kCreate;
  InputSpec input;                          // kCreate / kAppend / kCompress
  std::vector<int> tokens;                  // kCommit: the generated ids
  compression::CompressionConfig config;    // kCreate / kCompress
  std::string session_id;                   // kAppend / kCommit
  std::optional<absl::Duration> ttl;        // kCreate
  CancelFlag cancel;                        // never null
  ProgressFn progress;                      // may be empty
  DoneFn<SessionInfo> session_done;         // kCreate / kAppend
  DoneFn<CompressOutcome> compress_done;    // kCompress
  DoneFn<GenerateSummary> generate_done;    // kCommit
  GenerateSummary summary;                  // kCommit: the finished generation
  absl::Time admitted;                      // for elapsed_seconds
};

// One Generate stream (engine thread only).
struct Generation {
  GenerateParams params;
  CancelFlag cancel;                              // never null
  DeltaFn on_delta;
  DoneFn<GenerateSummary> done;
  model::KvCache cache;                           // private copy of the session's cache
  at::Tensor logits;                              // [V] float32 CPU, next-token logits
  int pending_token = -1;                         // sampled, not yet decoded into cache
  std::unique_ptr<model::Sampler> sampler;
  model::StopCriteria stop;
  std::unique_ptr<model::IncrementalDecoder> decoder;
  std::vector<int> generated;                     // every sampled token (no eos/stop id)
  std::string held;                               // text withheld: may start a stop string
  int64_t prompt_tokens = 0;                      // session tokens when admitted
  absl::Time admitted;
  absl::Time first_token;
  absl::Time last_token;
};

}  // namespace

struct Engine::Impl {
  EngineConfig config;
  EngineObserver* observer = nullptr;                // not owned; may be null
  ServerFacts facts;
  std::unique_ptr<model::Transformer> model;
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::optional<model::ChatTemplate> chat;           // unset: chat input unsupported
  std::string chat_error;                            // why chat is unsupported
  int64_t bytes_per_token = 0;                       // full-cache KV bytes of one token

  mutable absl::Mutex mu;
  std::deque<std::function<void()>> tasks ABSL_GUARDED_BY(mu);       // quick work
  bool accepting ABSL_GUARDED_BY(mu) = true;         // false once Shutdown begins
  bool stop ABSL_GUARDED_BY(mu) = false;             // the thread should exit
  std::vector<std::weak_ptr<std::atomic<bool>>> cancels ABSL_GUARDED_BY(mu);  // for CancelAll
  std::atomic<int> pending_prefill{0};               // prefill_jobs.size(), for QueueDepth
  std::thread thread;

  // ---- engine thread only ----
  absl::flat_hash_map<std::string, std::unique_ptr<Session>> sessions;
  std::deque<std::shared_ptr<PrefillJob>> prefill_jobs;
  std::list<std::unique_ptr<Generation>> generations;
  int reserved_sessions = 0;        // creates admitted, not finished
  int64_t reserved_kv_bytes = 0;    // estimated bytes of those creates
  absl::Time next_reap = absl::InfinitePast();

  bool HasTasksOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !tasks.empty() || stop; }

  // Queues `task` for the engine thread; false after Shutdown.
  bool Post(std::function<void()> task, const CancelFlag& cancel = nullptr) {
    absl::MutexLock lock(&mu);
    if (!accepting) return false;
    if (cancel != nullptr) {
      cancels.erase(std::remove_if(cancels.begin(), cancels.end(),
                                   [](const auto& w) { return w.expired(); }),
                    cancels.end());
      cancels.push_back(cancel);
    }
    tasks.push_back(std::move(task));
    return true;
  }

  void RunQueuedTasks() {
    std::deque<std::function<void()>> batch;
    {
      absl::MutexLock lock(&mu);
      batch.swap(tasks);
    }
    for (auto& t : batch) t();
  }

  void Loop();
  void Reap();
  void DecodeRound();
  bool Step(Generation& g);  // true when the generation left the active list
  void RunPrefill(PrefillJob& job);
  absl::Status RunPrefillOrError(PrefillJob& job);
  absl::StatusOr<std::vector<int>> Tokenize(const InputSpec& input, bool default_special);
  void ReportGauges();

  int64_t LiveRetainedBytes() const {
    int64_t total = 0;
    for (const auto& [id, s] : sessions) total += s->cache.KvBytes();
    return total;
  }

  SessionInfo Info(const Session& s) const {
    SessionInfo info;
    info.id = s.id;
    info.tokens_seen = s.tokens_seen;
    info.retained_entries = s.cache.cells().TotalEntries();
    info.retained_kv_bytes = s.cache.KvBytes();
    info.full_kv_bytes = s.cache.FullEquivalentKvBytes(s.tokens_seen);
    info.config = s.config;
    info.last_report = s.last_report;
    info.created = s.created;
    info.last_used = s.last_used;
    info.ttl = s.ttl;
    info.busy = s.busy;
    return info;
  }

  // The live session `id`, expiring it first when idle too long; null if none.
  Session* Find(const std::string& id) {
    auto it = sessions.find(id);
    if (it == sessions.end()) return nullptr;
    Session* s = it->second.get();
    if (!s->busy && absl::Now() - s->last_used > s->ttl) {
      sessions.erase(it);
      if (observer != nullptr) observer->OnSessionExpired();
      ECHOKV_LOG(INFO) << "a session expired (idle beyond its ttl)";
      return nullptr;
    }
    return s;
  }

  absl::Status CheckTtl(const std::optional<absl::Duration>& ttl) const {
    if (!ttl.has_value()) return absl::OkStatus();
    if (*ttl <= absl::ZeroDuration() || *ttl > config.limits.max_session_ttl) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ttl_seconds must be in [1, ", absl::ToInt64Seconds(config.limits.max_session_ttl),
          "] (max_session_ttl), got ", absl::ToInt64Seconds(*ttl)));
    }
    return absl::OkStatus();
  }

  void Reject(absl::string_view limit) {
    if (observer != nullptr) observer->OnSessionRejected(limit);
  }
};

// ------------------------------------------------------------------------------
// Engine thread

void Engine::Impl::Loop() {
  while (true) {
    bool stopping = false;
    {
      absl::MutexLock lock(&mu);
      if (prefill_jobs.empty() && generations.empty()) {
        mu.AwaitWithTimeout(absl::Condition(this, &Impl::HasTasksOrStop), absl::Milliseconds(200));
      }
      stopping = stop;
    }
    RunQueuedTasks();
    if (stopping) {
      // Everything still here was cancelled by Shutdown; finish it all.
      for (auto& g : generations) g->cancel->store(true);
      while (!generations.empty()) DecodeRound();
      while (!prefill_jobs.empty()) {
        std::shared_ptr<PrefillJob> job = std::move(prefill_jobs.front());
        prefill_jobs.pop_front();
        pending_prefill.fetch_sub(1);
        job->cancel->store(true);
        RunPrefill(*job);
        while (!generations.empty()) DecodeRound();
      }
      sessions.clear();
      ReportGauges();
      return;
    }
    Reap();
    DecodeRound();
    if (!prefill_jobs.empty()) {
      std::shared_ptr<PrefillJob> job = std::move(prefill_jobs.front());
      prefill_jobs.pop_front();
      pending_prefill.fetch_sub(1);
      RunPrefill(*job);
    }
    ReportGauges();
  }
}

void Engine::Impl::Reap() {
  const absl::Time now = absl::Now();
  if (now < next_reap) return;
  next_reap = now + absl::Milliseconds(200);
  for (auto it = sessions.begin(); it != sessions.end();) {
    const Session& s = *it->second;
    if (!s.busy && now - s.last_used > s.ttl) {
      sessions.erase(it++);
      if (observer != nullptr) observer->OnSessionExpired();
      ECHOKV_LOG(INFO) << "a session expired (idle beyond its ttl)";
    } else {
      ++it;
    }
  }
}

void Engine::Impl::ReportGauges() {
  if (observer == nullptr) return;
  EngineGauges g;
  g.live_sessions = static_cast<int>(sessions.size());
  for (const auto& [id, s] : sessions) {
    g.retained_kv_bytes += s->cache.KvBytes();
    g.full_kv_bytes += s->cache.FullEquivalentKvBytes(s->tokens_seen);
  }
  {
    absl::MutexLock lock(&mu);
    g.queue_depth = static_cast<int>(tasks.size());
  }
  g.queue_depth += pending_prefill.load();
  g.active_generations = static_cast<int>(generations.size());
  observer->OnGauges(g);
}

void Engine::Impl::DecodeRound() {
  for (auto it = generations.begin(); it != generations.end();) {
    if (Step(**it)) {
      it = generations.erase(it);  // over: its callback ran or its commit job is queued
    } else {
      ++it;
    }
  }
}

namespace {

// Length of the longest suffix of `text` that is a proper prefix of some stop string.
size_t HeldSuffix(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& s : stops) {
    for (size_t k = std::min(text.size(), s.size() - 1); k > best; --k) {
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        best = k;
        break;
      }
    }
  }
  return best;
}

}  // namespace

// One decode step of `g`: decode the previously sampled token, sample the next, emit
// its text. Returns true when the generation is over; then its final callback has run
// (or its commit job is queued) and the caller drops `g`.
bool Engine::Impl::Step(Generation& g) {
  auto fail = [&](absl::Status status) {
    if (g.params.commit) {
      if (Session* s = Find(g.params.session_id)) s->busy = false;
    }
    g.done(std::move(status));
    return true;
  };
  if (g.cancel->load()) return fail(absl::CancelledError("generation cancelled"));
  FinishReason reason = FinishReason::kLength;
  bool finished = false;
  try {
    if (g.pending_token >= 0) {
      absl::StatusOr<model::DecodeResult> step = model->Decode(g.pending_token, &g.cache);
      if (!step.ok()) return fail(step.status());
      g.logits = std::move(step->logits);
      g.pending_token = -1;
    }
    at::Tensor logits = g.logits.to(at::kFloat).contiguous();
    const int token = g.sampler->Sample(
        absl::MakeConstSpan(logits.data_ptr<float>(), static_cast<size_t>(logits.numel())));
    const model::StopReason stop = g.stop.Check(token, static_cast<int>(g.generated.size()) + 1);
    switch (stop) {
      case model::StopReason::kEos:
        reason = FinishReason::kEos;
        finished = true;
        break;
      case model::StopReason::kStopId:
        reason = FinishReason::kStopToken;
        finished = true;
        break;
      case model::StopReason::kLength:
      case model::StopReason::kNone:
        break;
    }
    GenerateDelta delta;
    if (!finished) {
      g.generated.push_back(token);
      const absl::Time now = absl::Now();
      if (g.generated.size() == 1) {
        g.first_token = now;
        if (observer != nullptr) observer->OnFirstToken(absl::ToDoubleSeconds(now - g.admitted));
      } else if (observer != nullptr) {
        observer->OnInterToken(absl::ToDoubleSeconds(now - g.last_token));
      }
      g.last_token = now;
      absl::StatusOr<std::string> text = g.decoder->Add(token);
      if (!text.ok()) return fail(text.status());
      g.held += *text;
      delta.ids.push_back(token);
      // Stop strings: emit up to the first match and finish, else hold back any tail
      // that could begin one.
      size_t cut = std::string::npos;
      for (const std::string& s : g.params.stop) {
        const size_t p = g.held.find(s);
        if (p != std::string::npos) cut = std::min(cut, p);
      }
      if (cut != std::string::npos) {
        delta.text = g.held.substr(0, cut);
        g.held.clear();
        reason = FinishReason::kStopString;
        finished = true;
      } else {
        const size_t keep = HeldSuffix(g.held, g.params.stop);
        delta.text = g.held.substr(0, g.held.size() - keep);
        g.held.erase(0, g.held.size() - keep);
        if (stop == model::StopReason::kLength) {
          reason = FinishReason::kLength;
          finished = true;
        }
      }
      if (!finished) g.pending_token = token;
    }
    if (finished && reason != FinishReason::kStopString) {
      absl::StatusOr<std::string> rest = g.decoder->Finish();
      if (!rest.ok()) return fail(rest.status());
      g.held += *rest;
      delta.text += g.held;
      g.held.clear();
    }
    if (!delta.text.empty() || !delta.ids.empty()) g.on_delta(std::move(delta));
  } catch (const std::exception& e) {
    return fail(absl::InternalError(absl::StrCat("generation failed: ", e.what())));
  }
  if (!finished) return false;

  // Summary (and the commit, which runs as a prefill job before `done`).
  GenerateSummary summary;
  summary.reason = reason;
  summary.prompt_tokens = g.prompt_tokens;
  summary.generated_tokens = static_cast<int>(g.generated.size());
  const absl::Time now = absl::Now();
  summary.total_seconds = absl::ToDoubleSeconds(now - g.admitted);
  if (!g.generated.empty()) {
    summary.time_to_first_token_seconds = absl::ToDoubleSeconds(g.first_token - g.admitted);
    const double decode = absl::ToDoubleSeconds(g.last_token - g.first_token);
    summary.tokens_per_second =
        (g.generated.size() > 1 && decode > 0) ? (g.generated.size() - 1) / decode : 0;
  }
  if (observer != nullptr) observer->OnGeneratedTokens(static_cast<int64_t>(g.generated.size()));
  if (g.params.commit && !g.generated.empty()) {
    auto job = std::make_shared<PrefillJob>();
    job->kind = PrefillJob::Kind::kCommit;
    job->tokens = g.generated;
    job->session_id = g.params.session_id;
    job->cancel = g.cancel;
    job->generate_done = std::move(g.done);
    job->summary = std::move(summary);
    job->admitted = g.admitted;
    prefill_jobs.push_front(std::move(job));  // commit promptly: the session is held
    pending_prefill.fetch_add(1);
    return true;
  }
  if (g.params.commit) {
    if (Session* s = Find(g.params.session_id)) {
      s->busy = false;
      s->last_used = absl::Now();
      summary.session = Info(*s);
    }
  }
  g.done(std::move(summary));
  return true;
}

absl::StatusOr<std::vector<int>> Engine::Impl::Tokenize(const InputSpec& input, bool default_special) {
  std::vector<int> ids;
  switch (input.kind) {
    case InputSpec::Kind::kNone:
      return absl::InvalidArgumentError("input: one of text, tokens or chat is required");
    case InputSpec::Kind::kText: {
      if (input.text.empty()) return absl::InvalidArgumentError("input.text: empty");
      model::EncodeOptions eo;
      eo.add_special_tokens = input.add_special_tokens.value_or(default_special);
      eo.parse_special = false;  // user text: special-token strings stay plain text
      ECHOKV_ASSIGN_OR_RETURN(ids, tokenizer->Encode(input.text, eo));
      break;
    }
    case InputSpec::Kind::kTokens: {
      if (input.tokens.empty()) return absl::InvalidArgumentError("input.tokens: empty");
      const int v = facts.vocab_size;
      for (size_t i = 0; i < input.tokens.size(); ++i) {
        if (input.tokens[i] < 0 || input.tokens[i] >= v) {
          return absl::InvalidArgumentError(absl::StrCat("input.tokens.ids[", i, "] = ",
                                                         input.tokens[i], " is outside the vocabulary [0, ",
                                                         v, ")"));
        }
      }
      ids = input.tokens;
      break;
    }
    case InputSpec::Kind::kChat: {
      if (input.chat.empty()) return absl::InvalidArgumentError("input.chat: no messages");
      if (!chat.has_value()) {
        return absl::UnimplementedError(
            absl::StrCat("input.chat: this model has no usable chat template (", chat_error,
                         "); send text or tokens instead"));
      }
      model::ChatTemplate tmpl = *chat;
      tmpl.add_generation_prompt = input.add_generation_prompt;
      absl::StatusOr<std::vector<int>> r = model::EncodeChat(tmpl, input.chat, *tokenizer);
      if (!r.ok()) {
        return absl::Status(r.status().code(), absl::StrCat("input.chat: ", r.status().message()));
      }
      ids = std::move(*r);
      break;
    }
  }
  if (ids.empty()) return absl::InvalidArgumentError("input: no tokens after tokenization");
  return ids;
}

void Engine::Impl::RunPrefill(PrefillJob& job) {
  absl::Status status;
  try {
    status = RunPrefillOrError(job);
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("prefill/compression failed: ", e.what()));
  }
  if (status.ok()) return;  // RunPrefillOrError called the done callback
  if (job.cancel->load() && !absl::IsCancelled(status)) {
    status = absl::CancelledError(absl::StrCat("cancelled: ", status.message()));
  }
  switch (job.kind) {
    case PrefillJob::Kind::kCreate:
      --reserved_sessions;
      job.session_done(status);
      break;
    case PrefillJob::Kind::kAppend:
      if (Session* s = Find(job.session_id)) s->busy = false;
      job.session_done(status);
      break;
    case PrefillJob::Kind::kCommit:
      if (Session* s = Find(job.session_id)) s->busy = false;
      job.generate_done(status);
      break;
    case PrefillJob::Kind::kCompress:
      job.compress_done(status);
      break;
  }
}

absl::Status Engine::Impl::RunPrefillOrError(PrefillJob& job) {
  if (job.cancel->load()) return absl::CancelledError("cancelled before it started");
  const bool on_session = job.kind == PrefillJob::Kind::kAppend || job.kind == PrefillJob::Kind::kCommit;
  Session* session = nullptr;
  if (on_session) {
    auto it = sessions.find(job.session_id);  // busy: never expires under us
    if (it == sessions.end()) return NotFound(job.session_id);
    session = it->second.get();
  }
  auto report_progress = [&](const std::string& phase, int64_t done, int64_t total) {
    if (job.progress) job.progress(ProgressEvent{phase, done, total, SecondsSince(job.admitted)});
  };
  std::vector<int> tokens;
  if (job.kind == PrefillJob::Kind::kCommit) {
    tokens = job.tokens;
  } else {
    const int64_t bytes = static_cast<int64_t>(job.input.text.size()) +
                          static_cast<int64_t>(job.input.tokens.size()) * 4;
    int64_t chat_bytes = 0;
    for (const auto& m : job.input.chat) chat_bytes += m.content.size() + m.role.size();
    if (bytes + chat_bytes > config.limits.max_request_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("input: ", bytes + chat_bytes,
                                                     " bytes exceed max_request_bytes (",
                                                     config.limits.max_request_bytes, ")"));
    }
    report_progress("tokenize", 0, 1);
    ECHOKV_ASSIGN_OR_RETURN(tokens, Tokenize(job.input, job.kind != PrefillJob::Kind::kAppend));
  }
  const int64_t before = session != nullptr ? session->tokens_seen : 0;
  const int64_t max_ctx = facts.limits.max_context_tokens;
  if (before + static_cast<int64_t>(tokens.size()) > max_ctx) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input: ", tokens.size(), " tokens", before > 0 ? absl::StrCat(" + ", before, " in the session") : "",
        " exceed max_context_tokens (", max_ctx, ")"));
  }
  const compression::CompressionConfig cfg = session != nullptr ? session->config : job.config;
  const int64_t old_bytes = session != nullptr ? session->cache.KvBytes() : 0;
  const int64_t live = LiveRetainedBytes();
  if (job.kind == PrefillJob::Kind::kCreate) {
    // Admission estimate: at most min(L, B) entries per layer/group survive.
    const int64_t keep = cfg.policy == compression::PolicyKind::kFull
                             ? static_cast<int64_t>(tokens.size())
                             : std::min<int64_t>(tokens.size(), cfg.budget);
    if (live + keep * bytes_per_token > config.limits.max_kv_bytes) {
      Reject("max_kv_bytes");
      return absl::ResourceExhaustedError(absl::StrCat(
          "max_kv_bytes (", config.limits.max_kv_bytes, ") would be exceeded: live sessions hold ",
          live, " bytes and this session needs up to ", keep * bytes_per_token));
    }
  }

  compression::PipelineOptions opts;
  opts.prefill_chunk = config.prefill_chunk;
  opts.cancel = job.cancel.get();
  opts.progress = [&](const std::string& phase, int64_t done, int64_t total) {
    report_progress(phase, done, total);
    // Keep the other streams moving between chunks and policy steps.
    RunQueuedTasks();
    DecodeRound();
  };
  model::KvCache base = session != nullptr ? session->cache.Clone() : model->NewCache();
  ECHOKV_ASSIGN_OR_RETURN(compression::CompressedContext ctx,
                          compression::PrefillAndCompress(*model, tokens, std::move(base), cfg, opts));
  if (job.cancel->load()) return absl::CancelledError("cancelled");
  if (job.kind != PrefillJob::Kind::kCompress) {
    const int64_t now_live = LiveRetainedBytes();
    const int64_t new_bytes = ctx.cache.KvBytes();
    if (now_live - old_bytes + new_bytes > config.limits.max_kv_bytes) {
      Reject("max_kv_bytes");
      return absl::ResourceExhaustedError(absl::StrCat(
          "max_kv_bytes (", config.limits.max_kv_bytes, ") would be exceeded: live sessions hold ",
          now_live, " bytes and this session would hold ", new_bytes));
    }
  }

  // Stats.
  const compression::CompressionReport& r = ctx.report;
  if (observer != nullptr) {
    CompressionStats st;
    st.policy = std::string(compression::PolicyName(r.config.policy));
    st.phases = r.phases;
    st.evicted = r.evicted;
    st.lookahead_policy = IsLookaheadPolicy(r.config.policy);
    st.lookahead_seconds = r.SecondsOf("bootstrap") + r.SecondsOf("round1") + r.SecondsOf("repair") +
                           r.SecondsOf("round2");
    st.prefill_seconds = r.SecondsOf("prefill");
    st.prompt_tokens = static_cast<int64_t>(tokens.size());
    st.evicted_kv_bytes = std::max<int64_t>(0, r.full_kv_bytes - r.retained_kv_bytes);
    st.ratio = r.full_kv_bytes > 0 ? static_cast<double>(r.retained_kv_bytes) / r.full_kv_bytes : 1.0;
    observer->OnCompression(st);
  }

  switch (job.kind) {
    case PrefillJob::Kind::kCompress: {
      CompressOutcome out;
      out.report = ctx.report;
      out.context_tokens = static_cast<int64_t>(tokens.size());
      const model::KvCells& cells = ctx.cache.cells();
      const int64_t row = bytes_per_token / std::max(1, facts.num_layers * facts.num_kv_heads);
      for (int l = 0; l < cells.num_layers(); ++l) {
        LayerCacheInfo layer;
        layer.retained = cells.size(l);
        for (int g = 0; g < cells.num_kv_heads(); ++g) {
          GroupCache gc;
          gc.positions = cells.positions(l, g);
          gc.retained = static_cast<int64_t>(gc.positions.size());
          gc.kv_bytes = gc.retained * row;
          layer.kv_bytes += gc.kv_bytes;
          layer.groups.push_back(std::move(gc));
        }
        out.layers.push_back(std::move(layer));
      }
      job.compress_done(std::move(out));
      return absl::OkStatus();
    }
    case PrefillJob::Kind::kCreate: {
      auto s = std::make_unique<Session>();
      ECHOKV_ASSIGN_OR_RETURN(s->id, NewSessionId());
      --reserved_sessions;
      s->cache = std::move(ctx.cache);
      s->last_logits = ctx.last_logits.to(at::kFloat).contiguous();
      s->config = ctx.report.config;
      s->last_report = std::move(ctx.report);
      s->tokens_seen = static_cast<int64_t>(tokens.size());
      s->created = s->last_used = absl::Now();
      s->ttl = job.ttl.value_or(config.limits.session_ttl);
      SessionInfo info = Info(*s);
      sessions.emplace(s->id, std::move(s));
      if (observer != nullptr) observer->OnSessionCreated();
      job.session_done(std::move(info));
      return absl::OkStatus();
    }
    case PrefillJob::Kind::kAppend:
    case PrefillJob::Kind::kCommit: {
      session->cache = std::move(ctx.cache);
      session->last_logits = ctx.last_logits.to(at::kFloat).contiguous();
      session->last_report = std::move(ctx.report);
      session->tokens_seen += static_cast<int64_t>(tokens.size());
      session->last_used = absl::Now();
      session->busy = false;
      SessionInfo info = Info(*session);
      if (job.kind == PrefillJob::Kind::kAppend) {
        job.session_done(std::move(info));
      } else {
        job.summary.session = std::move(info);
        job.generate_done(std::move(job.summary));
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------
// Public API

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config,
                                                       EngineObserver* observer) {
  ECHOKV_RETURN_IF_ERROR(config.Validate());
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->observer = observer;
  model::DeviceOptions dev;
  dev.device = config.device;
  dev.dtype = config.dtype;
  dev.num_threads = config.threads;
  ECHOKV_RETURN_IF_ERROR(dev.Validate());
  ECHOKV_ASSIGN_OR_RETURN(impl->model, model::Transformer::Load(config.model_dir, dev));
  ECHOKV_ASSIGN_OR_RETURN(impl->tokenizer, model::LoadTokenizer(config.model_dir));
  absl::StatusOr<model::ChatTemplate> chat = model::LoadChatTemplate(config.model_dir);
  if (chat.ok()) {
    impl->chat = *chat;
  } else {
    impl->chat_error = std::string(chat.status().message());
    ECHOKV_LOG(INFO) << "chat input disabled: " << impl->chat_error;
  }
  const model::ModelConfig& mc = impl->model->config();
  try {
    impl->bytes_per_token = impl->model->NewCache().FullEquivalentKvBytes(1);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cache shape: ", e.what()));
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
  f.device = config.device;
  f.dtype = config.dtype;
  for (compression::PolicyKind k : compression::AllPolicies()) {
    f.policies.emplace_back(compression::PolicyName(k));
  }
  f.default_compression = config.default_compression;
  f.limits = config.limits;
  if (f.limits.max_context_tokens == 0) f.limits.max_context_tokens = mc.max_position_embeddings;
  Impl* raw = impl.get();
  std::unique_ptr<Engine> engine(new Engine(std::move(impl)));
  raw->thread = std::thread([raw] { raw->Loop(); });
  ECHOKV_LOG(INFO) << "engine ready: " << f.model_type << " " << f.model_name << ", " << f.num_layers
                   << " layers, device " << f.device << " " << f.dtype;
  return engine;
}

const ServerFacts& Engine::facts() const { return impl_->facts; }

// A prefill job of `kind` admitted now, with its input and cancel flag.
std::shared_ptr<PrefillJob> NewPrefillJob(PrefillJob::Kind kind, InputSpec input, CancelFlag cancel) {
  auto job = std::make_shared<PrefillJob>();
  job->kind = kind;
  job->input = std::move(input);
  job->cancel = OrFreshFlag(std::move(cancel));
  job->admitted = absl::Now();
  return job;
}

void Engine::CreateSession(InputSpec input, compression::CompressionConfig config,
                           std::optional<absl::Duration> ttl, CancelFlag cancel, ProgressFn progress,
                           DoneFn<SessionInfo> done) {
  auto job = NewPrefillJob(PrefillJob::Kind::kCreate, std::move(input), std::move(cancel));
  job->config = std::move(config);
  job->ttl = ttl;
  job->progress = std::move(progress);
  job->session_done = std::move(done);
  Impl* impl = impl_.get();
  const bool posted = impl->Post(
      [impl, job] {
        if (absl::Status s = impl->CheckTtl(job->ttl); !s.ok()) return job->session_done(s);
        if (absl::Status s = job->config.Validate(); !s.ok()) {
          return job->session_done(absl::InvalidArgumentError(absl::StrCat("compression.", s.message())));
        }
        const int max = impl->config.limits.max_sessions;
        if (static_cast<int>(impl->sessions.size()) + impl->reserved_sessions >= max) {
          impl->Reject("max_sessions");
          return job->session_done(absl::ResourceExhaustedError(
              absl::StrCat("max_sessions (", max, ") reached; delete a session first")));
        }
        ++impl->reserved_sessions;
        impl->prefill_jobs.push_back(job);
        impl->pending_prefill.fetch_add(1);
      },
      job->cancel);
  if (!posted) job->session_done(absl::UnavailableError("server is shutting down"));
}

void Engine::AppendToSession(std::string session_id, InputSpec input, CancelFlag cancel,
                             ProgressFn progress, DoneFn<SessionInfo> done) {
  auto job = NewPrefillJob(PrefillJob::Kind::kAppend, std::move(input), std::move(cancel));
  job->session_id = std::move(session_id);
  job->progress = std::move(progress);
  job->session_done = std::move(done);
  Impl* impl = impl_.get();
  const bool posted = impl->Post(
      [impl, job] {
        Session* s = impl->Find(job->session_id);
        if (s == nullptr) return job->session_done(NotFound(job->session_id));
        if (s->busy) return job->session_done(Busy(job->session_id));
        s->busy = true;
        impl->prefill_jobs.push_back(job);
        impl->pending_prefill.fetch_add(1);
      },
      job->cancel);
  if (!posted) job->session_done(absl::UnavailableError("server is shutting down"));
}

void Engine::Generate(GenerateParams params, CancelFlag cancel, DeltaFn on_delta,
                      DoneFn<GenerateSummary> done) {
  auto g = std::make_shared<std::unique_ptr<Generation>>(std::make_unique<Generation>());
  (*g)->params = std::move(params);
  (*g)->cancel = OrFreshFlag(std::move(cancel));
  (*g)->on_delta = std::move(on_delta);
  (*g)->done = std::move(done);
  (*g)->admitted = absl::Now();
  Impl* impl = impl_.get();
  CancelFlag flag = (*g)->cancel;
  const bool posted = impl->Post(
      [impl, g] {
        Generation& gen = **g;
        const GenerateParams& p = gen.params;
        const EngineLimits& limits = impl->facts.limits;
        if (p.max_tokens < 1 || p.max_tokens > limits.max_new_tokens) {
          return gen.done(absl::InvalidArgumentError(absl::StrCat(
              "max_tokens must be in [1, ", limits.max_new_tokens, "] (max_new_tokens), got ", p.max_tokens)));
        }
        if (absl::Status s = p.sampling.Validate(); !s.ok()) {
          return gen.done(absl::InvalidArgumentError(absl::StrCat("sampling.", s.message())));
        }
        if (p.stop.size() > 16) return gen.done(absl::InvalidArgumentError("stop: at most 16 stop strings"));
        for (size_t i = 0; i < p.stop.size(); ++i) {
          if (p.stop[i].empty() || p.stop[i].size() > 256) {
            return gen.done(absl::InvalidArgumentError(
                absl::StrCat("stop[", i, "] must be 1..256 bytes, got ", p.stop[i].size())));
          }
        }
        for (size_t i = 0; i < p.stop_ids.size(); ++i) {
          if (p.stop_ids[i] < 0 || p.stop_ids[i] >= impl->facts.vocab_size) {
            return gen.done(absl::InvalidArgumentError(absl::StrCat(
                "stop_token_ids[", i, "] = ", p.stop_ids[i], " is outside the vocabulary")));
          }
        }
        Session* s = impl->Find(p.session_id);
        if (s == nullptr) return gen.done(NotFound(p.session_id));
        if (s->tokens_seen + p.max_tokens > limits.max_context_tokens) {
          return gen.done(absl::InvalidArgumentError(absl::StrCat(
              "max_tokens: the session holds ", s->tokens_seen, " tokens; + ", p.max_tokens,
              " exceeds max_context_tokens (", limits.max_context_tokens, ")")));
        }
        if (p.commit) {
          if (s->busy) return gen.done(Busy(p.session_id));
          s->busy = true;
        }
        s->last_used = absl::Now();
        try {
          gen.cache = s->cache.Clone();
          gen.logits = s->last_logits.clone();
        } catch (const std::exception& e) {
          if (p.commit) s->busy = false;
          return gen.done(absl::InternalError(absl::StrCat("copying the session cache: ", e.what())));
        }
        gen.prompt_tokens = s->tokens_seen;
        gen.sampler = std::make_unique<model::Sampler>(p.sampling);
        gen.stop.max_tokens = p.max_tokens;
        if (!p.ignore_eos) gen.stop.eos_ids = impl->tokenizer->eos_ids();
        if (!p.ignore_eos) {
          for (int id : impl->model->config().eos_token_ids) {
            if (std::find(gen.stop.eos_ids.begin(), gen.stop.eos_ids.end(), id) == gen.stop.eos_ids.end()) {
              gen.stop.eos_ids.push_back(id);
            }
          }
        }
        gen.stop.stop_ids = p.stop_ids;
        gen.decoder = std::make_unique<model::IncrementalDecoder>(impl->tokenizer.get());
        impl->generations.push_back(std::move(*g));
      },
      flag);
  if (!posted) (*g)->done(absl::UnavailableError("server is shutting down"));
}

void Engine::Compress(InputSpec input, compression::CompressionConfig config, CancelFlag cancel,
                      DoneFn<CompressOutcome> done) {
  auto job = NewPrefillJob(PrefillJob::Kind::kCompress, std::move(input), std::move(cancel));
  job->config = std::move(config);
  job->compress_done = std::move(done);
  Impl* impl = impl_.get();
  const bool posted = impl->Post(
      [impl, job] {
        if (absl::Status s = job->config.Validate(); !s.ok()) {
          return job->compress_done(absl::InvalidArgumentError(absl::StrCat("compression.", s.message())));
        }
        impl->prefill_jobs.push_back(job);
        impl->pending_prefill.fetch_add(1);
      },
      job->cancel);
  if (!posted) job->compress_done(absl::UnavailableError("server is shutting down"));
}

void Engine::ForkSession(std::string session_id, std::optional<absl::Duration> ttl,
                         DoneFn<SessionInfo> done) {
  Impl* impl = impl_.get();
  auto d = std::make_shared<DoneFn<SessionInfo>>(std::move(done));
  const bool posted = impl->Post([impl, session_id, ttl, d] {
    if (absl::Status st = impl->CheckTtl(ttl); !st.ok()) return (*d)(st);
    Session* src = impl->Find(session_id);
    if (src == nullptr) return (*d)(NotFound(session_id));
    const int max = impl->config.limits.max_sessions;
    if (static_cast<int>(impl->sessions.size()) + impl->reserved_sessions >= max) {
      impl->Reject("max_sessions");
      return (*d)(absl::ResourceExhaustedError(absl::StrCat("max_sessions (", max, ") reached; delete a session first")));
    }
    const int64_t live = impl->LiveRetainedBytes();
    const int64_t need = src->cache.KvBytes();
    if (live + need > impl->config.limits.max_kv_bytes) {
      impl->Reject("max_kv_bytes");
      return (*d)(absl::ResourceExhaustedError(absl::StrCat("max_kv_bytes (", impl->config.limits.max_kv_bytes,
                                                            ") would be exceeded: live sessions hold ", live,
                                                            " bytes and the fork needs ", need)));
    }
    auto s = std::make_unique<Session>();
    absl::StatusOr<std::string> id = NewSessionId();
    if (!id.ok()) return (*d)(id.status());
    s->id = *id;
    try {
      s->cache = src->cache.Clone();
      s->last_logits = src->last_logits.clone();
    } catch (const std::exception& e) {
      return (*d)(absl::InternalError(absl::StrCat("fork: ", e.what())));
    }
    s->config = src->config;
    s->last_report = src->last_report;
    s->tokens_seen = src->tokens_seen;
    s->created = s->last_used = absl::Now();
    s->ttl = ttl.value_or(src->ttl);
    src->last_used = s->created;
    SessionInfo info = impl->Info(*s);
    impl->sessions.emplace(s->id, std::move(s));
    if (impl->observer != nullptr) impl->observer->OnSessionCreated();
    (*d)(std::move(info));
  });
  if (!posted) (*d)(absl::UnavailableError("server is shutting down"));
}

void Engine::GetSession(std::string session_id, DoneFn<SessionInfo> done) {
  Impl* impl = impl_.get();
  auto d = std::make_shared<DoneFn<SessionInfo>>(std::move(done));
  if (!impl->Post([impl, session_id, d] {
        Session* s = impl->Find(session_id);
        if (s == nullptr) return (*d)(NotFound(session_id));
        s->last_used = absl::Now();
        (*d)(impl->Info(*s));
      })) {
    (*d)(absl::UnavailableError("server is shutting down"));
  }
}

void Engine::ListSessions(DoneFn<std::vector<SessionInfo>> done) {
  Impl* impl = impl_.get();
  auto d = std::make_shared<DoneFn<std::vector<SessionInfo>>>(std::move(done));
  if (!impl->Post([impl, d] {
        impl->Reap();
        std::vector<SessionInfo> out;
        for (const auto& [id, s] : impl->sessions) out.push_back(impl->Info(*s));
        std::sort(out.begin(), out.end(),
                  [](const SessionInfo& a, const SessionInfo& b) { return a.created < b.created; });
        (*d)(std::move(out));
      })) {
    (*d)(absl::UnavailableError("server is shutting down"));
  }
}

void Engine::DeleteSession(std::string session_id, DoneFn<int64_t> done) {
  Impl* impl = impl_.get();
  auto d = std::make_shared<DoneFn<int64_t>>(std::move(done));
  if (!impl->Post([impl, session_id, d] {
        Session* s = impl->Find(session_id);
        if (s == nullptr) return (*d)(NotFound(session_id));
        if (s->busy) return (*d)(Busy(session_id));
        const int64_t freed = s->cache.KvBytes();
        impl->sessions.erase(session_id);
        (*d)(freed);
      })) {
    (*d)(absl::UnavailableError("server is shutting down"));
  }
}

void Engine::InspectCache(std::string session_id, bool include_positions, DoneFn<CacheInspection> done) {
  Impl* impl = impl_.get();
  auto d = std::make_shared<DoneFn<CacheInspection>>(std::move(done));
  if (!impl->Post([impl, session_id, include_positions, d] {
        Session* s = impl->Find(session_id);
        if (s == nullptr) return (*d)(NotFound(session_id));
        s->last_used = absl::Now();
        CacheInspection out;
        out.session = impl->Info(*s);
        const model::KvCells& cells = s->cache.cells();
        const int64_t row =
            impl->bytes_per_token / std::max(1, impl->facts.num_layers * impl->facts.num_kv_heads);
        for (int l = 0; l < cells.num_layers(); ++l) {
          LayerCacheInfo layer;
          layer.retained = cells.size(l);
          for (int g = 0; g < cells.num_kv_heads(); ++g) {
            GroupCache gc;
            gc.retained = static_cast<int64_t>(cells.positions(l, g).size());
            if (include_positions) gc.positions = cells.positions(l, g);
            gc.kv_bytes = gc.retained * row;
            layer.kv_bytes += gc.kv_bytes;
            layer.groups.push_back(std::move(gc));
          }
          out.total_retained_entries += layer.retained * cells.num_kv_heads();
          out.layers.push_back(std::move(layer));
        }
        out.total_kv_bytes = s->cache.KvBytes();
        out.full_equivalent_kv_bytes = s->cache.FullEquivalentKvBytes(s->tokens_seen);
        out.position_bytes = s->cache.PositionBytes();
        (*d)(std::move(out));
      })) {
    (*d)(absl::UnavailableError("server is shutting down"));
  }
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
  if (impl_->thread.joinable()) impl_->thread.join();
}

int Engine::QueueDepth() const {
  absl::MutexLock lock(&impl_->mu);
  return static_cast<int>(impl_->tasks.size()) + impl_->pending_prefill.load();
}

}  // namespace echokv::server
