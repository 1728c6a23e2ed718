#include "server/sessions/sessions.h"

#include <utility>

#include "common/errors.h"

namespace echokv::server {

void Completion::Abandon() {
  cancel_->store(true);
  absl::MutexLock lock(&mu_);
  abandoned_ = true;
  if (ended_) DeleteCreated();  // it had finished: the reply it made is not delivered
}

void Completion::Ended(bool ok) {
  absl::MutexLock lock(&mu_);
  ended_ = true;
  if (mode_ == CompletionRequest::Session::kStateless || !ok || abandoned_) DeleteCreated();
}

void Completion::DeleteCreated() {
  if (created_.empty() || deleted_) return;
  deleted_ = true;
  engine_->DeleteSession(caller_, created_, [](absl::StatusOr<int64_t>) {});
}

Sessions::Sessions(EnginePort* engine, EngineObserver* observer, SessionsOptions options)
    : engine_(engine),
      observer_(observer),
      options_(std::move(options)),
      slots_(engine->facts().limits.max_concurrent_streams, options_.stream_reserve) {}

absl::Status Sessions::AcquireStream(const std::string& tenant) {
  const int cap = options_.stream_quota ? options_.stream_quota(tenant) : 0;
  absl::Status s = slots_.Acquire(tenant, cap);
  if (observer_ != nullptr) {
    if (!s.ok()) {
      observer_->OnSessionRejected(ErrorInfoOf(s).limit);  // max_concurrent_streams or the tenant's max_streams
    } else {
      observer_->OnStreamSlot(tenant, 1);
    }
  }
  return s;
}

void Sessions::ReleaseStream(const std::string& tenant) {
  slots_.Release(tenant);
  if (observer_ != nullptr) observer_->OnStreamSlot(tenant, -1);
}

void Sessions::Create(CreateRequest request, CancelFlag cancel, ProgressFn progress, DoneFn<SessionInfo> done) {
  engine_->CreateSession(std::move(request), std::move(cancel), std::move(progress), std::move(done));
}

void Sessions::Append(AppendRequest request, CancelFlag cancel, ProgressFn progress, DoneFn<SessionInfo> done) {
  engine_->AppendToSession(std::move(request), std::move(cancel), std::move(progress), std::move(done));
}

void Sessions::Generate(GenerateParams params, CancelFlag cancel, StreamSink sink, DoneFn<GenerateSummary> done) {
  engine_->Generate(std::move(params), std::move(cancel), std::move(sink), std::move(done));
}

void Sessions::Fork(Caller caller, std::string session_id, std::optional<absl::Duration> ttl,
                    DoneFn<SessionInfo> done) {
  engine_->ForkSession(std::move(caller), std::move(session_id), ttl, std::move(done));
}

void Sessions::Compress(Caller caller, InputSpec input, compression::CompressionConfig config, CancelFlag cancel,
                        DoneFn<CompressOutcome> done) {
  engine_->Compress(std::move(caller), std::move(input), std::move(config), std::move(cancel), std::move(done));
}

void Sessions::Get(Caller caller, std::string session_id, bool include_tokens, DoneFn<SessionView> done) {
  EnginePort* engine = engine_;
  engine_->GetSession(caller, session_id, [engine, caller, session_id, include_tokens,
                                           done = std::move(done)](absl::StatusOr<SessionInfo> info) mutable {
    if (!info.ok()) return done(info.status());
    auto view = std::make_shared<SessionView>();
    view->info = *std::move(info);
    if (!include_tokens) return done(std::move(*view));
    engine->SessionTokens(caller, session_id, [view, done = std::move(done)](absl::StatusOr<std::vector<int>> t) {
      if (!t.ok()) return done(t.status());
      view->tokens = *std::move(t);
      done(std::move(*view));
    });
  });
}

void Sessions::List(Caller caller, DoneFn<std::vector<SessionInfo>> done) {
  engine_->ListSessions(std::move(caller), std::move(done));
}

void Sessions::Delete(Caller caller, std::string session_id, DoneFn<int64_t> done) {
  engine_->DeleteSession(std::move(caller), std::move(session_id), std::move(done));
}

void Sessions::Inspect(Caller caller, std::string session_id, bool include_positions, DoneFn<CacheInspection> done) {
  engine_->InspectCache(std::move(caller), std::move(session_id), include_positions, std::move(done));
}

void Sessions::Export(Caller caller, std::string session_id, CancelFlag cancel, ExportSink sink,
                      DoneFn<int64_t> done) {
  engine_->ExportSession(std::move(caller), std::move(session_id), std::move(cancel), std::move(sink),
                         std::move(done));
}

std::unique_ptr<SessionImport> Sessions::BeginImport(Caller caller, bool keep_id, std::optional<absl::Duration> ttl) {
  return engine_->BeginImport(std::move(caller), keep_id, ttl);
}

std::shared_ptr<Completion> Sessions::Complete(CompletionRequest request, StreamSink sink,
                                               std::function<void(const std::string& session_id)> on_session,
                                               DoneFn<GenerateSummary> done) {
  auto run = std::make_shared<Completion>();
  run->engine_ = engine_;
  run->caller_ = request.caller;
  run->mode_ = request.session;
  GenerateParams p = std::move(request.generate);
  p.caller = request.caller;
  // The end of the generation decides the fate of a session the completion created.
  DoneFn<GenerateSummary> finish = [run, done = std::move(done)](absl::StatusOr<GenerateSummary> r) {
    run->Ended(r.ok());
    done(std::move(r));
  };

  if (request.session == CompletionRequest::Session::kContinue) {
    // One engine job: the input's append and the generation are one unit.
    p.session_id = request.session_id;
    p.commit = true;
    InputSpec& in = request.input;
    if (in.kind == InputSpec::Kind::kChat) {
      in.whole_conversation = true;
      p.input = std::move(in);
    } else if (in.kind != InputSpec::Kind::kNone && !(in.kind == InputSpec::Kind::kText && in.text.empty())) {
      p.input = std::move(in);
    }
    on_session(p.session_id);
    engine_->Generate(std::move(p), run->cancel_, std::move(sink), std::move(finish));
    return run;
  }

  CreateRequest create;
  create.caller = request.caller;
  create.input = std::move(request.input);
  create.config = std::move(request.config);
  create.memory = request.memory;
  create.ttl = request.ttl;
  p.commit = request.session == CompletionRequest::Session::kNew;
  EnginePort* engine = engine_;
  auto pending = std::make_shared<std::pair<GenerateParams, StreamSink>>(std::move(p), std::move(sink));
  engine_->CreateSession(
      std::move(create), run->cancel_, nullptr,
      [engine, run, pending, on_session = std::move(on_session), done_create = finish](
          absl::StatusOr<SessionInfo> info) mutable {
        if (!info.ok()) return done_create(info.status());  // nothing was created
        {
          absl::MutexLock lock(&run->mu_);
          run->created_ = info->id;
        }
        pending->first.session_id = info->id;
        on_session(info->id);
        engine->Generate(std::move(pending->first), run->cancel_, std::move(pending->second), std::move(done_create));
      });
  return run;
}

}  // namespace echokv::server
