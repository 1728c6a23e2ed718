// Durable sessions (docs/SESSION_MEMORY.md): snapshots written before a turn is
// acknowledged, room in the cold tier, the state store opened and sessions restored at
// start (engine_impl.h).
#include "server/engine/engine_impl.h"

#include <optional>
#include <system_error>

#include "absl/strings/str_replace.h"
#include "server/state/file_ops.h"

namespace echokv::server {

SessionInfo Engine::Impl::BuildMeta(const ActiveJob& j, const SessionData& data) const {
  const TurnJob& t = *j.turn;
  SessionInfo meta = MetaFor(data, t.report(), t.spec().memory);
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
    absl::StatusOr<SessionInfo> old = store->Get(j.session_id, j.caller.tenant, false);  // claimed: present
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
  int64_t before = spec.base != nullptr ? static_cast<int64_t>(spec.base->tokens.size()) : 0;
  // A reply committed with its prompt (GenerateParams::input): the prompt was never
  // written, so the segment begins where the committed session ends.
  if (j.stream != nullptr && j.stream->prompt() != nullptr) before = j.stream->prompt()->tokens_before;
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
    if (!status.ok() && !shutting_down) status = StateFailure(status, "saving the session state", /*write=*/true);
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

absl::Status Engine::Impl::StateFailure(const absl::Status& s, absl::string_view doing, bool write) {
  ECHOKV_LOG(ERROR) << doing << " failed: " << s.message();
  if (write && !absl::IsResourceExhausted(s)) MaybeProbeStateDir(/*now=*/true);
  std::string cause;
  if (const std::optional<int> err = state::ErrnoOf(s); err.has_value()) {
    cause = absl::StrCat(std::error_code(*err, std::generic_category()).message(), " (errno ", *err, ")");
  } else if (const std::optional<state::ErrorKind> kind = state::ErrorKindOf(s); kind.has_value()) {
    cause = absl::StrCat("the saved state failed verification (", state::ErrorKindName(*kind), ")");
  } else {
    cause = std::string(s.message());
    if (!config.state_dir.empty()) cause = absl::StrReplaceAll(cause, {{config.state_dir, "<state_dir>"}});
  }
  return absl::Status(s.code(), absl::StrCat(doing, " failed: ", cause, "; the server's log has the details"));
}

void Engine::Impl::MaybeProbeStateDir(bool now) {
  if (durable == nullptr || io == nullptr) return;
  const int64_t t = absl::ToUnixNanos(absl::Now());
  if (!now && t < next_state_probe_ns.load()) return;
  if (state_probe_running.exchange(true)) return;
  const absl::Duration every = state_writable.load() ? absl::Seconds(10) : absl::Seconds(1);
  next_state_probe_ns.store(t + absl::ToInt64Nanoseconds(every));
  io->Submit([this](bool shutting_down) {
    if (!shutting_down) {
      const absl::Status probe = durable->ProbeWritable();
      // A full disk is not an unwritable one: deletes free room, smaller writes may fit.
      const bool writable = probe.ok() || absl::IsResourceExhausted(probe);
      if (writable != state_writable.exchange(writable)) {
        if (writable) {
          ECHOKV_LOG(INFO) << "state dir " << config.state_dir << " is writable again";
        } else {
          ECHOKV_LOG(ERROR) << "state dir " << config.state_dir << " cannot be written (" << probe.message()
                            << "): health NOT_SERVING until it can; probing every second";
        }
        if (observer != nullptr) observer->OnStateDirWritable(writable);
      }
    }
    state_probe_running.store(false);
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
  return LimitError("max_cold_bytes", absl::StrCat("max_cold_bytes (", limit, ") would be exceeded: cold tiers in memory hold ",
                                                   t.cold_memory_bytes, " bytes and this needs ", bytes, " more"));
}

absl::StatusOr<std::shared_ptr<SessionData>> Engine::Impl::SessionDataFor(const std::string& id,
                                                                          const std::string& tenant) {
  ECHOKV_ASSIGN_OR_RETURN(std::shared_ptr<SessionData> data, store->Data(id, tenant, /*touch=*/false));
  if (data != nullptr) return data;
  if (durable == nullptr) return absl::InternalError(absl::StrCat("session ", EscapedIdPrefix(id), " has no state"));
  ECHOKV_ASSIGN_OR_RETURN(SessionInfo meta, store->Get(id, tenant, false));
  absl::StatusOr<std::unique_ptr<state::SessionReader>> reader = durable->OpenSession(id);
  if (!reader.ok()) return StateFailure(reader.status(), "loading the saved session", /*write=*/false);
  if (meta.memory == MemoryMode::kTiered) ECHOKV_RETURN_IF_ERROR(MakeColdRoom(meta.cold_kv_bytes, id));
  absl::StatusOr<std::shared_ptr<SessionData>> loaded = LoadSessionData(**reader, *model);
  if (!loaded.ok()) return StateFailure(loaded.status(), "loading the saved session", /*write=*/false);
  data = std::move(*loaded);
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
  // Create's own probe passed just now: the periodic ones start in 10 s.
  next_state_probe_ns.store(absl::ToUnixNanos(absl::Now() + absl::Seconds(10)));
  const state::RecoveryResult found = durable->OpenAll();
  for (const state::StateError& e : found.errors) {
    ECHOKV_LOG(ERROR) << "saved session " << EscapedIdPrefix(e.session_id) << " refused ("
                      << state::ErrorKindName(e.kind) << "): " << e.status.message() << "; its files are left untouched";
  }
  int64_t restored = 0;
  for (const state::SessionManifest& m : found.sessions) {
    absl::StatusOr<SessionInfo> meta = MetaFromManifest(m, *model);
    if (!meta.ok()) {
      ECHOKV_LOG(ERROR) << "saved session " << EscapedIdPrefix(m.meta.id) << " refused (bad_manifest): "
                        << meta.status().message();
      if (observer != nullptr) observer->OnStateError("bad_manifest");
      continue;
    }
    meta->last_used = clock->Now();  // the idle timer restarts with the process
    AdmitRequest ask;
    ask.what = Admission::kRestore;
    ask.tenant = meta->tenant;
    ask.hot_bytes = meta->retained_kv_bytes;
    ask.cold_bytes = meta->cold_kv_bytes;
    ask.cold_in_memory = false;  // loaded on first use
    ask.id = meta->id;
    absl::StatusOr<SessionStore::Reservation> r = Admit(ask);
    absl::Status s = r.ok() ? store->Insert(*r, *meta, nullptr) : r.status();
    if (!s.ok()) {
      ECHOKV_LOG(ERROR) << "saved session " << EscapedIdPrefix(m.meta.id) << " not restored: " << s.message();
      continue;
    }
    ++restored;
  }
  if (observer != nullptr) observer->OnSessionsRestored(restored);
  // The gauges too, now: the engine thread reports them only after its first idle wait
  // (up to 200 ms), and the server is listening before that, so a scrape right after
  // start read 0 sessions and 0 bytes however many were restored.
  ReportGauges();
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

}  // namespace echokv::server
