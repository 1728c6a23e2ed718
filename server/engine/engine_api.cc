// Engine's public methods (any thread): requests are checked and handed to the
// engine thread's inbox; ImportSession's transfer (engine_impl.h).
#include "server/engine/conversation.h"
#include "server/engine/engine_impl.h"

#ifndef ECHOKV_VERSION
#define ECHOKV_VERSION "0.0.0"
#endif

namespace echokv::server {

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config, EngineObserver* observer) {
  ECHOKV_RETURN_IF_ERROR(config.Validate());
  model::DeviceOptions dev;
  dev.device = config.device;
  dev.dtype = config.dtype;
  dev.weights = config.weights;
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
    const model::KvCache probe = impl->model->NewCache();  // one empty cache: its shape and options
    impl->bytes_per_token = probe.FullEquivalentKvBytes(1);
    const at::TensorOptions o = probe.options();
    impl->int8_bytes_per_token =
        int64_t{mc.num_layers} * mc.num_kv_heads * kernels::KvEntryBytes(kernels::KvDtype::kInt8, mc.head_dim);
    impl->int8_cache_ok = o.dtype() == at::kFloat && o.device().is_cpu();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cache shape: ", e.what()));
  }
  if (config.default_compression.cache_dtype == kernels::KvDtype::kInt8 && !impl->int8_cache_ok) {
    return MakeError(ErrorKind::kInvalidArgument, "default_cache_dtype",
                     "default_cache_dtype int8 needs the CPU float32 model; this server runs on another device or "
                     "dtype");
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
    if (absl::Status s = impl->CheckSessionSettings(req->ttl, req->config); !s.ok()) return done(s);
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

void Engine::Impl::EdgeAppend(std::shared_ptr<AppendRequest> req, CancelFlag cancel, ProgressFn progress,
                              absl::Time admitted, std::function<void(absl::Status)> fail,
                              std::function<void(std::vector<int>, std::optional<ChatEncoding>)> admit,
                              std::function<void()> nothing_new) {
  Impl* impl = this;
  edge->Submit([impl, req, cancel, progress, fail, admit, nothing_new, admitted](bool shutting_down) {
    if (shutting_down) return fail(absl::UnavailableError("server is shutting down"));
    if (cancel->load()) return fail(absl::CancelledError("cancelled before it started"));
    if (!IsValidSessionId(req->session_id)) {
      return fail(MalformedSessionId(req->session_id));
    }
    // Claim first: the tokens count against the session's room, and no other mutation
    // may slip in between.
    absl::StatusOr<SessionInfo> meta = impl->store->Claim(req->session_id, req->caller.tenant);
    if (!meta.ok()) return fail(meta.status());
    if (req->input.whole_conversation && req->input.kind == InputSpec::Kind::kChat) {
      // Checked under the claim: no other append can change the stored conversation
      // between this check and the append.
      absl::StatusOr<std::vector<model::ChatMessage>> added = NewMessages(meta->messages, req->input.chat);
      if (added.ok() && added->empty() && !nothing_new) {
        added = MakeError(ErrorKind::kInvalidArgument, "input.chat",
                          "input.chat: nothing new after the session's conversation");
      }
      if (!added.ok() || added->empty()) {
        impl->store->Release(req->session_id);
        if (!added.ok()) return fail(added.status());
        return nothing_new();
      }
      req->input.chat = std::move(*added);
      req->input.whole_conversation = false;
    }
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
        return fail(s);
      }
      enc = std::move(*e);
    } else {
      absl::StatusOr<std::vector<int>> tokens =
          impl->Tokenize(req->input, /*default_special=*/false, room, meta->tokens_seen);
      if (!tokens.ok()) {
        impl->store->Release(req->session_id);
        return fail(tokens.status());
      }
      ids = std::move(*tokens);
    }
    auto ids_ptr = std::make_shared<std::vector<int>>(std::move(ids));
    auto enc_ptr = std::make_shared<std::optional<Engine::Impl::ChatEncoding>>(std::move(enc));
    if (!impl->Post([admit, ids_ptr, enc_ptr] { admit(std::move(*ids_ptr), std::move(*enc_ptr)); }, cancel)) {
      impl->store->Release(req->session_id);
      fail(absl::UnavailableError("server is shutting down"));
    }
  });
}

void Engine::AppendToSession(AppendRequest request, CancelFlag cancel, ProgressFn progress, DoneFn<SessionInfo> done) {
  Impl* impl = impl_.get();
  cancel = OrFreshFlag(std::move(cancel));
  const absl::Time admitted = impl->clock->Now();
  auto req = std::make_shared<AppendRequest>(std::move(request));
  impl->EdgeAppend(req, cancel, progress, admitted, done,
                   [impl, req, cancel, progress, done, admitted](std::vector<int> ids,
                                                                  std::optional<Engine::Impl::ChatEncoding> enc) {
                     impl->AdmitAppend(req, cancel, progress, done, std::move(ids), std::move(enc), admitted);
                   },
                   /*nothing_new=*/nullptr);
}

namespace {

// A Generate between its checks and its admission.
struct PendingGenerate {
  GenerateParams params;
  CancelFlag cancel;
  StreamSink sink;
  DoneFn<GenerateSummary> done;
  absl::Time admitted;
};

// Queues the stream's admission for the engine thread (AdmitGenerate).
void PostGenerate(Engine::Impl* impl, const std::shared_ptr<PendingGenerate>& pending) {
  CancelFlag cancel = pending->cancel;
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

}  // namespace

void Engine::Generate(GenerateParams params, CancelFlag cancel, StreamSink sink, DoneFn<GenerateSummary> done) {
  Impl* impl = impl_.get();
  cancel = OrFreshFlag(std::move(cancel));
  const EngineLimits& limits = impl->facts.limits;
  auto fail = [&](absl::Status s) { done(std::move(s)); };
  if (!IsValidSessionId(params.session_id)) {
    return fail(MalformedSessionId(params.session_id));
  }
  if (params.max_tokens < 1 || params.max_tokens > limits.max_new_tokens) {
    return fail(MakeError(ErrorKind::kInvalidArgument, "max_tokens",
                          absl::StrCat("max_tokens must be in [1, ", limits.max_new_tokens,
                                       "] (max_new_tokens), got ", params.max_tokens)));
  }
  if (absl::Status s = params.sampling.Validate(); !s.ok()) {
    return fail(WithFieldPrefix(s, "sampling.", "sampling"));
  }
  if (params.stop.size() > 16) return fail(MakeError(ErrorKind::kInvalidArgument, "stop", "stop: at most 16 stop strings"));
  for (size_t i = 0; i < params.stop.size(); ++i) {
    if (params.stop[i].empty() || params.stop[i].size() > 256) {
      return fail(MakeError(ErrorKind::kInvalidArgument, "stop",
                            absl::StrCat("stop[", i, "] must be 1..256 bytes, got ", params.stop[i].size())));
    }
  }
  for (size_t i = 0; i < params.stop_ids.size(); ++i) {
    if (params.stop_ids[i] < 0 || params.stop_ids[i] >= impl->facts.vocab_size) {
      return fail(MakeError(ErrorKind::kInvalidArgument, "stop_token_ids",
                            absl::StrCat("stop_token_ids[", i, "] = ", params.stop_ids[i], " is outside the vocabulary")));
    }
  }
  if (params.input.has_value() && !params.commit) {
    return fail(MakeError(ErrorKind::kInvalidArgument, "input",
                          "input: a generation's input is appended with its commit (commit must be true)"));
  }
  auto pending = std::make_shared<PendingGenerate>(
      PendingGenerate{std::move(params), cancel, std::move(sink), std::move(done), impl->clock->Now()});
  if (pending->params.input.has_value()) {
    // The input's append and the generation are one unit (engine.h): the append turn
    // runs like AppendToSession's, then the stream starts from its uncommitted state.
    auto req = std::make_shared<AppendRequest>();
    req->caller = pending->params.caller;
    req->session_id = pending->params.session_id;
    req->input = std::move(*pending->params.input);
    pending->params.input.reset();
    impl->EdgeAppend(
        req, cancel, nullptr, pending->admitted, [pending](absl::Status s) { pending->done(std::move(s)); },
        [impl, req, pending](std::vector<int> ids, std::optional<Engine::Impl::ChatEncoding> enc) {
          CancelFlag job_cancel = pending->cancel;
          auto s = std::make_unique<Stream>(impl->next_work_id++, std::move(pending->params), pending->cancel,
                                            std::move(pending->sink), std::move(pending->done), pending->admitted);
          impl->AdmitAppend(req, std::move(job_cancel), nullptr, nullptr, std::move(ids), std::move(enc),
                            pending->admitted, std::move(s));
        },
        // A whole conversation with nothing new: the generation continues the session.
        [impl, pending] { PostGenerate(impl, pending); });
    return;
  }
  PostGenerate(impl, pending);
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
    if (absl::Status s = config.Validate(); !s.ok()) return done(WithFieldPrefix(s, "compression.", "compression"));
    absl::StatusOr<std::vector<int>> tokens =
        impl->Tokenize(*in, /*default_special=*/true, impl->facts.limits.max_context_tokens, 0);
    if (!tokens.ok()) return done(tokens.status());
    auto ids = std::make_shared<std::vector<int>>(std::move(*tokens));
    if (!impl->Post([impl, caller, config, cancel, done, ids, admitted] {
          impl->AdmitCompress(caller, config, cancel, done, std::move(*ids), admitted);
        }, cancel)) {
      done(absl::UnavailableError("server is shutting down"));
    }
  });
}

void Engine::ForkSession(Caller caller, std::string session_id, std::optional<absl::Duration> ttl,
                         DoneFn<SessionInfo> done) {
  Impl* impl = impl_.get();
  if (!IsValidSessionId(session_id)) {
    return done(MalformedSessionId(session_id));
  }
  if (absl::Status s = impl->CheckTtl(ttl); !s.ok()) return done(s);
  auto d = std::make_shared<DoneFn<SessionInfo>>(std::move(done));
  if (!impl->Post([impl, caller, session_id, ttl, d] { impl->AdmitFork(caller, session_id, ttl, d); })) {
    (*d)(absl::UnavailableError("server is shutting down"));
  }
}

void Engine::GetSession(Caller caller, std::string session_id, DoneFn<SessionInfo> done) {
  if (!IsValidSessionId(session_id)) {
    return done(MalformedSessionId(session_id));
  }
  absl::StatusOr<SessionInfo> meta = impl_->store->Get(session_id, caller.tenant, /*touch=*/true);
  if (!meta.ok()) return done(meta.status());
  done(*std::move(meta));
}

void Engine::ListSessions(Caller caller, DoneFn<std::vector<SessionInfo>> done) {
  std::vector<SessionInfo> out;
  for (SessionInfo& m : impl_->store->List(caller.tenant)) out.push_back(std::move(m));
  done(std::move(out));
}

void Engine::DeleteSession(Caller caller, std::string session_id, DoneFn<int64_t> done) {
  if (!IsValidSessionId(session_id)) {
    return done(MalformedSessionId(session_id));
  }
  absl::StatusOr<int64_t> freed = impl_->store->Delete(session_id, caller.tenant);
  Impl* impl = impl_.get();
  if (!freed.ok() || impl->durable == nullptr || !impl->durable->Contains(session_id)) return done(std::move(freed));
  // Answered only once the files are gone, like every other mutation: an acknowledged delete
  // must not come back after a crash (the writer may still be busy with other sessions' turns).
  impl->io->Submit([impl, session_id, bytes = *freed, done = std::move(done)](bool) {
    absl::Status s = impl->durable->DeleteSession(session_id);
    if (!s.ok() && !absl::IsNotFound(s)) return done(impl->StateFailure(s, "removing the saved session", /*write=*/true));
    done(bytes);
  });
}

void Engine::InspectCache(Caller caller, std::string session_id, bool include_positions,
                          DoneFn<CacheInspection> done) {
  Impl* impl = impl_.get();
  if (!IsValidSessionId(session_id)) {
    return done(MalformedSessionId(session_id));
  }
  auto d = std::make_shared<DoneFn<CacheInspection>>(std::move(done));
  if (!impl->Post([impl, caller, session_id, include_positions, d] {
        absl::StatusOr<SessionInfo> meta = impl->store->Get(session_id, caller.tenant, true);
        if (!meta.ok()) return (*d)(meta.status());
        absl::StatusOr<std::shared_ptr<SessionData>> data = impl->SessionDataFor(session_id, caller.tenant);
        if (!data.ok()) return (*d)(data.status());
        const model::KvCache& hot = (*data)->hot;
        CacheInspection out;
        out.session = *meta;
        out.layers = impl->Layers(hot.cells(), include_positions, &meta->last_report, hot.storage());
        for (const LayerCacheInfo& l : out.layers) out.total_retained_entries += l.retained * impl->facts.num_kv_heads;
        out.total_kv_bytes = hot.KvBytes();
        out.full_equivalent_kv_bytes = hot.FullEquivalentKvBytes(meta->tokens_seen);
        out.position_bytes = hot.PositionBytes();
        out.cold_kv_bytes = meta->cold_kv_bytes;
        (*d)(std::move(out));
      })) {
    (*d)(absl::UnavailableError("server is shutting down"));
  }
}

void Engine::ExportSession(Caller caller, std::string session_id, CancelFlag cancel, ExportSink sink,
                           DoneFn<int64_t> done) {
  Impl* impl = impl_.get();
  if (!IsValidSessionId(session_id)) {
    return done(MalformedSessionId(session_id));
  }
  cancel = OrFreshFlag(std::move(cancel));
  auto sink_ptr = std::make_shared<ExportSink>(std::move(sink));
  auto d = std::make_shared<DoneFn<int64_t>>(std::move(done));
  if (!impl->Post([impl, caller, session_id, cancel, sink_ptr, d] {
        // A read of the committed state: allowed while a mutation runs.
        absl::StatusOr<SessionInfo> meta = impl->store->Get(session_id, caller.tenant, /*touch=*/true);
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
  ECHOKV_ASSIGN_OR_RETURN(SessionInfo incoming, MetaFromManifest(*parsed, *impl_->model));
  // Checksums only say the bytes are the exporter's; what they say is checked as a
  // CreateSession with the same settings would be (docs/SECURITY.md "Imported snapshots").
  ECHOKV_RETURN_IF_ERROR(impl_->CheckImport(parsed->meta, incoming, ttl_));
  const bool in_memory = impl_->durable == nullptr;
  Engine::Impl::AdmitRequest ask;
  ask.what = Engine::Impl::Admission::kImport;
  ask.tenant = caller_.tenant;
  ask.hot_bytes = incoming.retained_kv_bytes;
  ask.cold_bytes = incoming.cold_kv_bytes;
  ask.cold_in_memory = in_memory && incoming.memory == MemoryMode::kTiered;
  if (keep_id_) ask.id = incoming.id;
  absl::StatusOr<SessionStore::Reservation> r = impl_->Admit(ask);
  if (!r.ok()) return r.status();
  const absl::Time now = impl_->clock->Now();
  absl::StatusOr<state::SessionManifest> committed =
      importer_->Finish(r->id, [this, now](state::SavedSession& m) {
        m.tenant = caller_.tenant;
        m.last_used = now;
        if (ttl_.has_value()) m.ttl = *ttl_;
        return absl::OkStatus();
      });
  if (!committed.ok()) {
    impl_->store->Unreserve(*r);
    return committed.status();
  }
  state::StateStore* store = in_memory ? scratch_->store.get() : impl_->durable.get();
  // Refused after the commit: the files go first (here, so a later import of the same id
  // cannot race their removal), then the reservation.
  auto refuse = [&](const absl::Status& s) {
    if (!in_memory) {
      if (absl::Status d = store->DeleteSession(r->id); !d.ok() && !absl::IsNotFound(d)) {
        ECHOKV_LOG(ERROR) << "removing a refused import failed: " << d.message();
      }
    }
    impl_->store->Unreserve(*r);
    return s;
  };
  absl::StatusOr<SessionInfo> meta = MetaFromManifest(*committed, *impl_->model);
  if (!meta.ok()) return refuse(meta.status());
  // The whole cache is rebuilt once, on either kind of server, so that a snapshot whose
  // tensors do not fit the model or whose positions break the cache's rules is refused
  // now rather than failing every later call (a durable server keeps only the files).
  absl::StatusOr<std::unique_ptr<state::SessionReader>> reader = store->OpenSession(r->id);
  if (!reader.ok()) return refuse(reader.status());
  absl::StatusOr<std::shared_ptr<SessionData>> loaded = LoadSessionData(**reader, *impl_->model);
  reader->reset();
  if (!loaded.ok()) {
    const absl::Status& s = loaded.status();
    if (absl::IsResourceExhausted(s) || absl::IsUnavailable(s)) return refuse(s);
    return refuse(MakeError(ErrorKind::kInvalidArgument, "snapshot", absl::StrCat("snapshot: ", s.message())));
  }
  std::shared_ptr<SessionData> data;
  if (in_memory) {
    // Kept: the scratch store goes away with this import.
    data = std::move(*loaded);
    meta->cold_in_memory = data->cold != nullptr;
  }
  meta->last_used = now;
  if (absl::Status s = impl_->store->Insert(*r, *meta, std::move(data)); !s.ok()) {
    impl_->Reject(s);
    impl_->ForgetOnDisk(r->id);
    return s;
  }
  if (impl_->observer != nullptr) impl_->observer->OnSessionCreated();
  ECHOKV_ASSIGN_OR_RETURN(SessionInfo now_meta, impl_->store->Get(r->id, caller_.tenant, false));
  return now_meta;
}

}  // namespace

void Engine::SessionTokens(Caller caller, std::string session_id, DoneFn<std::vector<int>> done) {
  Impl* impl = impl_.get();
  if (!IsValidSessionId(session_id)) {
    return done(MalformedSessionId(session_id));
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
StoreTotals Engine::TotalsOf(const std::string& tenant) const { return impl_->store->TotalsOf(tenant); }

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
  h.state_writable = impl_->state_writable.load();
  h.serving = !(h.queued > 0 && impl_->clock->Now() - last > impl_->config.stuck_after) && h.state_writable;
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
