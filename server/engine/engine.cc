// The engine loop: inbox -> schedule -> run -> outputs -> reap (engine.h). The pieces
// live in their own files: SessionStore (bookkeeping), Scheduler (what runs), Runner
// (batched decode rows), TurnJob (prefill + compression state machines), Stream
// (sampling and deltas), WorkerPool (edge threads for validation and tokenization).
#include "server/engine/engine.h"

#include <ATen/ATen.h>

#include "server/engine/engine_impl.h"

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
    MaybeProbeStateDir();
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
  const absl::Time started = clock->Now();

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
  if (observer != nullptr) {
    observer->OnStep(absl::ToDoubleSeconds(clock->Now() - started), static_cast<int>(rows.size()));
  }
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
  // Tokens generated before a cancel or failure were generated all the same.
  if (observer != nullptr) observer->OnGeneratedTokens(s.TakeUncountedTokens());
  if (s.params().commit) store->Release(s.params().session_id);
  s.Finish(std::move(status));
}

void Engine::Impl::FinishStream(std::unique_ptr<Stream> s) {
  GenerateSummary summary = s->Summary(clock->Now());
  if (observer != nullptr) observer->OnGeneratedTokens(s->TakeUncountedTokens());
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
  PendingPrompt* prompt = s->prompt();  // GenerateParams::input: committed with the reply
  if (tokens.empty() && prompt == nullptr) {
    store->Release(id);
    absl::StatusOr<SessionInfo> meta = store->Get(id, tenant, true);
    if (meta.ok()) summary.session = *meta;
    s->Finish(std::move(summary));
    return;
  }
  absl::StatusOr<SessionInfo> meta =
      prompt != nullptr ? absl::StatusOr<SessionInfo>(prompt->meta) : store->Get(id, tenant, false);
  if (!meta.ok()) return FailStream(*s, meta.status());
  if (meta->messages.empty() || !chat.has_value()) {
    return StartCommit(std::move(s), std::move(summary), std::move(tokens), {});
  }
  // A chat session: the reply enters the session as the template renders it (the whole
  // conversation re-rendered and tokenized, off the engine thread), so the session stays
  // exactly the tokens of render(conversation); the sampled ids are the fallback.
  std::vector<model::ChatMessage> reply = {MakeMessage("assistant", s->text())};
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
        const PendingPrompt* prompt = pending->stream->prompt();
        absl::StatusOr<std::shared_ptr<SessionData>> data =
            prompt != nullptr
                ? absl::StatusOr<std::shared_ptr<SessionData>>(prompt->data)
                : SessionDataFor(pending->stream->params().session_id, pending->stream->params().caller.tenant);
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
  const PendingPrompt* prompt = s->prompt();  // the base is the session with the prompt
  absl::StatusOr<SessionInfo> meta =
      prompt != nullptr ? absl::StatusOr<SessionInfo>(prompt->meta) : store->Get(id, tenant, false);
  absl::StatusOr<std::shared_ptr<SessionData>> data =
      prompt != nullptr ? absl::StatusOr<std::shared_ptr<SessionData>>(prompt->data) : SessionDataFor(id, tenant);
  if (!meta.ok() || !data.ok()) {
    FailStream(*s, meta.ok() ? data.status() : meta.status());
    return;
  }
  const int64_t max_ctx = facts.limits.max_context_tokens;
  if (meta->tokens_seen + static_cast<int64_t>(tokens.size()) > max_ctx) {
    FailStream(*s, MakeError(ErrorKind::kContextLengthExceeded, "commit",
                             absl::StrCat("commit: the session holds ", meta->tokens_seen, " tokens; the reply adds ",
                                          tokens.size(), ", beyond max_context_tokens (", max_ctx, ")")));
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
  if (prompt != nullptr) {
    // The prompt's messages enter the session with the reply.
    j->new_messages = prompt->new_messages;
    j->tools_json = prompt->tools_json;
  }
  // A chat session remembers the reply.
  j->new_messages.insert(j->new_messages.end(), reply.begin(), reply.end());
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
  st.retained_mass = r.RetainedMassMean();
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
      out.layers = Layers(cells, /*positions=*/true, &out.report, out.report.config.cache_dtype);
      if (j.reservation.has_value()) store->Unreserve(*j.reservation);  // the job's bytes
      j.reservation.reset();
      j.compress_done(std::move(out));
      return;
    }
    case TurnKind::kCreate: {
      std::shared_ptr<SessionData> data = t.TakeSessionData();
      SessionInfo meta = BuildMeta(j, *data);
      const std::string id = j.reservation->id;
      if (absl::Status s = store->Insert(*j.reservation, meta, std::move(data)); !s.ok()) {
        Reject(s);
        ForgetOnDisk(id);  // written, never acknowledged
        j.session_done(s);
        return;
      }
      t.Committed();
      if (observer != nullptr) observer->OnSessionCreated();
      absl::StatusOr<SessionInfo> now = store->Get(id, j.caller.tenant, false);
      j.session_done(now.ok() ? absl::StatusOr<SessionInfo>(*now) : now.status());
      return;
    }
    case TurnKind::kAppend:
    case TurnKind::kCommit: {
      if (j.then_generate != nullptr) return StartPromptedStream(j);  // committed with the reply
      std::shared_ptr<SessionData> data = t.TakeSessionData();
      SessionInfo meta = BuildMeta(j, *data);
      absl::Status s = store->Commit(j.session_id, meta, std::move(data));
      if (!s.ok()) {
        Reject(s);
        FailJob(j, s);
        return;
      }
      t.Committed();
      if (j.stream != nullptr && j.stream->prompt() != nullptr) j.stream->prompt()->turn->Committed();
      absl::StatusOr<SessionInfo> now = store->Get(j.session_id, j.caller.tenant, false);
      absl::StatusOr<SessionInfo> info =
          now.ok() ? absl::StatusOr<SessionInfo>(*now) : absl::StatusOr<SessionInfo>(now.status());
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
      if (j.then_generate != nullptr) {
        j.then_generate->Finish(std::move(status));
      } else {
        j.session_done(std::move(status));
      }
      break;
    case TurnKind::kCommit:
      store->Release(j.session_id);
      j.stream->Finish(std::move(status));
      break;
    case TurnKind::kCompress:
      if (j.reservation.has_value()) store->Unreserve(*j.reservation);
      j.reservation.reset();
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

}  // namespace echokv::server
