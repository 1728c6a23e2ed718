#include "server/doors/http/openai_server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/echo.h"
#include "server/doors/http/http_auth.h"
#include "server/doors/http/http_status.h"
#include "server/doors/http/completion_stream.h"
#include "server/doors/http/openai_protocol.h"

namespace echokv::server {

using openai::ApiKind;
using openai::GenerationRequest;
using openai::ResponseBuilder;
using openai::SessionRef;
using http_door::Generation;

namespace {

constexpr char kSessionHeader[] = "x-echokv-session";
constexpr char kJson[] = "application/json";
// How often an idle stream checks that its client is still there.
constexpr absl::Duration kStreamPoll = absl::Milliseconds(100);

// An engine error in the request's own names: the engine's fields (ErrorInfo::field)
// "input..." and "max_tokens" are this request's messages / prompt and max_tokens /
// max_completion_tokens (http_status.h's OpenAiError table does the rest).
HttpError EngineError(const absl::Status& status, ApiKind kind, const std::string& max_tokens_param) {
  OpenAiParamNames names;
  names.input = kind == ApiKind::kChat ? "messages" : "prompt";
  if (!max_tokens_param.empty()) names.max_tokens = max_tokens_param;
  return ToHttpError(status, names);
}

uint64_t RandomSeed() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

}  // namespace

class OpenAiServer::Impl {
 public:
  Sessions* sessions = nullptr;               // not owned
  Metrics* metrics = nullptr;                 // not owned; may be null
  OpenAiConfig config;
  std::string model_name;                     // the served id
  int64_t created = 0;                        // Unix seconds at start (GET /v1/models)
  std::unique_ptr<openai::TokenTable> tokens; // logprobs token strings
  std::atomic<bool> draining{false};
  std::atomic<bool> stopping{false};          // Stop(): streams end with an error event
  std::atomic<int> in_flight{0};              // completion requests running
  std::unique_ptr<HttpListener> listener;

  // One completion request from parse to the last byte; the destructor (on an HTTP
  // worker, after the generation ended) frees the stream slot and counts the request.
  struct Call {
    Impl* impl;
    const char* route;
    Caller caller;
    bool slot = false;               // holds a stream slot of caller.tenant (Sessions)
    int status = 200;                // for metrics (499: the client left mid-stream)
    Call(Impl* i, const char* r) : impl(i), route(r) { impl->in_flight.fetch_add(1); }
    ~Call() {
      if (slot) impl->sessions->ReleaseStream(caller.tenant);
      if (impl->metrics != nullptr && route != nullptr) impl->metrics->OnHttpRequest(route, status);
      impl->in_flight.fetch_sub(1);
    }
  };

  void Routes(httplib::Server& s);
  // The front's look at a complete head, before the body is read (HttpOptions::gate):
  // the bearer token (401), a body on /health (400), a body over the limit (413).
  std::optional<HttpEarlyReply> Gate(const HttpRequestHead& head) const;

 private:
  void Reply(Call* call, httplib::Response& res, HttpError e) {
    if (call != nullptr) call->status = e.status;
    res.status = e.status;
    for (const auto& [name, value] : HttpErrorHeaders(e)) res.set_header(name, value);
    res.set_content(HttpErrorJson(e), kJson);
  }
  bool CheckModel(const std::string& model, HttpError* e) const {
    if (model == model_name || model == config.model_alias) return true;
    *e = ToHttpError(absl::NotFoundError(absl::StrCat("The model ", EchoPrefix(model), " does not exist; this server serves '",
                                                      model_name, "' (alias '", config.model_alias, "')")));
    e->param = "model";
    e->code = "model_not_found";
    return false;
  }
  absl::StatusOr<compression::CompressionConfig> ConfigFrom(const openai::EchokvOptions& o) const;
  void Complete(const httplib::Request& req, httplib::Response& res, ApiKind kind, const GenerationRequest& gen,
                InputSpec input, std::shared_ptr<Call> call);
  void HandleChat(const httplib::Request& req, httplib::Response& res);
  void HandleCompletion(const httplib::Request& req, httplib::Response& res);
  // /v1/completions with several prompts (stateless only): each runs through Complete
  // in turn; choice i answers prompt i, usage sums over them.
  void CompleteMany(const httplib::Request& req, httplib::Response& res, openai::CompletionRequest cr,
                    std::shared_ptr<Call> call);
  // Auth, drain and parse checks shared by both; false: `res` holds the error.
  bool Admit(const httplib::Request& req, httplib::Response& res, Call* call);
  nlohmann::ordered_json ModelJson() const {
    return nlohmann::ordered_json{{"id", model_name}, {"object", "model"}, {"created", created}, {"owned_by", "echokv"}};
  }
};

absl::StatusOr<compression::CompressionConfig> OpenAiServer::Impl::ConfigFrom(const openai::EchokvOptions& o) const {
  compression::CompressionConfig cfg = sessions->facts().default_compression;
  if (o.policy.has_value()) {
    absl::StatusOr<compression::PolicyKind> kind = compression::ParsePolicyKind(*o.policy);
    if (!kind.ok()) {
      return MakeError(ErrorKind::kInvalidArgument, "echokv.policy",
                       absl::StrCat("echokv.policy: unknown policy ", EchoPrefix(*o.policy), "; one of ",
                                    absl::StrJoin(sessions->facts().policies, ", ")));
    }
    cfg.policy = *kind;
  }
  if (o.budget.has_value()) cfg.budget = *o.budget;
  if (o.lookahead.has_value()) cfg.lookahead = *o.lookahead;
  if (o.workspace.has_value()) cfg.workspace = *o.workspace;
  if (o.window.has_value()) cfg.stage2_window = *o.window;
  if (o.cache_dtype.has_value()) {
    kernels::KvDtype dtype;
    if (!kernels::ParseKvDtype(*o.cache_dtype, &dtype) || dtype == kernels::KvDtype::kBFloat16) {
      return MakeError(ErrorKind::kInvalidArgument, "echokv.cache_dtype",
                       absl::StrCat("echokv.cache_dtype: unknown cache dtype ", EchoPrefix(*o.cache_dtype),
                                    "; one of float32, int8"));
    }
    cfg.cache_dtype = dtype;
  }
  if (o.target_mass.has_value()) cfg.target_mass = *o.target_mass;
  return cfg;
}

bool OpenAiServer::Impl::Admit(const httplib::Request& req, httplib::Response& res, Call* call) {
  absl::StatusOr<Caller> caller = CallerFromHttp(req, config.tokens);
  if (!caller.ok()) {
    Reply(call, res, ToHttpError(caller.status()));
    return false;
  }
  call->caller = *caller;
  if (draining.load()) {
    Reply(call, res, ToHttpError(absl::UnavailableError("the server is shutting down")));
    return false;
  }
  return true;
}

void OpenAiServer::Impl::Complete(const httplib::Request& req, httplib::Response& res, ApiKind kind,
                                  const GenerationRequest& gen, InputSpec input, std::shared_ptr<Call> call) {
  HttpError err;
  if (!CheckModel(gen.model, &err)) return Reply(call.get(), res, err);
  SessionRef ref;
  if (!openai::ResolveSession(gen.session_id, req.get_header_value(kSessionHeader), &ref, &err)) {
    return Reply(call.get(), res, err);
  }
  const ServerFacts& facts = sessions->facts();
  if (gen.max_tokens.has_value() && *gen.max_tokens > facts.limits.max_new_tokens) {
    return Reply(call.get(), res,
                 InvalidParam(gen.max_tokens_param,
                                      absl::StrCat(gen.max_tokens_param, ": must be at most ",
                                                   facts.limits.max_new_tokens, " (the server's max_new_tokens), not ",
                                                   *gen.max_tokens)));
  }
  // The request, in the session layer's terms: which session it runs on and how.
  CompletionRequest c;
  c.caller = call->caller;
  switch (ref.mode) {
    case SessionRef::Mode::kStateless: c.session = CompletionRequest::Session::kStateless; break;
    case SessionRef::Mode::kNew: c.session = CompletionRequest::Session::kNew; break;
    case SessionRef::Mode::kContinue:
      c.session = CompletionRequest::Session::kContinue;
      c.session_id = ref.id;
      break;
  }
  if (c.session != CompletionRequest::Session::kContinue) {
    absl::StatusOr<compression::CompressionConfig> cfg = ConfigFrom(gen.echokv);
    if (!cfg.ok()) return Reply(call.get(), res, EngineError(cfg.status(), kind, ""));
    c.config = *cfg;
    if (gen.echokv.memory.has_value()) {
      absl::StatusOr<MemoryMode> m = ParseMemoryMode(*gen.echokv.memory);
      if (!m.ok()) {
        return Reply(call.get(), res,
                     InvalidParam("echokv.memory", absl::StrCat("echokv.memory: ", m.status().message())));
      }
      c.memory = *m;
    }
    if (gen.echokv.ttl_seconds.has_value()) c.ttl = absl::Seconds(*gen.echokv.ttl_seconds);
  }
  c.input = std::move(input);  // chat: the whole conversation (Sessions::Complete)
  GenerateParams& p = c.generate;
  p.sampling = gen.sampling;
  p.sampling.seed = gen.seed.has_value() ? *gen.seed : RandomSeed();
  p.stop = gen.stop;
  p.stop_ids = gen.stop_token_ids;
  p.ignore_eos = gen.ignore_eos;
  if (gen.max_tokens.has_value()) {
    p.max_tokens = *gen.max_tokens;
  } else {
    // OpenAI: chat runs until the model stops (here: max_new_tokens, and the room the
    // context has left: the engine fits it); legacy completions default to 16 tokens.
    p.max_tokens = kind == ApiKind::kChat ? facts.limits.max_new_tokens : std::min(16, facts.limits.max_new_tokens);
    p.fit_max_tokens = true;
  }

  if (absl::Status s = sessions->AcquireStream(call->caller.tenant); !s.ok()) {
    return Reply(call.get(), res, ToHttpError(s));
  }
  call->slot = true;

  // A request is one unit (Sessions::Complete): a continued session changes only when
  // it succeeds; a session it created is deleted again when the generation is refused,
  // fails or the client leaves (Generation::Abandon).
  const bool keep = ref.mode != SessionRef::Mode::kStateless;
  // An error before the first token.
  auto refused = [kind](const absl::Status& s, const std::string& max_param) {
    HttpError e = EngineError(s, kind, max_param);
    if (s.code() == absl::StatusCode::kNotFound) e.code = "session_not_found";
    return e;
  };

  auto generation = std::make_shared<Generation>(sessions, facts.limits.max_stream_backlog);
  generation->set_completion(
      sessions->Complete(std::move(c), generation->Sink(gen.stream), generation->OnSession(), generation->Done()));
  const std::string session_id = generation->WaitSession();  // "" when creating it failed

  ResponseBuilder builder(kind, openai::NewResponseId(kind), absl::ToUnixSeconds(absl::Now()), model_name,
                          tokens.get());
  builder.set_logprobs(gen.sampling.logprobs);
  builder.set_include_usage(gen.include_usage);
  if (keep && !session_id.empty()) {
    builder.set_session_id(session_id);
    res.set_header(kSessionHeader, session_id);
  }
  // A refused request names no session (one it created is gone again).
  auto undo = [&res, created = ref.mode == SessionRef::Mode::kNew] {
    if (created) res.headers.erase(kSessionHeader);
  };
  const std::string max_param = gen.max_tokens_param;

  if (!gen.stream) {
    std::vector<GenerateDelta> deltas;
    absl::StatusOr<GenerateSummary> r = generation->WaitEnd(&deltas);
    if (!r.ok()) {
      undo();
      return Reply(call.get(), res, refused(r.status(), max_param));
    }
    std::string text;
    std::vector<model::SampledToken> logprobs;
    for (GenerateDelta& d : deltas) {
      text += d.text;
      for (model::SampledToken& t : d.logprobs) logprobs.push_back(std::move(t));
    }
    res.status = 200;
    res.set_content(builder.Full(text, logprobs, r->reason, {r->prompt_tokens, r->generated_tokens}), kJson);
    return;
  }

  // Streaming: errors that come before any token still get their HTTP status.
  generation->WaitFirstEvent();
  if (generation->EndedEmpty()) {
    absl::StatusOr<GenerateSummary> r = generation->result();
    if (!r.ok()) {
      undo();
      return Reply(call.get(), res, refused(r.status(), max_param));
    }
  }
  struct StreamState {
    ResponseBuilder builder;
    bool first = true;
    bool delivered = false;  // [DONE] was written
  };
  auto state = std::make_shared<StreamState>(StreamState{std::move(builder)});
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // proxies: do not buffer the events
  const bool include_usage = gen.include_usage;
  // "text/event-stream" exactly: httplib never compresses it (events flush at once).
  res.set_chunked_content_provider(
      "text/event-stream",
      [generation, state, kind, max_param, include_usage, call](size_t, httplib::DataSink& sink) -> bool {
        std::string out;
        if (state->first) {
          state->first = false;
          const std::string first = state->builder.FirstChunk();
          if (!first.empty()) out = openai::SseEvent(first);
        }
        if (call->impl->stopping.load()) {
          // Stop (SIGTERM): what is still queued for a slow reader is dropped; the stream
          // ends with an explicit error event and [DONE], never a bare close.
          generation->Abandon();
          const HttpError e = ToHttpError(absl::UnavailableError("the server is shutting down; the stream ends here"));
          call->status = e.status;
          out += openai::SseEvent(HttpErrorJson(e));
          out += std::string(openai::kSseDone);
          if (!sink.write(out.data(), out.size())) return false;
          state->delivered = true;
          sink.done();
          return true;
        }
        std::vector<GenerateDelta> deltas;
        switch (generation->Take(kStreamPoll, &deltas)) {
          case Generation::Next::kDeltas: {
            for (const GenerateDelta& d : deltas) out += openai::SseEvent(state->builder.DeltaChunk(d));
            const bool ok = sink.write(out.data(), out.size());
            generation->Written();
            return ok;  // false: the client is gone (the releaser cancels)
          }
          case Generation::Next::kEnd: {
            absl::StatusOr<GenerateSummary> r = generation->result();
            if (r.ok()) {
              out += openai::SseEvent(state->builder.FinishChunk(r->reason));
              if (include_usage) {
                out += openai::SseEvent(state->builder.UsageChunk({r->prompt_tokens, r->generated_tokens}));
              }
            } else {
              const HttpError e = EngineError(r.status(), kind, max_param);
              call->status = e.status;  // a session the request created is gone (Sessions::Complete)
              out += openai::SseEvent(HttpErrorJson(e));
            }
            out += std::string(openai::kSseDone);
            if (!sink.write(out.data(), out.size())) return false;
            state->delivered = true;
            sink.done();
            return true;
          }
          case Generation::Next::kIdle:
            if (!out.empty() && !sink.write(out.data(), out.size())) return false;
            return sink.is_writable();  // a closed connection ends the stream
        }
        return false;
      },
      [generation, state, call](bool) {
        if (!state->delivered) {
          // The client left (or the server is stopping): stop the generation; a
          // commit is rolled back by the engine (with a continued session's input),
          // a session the request created is deleted.
          generation->Abandon();
          if (call->status == 200) call->status = 499;
        }
        (void)generation->WaitEnd();  // before `call` gives the stream slot back
      });
}

void OpenAiServer::Impl::HandleChat(const httplib::Request& req, httplib::Response& res) {
  auto call = std::make_shared<Call>(this, "/v1/chat/completions");
  if (!Admit(req, res, call.get())) return;
  openai::ChatRequest cr;
  HttpError err;
  if (!openai::ParseChatRequest(req.body, &cr, &err, sessions->facts().limits.max_new_tokens)) {
    return Reply(call.get(), res, err);
  }
  InputSpec input;
  input.kind = InputSpec::Kind::kChat;
  input.chat = std::move(cr.messages);
  input.add_generation_prompt = cr.add_generation_prompt;
  Complete(req, res, ApiKind::kChat, cr.gen, std::move(input), std::move(call));
}

void OpenAiServer::Impl::HandleCompletion(const httplib::Request& req, httplib::Response& res) {
  auto call = std::make_shared<Call>(this, "/v1/completions");
  if (!Admit(req, res, call.get())) return;
  openai::CompletionRequest cr;
  HttpError err;
  if (!openai::ParseCompletionRequest(req.body, &cr, &err, sessions->facts().limits.max_new_tokens)) {
    return Reply(call.get(), res, err);
  }
  if (cr.prompts.size() > 1) return CompleteMany(req, res, std::move(cr), std::move(call));
  InputSpec input;
  if (cr.token_prompt) {
    input.kind = InputSpec::Kind::kTokens;
    input.tokens = std::move(cr.tokens);
  } else {
    input.kind = InputSpec::Kind::kText;
    input.text = std::move(cr.text);
  }
  Complete(req, res, ApiKind::kCompletion, cr.gen, std::move(input), std::move(call));
}

namespace {

InputSpec InputOf(const openai::CompletionPrompt& prompt) {
  InputSpec input;
  if (prompt.tokens) {
    input.kind = InputSpec::Kind::kTokens;
    input.tokens = prompt.ids;
  } else {
    input.kind = InputSpec::Kind::kText;
    input.text = prompt.text;
  }
  return input;
}

void CopyReply(const httplib::Response& from, httplib::Response& to) {
  to.status = from.status;
  for (const auto& [name, value] : from.headers) to.set_header(name, value);
  to.body = from.body;
}

}  // namespace

void OpenAiServer::Impl::CompleteMany(const httplib::Request& req, httplib::Response& res,
                                      openai::CompletionRequest cr, std::shared_ptr<Call> call) {
  const size_t n = cr.prompts.size();
  if (!cr.gen.session_id.empty() || !req.get_header_value(kSessionHeader).empty()) {
    return Reply(call.get(), res,
                 InvalidParam("prompt", absl::StrCat("prompt: a session continues one text: send one prompt with "
                                                     "session_id, not ", n),
                              "unsupported_value"));
  }
  // One prompt through Complete on a Call of its own (no metrics of its own: the
  // outer call counts the request); it inherits the caller and takes its own slot.
  auto run = [this, &req, call](const openai::CompletionRequest& r, size_t i, httplib::Response* out) {
    auto inner = std::make_shared<Call>(this, nullptr);
    inner->caller = call->caller;
    Complete(req, *out, ApiKind::kCompletion, r.gen, InputOf(r.prompts[i]), std::move(inner));
  };
  if (!cr.gen.stream) {
    nlohmann::ordered_json whole;
    nlohmann::ordered_json choices = nlohmann::ordered_json::array();
    int64_t prompt_tokens = 0, completion_tokens = 0;
    for (size_t i = 0; i < n; ++i) {
      httplib::Response one;
      run(cr, i, &one);
      if (one.status != 200) {
        call->status = one.status;
        return CopyReply(one, res);
      }
      nlohmann::ordered_json j = nlohmann::ordered_json::parse(one.body);
      for (auto& c : j["choices"]) {
        c["index"] = i;
        choices.push_back(std::move(c));
      }
      prompt_tokens += j["usage"]["prompt_tokens"].get<int64_t>();
      completion_tokens += j["usage"]["completion_tokens"].get<int64_t>();
      if (i == 0) whole = std::move(j);
    }
    whole["choices"] = std::move(choices);
    whole["usage"] = {{"prompt_tokens", prompt_tokens},
                      {"completion_tokens", completion_tokens},
                      {"total_tokens", prompt_tokens + completion_tokens}};
    res.status = 200;
    res.set_content(openai::Dump(whole), kJson);
    return;
  }
  // Streaming: prompt i's events (index i) follow prompt i-1's; one [DONE] at the end.
  struct Many {
    openai::CompletionRequest cr;
    size_t i = 0;
    std::unique_ptr<httplib::Response> inner;  // prompt i's response (its stream)
    std::string id;                             // the first chunk's id, used by all
    int64_t prompt_tokens = 0, completion_tokens = 0;
    bool failed = false;                        // an error event was passed on
  };
  auto st = std::make_shared<Many>();
  st->cr = std::move(cr);
  st->inner = std::make_unique<httplib::Response>();
  run(st->cr, 0, st->inner.get());
  if (st->inner->status != 200 || !st->inner->content_provider_) {
    call->status = st->inner->status;
    return CopyReply(*st->inner, res);
  }
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // Rewrites prompt i's events: index i, one id; its usage chunk and [DONE] are kept back.
  auto rewrite = [st](absl::string_view events) {
    std::string out;
    for (absl::string_view ev : absl::StrSplit(events, "\n\n", absl::SkipEmpty())) {
      if (!absl::ConsumePrefix(&ev, "data: ") || ev == "[DONE]") continue;
      nlohmann::ordered_json j = nlohmann::ordered_json::parse(ev, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) {
        st->failed = true;
      } else if (j.contains("choices") && j["choices"].empty()) {  // include_usage's chunk
        st->prompt_tokens += j["usage"]["prompt_tokens"].get<int64_t>();
        st->completion_tokens += j["usage"]["completion_tokens"].get<int64_t>();
        continue;
      } else {
        if (st->id.empty()) st->id = j["id"].get<std::string>();
        j["id"] = st->id;
        for (auto& c : j["choices"]) c["index"] = st->i;
      }
      out += openai::SseEvent(openai::Dump(j));
    }
    return out;
  };
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st, rewrite, run, call](size_t, httplib::DataSink& sink) -> bool {
        bool inner_done = false, write_ok = true;
        httplib::DataSink inner;
        inner.write = [&](const char* d, size_t l) {
          const std::string out = rewrite(absl::string_view(d, l));
          if (!out.empty()) write_ok = sink.write(out.data(), out.size());
          return write_ok;
        };
        inner.done = [&] { inner_done = true; };
        inner.is_writable = [&] { return sink.is_writable(); };
        if (!st->inner->content_provider_(0, 0, inner) || !write_ok) return false;
        if (!inner_done) return true;
        st->inner->content_provider_success_ = true;
        st->inner.reset();  // its releaser waits for its generation; its Call ends
        std::string out;
        if (!st->failed && ++st->i < st->cr.prompts.size()) {
          st->inner = std::make_unique<httplib::Response>();
          run(st->cr, st->i, st->inner.get());
          if (st->inner->status == 200 && st->inner->content_provider_) return true;
          call->status = st->inner->status;
          out = openai::SseEvent(st->inner->body);  // the error object, as a stream's error event
          st->inner.reset();
        } else if (!st->failed && st->cr.gen.include_usage) {
          nlohmann::ordered_json u{{"id", st->id}, {"object", "text_completion"}, {"created", absl::ToUnixSeconds(absl::Now())},
                                   {"model", model_name}, {"choices", nlohmann::ordered_json::array()},
                                   {"usage", {{"prompt_tokens", st->prompt_tokens},
                                              {"completion_tokens", st->completion_tokens},
                                              {"total_tokens", st->prompt_tokens + st->completion_tokens}}}};
          out = openai::SseEvent(openai::Dump(u));
        }
        out += std::string(openai::kSseDone);
        if (!sink.write(out.data(), out.size())) return false;
        sink.done();
        return true;
      },
      [st](bool) { st->inner.reset(); });  // a prompt not finished: its releaser cancels it
}

std::optional<HttpEarlyReply> OpenAiServer::Impl::Gate(const HttpRequestHead& head) const {
  auto early = [](const HttpError& e) {
    HttpEarlyReply r;
    r.status = e.status;
    r.content_type = kJson;
    r.body = HttpErrorJson(e);
    r.headers = HttpErrorHeaders(e);
    return r;
  };
  if (head.path == "/health") {
    if (head.method != "GET" && head.method != "HEAD") {  // answered here: no body is read for it
      HttpError e;
      e.status = 405;
      e.type = "invalid_request_error";
      e.code = "method_not_allowed";
      e.message = absl::StrCat(EchoPrefix(head.method), " is not allowed on /health; use GET");
      HttpEarlyReply r = early(e);
      r.headers.emplace_back("Allow", "GET");
      return r;
    }
    if (head.content_length <= 0 && !head.chunked) return std::nullopt;
    HttpError e = InvalidParam("", "GET /health takes no request body", "bad_request");
    e.param.clear();
    return early(e);
  }
  if (config.tokens != nullptr) {
    if (absl::StatusOr<Caller> who = CallerFromHead(head, config.tokens); !who.ok()) {
      HttpEarlyReply r = early(ToHttpError(who.status()));
      r.headers.emplace_back("WWW-Authenticate", "Bearer");
      if (metrics != nullptr) {
        const bool known = head.path == "/v1/chat/completions" || head.path == "/v1/completions" ||
                           head.path == "/v1/models" || absl::StartsWith(head.path, "/v1/models/");
        metrics->OnHttpRequest(known ? (absl::StartsWith(head.path, "/v1/models") ? "/v1/models" : head.path) : "other",
                               401);
      }
      return r;
    }
  }
  if (head.content_length > config.http.max_body_bytes) {
    HttpError e;
    e.status = 413;
    e.type = "invalid_request_error";
    e.code = "request_too_large";
    e.message = absl::StrCat("the request body exceeds ", config.http.max_body_bytes, " bytes (--http_max_body_bytes)");
    return early(e);
  }
  return std::nullopt;
}

void OpenAiServer::Impl::Routes(httplib::Server& s) {
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { HandleChat(req, res); });
  s.Post("/v1/completions",
         [this](const httplib::Request& req, httplib::Response& res) { HandleCompletion(req, res); });
  s.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (absl::StatusOr<Caller> caller = CallerFromHttp(req, config.tokens); !caller.ok()) {
      Reply(nullptr, res, ToHttpError(caller.status()));
      if (metrics != nullptr) metrics->OnHttpRequest("/v1/models", res.status);
      return;
    }
    nlohmann::ordered_json body{{"object", "list"}, {"data", nlohmann::ordered_json::array({ModelJson()})}};
    res.set_content(openai::Dump(body), kJson);
    if (metrics != nullptr) metrics->OnHttpRequest("/v1/models", 200);
  });
  s.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    HttpError e;
    if (absl::StatusOr<Caller> caller = CallerFromHttp(req, config.tokens); !caller.ok()) {
      Reply(nullptr, res, ToHttpError(caller.status()));
    } else if (!CheckModel(id, &e)) {
      Reply(nullptr, res, e);
    } else {
      res.set_content(openai::Dump(ModelJson()), kJson);
    }
    if (metrics != nullptr) metrics->OnHttpRequest("/v1/models", res.status < 0 ? 200 : res.status);
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const EngineHealth h = sessions->Health();
    const char* status = draining.load()     ? "draining"
                         : h.serving          ? "ok"
                         : !h.state_writable  ? "state_unwritable"
                                              : "stuck";
    res.status = std::string(status) == "ok" ? 200 : 503;
    res.set_content(openai::Dump(nlohmann::ordered_json{{"status", status}}), kJson);
  });
  // httplib's own errors (no route, body too large, malformed HTTP) get OpenAI's shape.
  const int64_t max_body = config.http.max_body_bytes;
  s.set_error_handler(httplib::Server::HandlerWithResponse([this, max_body](const httplib::Request& req,
                                                                            httplib::Response& res) {
    if (!res.body.empty() || res.content_provider_) return httplib::Server::HandlerResponse::Unhandled;
    HttpError e;
    e.status = res.status;
    e.type = "invalid_request_error";
    switch (res.status) {
      case 404: {
        // A known path with another method: 405 and the methods it has.
        const std::string allow =
            req.path == "/v1/chat/completions" || req.path == "/v1/completions" ? "POST"
            : req.path == "/v1/models" || absl::StartsWith(req.path, "/v1/models/") || req.path == "/health"
                ? "GET"
                : "";
        if (!allow.empty()) {
          res.status = e.status = 405;
          e.code = "method_not_allowed";
          e.message = absl::StrCat(EchoPrefix(req.method), " is not allowed on ", req.path, "; use ", allow);
          res.set_header("Allow", allow);
          break;
        }
        e.code = "not_found";
        e.message = absl::StrCat("no route for ", EchoPrefix(req.method), " ", EchoPrefix(req.path),
                                 " (POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health)");
        break;
      }
      case 413:
        e.code = "request_too_large";
        e.message = absl::StrCat("the request body exceeds ", max_body, " bytes (--http_max_body_bytes)");
        break;
      default:
        e.code = "bad_request";
        e.message = absl::StrCat("HTTP ", res.status, ": the request could not be read");
        if (res.status >= 500) e.type = "server_error";
        break;
    }
    res.set_content(HttpErrorJson(e), kJson);
    if (metrics != nullptr) metrics->OnHttpRequest("other", res.status);
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(HttpErrorJson(ToHttpError(absl::InternalError(absl::StrCat("internal error: ", what)))), kJson);
  });
}

OpenAiServer::OpenAiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OpenAiServer::~OpenAiServer() { Stop(); }

absl::StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Start(Sessions* sessions,
                                                                  const model::Tokenizer& tokenizer, Metrics* metrics,
                                                                  const OpenAiConfig& config) {
  if (sessions == nullptr) return absl::InvalidArgumentError("OpenAiServer: the session layer is required");
  auto impl = std::make_unique<Impl>();
  impl->sessions = sessions;
  impl->metrics = metrics;
  impl->config = config;
  impl->model_name = config.model_name.empty() ? sessions->facts().model_name : config.model_name;
  impl->created = absl::ToUnixSeconds(absl::Now());
  impl->tokens = std::make_unique<openai::TokenTable>(tokenizer);
  Impl* raw = impl.get();
  HttpOptions http = config.http;
  http.gate = [raw](const HttpRequestHead& head) { return raw->Gate(head); };
  absl::StatusOr<std::unique_ptr<HttpListener>> listener =
      HttpListener::Start(config.host, config.port, http, [raw](httplib::Server& s) { raw->Routes(s); });
  if (!listener.ok()) {
    return absl::Status(listener.status().code(), absl::StrCat("http: ", listener.status().message()));
  }
  impl->listener = std::move(*listener);
  return std::unique_ptr<OpenAiServer>(new OpenAiServer(std::move(impl)));
}

int OpenAiServer::port() const { return impl_->listener->port(); }
const std::string& OpenAiServer::model_name() const { return impl_->model_name; }
void OpenAiServer::Drain() { impl_->draining.store(true); }
int OpenAiServer::in_flight() const { return impl_->in_flight.load(); }

void OpenAiServer::Stop() {
  impl_->draining.store(true);
  impl_->stopping.store(true);  // streams still open end with an error event and [DONE]
  if (impl_->listener != nullptr) impl_->listener->Stop();
}

}  // namespace echokv::server
