#include "server/doors/grpc/service.h"

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "server/doors/grpc/grpc_auth.h"
#include "server/doors/grpc/reply_convert.h"
#include "server/doors/grpc/request_convert.h"
#include "server/engine/session_store.h"
#include "server/doors/grpc/status_util.h"
#include "server/doors/grpc/wire_check.h"

namespace echokv::server {
namespace {

namespace pb = ::echokv::v1;

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case grpc::StatusCode::DO_NOT_USE: return "UNKNOWN";
  }
  return "UNKNOWN";
}

// ---- native -> proto ----

grpc::ByteBuffer ToBytes(const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

// A request for a session whose id names another replica ("<owner>.<hex>") carries the
// owner back in trailing metadata, so that a NOT_FOUND tells routers and clients where
// the session lives (docs/DEPLOY.md, routing). Sessions imported with keep_id keep a
// foreign prefix and are still served here: the hint only matters with NOT_FOUND.
constexpr char kOwnerMetadata[] = "x-echokv-owner";

void HintOwner(grpc::CallbackServerContext* ctx, const google::protobuf::Message& request,
               const std::string& replica_id) {
  const google::protobuf::FieldDescriptor* field = request.GetDescriptor()->FindFieldByName("session_id");
  if (field == nullptr || field->type() != google::protobuf::FieldDescriptor::TYPE_STRING || field->is_repeated()) {
    return;
  }
  const std::string id = request.GetReflection()->GetString(request, field);
  const size_t dot = id.find('.');
  if (dot == std::string::npos || !IsValidSessionId(id)) return;
  const std::string owner = id.substr(0, dot);
  if (owner != replica_id) ctx->AddTrailingMetadata(kOwnerMetadata, owner);
}

// Parses one raw message (wire_check.h): INVALID_ARGUMENT naming the bad field / the
// malformed message; `what` names it when its bytes cannot be read at all.
absl::Status ParseRaw(const grpc::ByteBuffer& raw, const char* what, google::protobuf::Message* message) {
  std::vector<grpc::Slice> slices;
  if (!raw.Dump(&slices).ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": unreadable message"));
  std::string bytes;
  bytes.reserve(raw.Length());
  for (const grpc::Slice& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  return ParseRequest(bytes, message);
}

// Coalescing (see StreamReactor): appends `later`, a delta queued after `earlier`, to
// `earlier` and returns true, so that one message carries both. The client-visible
// concatenation is unchanged: ids and logprobs (one per id, in order) are appended and
// the texts concatenated. The message with `final` is never merged (it stays the last
// message of the stream, on its own, as before). Other message kinds are not merged.
bool MergeInto(pb::GenerateResponse* earlier, pb::GenerateResponse* later) {
  if (earlier->has_final() || later->has_final()) return false;
  earlier->mutable_text()->append(later->text());
  earlier->mutable_token_ids()->MergeFrom(later->token_ids());
  for (pb::TokenLogprob& lp : *later->mutable_logprobs()) earlier->add_logprobs()->Swap(&lp);
  return true;
}
template <typename Response>
bool MergeInto(Response*, Response*) {
  return false;  // progress events, snapshot chunks: one message each
}

// Counts a call in EchoKvService::calls_in_flight for as long as its reactor lives.
class InFlight {
 public:
  explicit InFlight(EchoKvService* service) : service_(service) { service_->OnCallStarted(); }
  ~InFlight() { service_->OnCallEnded(); }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  EchoKvService* service_;
};

// A server-streaming call: messages queued from any thread, one write in flight.
//
// While a write is in flight, Generate deltas queued behind it are coalesced into one
// message (MergeInto): a reader (or a transport) that lags gets fewer, larger messages
// with the same ids and text instead of one gRPC message per token (each costs a
// serialization, HTTP/2 frames, a write completion and a client wakeup; measured in
// docs/BENCHMARKS.md, issue 14).
//
// Backpressure counts deltas, not messages: Backlog() = deltas queued (merged or not)
// + deltas in the write in flight, i.e. what the client has not taken yet, as the
// OpenAI path counts it (openai_server.cc). The engine skips the stream at
// EngineLimits::max_stream_backlog, so a reader that never reads holds at most that
// many deltas here (bounded memory) whatever the message boundaries are.
template <typename Response>
class StreamReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  StreamReactor(EchoKvService* service, const char* method)
      : in_flight_(service), service_(service), method_(method),
        max_backlog_(service->sessions()->facts().limits.max_stream_backlog) {}

  CancelFlag cancel() const { return cancel_; }

  // Claims a stream slot for `tenant`, released in OnDone.
  absl::Status TakeSlot(const std::string& tenant) {
    absl::Status s = service_->sessions()->AcquireStream(tenant);
    if (s.ok()) slot_tenant_ = tenant;
    return s;
  }

  // Deltas queued or in flight that the client has not taken yet (backpressure).
  int Backlog() {
    absl::MutexLock lock(&mu_);
    return queued_ + writing_;
  }

  // Queues one message (any thread; never blocks), merged into the last queued one
  // when a write is in flight and both are plain deltas.
  void Push(Response message) {
    Ref();
    bool queued = false;
    {
      absl::MutexLock lock(&mu_);
      if (!closing_ && !broken_) {
        queued = true;
        ++queued_;
        if (writing_ > 0 && !queue_.empty() && MergeInto(&queue_.back().message, &message)) {
          ++queue_.back().count;  // the write in flight pumps it; Pump below finds it busy
        } else {
          queue_.push_back({std::move(message), 1});
        }
      }
    }
    if (queued) Pump();
    Unref();  // outside the lock: it may delete the reactor
  }

  // Ends the call once the queued messages are written (all dropped on error).
  void Close(const absl::Status& status) {
    Ref();
    bool first = false;
    {
      absl::MutexLock lock(&mu_);
      if (!closing_) {
        first = true;
        closing_ = true;
        status_ = ToGrpcStatus(status);
        if (!status.ok()) {
          queue_.clear();
          queued_ = 0;
        }
      }
    }
    if (first) Pump();
    Unref();  // outside the lock: it may delete the reactor
  }

  void OnWriteDone(bool ok) override {
    EchoKvService* service = service_;  // `this` may be gone once Pump() starts Finish
    bool wake = false;
    {
      absl::MutexLock lock(&mu_);
      // The engine skips the stream while the backlog is at the limit (it may have
      // looked at any moment since the write started): wake it only if that could be
      // so, not once per message.
      wake = queued_ + writing_ >= max_backlog_;
      writing_ = 0;
      if (!ok) {  // the client went away: stop the work, drop what is queued
        broken_ = true;
        queue_.clear();
        queued_ = 0;
        cancel_->store(true);
        wake = true;
      }
    }
    if (wake) service->sessions()->Wake();  // a stream held back by its backlog may run again
    Pump();
  }

  void OnCancel() override { cancel_->store(true); }

  void OnDone() override {
    if (service_->metrics() != nullptr) service_->metrics()->OnRequest(method_, CodeName(status_.error_code()));
    if (slot_tenant_.has_value()) service_->sessions()->ReleaseStream(*slot_tenant_);
    Unref();  // gRPC's reference
  }

 private:
  // Push and Close run on the engine thread while gRPC may end the call on one of its
  // own (OnWriteDone -> Pump -> Finish -> OnDone) the moment their lock is released:
  // without a reference of their own, Close's Pump could lock a reactor OnDone had
  // already deleted (seen as a sanitized server dying at the end of a stream under
  // load). gRPC's own reactions (OnWriteDone) are safe: OnDone waits for them.
  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  struct Queued {
    Response message;
    int count;  // deltas merged into it
  };

  // Starts the next write or the Finish; serializes outside the lock.
  void Pump() {
    enum class Action { kNone, kWrite, kFinish };
    Action action = Action::kNone;
    std::optional<Response> next;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_ > 0) return;
      if (!queue_.empty()) {
        next.emplace(std::move(queue_.front().message));
        writing_ = queue_.front().count;
        queued_ -= writing_;
        queue_.pop_front();
        action = Action::kWrite;
      } else if (closing_) {
        finished_ = true;
        action = Action::kFinish;
      }
    }
    switch (action) {
      case Action::kWrite:
        current_ = ToBytes(*next);  // only this thread writes: writing_ > 0 keeps others out
        this->StartWrite(&current_);
        break;
      case Action::kFinish:
        this->Finish(status_);
        break;
      case Action::kNone:
        break;
    }
  }

  InFlight in_flight_;           // first: counted until the last member is gone
  EchoKvService* service_;       // not owned
  const char* method_;           // RPC name for metrics
  const int max_backlog_;        // EngineLimits::max_stream_backlog
  std::optional<std::string> slot_tenant_;  // holds a stream slot of this tenant
  CancelFlag cancel_ = std::make_shared<std::atomic<bool>>(false);  // shared with the engine job
  absl::Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);  // messages not yet written
  int queued_ ABSL_GUARDED_BY(mu_) = 0;            // deltas in queue_ (sum of counts)
  grpc::ByteBuffer current_;     // the write in flight (touched only by the writer)
  int writing_ ABSL_GUARDED_BY(mu_) = 0;           // deltas in the write in flight (0: none)
  bool closing_ ABSL_GUARDED_BY(mu_) = false;        // Close was called
  bool broken_ ABSL_GUARDED_BY(mu_) = false;         // a write failed
  bool finished_ ABSL_GUARDED_BY(mu_) = false;       // Finish was called
  grpc::Status status_;          // set once by Close, read after finished_
  std::atomic<int> refs_{1};     // gRPC's (dropped in OnDone) + Push / Close in progress
};

// A unary call; Done() from any thread. The handler fills response(); Done
// serializes it into the raw response buffer.
template <typename Response>
class UnaryReactor : public grpc::ServerUnaryReactor {
 public:
  UnaryReactor(EchoKvService* service, const char* method, grpc::ByteBuffer* out)
      : in_flight_(service), service_(service), method_(method), out_(out) {}
  CancelFlag cancel() const { return cancel_; }
  Response* response() { return &response_; }
  absl::Status TakeSlot(const std::string& tenant) {
    absl::Status s = service_->sessions()->AcquireStream(tenant);
    if (s.ok()) slot_tenant_ = tenant;
    return s;
  }
  void Done(const absl::Status& status) {
    const grpc::Status st = ToGrpcStatus(status);
    code_ = st.error_code();
    if (st.ok()) *out_ = ToBytes(response_);
    Finish(st);
  }
  void OnCancel() override { cancel_->store(true); }
  void OnDone() override {
    if (service_->metrics() != nullptr) service_->metrics()->OnRequest(method_, CodeName(code_));
    if (slot_tenant_.has_value()) service_->sessions()->ReleaseStream(*slot_tenant_);
    delete this;
  }

 private:
  InFlight in_flight_;           // first: counted until the last member is gone
  EchoKvService* service_;       // not owned
  const char* method_;           // RPC name for metrics
  grpc::ByteBuffer* out_;        // the raw response (owned by gRPC)
  Response response_;            // filled by the handler / engine callback
  std::optional<std::string> slot_tenant_;  // holds a stream slot of this tenant
  CancelFlag cancel_ = std::make_shared<std::atomic<bool>>(false);
  grpc::StatusCode code_ = grpc::StatusCode::OK;  // written before Finish
};

// Engine callbacks of CreateSession / AppendToSession: progress events become
// SessionProgress.progress messages; the result becomes the final SessionProgress
// carrying the Session (or the call's error).
ProgressFn ProgressToStream(StreamReactor<pb::SessionProgress>* reactor) {
  return [reactor](const ProgressEvent& p) {
    pb::SessionProgress msg;
    pb::SessionProgress::Progress* pr = msg.mutable_progress();
    pr->set_phase(p.phase);
    pr->set_done(p.done);
    pr->set_total(p.total);
    pr->set_elapsed_seconds(p.elapsed_seconds);
    reactor->Push(std::move(msg));
  };
}

DoneFn<SessionInfo> SessionToStream(StreamReactor<pb::SessionProgress>* reactor) {
  return [reactor](absl::StatusOr<SessionInfo> s) {
    if (!s.ok()) return reactor->Close(s.status());
    pb::SessionProgress msg;
    FillSession(*s, msg.mutable_session());
    reactor->Push(std::move(msg));
    reactor->Close(absl::OkStatus());
  };
}

// ImportSession: the client streams a header, then the snapshot's bytes. Each data
// message is fed to the engine's importer; the next read starts once it is consumed
// (flow control reaches the client). Half-close finishes the import; an error or a
// cancel before that creates nothing.
class ImportReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  ImportReactor(EchoKvService* service, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* out)
      : in_flight_(service), service_(service), ctx_(ctx), out_(out) {}

  void Start() {
    absl::StatusOr<Caller> caller = CallerFromGrpc(*ctx_, service_->tokens());
    if (!caller.ok()) return Fail(caller.status());
    caller_ = *caller;
    if (absl::Status s = service_->sessions()->AcquireStream(caller_.tenant); !s.ok()) return Fail(s);
    slot_tenant_ = caller_.tenant;
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed (or went away)
      if (ctx_->IsCancelled()) return Fail(absl::CancelledError("ImportSession: cancelled by the client"));
      if (import_ == nullptr) return Fail(absl::InvalidArgumentError("ImportSession: the stream carried no header"));
      import_->Finish([this](absl::StatusOr<SessionInfo> s) {
        if (!s.ok()) return Fail(s.status());
        pb::Session session;
        FillSession(*s, &session);
        *out_ = ToBytes(session);
        Fail(absl::OkStatus());
      });
      return;
    }
    pb::ImportSessionRequest msg;
    if (absl::Status s = ParseRaw(in_, "ImportSession", &msg); !s.ok()) return Fail(s);
    if (import_ == nullptr) {
      if (!msg.has_header()) {
        return Fail(absl::InvalidArgumentError("ImportSession: the first message must carry the header"));
      }
      const pb::ImportSessionRequest::Header& h = msg.header();
      if (h.has_ttl_seconds() && h.ttl_seconds() <= 0) {
        return Fail(absl::InvalidArgumentError("header.ttl_seconds: must be > 0"));
      }
      import_ = service_->sessions()->BeginImport(caller_, h.keep_id(), ToTtl(h.has_ttl_seconds(), h.ttl_seconds()));
      StartRead(&in_);
      return;
    }
    if (msg.has_header()) return Fail(absl::InvalidArgumentError("ImportSession: a second header"));
    import_->Feed(std::move(*msg.mutable_data()), [this](absl::Status s) {
      if (!s.ok()) return Fail(s);
      StartRead(&in_);
    });
  }

  void OnDone() override {
    if (service_->metrics() != nullptr) service_->metrics()->OnRequest("ImportSession", CodeName(code_));
    if (slot_tenant_.has_value()) service_->sessions()->ReleaseStream(*slot_tenant_);
    delete this;
  }

 private:
  // Ends the call with `status` (OK after the response is filled).
  void Fail(const absl::Status& status) {
    const grpc::Status st = ToGrpcStatus(status);
    code_ = st.error_code();
    import_.reset();  // nothing is created without Finish
    Finish(st);
  }

  InFlight in_flight_;           // first: counted until the last member is gone
  EchoKvService* service_;              // not owned
  grpc::CallbackServerContext* ctx_;    // owned by gRPC, valid until OnDone
  grpc::ByteBuffer* out_;               // the raw response (owned by gRPC)
  grpc::ByteBuffer in_;                 // the message being read
  Caller caller_;
  std::unique_ptr<SessionImport> import_;  // after the header
  std::optional<std::string> slot_tenant_;
  grpc::StatusCode code_ = grpc::StatusCode::OK;
};

template <typename Response>
void AnswerError(UnaryReactor<Response>* reactor, const absl::Status& status) {
  reactor->Done(status);
}
template <typename Response>
void AnswerError(StreamReactor<Response>* reactor, const absl::Status& status) {
  reactor->Close(status);
}

// Whether a call holds a slot of its tenant's stream quota while it runs (the streams,
// and Compress, which is as long as a CreateSession).
enum class Slot { kNone, kTake };

// The start of every call, once its reactor exists: authenticate the caller, parse the
// request (UNAUTHENTICATED, or ParseRaw's errors), hint the session's owner, then claim
// the stream slot if `slot` says so. On failure the call is answered with that error and
// nothing is returned.
template <typename Reactor, typename Request>
std::optional<Caller> AdmitCall(EchoKvService* service, Reactor* reactor, grpc::CallbackServerContext* ctx,
                                const grpc::ByteBuffer* raw, Request* request, Slot slot) {
  absl::StatusOr<Caller> caller = CallerFromGrpc(*ctx, service->tokens());
  absl::Status status = caller.status();
  if (status.ok()) status = raw != nullptr ? ParseRaw(*raw, "request", request) : ParseRequest("", request);
  if (status.ok()) {
    HintOwner(ctx, *request, service->sessions()->facts().replica_id);
    if (slot == Slot::kTake) status = reactor->TakeSlot(caller->tenant);
  }
  if (!status.ok()) {
    AnswerError(reactor, status);
    return std::nullopt;
  }
  return *std::move(caller);
}

}  // namespace

EchoKvService::EchoKvService(Sessions* sessions, Metrics* metrics, const TokenStore* tokens)
    : sessions_(sessions), metrics_(metrics), tokens_(tokens) {}

EchoKvService::Unary* EchoKvService::GetServerInfo(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                   grpc::ByteBuffer* out) {
  auto* reactor = new UnaryReactor<pb::ServerInfo>(this, "GetServerInfo", out);
  pb::GetServerInfoRequest request;
  const std::optional<Caller> caller = AdmitCall(this, reactor, ctx, raw, &request, Slot::kNone);
  if (!caller) return reactor;
  pb::ServerInfo* response = reactor->response();
  const ServerFacts& f = sessions_->facts();
  response->set_version(f.version);
  pb::ModelInfo* m = response->mutable_model();
  m->set_model_type(f.model_type);
  m->set_path(f.model_name);
  m->set_num_layers(f.num_layers);
  m->set_num_heads(f.num_heads);
  m->set_num_kv_heads(f.num_kv_heads);
  m->set_head_dim(f.head_dim);
  m->set_hidden_size(f.hidden_size);
  m->set_vocab_size(f.vocab_size);
  m->set_max_context(f.max_context);
  m->set_tokenizer(f.tokenizer_kind);
  m->set_chat_template(f.chat_template);
  m->set_kv_bytes_per_token(f.kv_bytes_per_token);
  response->set_device(f.device);
  response->set_dtype(f.dtype);
  for (const std::string& p : f.policies) response->add_policies(p);
  FillConfig(f.default_compression, response->mutable_default_compression());
  pb::Limits* l = response->mutable_limits();
  l->set_max_context_tokens(f.limits.max_context_tokens);
  l->set_max_new_tokens(f.limits.max_new_tokens);
  l->set_max_sessions(f.limits.max_sessions);
  l->set_max_kv_bytes(f.limits.max_kv_bytes);
  l->set_session_ttl_seconds(absl::ToInt64Seconds(f.limits.session_ttl));
  l->set_max_session_ttl_seconds(absl::ToInt64Seconds(f.limits.max_session_ttl));
  l->set_max_concurrent_streams(f.limits.max_concurrent_streams);
  l->set_max_request_bytes(f.limits.max_request_bytes);
  l->set_max_cold_bytes(f.limits.max_cold_bytes);
  response->mutable_default_compression()->set_memory(std::string(MemoryModeName(f.default_memory)));
  response->set_replica_id(f.replica_id);
  response->set_durable(f.durable);
  // A tenant sees its own sessions only (the server-wide figures are the operator's, on
  // /metrics); without authentication every session is everyone's (docs/API.md).
  const StoreTotals totals = tokens_ == nullptr ? sessions_->Totals() : sessions_->TotalsOf(caller->tenant);
  response->set_live_sessions(totals.sessions);
  response->set_live_retained_kv_bytes(totals.hot_bytes);
  response->set_live_cold_kv_bytes(totals.cold_bytes);
  reactor->Done(absl::OkStatus());
  return reactor;
}

EchoKvService::Stream* EchoKvService::CreateSession(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw) {
  auto* reactor = new StreamReactor<pb::SessionProgress>(this, "CreateSession");
  pb::CreateSessionRequest request_msg;
  const pb::CreateSessionRequest* request = &request_msg;
  const std::optional<Caller> caller = AdmitCall(this, reactor, ctx, raw, &request_msg, Slot::kTake);
  if (!caller) return reactor;
  absl::StatusOr<compression::CompressionConfig> cfg =
      ToConfig(request->compression(), sessions_->facts().default_compression);
  if (!cfg.ok()) {
    reactor->Close(cfg.status());
    return reactor;
  }
  CreateRequest req;
  req.caller = *caller;
  req.input = ToInput(request->input());
  req.config = *cfg;
  if (request->compression().has_memory()) {
    absl::StatusOr<MemoryMode> memory = ParseMemoryMode(request->compression().memory());
    if (!memory.ok()) {
      reactor->Close(WithFieldPrefix(memory.status(), "compression.", "compression"));
      return reactor;
    }
    req.memory = *memory;
  }
  req.ttl = ToTtl(request->has_ttl_seconds(), request->ttl_seconds());
  sessions_->Create(std::move(req), reactor->cancel(), ProgressToStream(reactor), SessionToStream(reactor));
  return reactor;
}

EchoKvService::Stream* EchoKvService::AppendToSession(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw) {
  auto* reactor = new StreamReactor<pb::SessionProgress>(this, "AppendToSession");
  pb::AppendToSessionRequest request_msg;
  const pb::AppendToSessionRequest* request = &request_msg;
  const std::optional<Caller> caller = AdmitCall(this, reactor, ctx, raw, &request_msg, Slot::kTake);
  if (!caller) return reactor;
  AppendRequest req;
  req.caller = *caller;
  req.session_id = request->session_id();
  req.input = ToInput(request->input());
  sessions_->Append(std::move(req), reactor->cancel(), ProgressToStream(reactor), SessionToStream(reactor));
  return reactor;
}

EchoKvService::Stream* EchoKvService::Generate(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw) {
  auto* reactor = new StreamReactor<pb::GenerateResponse>(this, "Generate");
  pb::GenerateRequest request_msg;
  const pb::GenerateRequest* request = &request_msg;
  const std::optional<Caller> caller = AdmitCall(this, reactor, ctx, raw, &request_msg, Slot::kTake);
  if (!caller) return reactor;
  const ServerFacts& f = sessions_->facts();
  GenerateParams p;
  p.caller = *caller;
  p.session_id = request->session_id();
  p.max_tokens = request->has_max_tokens() ? request->max_tokens() : std::min(128, f.limits.max_new_tokens);
  const pb::SamplingParams& sp = request->sampling();
  if (sp.has_temperature()) p.sampling.temperature = sp.temperature();
  if (sp.has_top_p()) p.sampling.top_p = sp.top_p();
  if (sp.has_top_k()) p.sampling.top_k = sp.top_k();
  if (sp.has_seed()) p.sampling.seed = sp.seed();
  if (sp.has_min_p()) p.sampling.min_p = sp.min_p();
  if (sp.has_repetition_penalty()) p.sampling.repetition_penalty = sp.repetition_penalty();
  if (sp.has_presence_penalty()) p.sampling.presence_penalty = sp.presence_penalty();
  if (sp.has_frequency_penalty()) p.sampling.frequency_penalty = sp.frequency_penalty();
  p.sampling.logprobs = sp.logprobs();
  if (sp.has_top_logprobs()) p.sampling.top_logprobs = sp.top_logprobs();
  p.stop.assign(request->stop().begin(), request->stop().end());
  p.stop_ids.assign(request->stop_token_ids().begin(), request->stop_token_ids().end());
  p.ignore_eos = request->ignore_eos();
  p.commit = request->commit();
  StreamSink sink;
  sink.on_delta = [reactor](GenerateDelta d) {
    pb::GenerateResponse msg;
    msg.set_text(std::move(d.text));
    for (int id : d.ids) msg.add_token_ids(id);
    for (const model::SampledToken& t : d.logprobs) {
      pb::TokenLogprob* lp = msg.add_logprobs();
      lp->set_token_id(t.token);
      lp->set_logprob(t.logprob);
      for (const model::TokenLogprob& alt : t.top_logprobs) {
        pb::TokenLogprob::Alternative* a = lp->add_top();
        a->set_token_id(alt.token);
        a->set_logprob(alt.logprob);
      }
    }
    reactor->Push(std::move(msg));
  };
  sink.backlog = [reactor] { return reactor->Backlog(); };
  sessions_->Generate(
      std::move(p), reactor->cancel(), std::move(sink),
      [reactor](absl::StatusOr<GenerateSummary> s) {
        if (!s.ok()) return reactor->Close(s.status());
        pb::GenerateResponse msg;
        pb::GenerateResponse::Final* fin = msg.mutable_final();
        switch (s->reason) {
          case FinishReason::kLength: fin->set_finish_reason(pb::GenerateResponse::Final::LENGTH); break;
          case FinishReason::kEos: fin->set_finish_reason(pb::GenerateResponse::Final::EOS); break;
          case FinishReason::kStopToken: fin->set_finish_reason(pb::GenerateResponse::Final::STOP_TOKEN); break;
          case FinishReason::kStopString: fin->set_finish_reason(pb::GenerateResponse::Final::STOP_STRING); break;
        }
        fin->set_prompt_tokens(s->prompt_tokens);
        fin->set_generated_tokens(s->generated_tokens);
        fin->set_time_to_first_token_seconds(s->time_to_first_token_seconds);
        fin->set_tokens_per_second(s->tokens_per_second);
        fin->set_total_seconds(s->total_seconds);
        if (s->session.has_value()) FillSession(*s->session, fin->mutable_session());
        reactor->Push(std::move(msg));
        reactor->Close(absl::OkStatus());
      });
  return reactor;
}

EchoKvService::Unary* EchoKvService::ForkSession(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                 grpc::ByteBuffer* out) {
  auto* reactor = new UnaryReactor<pb::Session>(this, "ForkSession", out);
  pb::ForkSessionRequest request_msg;
  const pb::ForkSessionRequest* request = &request_msg;
  const std::optional<Caller> caller = AdmitCall(this, reactor, ctx, raw, &request_msg, Slot::kNone);
  if (!caller) return reactor;
  pb::Session* response = reactor->response();
  sessions_->Fork(*caller, request->session_id(), ToTtl(request->has_ttl_seconds(), request->ttl_seconds()),
                       [reactor, response](absl::StatusOr<SessionInfo> s) {
                         if (s.ok()) FillSession(*s, response);
                         reactor->Done(s.status());
                       });
  return reactor;
}

EchoKvService::Unary* EchoKvService::GetSession(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                 grpc::ByteBuffer* out) {
  auto* reactor = new UnaryReactor<pb::Session>(this, "GetSession", out);
  pb::GetSessionRequest request_msg;
  const std::optional<Caller> caller = AdmitCall(this, reactor, ctx, raw, &request_msg, Slot::kNone);
  if (!caller) return reactor;
  pb::Session* response = reactor->response();
  sessions_->Get(*caller, request_msg.session_id(), request_msg.include_tokens(),
                 [reactor, response](absl::StatusOr<SessionView> s) {
                   if (s.ok()) {
                     FillSession(s->info, response);
                     if (s->tokens.has_value()) {
                       for (int t : *s->tokens) response->add_tokens(t);
                     }
                   }
                   reactor->Done(s.status());
                 });
  return reactor;
}

EchoKvService::Unary* EchoKvService::ListSessions(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                 grpc::ByteBuffer* out) {
  auto* reactor = new UnaryReactor<pb::ListSessionsResponse>(this, "ListSessions", out);
  pb::ListSessionsRequest request_msg;
  const std::optional<Caller> caller = AdmitCall(this, reactor, ctx, raw, &request_msg, Slot::kNone);
  if (!caller) return reactor;
  pb::ListSessionsResponse* response = reactor->response();
  sessions_->List(*caller, [reactor, response](absl::StatusOr<std::vector<SessionInfo>> s) {
    if (s.ok()) {
      for (const SessionInfo& info : *s) FillSession(info, response->add_sessions());
    }
    reactor->Done(s.status());
  });
  return reactor;
}

EchoKvService::Unary* EchoKvService::DeleteSession(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                 grpc::ByteBuffer* out) {
  auto* reactor = new UnaryReactor<pb::DeleteSessionResponse>(this, "DeleteSession", out);
  pb::DeleteSessionRequest request_msg;
  const pb::DeleteSessionRequest* request = &request_msg;
  const std::optional<Caller> caller = AdmitCall(this, reactor, ctx, raw, &request_msg, Slot::kNone);
  if (!caller) return reactor;
  pb::DeleteSessionResponse* response = reactor->response();
  sessions_->Delete(*caller, request->session_id(), [reactor, response](absl::StatusOr<int64_t> freed) {
    if (freed.ok()) response->set_freed_kv_bytes(*freed);
    reactor->Done(freed.status());
  });
  return reactor;
}

EchoKvService::Unary* EchoKvService::InspectCache(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                 grpc::ByteBuffer* out) {
  auto* reactor = new UnaryReactor<pb::InspectCacheResponse>(this, "InspectCache", out);
  pb::InspectCacheRequest request_msg;
  const pb::InspectCacheRequest* request = &request_msg;
  const std::optional<Caller> caller = AdmitCall(this, reactor, ctx, raw, &request_msg, Slot::kNone);
  if (!caller) return reactor;
  pb::InspectCacheResponse* response = reactor->response();
  sessions_->Inspect(*caller, request->session_id(), request->include_positions(),
                        [reactor, response](absl::StatusOr<CacheInspection> c) {
                          if (c.ok()) {
                            FillSession(c->session, response->mutable_session());
                            FillLayers(c->layers, response->mutable_layers());
                            response->set_total_retained_entries(c->total_retained_entries);
                            response->set_total_kv_bytes(c->total_kv_bytes);
                            response->set_full_equivalent_kv_bytes(c->full_equivalent_kv_bytes);
                            response->set_position_bytes(c->position_bytes);
                            FillReport(c->session.last_report, response->mutable_last_report());
                            response->set_memory(std::string(MemoryModeName(c->session.memory)));
                            response->set_cold_kv_bytes(c->cold_kv_bytes);
                          }
                          reactor->Done(c.status());
                        });
  return reactor;
}

EchoKvService::Unary* EchoKvService::Compress(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                                 grpc::ByteBuffer* out) {
  auto* reactor = new UnaryReactor<pb::CompressResponse>(this, "Compress", out);
  pb::CompressRequest request_msg;
  const pb::CompressRequest* request = &request_msg;
  const std::optional<Caller> caller = AdmitCall(this, reactor, ctx, raw, &request_msg, Slot::kTake);
  if (!caller) return reactor;
  pb::CompressResponse* response = reactor->response();
  absl::StatusOr<compression::CompressionConfig> cfg =
      ToConfig(request->compression(), sessions_->facts().default_compression);
  if (!cfg.ok()) {
    reactor->Done(cfg.status());
    return reactor;
  }
  sessions_->Compress(*caller, ToInput(request->input()), *cfg, reactor->cancel(),
                    [reactor, response](absl::StatusOr<CompressOutcome> c) {
                      if (c.ok()) {
                        FillLayers(c->layers, response->mutable_layers());
                        FillReport(c->report, response->mutable_report());
                        response->set_context_tokens(c->context_tokens);
                      }
                      reactor->Done(c.status());
                    });
  return reactor;
}

EchoKvService::Stream* EchoKvService::ExportSession(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw) {
  auto* reactor = new StreamReactor<pb::SessionSnapshotChunk>(this, "ExportSession");
  pb::ExportSessionRequest request;
  const std::optional<Caller> caller = AdmitCall(this, reactor, ctx, raw, &request, Slot::kTake);
  if (!caller) return reactor;
  ExportSink sink;
  sink.on_chunk = [reactor](std::string bytes) {
    pb::SessionSnapshotChunk chunk;
    chunk.set_data(std::move(bytes));
    reactor->Push(std::move(chunk));
  };
  sink.backlog = [reactor] { return reactor->Backlog(); };
  sessions_->Export(*caller, request.session_id(), reactor->cancel(), std::move(sink),
                         [reactor](absl::StatusOr<int64_t> total) { reactor->Close(total.status()); });
  return reactor;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* EchoKvService::ImportSession(grpc::CallbackServerContext* ctx,
                                                                        grpc::ByteBuffer* out) {
  auto* reactor = new ImportReactor(this, ctx, out);
  reactor->Start();
  return reactor;
}

}  // namespace echokv::server
