// The session layer (server/sessions/sessions.h) against a fake engine: which engine
// calls each use-case makes, in which order, with which parameters; how a completion
// creates, continues and cleans up its session; the stream slots both doors share; and
// that the engine's typed errors come through unchanged.
#include "server/sessions/sessions.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/errors.h"

namespace echokv::server {
namespace {

// Records every call; the test answers them (the engine's callbacks run later, on its
// own thread in production, so nothing here may depend on an inline answer).
class FakeEngine final : public EnginePort {
 public:
  struct Created {
    CreateRequest request;
    DoneFn<SessionInfo> done;
  };
  struct Generated {
    GenerateParams params;
    CancelFlag cancel;
    DoneFn<GenerateSummary> done;
  };
  FakeEngine() {
    facts_.limits.max_concurrent_streams = 3;
    facts_.model_name = "fake";
  }

  const ServerFacts& facts() const override { return facts_; }
  void CreateSession(CreateRequest request, CancelFlag, ProgressFn, DoneFn<SessionInfo> done) override {
    calls.push_back("CreateSession");
    created.push_back({std::move(request), std::move(done)});
  }
  void AppendToSession(AppendRequest request, CancelFlag, ProgressFn, DoneFn<SessionInfo> done) override {
    calls.push_back("AppendToSession " + request.session_id);
    done(absl::NotFoundError("no such session"));
  }
  void Generate(GenerateParams params, CancelFlag cancel, StreamSink, DoneFn<GenerateSummary> done) override {
    calls.push_back("Generate " + params.session_id);
    generated.push_back({std::move(params), std::move(cancel), std::move(done)});
  }
  void Compress(Caller, InputSpec, compression::CompressionConfig, CancelFlag, DoneFn<CompressOutcome> done) override {
    calls.push_back("Compress");
    done(LimitError("max_kv_bytes", "full"));
  }
  void ForkSession(Caller, std::string session_id, std::optional<absl::Duration>, DoneFn<SessionInfo> done) override {
    calls.push_back("ForkSession " + session_id);
    SessionInfo info;
    info.id = session_id + "-fork";
    done(info);
  }
  void GetSession(Caller, std::string session_id, DoneFn<SessionInfo> done) override {
    calls.push_back("GetSession " + session_id);
    if (session_id == "gone") return done(MakeError(ErrorKind::kNotFound, "session_id", "gone"));
    SessionInfo info;
    info.id = session_id;
    info.tokens_seen = 3;
    done(info);
  }
  void ListSessions(Caller caller, DoneFn<std::vector<SessionInfo>> done) override {
    calls.push_back("ListSessions " + caller.tenant);
    done(std::vector<SessionInfo>(2));
  }
  void DeleteSession(Caller caller, std::string session_id, DoneFn<int64_t> done) override {
    calls.push_back("DeleteSession " + session_id);
    deleted_by.push_back(caller.tenant);
    done(int64_t{100});
  }
  void InspectCache(Caller, std::string session_id, bool include_positions, DoneFn<CacheInspection> done) override {
    calls.push_back(absl::StrCat("InspectCache ", session_id, include_positions ? " positions" : ""));
    done(CacheInspection{});
  }
  void ExportSession(Caller, std::string session_id, CancelFlag, ExportSink, DoneFn<int64_t> done) override {
    calls.push_back("ExportSession " + session_id);
    done(int64_t{7});
  }
  std::unique_ptr<SessionImport> BeginImport(Caller, bool keep_id, std::optional<absl::Duration>) override {
    calls.push_back(keep_id ? "BeginImport keep_id" : "BeginImport");
    return nullptr;
  }
  void SessionTokens(Caller, std::string session_id, DoneFn<std::vector<int>> done) override {
    calls.push_back("SessionTokens " + session_id);
    if (session_id == "busy") return done(MakeError(ErrorKind::kBusy, "session_id", "busy"));
    done(std::vector<int>{1, 2, 3});
  }
  StoreTotals Totals() const override { return {}; }
  StoreTotals TotalsOf(const std::string&) const override { return {}; }
  void Wake() override { calls.push_back("Wake"); }
  EngineHealth Health() const override { return {}; }

  std::vector<std::string> calls;
  std::vector<std::string> deleted_by;
  std::deque<Created> created;
  std::deque<Generated> generated;

 private:
  ServerFacts facts_;
};

class Observer final : public EngineObserver {
 public:
  void OnCompression(const CompressionStats&) override {}
  void OnFirstToken(double) override {}
  void OnInterToken(double) override {}
  void OnGeneratedTokens(int64_t) override {}
  void OnSessionCreated() override {}
  void OnSessionExpired() override {}
  void OnSessionRejected(absl::string_view limit) override { rejected.emplace_back(limit); }
  void OnGauges(const EngineGauges&) override {}
  void OnStreamSlot(absl::string_view tenant, int delta) override { slots[std::string(tenant)] += delta; }
  std::vector<std::string> rejected;
  std::map<std::string, int> slots;
};

SessionInfo Info(const std::string& id) {
  SessionInfo info;
  info.id = id;
  return info;
}

// What Complete reported: the session it named and how it ended.
struct Outcome {
  std::vector<std::string> sessions;  // on_session, in order
  bool done = false;
  absl::Status status = absl::UnknownError("not done");
};

std::shared_ptr<Completion> Start(Sessions& sessions, CompletionRequest request, Outcome* out) {
  return sessions.Complete(
      std::move(request), StreamSink{}, [out](const std::string& id) { out->sessions.push_back(id); },
      [out](absl::StatusOr<GenerateSummary> r) {
        out->done = true;
        out->status = r.status();
      });
}

CompletionRequest ChatCompletion(CompletionRequest::Session mode, const std::string& id = "") {
  CompletionRequest c;
  c.caller.tenant = "acme";
  c.session = mode;
  c.session_id = id;
  c.input.kind = InputSpec::Kind::kChat;
  c.input.chat = {model::ChatMessage{"user", "hi"}};
  c.generate.max_tokens = 5;
  c.generate.session_id = "ignored";  // the session layer sets it
  return c;
}

TEST(SessionsCompleteTest, AContinuedSessionIsOneEngineJobWithTheWholeConversation) {
  FakeEngine engine;
  Sessions sessions(&engine, nullptr, {});
  Outcome out;
  Start(sessions, ChatCompletion(CompletionRequest::Session::kContinue, "s1"), &out);
  ASSERT_EQ(engine.calls, (std::vector<std::string>{"Generate s1"}));
  const GenerateParams& p = engine.generated.front().params;
  EXPECT_TRUE(p.commit);
  EXPECT_EQ(p.caller.tenant, "acme");
  EXPECT_EQ(p.max_tokens, 5);
  ASSERT_TRUE(p.input.has_value());
  EXPECT_TRUE(p.input->whole_conversation);  // the engine checks it against the session's
  EXPECT_EQ(p.input->chat.size(), 1u);
  EXPECT_EQ(out.sessions, (std::vector<std::string>{"s1"}));
  engine.generated.front().done(GenerateSummary{});
  EXPECT_TRUE(out.done);
  EXPECT_TRUE(out.status.ok());
  EXPECT_EQ(engine.calls.size(), 1u);  // nothing deleted: the session is the client's
}

TEST(SessionsCompleteTest, AnEmptyTextContinuesWhereTheSessionEnds) {
  FakeEngine engine;
  Sessions sessions(&engine, nullptr, {});
  CompletionRequest c = ChatCompletion(CompletionRequest::Session::kContinue, "s1");
  c.input = InputSpec{};
  c.input.kind = InputSpec::Kind::kText;
  Outcome out;
  Start(sessions, std::move(c), &out);
  ASSERT_EQ(engine.generated.size(), 1u);
  EXPECT_FALSE(engine.generated.front().params.input.has_value());
  EXPECT_TRUE(engine.generated.front().params.commit);
}

TEST(SessionsCompleteTest, AStatelessCompletionCreatesThenDeletesItsSession) {
  FakeEngine engine;
  Sessions sessions(&engine, nullptr, {});
  CompletionRequest c = ChatCompletion(CompletionRequest::Session::kStateless);
  c.config.budget = 17;
  c.ttl = absl::Seconds(9);
  Outcome out;
  Start(sessions, std::move(c), &out);
  ASSERT_EQ(engine.calls, (std::vector<std::string>{"CreateSession"}));
  EXPECT_EQ(engine.created.front().request.config.budget, 17);
  EXPECT_EQ(engine.created.front().request.ttl, absl::Seconds(9));
  EXPECT_FALSE(engine.created.front().request.input.whole_conversation);
  EXPECT_TRUE(out.sessions.empty());  // not before it exists
  engine.created.front().done(Info("tmp1"));
  ASSERT_EQ(engine.calls, (std::vector<std::string>{"CreateSession", "Generate tmp1"}));
  EXPECT_FALSE(engine.generated.front().params.commit);
  EXPECT_FALSE(engine.generated.front().params.input.has_value());  // the prompt went into the creation
  EXPECT_EQ(out.sessions, (std::vector<std::string>{"tmp1"}));
  engine.generated.front().done(GenerateSummary{});
  EXPECT_EQ(engine.calls.back(), "DeleteSession tmp1");
  EXPECT_EQ(engine.deleted_by, (std::vector<std::string>{"acme"}));
  EXPECT_TRUE(out.done);
  EXPECT_TRUE(out.status.ok());
}

TEST(SessionsCompleteTest, ANewSessionStaysWhenTheGenerationSucceeds) {
  FakeEngine engine;
  Sessions sessions(&engine, nullptr, {});
  Outcome out;
  std::shared_ptr<Completion> run = Start(sessions, ChatCompletion(CompletionRequest::Session::kNew), &out);
  engine.created.front().done(Info("new1"));
  EXPECT_TRUE(engine.generated.front().params.commit);
  engine.generated.front().done(GenerateSummary{});
  EXPECT_EQ(engine.calls, (std::vector<std::string>{"CreateSession", "Generate new1"}));
  // The reply was not delivered after all (the client left before the end).
  run->Abandon();
  EXPECT_EQ(engine.calls.back(), "DeleteSession new1");
  run->Abandon();  // once only
  EXPECT_EQ(engine.calls.size(), 3u);
}

TEST(SessionsCompleteTest, ANewSessionGoesWhenTheGenerationFailsOrIsAbandoned) {
  FakeEngine engine;
  Sessions sessions(&engine, nullptr, {});
  {
    Outcome out;
    Start(sessions, ChatCompletion(CompletionRequest::Session::kNew), &out);
    engine.created.front().done(Info("new1"));
    engine.generated.front().done(MakeError(ErrorKind::kContextLengthExceeded, "input", "too long"));
    EXPECT_EQ(engine.calls.back(), "DeleteSession new1");
    EXPECT_EQ(ErrorInfoOf(out.status).kind, ErrorKind::kContextLengthExceeded);  // unchanged
    EXPECT_EQ(ErrorInfoOf(out.status).field, "input");
  }
  {
    Outcome out;
    std::shared_ptr<Completion> run = Start(sessions, ChatCompletion(CompletionRequest::Session::kNew), &out);
    engine.created.back().done(Info("new2"));
    run->Abandon();
    EXPECT_TRUE(engine.generated.back().cancel->load());  // the engine job stops
    EXPECT_NE(engine.calls.back(), "DeleteSession new2");  // not while it still runs
    engine.generated.back().done(absl::CancelledError("cancelled"));
    EXPECT_EQ(engine.calls.back(), "DeleteSession new2");
  }
}

TEST(SessionsCompleteTest, ACreationThatFailsEndsTheCompletionWithItsError) {
  FakeEngine engine;
  Sessions sessions(&engine, nullptr, {});
  Outcome out;
  Start(sessions, ChatCompletion(CompletionRequest::Session::kNew), &out);
  engine.created.front().done(LimitError("max_sessions", "max_sessions reached"));
  EXPECT_TRUE(out.done);
  EXPECT_EQ(ErrorInfoOf(out.status).kind, ErrorKind::kLimitReached);
  EXPECT_EQ(ErrorInfoOf(out.status).limit, "max_sessions");
  EXPECT_TRUE(out.sessions.empty());
  EXPECT_EQ(engine.calls, (std::vector<std::string>{"CreateSession"}));  // no generation, nothing to delete
}

TEST(SessionsCompleteTest, AContinuedSessionIsNeverDeleted) {
  FakeEngine engine;
  Sessions sessions(&engine, nullptr, {});
  Outcome out;
  std::shared_ptr<Completion> run = Start(sessions, ChatCompletion(CompletionRequest::Session::kContinue, "s1"), &out);
  run->Abandon();
  EXPECT_TRUE(engine.generated.front().cancel->load());  // the engine rolls the turn back
  engine.generated.front().done(MakeError(ErrorKind::kConversationMismatch, "input.chat[0]", "differs"));
  EXPECT_EQ(engine.calls, (std::vector<std::string>{"Generate s1"}));
  EXPECT_EQ(ErrorInfoOf(out.status).kind, ErrorKind::kConversationMismatch);
  EXPECT_EQ(ErrorInfoOf(out.status).field, "input.chat[0]");
}

TEST(SessionsTest, GetWithTokensReadsTheTokensAfterTheSession) {
  FakeEngine engine;
  Sessions sessions(&engine, nullptr, {});
  absl::StatusOr<SessionView> got = absl::UnknownError("");
  sessions.Get({}, "s1", /*include_tokens=*/true, [&](absl::StatusOr<SessionView> v) { got = std::move(v); });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->info.id, "s1");
  EXPECT_EQ(got->tokens, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(engine.calls, (std::vector<std::string>{"GetSession s1", "SessionTokens s1"}));

  engine.calls.clear();
  sessions.Get({}, "s1", /*include_tokens=*/false, [&](absl::StatusOr<SessionView> v) { got = std::move(v); });
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->tokens.has_value());
  EXPECT_EQ(engine.calls, (std::vector<std::string>{"GetSession s1"}));

  sessions.Get({}, "gone", true, [&](absl::StatusOr<SessionView> v) { got = std::move(v); });
  EXPECT_EQ(ErrorInfoOf(got.status()).kind, ErrorKind::kNotFound);
  EXPECT_EQ(engine.calls.back(), "GetSession gone");  // no token read for a missing session
  sessions.Get({}, "busy", true, [&](absl::StatusOr<SessionView> v) { got = std::move(v); });
  EXPECT_EQ(ErrorInfoOf(got.status()).kind, ErrorKind::kBusy);
}

TEST(SessionsTest, EveryUseCaseReachesTheEngineWithItsErrorsUnchanged) {
  FakeEngine engine;
  Sessions sessions(&engine, nullptr, {});
  Caller acme{"acme"};
  absl::Status append, compress;
  sessions.Append(AppendRequest{acme, "s9", {}}, nullptr, nullptr,
                  [&](absl::StatusOr<SessionInfo> r) { append = r.status(); });
  sessions.Compress(acme, {}, {}, nullptr, [&](absl::StatusOr<CompressOutcome> r) { compress = r.status(); });
  std::string fork;
  sessions.Fork(acme, "s1", std::nullopt, [&](absl::StatusOr<SessionInfo> r) { fork = r->id; });
  size_t listed = 0;
  sessions.List(acme, [&](absl::StatusOr<std::vector<SessionInfo>> r) { listed = r->size(); });
  int64_t freed = 0, exported = 0;
  sessions.Delete(acme, "s2", [&](absl::StatusOr<int64_t> r) { freed = *r; });
  sessions.Inspect(acme, "s3", true, [](absl::StatusOr<CacheInspection>) {});
  sessions.Export(acme, "s4", nullptr, {}, [&](absl::StatusOr<int64_t> r) { exported = *r; });
  EXPECT_EQ(sessions.BeginImport(acme, true, std::nullopt), nullptr);
  sessions.Create(CreateRequest{}, nullptr, nullptr, [](absl::StatusOr<SessionInfo>) {});
  sessions.Wake();
  EXPECT_EQ(engine.calls,
            (std::vector<std::string>{"AppendToSession s9", "Compress", "ForkSession s1", "ListSessions acme",
                                      "DeleteSession s2", "InspectCache s3 positions", "ExportSession s4",
                                      "BeginImport keep_id", "CreateSession", "Wake"}));
  EXPECT_EQ(append.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrorInfoOf(compress).kind, ErrorKind::kLimitReached);
  EXPECT_EQ(ErrorInfoOf(compress).limit, "max_kv_bytes");
  EXPECT_EQ(fork, "s1-fork");
  EXPECT_EQ(listed, 2u);
  EXPECT_EQ(freed, 100);
  EXPECT_EQ(exported, 7);
}

TEST(SessionsStreamSlotsTest, BothDoorsDrawOnOnePoolWithTenantQuotas) {
  FakeEngine engine;  // max_concurrent_streams = 3
  Observer observer;
  SessionsOptions options;
  options.stream_quota = [](const std::string& tenant) { return tenant == "small" ? 1 : 0; };
  Sessions sessions(&engine, &observer, options);
  ASSERT_TRUE(sessions.AcquireStream("small").ok());
  absl::Status quota = sessions.AcquireStream("small");
  EXPECT_EQ(ErrorInfoOf(quota).kind, ErrorKind::kLimitReached);
  EXPECT_EQ(ErrorInfoOf(quota).limit, "max_streams");
  ASSERT_TRUE(sessions.AcquireStream("big").ok());
  ASSERT_TRUE(sessions.AcquireStream("big").ok());
  absl::Status full = sessions.AcquireStream("other");
  EXPECT_EQ(ErrorInfoOf(full).limit, "max_concurrent_streams");
  EXPECT_EQ(sessions.streams_in_flight(), 3);
  EXPECT_EQ(observer.rejected, (std::vector<std::string>{"max_streams", "max_concurrent_streams"}));
  EXPECT_EQ(observer.slots["small"], 1);
  EXPECT_EQ(observer.slots["big"], 2);
  sessions.ReleaseStream("big");
  EXPECT_TRUE(sessions.AcquireStream("other").ok());
  sessions.ReleaseStream("small");
  EXPECT_EQ(observer.slots["small"], 0);
  EXPECT_EQ(sessions.streams_in_flight(), 2);
}

}  // namespace
}  // namespace echokv::server
