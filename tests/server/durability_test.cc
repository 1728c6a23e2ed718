// Durable sessions through the engine (--state_dir): a restart on the same directory
// restores every session (listed at once, tensors loaded on first use) with the same hot
// positions, tokens and greedy continuation; forks are saved too; damaged state is
// refused with a metric while the rest is served; a full disk refuses the turn with
// RESOURCE_EXHAUSTED and leaves the session as it was; an unusable state dir stops the
// engine from starting; max_cold_bytes spills idle saved sessions instead of refusing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/tokenizer.h"
#include "model/transformer.h"
#include "server/engine/engine.h"
#include "server/state/file_ops.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"
#include "tools/make_test_model.h"

namespace echokv::server {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;
namespace fs = std::filesystem;

struct Loaded {
  std::shared_ptr<const model::Transformer> model;
  std::shared_ptr<const model::Tokenizer> tokenizer;
  std::string dir;
};

const Loaded& Tiny() {
  static const Loaded* loaded = [] {
    auto* l = new Loaded;
    l->dir = echokv::testing::MakeTempDir("durability-model");
    tools::TestModelOptions o;
    o.out_dir = l->dir;
    o.max_pos = 512;
    EXPECT_THAT(tools::MakeTestModel(o), IsOk());
    model::DeviceOptions dev;
    dev.num_threads = 1;
    l->model = std::move(*model::Transformer::Load(l->dir, dev));
    l->tokenizer = std::move(*model::LoadTokenizer(l->dir));
    return l;
  }();
  return *loaded;
}

class CountingObserver : public EngineObserver {
 public:
  void OnCompression(const CompressionStats&) override {}
  void OnFirstToken(double) override {}
  void OnInterToken(double) override {}
  void OnGeneratedTokens(int64_t) override {}
  void OnSessionCreated() override {}
  void OnSessionExpired() override {}
  void OnSessionRejected(absl::string_view) override {}
  void OnGauges(const EngineGauges&) override {}
  void OnStateWrite(double, bool ok) override { (ok ? writes_ok : writes_failed)++; }
  void OnStateError(absl::string_view kind) override { errors[std::string(kind)]++; }
  void OnSessionsRestored(int64_t n) override { restored += n; }
  std::atomic<int> writes_ok{0}, writes_failed{0};
  std::map<std::string, int> errors;
  std::atomic<int64_t> restored{0};
};

std::vector<int> Prompt(int n, int salt) {
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back(3 + (i * 11 + salt * 7) % 300);
  return ids;
}

compression::CompressionConfig Cfg(compression::PolicyKind k) {
  compression::CompressionConfig c;
  c.policy = k;
  c.budget = 20;
  c.lookahead = 4;
  c.workspace = 32;
  c.snapkv_window = 8;
  return c;
}

// Synchronous wrappers over one engine.
struct Server {
  // Declared before the engine, so destroyed after it: the engine thread reads the clock
  // until the engine is gone (in the other order the sanitized build reports a call
  // through the destroyed clock's vptr from Engine::Impl::Heartbeat).
  FakeClock clock;
  std::unique_ptr<Engine> engine;

  absl::Status Start(const std::string& state_dir, EngineObserver* obs, state::FileOps* ops = nullptr,
                     int64_t max_cold = int64_t{1} << 40) {
    EngineConfig c;
    c.model_dir = Tiny().dir;
    c.state_dir = state_dir;
    c.state_file_ops = ops;
    c.limits.max_cold_bytes = max_cold;
    absl::StatusOr<std::unique_ptr<Engine>> e =
        Engine::CreateWithModel(c, Tiny().model, Tiny().tokenizer, std::nullopt, obs, &clock);
    if (!e.ok()) return e.status();
    engine = std::move(*e);
    return absl::OkStatus();
  }
  void Stop() { engine.reset(); }

  absl::StatusOr<SessionInfo> Create(std::vector<int> ids, compression::PolicyKind k, MemoryMode m) {
    CreateRequest r;
    r.input.kind = InputSpec::Kind::kTokens;
    r.input.tokens = std::move(ids);
    r.config = Cfg(k);
    r.memory = m;
    std::promise<absl::StatusOr<SessionInfo>> p;
    engine->CreateSession(r, nullptr, nullptr, [&](absl::StatusOr<SessionInfo> s) { p.set_value(s); });
    return p.get_future().get();
  }
  absl::StatusOr<SessionInfo> Append(const std::string& id, std::vector<int> ids) {
    AppendRequest r;
    r.session_id = id;
    r.input.kind = InputSpec::Kind::kTokens;
    r.input.tokens = std::move(ids);
    std::promise<absl::StatusOr<SessionInfo>> p;
    engine->AppendToSession(r, nullptr, nullptr, [&](absl::StatusOr<SessionInfo> s) { p.set_value(s); });
    return p.get_future().get();
  }
  absl::StatusOr<std::vector<int>> Generate(const std::string& id, int n, bool commit) {
    GenerateParams g;
    g.session_id = id;
    g.max_tokens = n;
    g.ignore_eos = true;
    g.commit = commit;
    std::vector<int> out;
    std::promise<absl::Status> p;
    StreamSink sink;
    sink.on_delta = [&](GenerateDelta d) { out.insert(out.end(), d.ids.begin(), d.ids.end()); };
    engine->Generate(g, nullptr, sink, [&](absl::StatusOr<GenerateSummary> s) { p.set_value(s.status()); });
    absl::Status st = p.get_future().get();
    if (!st.ok()) return st;
    return out;
  }
  absl::StatusOr<CacheInspection> Inspect(const std::string& id) {
    std::promise<absl::StatusOr<CacheInspection>> p;
    engine->InspectCache(Caller{}, id, true, [&](absl::StatusOr<CacheInspection> c) { p.set_value(c); });
    return p.get_future().get();
  }
  std::vector<SessionInfo> List() {
    std::vector<SessionInfo> out;
    engine->ListSessions(Caller{}, [&](absl::StatusOr<std::vector<SessionInfo>> l) { out = *l; });
    return out;
  }
  absl::StatusOr<SessionInfo> Fork(const std::string& id) {
    std::promise<absl::StatusOr<SessionInfo>> p;
    engine->ForkSession(Caller{}, id, std::nullopt, [&](absl::StatusOr<SessionInfo> s) { p.set_value(s); });
    return p.get_future().get();
  }
};

std::vector<std::vector<int64_t>> Positions(const CacheInspection& c) {
  std::vector<std::vector<int64_t>> out;
  for (const LayerCacheInfo& l : c.layers) {
    for (const GroupCache& g : l.groups) out.push_back(g.positions);
  }
  return out;
}

struct Snapshot {
  int64_t tokens = 0;
  std::vector<std::vector<int64_t>> positions;
  std::vector<int> greedy;
};

Snapshot Observe(Server& s, const std::string& id) {
  Snapshot snap;
  absl::StatusOr<CacheInspection> c = s.Inspect(id);
  EXPECT_THAT(c.status(), IsOk());
  if (!c.ok()) return snap;
  snap.tokens = c->session.tokens_seen;
  snap.positions = Positions(*c);
  absl::StatusOr<std::vector<int>> g = s.Generate(id, 8, false);
  EXPECT_THAT(g.status(), IsOk());
  if (g.ok()) snap.greedy = *g;
  return snap;
}

TEST(DurabilityTest, ARestartRestoresEverySessionExactly) {
  const std::string dir = echokv::testing::MakeTempDir("durability-restart");
  std::map<std::string, Snapshot> before;
  {
    CountingObserver obs;
    Server s;
    ASSERT_THAT(s.Start(dir, &obs), IsOk());
    for (compression::PolicyKind k : compression::AllPolicies()) {
      for (MemoryMode m : {MemoryMode::kTiered, MemoryMode::kEvict}) {
        absl::StatusOr<SessionInfo> a = s.Create(Prompt(45, static_cast<int>(k)), k, m);
        ASSERT_THAT(a.status(), IsOk());
        ASSERT_THAT(s.Append(a->id, Prompt(17, 3)).status(), IsOk());
        ASSERT_THAT(s.Generate(a->id, 5, /*commit=*/true).status(), IsOk());
        ASSERT_THAT(s.Append(a->id, Prompt(9, 4)).status(), IsOk());
        before[a->id] = Observe(s, a->id);
        EXPECT_EQ(before[a->id].tokens, 45 + 17 + 5 + 9);
      }
    }
    absl::StatusOr<SessionInfo> fork = s.Fork(before.begin()->first);
    ASSERT_THAT(fork.status(), IsOk());
    before[fork->id] = Observe(s, fork->id);
    EXPECT_EQ(obs.writes_failed.load(), 0);
    EXPECT_GE(obs.writes_ok.load(), 14 * 4 + 1);
  }
  CountingObserver obs;
  Server s;
  ASSERT_THAT(s.Start(dir, &obs), IsOk());
  EXPECT_EQ(obs.restored.load(), static_cast<int64_t>(before.size()));
  // Listed at once (metadata only), then identical on first use.
  std::vector<SessionInfo> listed = s.List();
  ASSERT_EQ(listed.size(), before.size());
  for (const SessionInfo& info : listed) {
    ASSERT_TRUE(before.count(info.id)) << info.id;
    EXPECT_EQ(info.tokens_seen, before[info.id].tokens);
  }
  for (const auto& [id, snap] : before) {
    Snapshot after = Observe(s, id);
    EXPECT_EQ(after.tokens, snap.tokens) << id;
    EXPECT_EQ(after.positions, snap.positions) << id;
    EXPECT_EQ(after.greedy, snap.greedy) << id;
  }
  // Restored sessions keep taking turns.
  ASSERT_THAT(s.Append(before.begin()->first, Prompt(5, 9)).status(), IsOk());
}

TEST(DurabilityTest, DamagedStateIsRefusedTheRestIsServed) {
  const std::string dir = echokv::testing::MakeTempDir("durability-damage");
  std::string good, bad;
  {
    Server s;
    ASSERT_THAT(s.Start(dir, nullptr), IsOk());
    good = s.Create(Prompt(40, 1), compression::PolicyKind::kEchoKv, MemoryMode::kTiered)->id;
    bad = s.Create(Prompt(40, 2), compression::PolicyKind::kEchoKv, MemoryMode::kTiered)->id;
  }
  // Flip one byte in the middle of the bad session's segment header.
  const fs::path seg = fs::path(dir) / "sessions" / bad / "seg-1.ekv";
  ASSERT_TRUE(fs::exists(seg)) << seg;
  std::string bytes = echokv::testing::ReadFileOrDie(seg.string());
  bytes[40] ^= 0x5a;
  echokv::testing::WriteFileOrDie(seg.string(), bytes);
  const std::string damaged = bytes;
  CountingObserver obs;
  Server s;
  ASSERT_THAT(s.Start(dir, &obs), IsOk());
  std::vector<SessionInfo> listed = s.List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].id, good);
  EXPECT_EQ(obs.errors["checksum"], 1);
  EXPECT_THAT(s.Generate(good, 4, false).status(), IsOk());
  EXPECT_THAT(s.Generate(bad, 4, false).status(), StatusIs(absl::StatusCode::kNotFound, ""));
  EXPECT_EQ(echokv::testing::ReadFileOrDie(seg.string()), damaged);  // left untouched
}

TEST(DurabilityTest, DiskFullRefusesTheTurnAndLeavesTheSessionAsItWas) {
  const std::string dir = echokv::testing::MakeTempDir("durability-full");
  state::PosixFileOps posix;
  state::FaultInjectingFileOps faults(&posix);
  Server s;
  ASSERT_THAT(s.Start(dir, nullptr, &faults), IsOk());
  absl::StatusOr<SessionInfo> a = s.Create(Prompt(40, 1), compression::PolicyKind::kSnapKv, MemoryMode::kTiered);
  ASSERT_THAT(a.status(), IsOk());
  const Snapshot before = Observe(s, a->id);
  faults.FailAt(state::FileOp::kWrite, 1, ENOSPC, /*partial=*/true);
  EXPECT_THAT(s.Append(a->id, Prompt(30, 5)).status(), StatusIs(absl::StatusCode::kResourceExhausted, ""));
  EXPECT_TRUE(faults.fired());
  faults.Disarm();
  const Snapshot after = Observe(s, a->id);
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_EQ(after.positions, before.positions);
  EXPECT_EQ(after.greedy, before.greedy);
  // The server keeps serving: the same append now succeeds, and survives a restart.
  ASSERT_THAT(s.Append(a->id, Prompt(30, 5)).status(), IsOk());
  const Snapshot appended = Observe(s, a->id);
  s.Stop();
  Server again;
  ASSERT_THAT(again.Start(dir, nullptr), IsOk());
  const Snapshot restored = Observe(again, a->id);
  EXPECT_EQ(restored.tokens, 70);
  EXPECT_EQ(restored.positions, appended.positions);
  EXPECT_EQ(restored.greedy, appended.greedy);
}

TEST(DurabilityTest, AnUnusableStateDirStopsTheStart) {
  const std::string dir = echokv::testing::MakeTempDir("durability-file");
  const std::string file = dir + "/not-a-dir";
  echokv::testing::WriteFileOrDie(file, "x");
  Server s;
  absl::Status st = s.Start(file, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("--state_dir"));
}

TEST(DurabilityTest, MaxColdBytesSpillsIdleSavedSessionsInsteadOfRefusing) {
  const std::string dir = echokv::testing::MakeTempDir("durability-spill");
  const int64_t per_token = Tiny().model->NewCache().FullEquivalentKvBytes(1);
  Server s;
  ASSERT_THAT(s.Start(dir, nullptr, nullptr, /*max_cold=*/100 * per_token), IsOk());
  absl::StatusOr<SessionInfo> a = s.Create(Prompt(60, 1), compression::PolicyKind::kSnapKv, MemoryMode::kTiered);
  ASSERT_THAT(a.status(), IsOk());
  const Snapshot first = Observe(s, a->id);
  // A second 60-token cold tier does not fit next to the first: the first is spilled.
  absl::StatusOr<SessionInfo> b = s.Create(Prompt(60, 2), compression::PolicyKind::kSnapKv, MemoryMode::kTiered);
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_LE(s.engine->Totals().cold_memory_bytes, 100 * per_token);
  // Using the first again reloads it (spilling the second) with identical results.
  const Snapshot reloaded = Observe(s, a->id);
  EXPECT_EQ(reloaded.positions, first.positions);
  EXPECT_EQ(reloaded.greedy, first.greedy);
  EXPECT_LE(s.engine->Totals().cold_memory_bytes, 100 * per_token);
}

}  // namespace
}  // namespace echokv::server
