// The one admission point (Engine::Impl::Admit, docs/ARCHITECTURE.md "Admission"): every
// job that brings a session or holds KV bytes is refused by the same limits with the same
// error kind and limit name, whichever call it is: CreateSession, ForkSession,
// ImportSession and Compress (for its bytes; it creates no session, so max_sessions does
// not apply to it); a tenant's quota likewise; after Shutdown every one is UNAVAILABLE.
// An in-process engine over a tiny random model (as engine_test.cc), a fake clock.
#include "server/engine/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/errors.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"
#include "tools/make_test_model.h"

namespace echokv::server {
namespace {

using ::echokv::testing::IsOk;

struct Loaded {
  std::shared_ptr<const model::Transformer> model;
  std::shared_ptr<const model::Tokenizer> tokenizer;
  std::string dir;
};

const Loaded& TinyModel() {
  static Loaded* l = [] {
    auto* out = new Loaded;
    out->dir = echokv::testing::MakeTempDir("admission-test");
    tools::TestModelOptions o;
    o.arch = "llama";
    o.out_dir = out->dir;
    o.max_pos = 512;
    EXPECT_THAT(tools::MakeTestModel(o), IsOk());
    model::DeviceOptions dev;
    dev.num_threads = 1;
    absl::StatusOr<std::unique_ptr<model::Transformer>> m = model::Transformer::Load(out->dir, dev);
    EXPECT_THAT(m.status(), IsOk());
    absl::StatusOr<std::unique_ptr<model::Tokenizer>> t = model::LoadTokenizer(out->dir);
    EXPECT_THAT(t.status(), IsOk());
    out->model = std::move(*m);
    out->tokenizer = std::move(*t);
    return out;
  }();
  return *l;
}

std::vector<int> Prompt(int length, int salt) {
  std::vector<int> ids;
  for (int i = 0; i < length; ++i) ids.push_back(3 + (i * 7 + salt * 13) % 300);
  return ids;
}

constexpr int kBudget = 16;

compression::CompressionConfig Config() {
  compression::CompressionConfig c;
  c.policy = compression::PolicyKind::kStreamingLlm;
  c.budget = kBudget;
  return c;
}

// Records the observer's rejections (the rest is ignored).
class Rejections : public EngineObserver {
 public:
  void OnCompression(const CompressionStats&) override {}
  void OnFirstToken(double) override {}
  void OnInterToken(double) override {}
  void OnGeneratedTokens(int64_t) override {}
  void OnSessionCreated() override {}
  void OnSessionExpired() override {}
  void OnSessionRejected(absl::string_view limit) override {
    absl::MutexLock lock(&mu_);
    limits_.emplace_back(limit);
  }
  void OnGauges(const EngineGauges&) override {}
  std::vector<std::string> limits() {
    absl::MutexLock lock(&mu_);
    return limits_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> limits_ ABSL_GUARDED_BY(mu_);
};

class Engine1 {
 public:
  explicit Engine1(EngineConfig c) {
    const Loaded& m = TinyModel();
    c.model_dir = m.dir;
    absl::StatusOr<std::unique_ptr<Engine>> e =
        Engine::CreateWithModel(c, m.model, m.tokenizer, std::nullopt, &rejections_, &clock_);
    EXPECT_THAT(e.status(), IsOk());
    engine_ = std::move(*e);
  }
  Engine& engine() { return *engine_; }
  Rejections& rejections() { return rejections_; }

  absl::StatusOr<SessionInfo> Create(int salt, const std::string& tenant = "") {
    CreateRequest r;
    r.caller.tenant = tenant;
    r.input.kind = InputSpec::Kind::kTokens;
    r.input.tokens = Prompt(40, salt);
    r.config = Config();
    r.memory = MemoryMode::kEvict;
    std::promise<absl::StatusOr<SessionInfo>> p;
    engine_->CreateSession(std::move(r), nullptr, nullptr, [&](absl::StatusOr<SessionInfo> s) { p.set_value(s); });
    return p.get_future().get();
  }
  absl::StatusOr<SessionInfo> Fork(const std::string& id, const std::string& tenant = "") {
    std::promise<absl::StatusOr<SessionInfo>> p;
    engine_->ForkSession(Caller{tenant}, id, std::nullopt, [&](absl::StatusOr<SessionInfo> s) { p.set_value(s); });
    return p.get_future().get();
  }
  absl::StatusOr<CompressOutcome> Compress(const std::string& tenant = "") {
    InputSpec in;
    in.kind = InputSpec::Kind::kTokens;
    in.tokens = Prompt(40, 77);
    std::promise<absl::StatusOr<CompressOutcome>> p;
    engine_->Compress(Caller{tenant}, in, Config(), nullptr, [&](absl::StatusOr<CompressOutcome> c) { p.set_value(c); });
    return p.get_future().get();
  }
  absl::StatusOr<std::string> Export(const std::string& id) {
    auto bytes = std::make_shared<std::string>();
    ExportSink sink;
    sink.on_chunk = [bytes](std::string chunk) { *bytes += chunk; };
    std::promise<absl::StatusOr<int64_t>> p;
    engine_->ExportSession(Caller{}, id, nullptr, sink, [&](absl::StatusOr<int64_t> n) { p.set_value(n); });
    absl::StatusOr<int64_t> n = p.get_future().get();
    if (!n.ok()) return n.status();
    return *bytes;
  }
  absl::StatusOr<SessionInfo> Import(const std::string& snapshot) {
    std::unique_ptr<SessionImport> import = engine_->BeginImport(Caller{}, /*keep_id=*/false, std::nullopt);
    std::promise<absl::Status> fed;
    import->Feed(snapshot, [&](absl::Status s) { fed.set_value(s); });
    if (absl::Status s = fed.get_future().get(); !s.ok()) return s;
    std::promise<absl::StatusOr<SessionInfo>> p;
    import->Finish([&](absl::StatusOr<SessionInfo> s) { p.set_value(s); });
    return p.get_future().get();
  }

 private:
  FakeClock clock_;
  Rejections rejections_;
  std::unique_ptr<Engine> engine_;
};

// The kind and limit of a refusal, as "kind/limit".
std::string Refusal(const absl::Status& s) {
  if (s.ok()) return "ok";
  const ErrorInfo info = ErrorInfoOf(s);
  return absl::StrCat(ErrorKindName(info.kind), "/", info.limit);
}

TEST(AdmissionTest, MaxSessionsRefusesCreateForkAndImportAlikeAndNotCompress) {
  EngineConfig c;
  c.limits.max_sessions = 1;
  Engine1 e(c);
  absl::StatusOr<SessionInfo> first = e.Create(1);
  ASSERT_THAT(first.status(), IsOk());
  absl::StatusOr<std::string> snapshot = e.Export(first->id);
  ASSERT_THAT(snapshot.status(), IsOk());

  EXPECT_EQ(Refusal(e.Create(2).status()), "limit_reached/max_sessions");
  EXPECT_EQ(Refusal(e.Fork(first->id).status()), "limit_reached/max_sessions");
  EXPECT_EQ(Refusal(e.Import(*snapshot).status()), "limit_reached/max_sessions");
  // Compress creates no session: the session count does not refuse it.
  EXPECT_THAT(e.Compress().status(), IsOk());
  EXPECT_EQ(e.rejections().limits(), (std::vector<std::string>{"max_sessions", "max_sessions", "max_sessions"}));
  EXPECT_EQ(e.engine().Totals().sessions, 1);
  EXPECT_EQ(e.engine().Totals().reserved, 0);
}

TEST(AdmissionTest, MaxKvBytesRefusesCreateForkImportAndCompressAlike) {
  const int64_t per_token = TinyModel().model->NewCache().FullEquivalentKvBytes(1);
  EngineConfig c;
  c.limits.max_kv_bytes = kBudget * per_token;  // one compressed session, exactly
  Engine1 e(c);
  absl::StatusOr<SessionInfo> first = e.Create(1);
  ASSERT_THAT(first.status(), IsOk());
  ASSERT_EQ(first->retained_kv_bytes, kBudget * per_token);
  absl::StatusOr<std::string> snapshot = e.Export(first->id);
  ASSERT_THAT(snapshot.status(), IsOk());

  EXPECT_EQ(Refusal(e.Create(2).status()), "limit_reached/max_kv_bytes");
  EXPECT_EQ(Refusal(e.Fork(first->id).status()), "limit_reached/max_kv_bytes");
  EXPECT_EQ(Refusal(e.Import(*snapshot).status()), "limit_reached/max_kv_bytes");
  // Compress holds a cache of the same estimate while it runs: refused the same way.
  EXPECT_EQ(Refusal(e.Compress().status()), "limit_reached/max_kv_bytes");
  EXPECT_EQ(e.rejections().limits(),
            (std::vector<std::string>{"max_kv_bytes", "max_kv_bytes", "max_kv_bytes", "max_kv_bytes"}));

  // Room again: Compress runs and gives its bytes back when it ends.
  std::promise<absl::StatusOr<int64_t>> deleted;
  e.engine().DeleteSession(Caller{}, first->id, [&](absl::StatusOr<int64_t> n) { deleted.set_value(n); });
  ASSERT_THAT(deleted.get_future().get().status(), IsOk());
  EXPECT_THAT(e.Compress().status(), IsOk());
  EXPECT_EQ(e.engine().Totals().hot_bytes, 0);
  EXPECT_EQ(e.engine().Totals().reserved, 0);
}

TEST(AdmissionTest, TenantQuotaRefusesCreateForkAndCompressAlike) {
  const int64_t per_token = TinyModel().model->NewCache().FullEquivalentKvBytes(1);
  Engine1 e(EngineConfig{});
  TenantQuota q;
  q.max_sessions = 1;
  q.max_kv_bytes = kBudget * per_token;
  e.engine().SetTenantQuotas({{"acme", q}});
  absl::StatusOr<SessionInfo> first = e.Create(1, "acme");
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_EQ(Refusal(e.Create(2, "acme").status()), "limit_reached/max_sessions");
  EXPECT_EQ(Refusal(e.Fork(first->id, "acme").status()), "limit_reached/max_sessions");
  EXPECT_EQ(Refusal(e.Compress("acme").status()), "limit_reached/max_kv_bytes");
  // Another tenant is not bound by acme's quota.
  EXPECT_THAT(e.Create(3, "other").status(), IsOk());
  EXPECT_THAT(e.Compress("other").status(), IsOk());
}

TEST(AdmissionTest, AfterShutdownEveryJobIsUnavailable) {
  Engine1 e(EngineConfig{});
  absl::StatusOr<SessionInfo> first = e.Create(1);
  ASSERT_THAT(first.status(), IsOk());
  e.engine().Shutdown();
  EXPECT_EQ(Refusal(e.Create(2).status()), "unavailable/");
  EXPECT_EQ(Refusal(e.Fork(first->id).status()), "unavailable/");
  EXPECT_EQ(Refusal(e.Compress().status()), "unavailable/");
}

}  // namespace
}  // namespace echokv::server
