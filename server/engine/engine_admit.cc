// Admissions: the one admission point (Admit) and the engine-thread admissions of
// every job and stream: create, append, generate, compress, fork (engine_impl.h;
// docs/ARCHITECTURE.md "Admission").
#include "server/engine/engine_impl.h"

namespace echokv::server {

absl::StatusOr<SessionStore::Reservation> Engine::Impl::Admit(const AdmitRequest& req) {
  {
    absl::MutexLock lock(&mu);
    if (!accepting) return MakeError(ErrorKind::kUnavailable, "", "server is shutting down");
  }
  // Spill idle saved sessions first; the store's check below decides.
  if (req.cold_in_memory && req.cold_bytes > 0) (void)MakeColdRoom(req.cold_bytes, req.spare);
  absl::StatusOr<SessionStore::Reservation> r = absl::InternalError("not admitted");
  switch (req.what) {
    case Admission::kCompress:
      r = store->ReserveBytes(req.tenant, req.hot_bytes, req.cold_bytes, req.cold_in_memory);
      break;
    case Admission::kRestore:
      r = store->ReserveId(req.id.value_or(""), req.tenant, req.hot_bytes, req.cold_bytes, req.cold_in_memory);
      break;
    case Admission::kImport:
      if (req.id.has_value()) {
        r = store->ReserveImportedId(*req.id, req.tenant, req.hot_bytes, req.cold_bytes, req.cold_in_memory);
        break;
      }
      [[fallthrough]];
    case Admission::kCreate:
    case Admission::kFork:
      r = store->Reserve(req.tenant, req.hot_bytes, req.cold_bytes, req.cold_in_memory);
      break;
  }
  if (!r.ok() && req.what != Admission::kRestore) Reject(r.status());
  return r;
}

absl::StatusOr<std::unique_ptr<ActiveJob>> Engine::Impl::StartJob(TurnSpec spec, CancelFlag cancel, Caller caller,
                                                                   absl::Time admitted) {
  absl::StatusOr<std::unique_ptr<TurnJob>> turn = TurnJob::Start(model.get(), std::move(spec));
  if (!turn.ok()) return turn.status();
  auto j = std::make_unique<ActiveJob>();
  j->id = next_work_id++;
  j->turn = std::move(*turn);
  j->cancel = std::move(cancel);
  j->caller = std::move(caller);
  j->admitted = admitted;
  return j;
}

std::vector<int> Engine::Impl::StopIds(bool chat_session) const {
  std::vector<int> stops = eos_ids;
  if (chat_session && chat.has_value()) {
    for (int id : model::EndOfTurnIds(*chat, *tokenizer)) {
      if (std::find(stops.begin(), stops.end(), id) == stops.end()) stops.push_back(id);
    }
  }
  return stops;
}

void Engine::Impl::AdmitCreate(std::shared_ptr<CreateRequest> req, CancelFlag cancel, ProgressFn progress,
                               DoneFn<SessionInfo> done, std::vector<int> tokens, absl::Time admitted) {
  const MemoryMode memory = req->memory.value_or(config.default_memory);
  const int64_t n = static_cast<int64_t>(tokens.size());
  AdmitRequest ask;
  ask.what = Admission::kCreate;
  ask.tenant = req->caller.tenant;
  ask.hot_bytes = HotEstimate(n, req->config);
  ask.cold_bytes = memory == MemoryMode::kTiered ? n * bytes_per_token : 0;
  ask.cold_in_memory = memory == MemoryMode::kTiered;
  absl::StatusOr<SessionStore::Reservation> r = Admit(ask);
  if (!r.ok()) return done(r.status());
  TurnSpec spec;
  spec.kind = TurnKind::kCreate;
  spec.tokens = std::move(tokens);
  spec.config = req->config;
  spec.memory = memory;
  spec.prefill_chunk = config.prefill_chunk;
  spec.progress = ProgressAdapter(progress, admitted);
  absl::StatusOr<std::unique_ptr<ActiveJob>> job = StartJob(std::move(spec), std::move(cancel), req->caller, admitted);
  if (!job.ok()) {
    store->Unreserve(*r);
    return done(job.status());
  }
  std::unique_ptr<ActiveJob> j = std::move(*job);
  j->reservation = *r;
  j->ttl = req->ttl;
  if (req->input.kind == InputSpec::Kind::kChat) {
    j->new_messages = req->input.chat;
    j->tools_json = req->input.tools_json;
  }
  j->session_done = std::move(done);
  jobs.push_back(std::move(j));
}

void Engine::Impl::AdmitAppend(std::shared_ptr<AppendRequest> req, CancelFlag cancel, ProgressFn progress,
                               DoneFn<SessionInfo> done, std::vector<int> tokens,
                               std::optional<ChatEncoding> chat_enc, absl::Time admitted, std::unique_ptr<Stream> then) {
  // Errors release the claim and answer the append, or the stream it was to start.
  auto refuse = [&](absl::Status status) {
    store->Release(req->session_id);
    if (then != nullptr) return then->Finish(std::move(status));
    done(std::move(status));
  };
  // The session was claimed on the edge; it cannot have changed since.
  absl::StatusOr<SessionInfo> meta = store->Get(req->session_id, req->caller.tenant, false);
  absl::StatusOr<std::shared_ptr<SessionData>> data = SessionDataFor(req->session_id, req->caller.tenant);
  if (!meta.ok() || !data.ok()) return refuse(meta.ok() ? data.status() : meta.status());
  const int64_t max_ctx = facts.limits.max_context_tokens;
  if (chat_enc.has_value()) {
    tokens = NewChatTokens(*chat_enc, (*data)->tokens);
    if (tokens.empty()) {
      return refuse(MakeError(ErrorKind::kInvalidArgument, "input.chat",
                              "input.chat: the messages add no tokens to the conversation"));
    }
    if (meta->tokens_seen + static_cast<int64_t>(tokens.size()) > max_ctx) {
      return refuse(MakeError(ErrorKind::kContextLengthExceeded, "input",
                              absl::StrCat("input: ", tokens.size(), " tokens + ", meta->tokens_seen,
                                           " in the session exceed max_context_tokens (", max_ctx, ")")));
    }
  }
  if (then != nullptr) {
    // The generation's room is checked now, before anything runs: a commit feeds every
    // generated token back, so held + input + max_tokens must fit (AdmitGenerate's rule).
    const int64_t held = meta->tokens_seen + static_cast<int64_t>(tokens.size());
    then->FitMaxTokens(max_ctx - held);
    const int max_tokens = then->params().max_tokens;
    if (max_tokens > max_ctx - held) {
      return refuse(MakeError(ErrorKind::kContextLengthExceeded, "max_tokens",
                              absl::StrCat("max_tokens: the session holds ", meta->tokens_seen,
                                           " tokens and the input adds ", tokens.size(), "; ", max_tokens,
                                           " more (committed) exceed max_context_tokens (", max_ctx, "): at most ",
                                           std::max<int64_t>(max_ctx - held, 0))));
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
  absl::StatusOr<std::unique_ptr<ActiveJob>> job = StartJob(std::move(spec), std::move(cancel), req->caller, admitted);
  if (!job.ok()) return refuse(job.status());
  std::unique_ptr<ActiveJob> j = std::move(*job);
  j->session_id = req->session_id;
  j->session_done = std::move(done);
  j->then_generate = std::move(then);
  if (req->input.kind == InputSpec::Kind::kChat) {
    j->new_messages = req->input.chat;
    if (!req->input.tools_json.empty()) j->tools_json = req->input.tools_json;
  }
  jobs.push_back(std::move(j));
}

void Engine::Impl::StartPromptedStream(ActiveJob& j) {
  std::unique_ptr<Stream> s = std::move(j.then_generate);
  auto prompt = std::make_shared<PendingPrompt>();
  prompt->tokens_before = static_cast<int64_t>(j.turn->spec().base->tokens.size());
  prompt->data = j.turn->TakeSessionData();
  prompt->meta = BuildMeta(j, *prompt->data);
  prompt->new_messages = j.new_messages;
  prompt->tools_json = j.tools_json;
  prompt->turn = std::move(j.turn);  // uncommitted: rolled back if the stream goes away
  std::vector<int> stops = StopIds(!prompt->meta.messages.empty());
  const SessionData& d = *prompt->data;
  try {
    s->Begin(d.hot.Clone(), d.last_logits, d.tokens, std::move(stops), tokenizer.get());
  } catch (const std::exception& e) {
    store->Release(j.session_id);
    return s->Finish(absl::InternalError(absl::StrCat("copying the session cache: ", e.what())));
  }
  s->set_prompt(std::move(prompt));
  streams.push_back(std::move(s));
}

void Engine::Impl::AdmitGenerate(std::unique_ptr<Stream> s) {
  const GenerateParams& p = s->params();
  absl::StatusOr<SessionInfo> meta =
      p.commit ? store->Claim(p.session_id, p.caller.tenant) : store->Get(p.session_id, p.caller.tenant, true);
  if (!meta.ok()) return s->Finish(meta.status());
  // Positions: the last sampled token is never fed back, so without commit a session
  // of n tokens can sample max_context - n + 1 more (llama2.c's run.c does the same).
  // A commit feeds every generated token (and the end-of-turn id) back: n + max_tokens
  // must fit.
  const int64_t max_ctx = facts.limits.max_context_tokens;
  const int64_t room = p.commit ? max_ctx - meta->tokens_seen : max_ctx - meta->tokens_seen + 1;
  s->FitMaxTokens(room);
  if (p.max_tokens > room) {
    if (p.commit) store->Release(p.session_id);
    return s->Finish(MakeError(ErrorKind::kContextLengthExceeded, "max_tokens",
                               absl::StrCat("max_tokens: the session holds ", meta->tokens_seen, " tokens; ",
                                            p.max_tokens, " more", p.commit ? " (committed)" : "",
                                            " exceed max_context_tokens (", max_ctx, "): at most ",
                                            std::max<int64_t>(room, 0))));
  }
  absl::StatusOr<std::shared_ptr<SessionData>> data = SessionDataFor(p.session_id, p.caller.tenant);
  if (!data.ok()) {
    if (p.commit) store->Release(p.session_id);
    return s->Finish(data.status());
  }
  // A chat session's turn also ends at the template's end-of-turn token.
  std::vector<int> stops = StopIds(!meta->messages.empty());
  try {
    s->Begin((*data)->hot.Clone(), (*data)->last_logits, (*data)->tokens, std::move(stops), tokenizer.get());
  } catch (const std::exception& e) {
    if (p.commit) store->Release(p.session_id);
    return s->Finish(absl::InternalError(absl::StrCat("copying the session cache: ", e.what())));
  }
  streams.push_back(std::move(s));
}

void Engine::Impl::AdmitCompress(Caller caller, compression::CompressionConfig config_in, CancelFlag cancel,
                                 DoneFn<CompressOutcome> done, std::vector<int> tokens, absl::Time admitted) {
  // No session: the job's cache counts against max_kv_bytes (and the tenant's quota)
  // while it runs, estimated as a new session's would be.
  AdmitRequest ask;
  ask.what = Admission::kCompress;
  ask.tenant = caller.tenant;
  ask.hot_bytes = HotEstimate(static_cast<int64_t>(tokens.size()), config_in);
  absl::StatusOr<SessionStore::Reservation> r = Admit(ask);
  if (!r.ok()) return done(r.status());
  TurnSpec spec;
  spec.kind = TurnKind::kCompress;
  spec.tokens = std::move(tokens);
  spec.config = config_in;
  spec.prefill_chunk = config.prefill_chunk;
  absl::StatusOr<std::unique_ptr<ActiveJob>> job = StartJob(std::move(spec), std::move(cancel), std::move(caller),
                                                            admitted);
  if (!job.ok()) {
    store->Unreserve(*r);
    return done(job.status());
  }
  std::unique_ptr<ActiveJob> j = std::move(*job);
  j->reservation = *r;
  j->compress_done = std::move(done);
  jobs.push_back(std::move(j));
}

void Engine::Impl::AdmitFork(Caller caller, std::string session_id, std::optional<absl::Duration> ttl,
                             std::shared_ptr<DoneFn<SessionInfo>> d) {
  // A read of the source: allowed while it is busy; sees its committed state.
  absl::StatusOr<SessionInfo> meta = store->Get(session_id, caller.tenant, true);
  if (!meta.ok()) return (*d)(meta.status());
  absl::StatusOr<std::shared_ptr<SessionData>> src = SessionDataFor(session_id, caller.tenant);
  if (!src.ok()) return (*d)(src.status());
  AdmitRequest ask;
  ask.what = Admission::kFork;
  ask.tenant = caller.tenant;
  ask.hot_bytes = meta->retained_kv_bytes;
  ask.cold_bytes = meta->cold_kv_bytes;
  ask.cold_in_memory = meta->cold_in_memory;
  ask.spare = session_id;
  absl::StatusOr<SessionStore::Reservation> r = Admit(ask);
  if (!r.ok()) return (*d)(r.status());
  auto data = std::make_shared<SessionData>();
  try {
    const SessionData& from = **src;
    data->hot = from.hot.Clone();
    data->last_logits = from.last_logits.clone();
    data->tokens = from.tokens;
    if (from.cold != nullptr) {
      absl::StatusOr<model::KvCache> cold = from.cold->ClonePrefix(from.cold_len);
      if (!cold.ok()) {
        store->Unreserve(*r);
        return (*d)(cold.status());
      }
      data->cold = std::make_shared<model::KvCache>(std::move(*cold));
      data->cold_len = from.cold_len;
      data->window_queries = from.window_queries;    // never modified in place
      data->window_positions = from.window_positions;
      data->h2o_scores = from.h2o_scores;
    }
  } catch (const std::exception& e) {
    store->Unreserve(*r);
    return (*d)(absl::InternalError(absl::StrCat("fork: ", e.what())));
  }
  SessionInfo copy = *meta;
  copy.id = r->id;
  copy.tenant = caller.tenant;
  copy.created = copy.last_used = clock->Now();
  copy.ttl = ttl.value_or(meta->ttl);
  copy.busy = false;
  data->segments_since_full = 0;
  auto reservation = std::make_shared<SessionStore::Reservation>(*r);
  Impl* impl = this;
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
    absl::StatusOr<SessionInfo> now = impl->store->Get(reservation->id, caller.tenant, false);
    (*d)(now.ok() ? absl::StatusOr<SessionInfo>(*now) : now.status());
  };
  if (durable == nullptr) return finish(absl::OkStatus());
  absl::StatusOr<TurnRecord> rec = EncodeTurn(copy, *data, 0, /*full=*/true);
  if (!rec.ok()) return finish(rec.status());
  auto record = std::make_shared<TurnRecord>(std::move(*rec));
  io->Submit([impl, record, finish](bool shutting_down) {
    absl::Status st = shutting_down ? absl::UnavailableError("server is shutting down")
                                    : impl->durable->WriteTurn(record->meta, record->segment);
    if (!st.ok() && !shutting_down) st = impl->StateFailure(st, "saving the forked session", /*write=*/true);
    if (!impl->Post([finish, st] { finish(st); })) finish(absl::UnavailableError("server is shutting down"));
  });
}

}  // namespace echokv::server
