// echokv-bench-memory: what session memory (docs/SESSION_MEMORY.md §6) costs, measured through
// the server's engine (Engine::CreateWithModel over the random ~40M llama), so every
// figure is the code path a request takes:
//
//  1. one turn of --turn tokens (AppendToSession) on a session holding L tokens, for
//     L in --histories: `tiered` (prefill against the exact cold history + re-selection
//     over all of it), `evict` (prefill against the B retained entries + re-selection
//     over B + turn), and the naive alternative without a cold tier: re-prefilling the
//     whole history plus the turn and compressing it (a one-shot CreateSession of
//     L + turn tokens). Wall time from the request to its answer, the minimum of
//     --repeats turns (each on a session of L, L + turn, ... tokens);
//  2. state writes (--state_dir, tiered sessions): bytes written / write seconds (the
//     engine's own OnStateWrite timing) while --sessions sessions of --session_tokens
//     tokens are created, and the acknowledged latency of a --turn-token append with
//     --fsync always vs none (median of --repeats appends on a session of --fsync_history);
//  3. restart: Engine::CreateWithModel on a state dir holding --sessions saved sessions
//     (minus the same on an empty state dir) and a ListSessions that shows them.
//
//   flock /work/.bench.lock build/bin/echokv-bench-memory --random40m /tmp/echokv-m40 --threads 2
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "common/blas_env.h"
#include "common/logging.h"
#include "compression/config.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "server/engine/clock.h"
#include "server/engine/engine.h"
#include "server/engine/stats.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, random40m, "", "write (once) and use the random ~40M llama in this directory");
ABSL_FLAG(std::string, histories, "1024,2048,4096,8192", "history lengths L, comma-separated");
ABSL_FLAG(int, turn, 256, "tokens per timed turn");
ABSL_FLAG(std::string, policy, "echokv", "the sessions' policy");
ABSL_FLAG(int, budget, 128, "B");
ABSL_FLAG(int, workspace, 0, "EchoKV workspace B1 (0 = its default)");
ABSL_FLAG(int, repeats, 3, "timed turns per (L, mode) (minimum reported) and fsync appends (median)");
ABSL_FLAG(int, sessions, 100, "saved sessions for the write-throughput and restart figures");
ABSL_FLAG(int, session_tokens, 256, "tokens of each saved session");
ABSL_FLAG(int, fsync_history, 1024, "tokens of the session the fsync appends go to");
ABSL_FLAG(std::string, state_dir, "", "scratch directory for the state dirs (default: a new one under /tmp)");
ABSL_FLAG(bool, turns_only, false, "measure the turns only (no state writes, no restart)");
ABSL_FLAG(bool, phases, true, "print each timed turn's phase times (the compression report)");
ABSL_FLAG(int, threads, 0, "compute threads (0 = default)");

namespace {

using echokv::server::Engine;
using echokv::server::MemoryMode;
using echokv::server::SessionInfo;
namespace fs = std::filesystem;

// The engine wants a tokenizer; the bench feeds token ids only.
class IdsOnlyTokenizer : public echokv::model::Tokenizer {
 public:
  explicit IdsOnlyTokenizer(int vocab) : vocab_(vocab) {}
  absl::StatusOr<std::vector<int>> Encode(absl::string_view, const echokv::model::EncodeOptions&) const override {
    return absl::UnimplementedError("echokv-bench-memory feeds token ids");
  }
  absl::StatusOr<std::string> Decode(absl::Span<const int> ids, const echokv::model::DecodeOptions&) const override {
    return std::string(ids.size(), '.');
  }
  std::string IdToPiece(int) const override { return "."; }
  int vocab_size() const override { return vocab_; }
  std::optional<int> bos_id() const override { return 1; }
  std::vector<int> eos_ids() const override { return {2}; }
  bool IsSpecial(int id) const override { return id < 3; }
  absl::string_view kind() const override { return "ids-only"; }

 private:
  int vocab_;
};

class WriteObserver : public echokv::server::EngineObserver {
 public:
  void OnCompression(const echokv::server::CompressionStats&) override {}
  void OnFirstToken(double) override {}
  void OnInterToken(double) override {}
  void OnGeneratedTokens(int64_t) override {}
  void OnSessionCreated() override {}
  void OnSessionExpired() override {}
  void OnSessionRejected(absl::string_view) override {}
  void OnGauges(const echokv::server::EngineGauges&) override {}
  void OnStateWrite(double seconds, bool ok) override {
    std::lock_guard<std::mutex> l(mu);
    write_seconds += seconds;
    writes += ok ? 1 : 0;
    failed += ok ? 0 : 1;
  }
  std::mutex mu;
  double write_seconds = 0;
  int writes = 0, failed = 0;
};

struct Bench {
  std::shared_ptr<const echokv::model::Transformer> model;
  std::shared_ptr<const echokv::model::Tokenizer> tokenizer;
  std::string model_dir;
  echokv::compression::CompressionConfig config;
};

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

absl::StatusOr<std::unique_ptr<Engine>> Start(const Bench& b, const std::string& state_dir, bool fsync_always,
                                              WriteObserver* obs) {
  echokv::server::EngineConfig c;
  c.model_dir = b.model_dir;
  c.state_dir = state_dir;
  c.fsync_always = fsync_always;
  c.limits.max_sessions = 1024;
  c.limits.max_cold_bytes = int64_t{16} << 30;
  c.limits.max_kv_bytes = int64_t{16} << 30;
  return Engine::CreateWithModel(c, b.model, b.tokenizer, std::nullopt, obs, echokv::server::RealClock());
}

// Ids of a session's history: the bench's fixed pattern, offset so sessions differ.
std::vector<int> Ids(int n, int salt, int vocab) {
  std::vector<int> ids = echokv::bench::BenchContext(n + salt, vocab);
  ids.erase(ids.begin() + 1, ids.begin() + 1 + salt);  // keep BOS first
  return ids;
}

// "prefill 0.41 bootstrap 0.02 ..." of a turn's report (the engine's own phase clock).
std::string Phases(const echokv::compression::CompressionReport& r) {
  std::string out;
  for (const auto& p : r.phases) absl::StrAppend(&out, out.empty() ? "" : ", ", p.phase, " ", absl::StrFormat("%.3f", p.seconds));
  return out;
}

absl::StatusOr<SessionInfo> Create(Engine& e, const Bench& b, std::vector<int> ids, MemoryMode mode) {
  echokv::server::CreateRequest r;
  r.input.kind = echokv::server::InputSpec::Kind::kTokens;
  r.input.tokens = std::move(ids);
  r.config = b.config;
  r.memory = mode;
  std::promise<absl::StatusOr<SessionInfo>> p;
  e.CreateSession(r, nullptr, nullptr, [&](absl::StatusOr<SessionInfo> s) { p.set_value(std::move(s)); });
  return p.get_future().get();
}

absl::StatusOr<SessionInfo> Append(Engine& e, const std::string& id, std::vector<int> ids) {
  echokv::server::AppendRequest r;
  r.session_id = id;
  r.input.kind = echokv::server::InputSpec::Kind::kTokens;
  r.input.tokens = std::move(ids);
  std::promise<absl::StatusOr<SessionInfo>> p;
  e.AppendToSession(r, nullptr, nullptr, [&](absl::StatusOr<SessionInfo> s) { p.set_value(std::move(s)); });
  return p.get_future().get();
}

absl::Status Delete(Engine& e, const std::string& id) {
  std::promise<absl::Status> p;
  e.DeleteSession(echokv::server::Caller{}, id, [&](absl::StatusOr<int64_t> s) { p.set_value(s.status()); });
  return p.get_future().get();
}

absl::StatusOr<std::vector<SessionInfo>> List(Engine& e) {
  std::promise<absl::StatusOr<std::vector<SessionInfo>>> p;
  e.ListSessions(echokv::server::Caller{}, [&](absl::StatusOr<std::vector<SessionInfo>> l) { p.set_value(l); });
  return p.get_future().get();
}

int64_t DirBytes(const std::string& dir) {
  int64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) n += static_cast<int64_t>(e.file_size());
  }
  return n;
}

#define BENCH_ASSIGN(lhs, expr)                                               \
  auto lhs##_or = (expr);                                                     \
  if (!lhs##_or.ok()) return echokv::bench::ReportBenchError(lhs##_or.status()); \
  auto lhs = std::move(*lhs##_or)

int Run() {
  Bench b;
  std::string dir;
  BENCH_ASSIGN(model, echokv::bench::LoadBenchModel(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_random40m),
                                                    absl::GetFlag(FLAGS_threads), &dir));
  b.model = std::shared_ptr<const echokv::model::Transformer>(std::move(model));
  b.model_dir = dir;
  const int vocab = b.model->config().vocab_size;
  b.tokenizer = std::make_shared<IdsOnlyTokenizer>(vocab);
  BENCH_ASSIGN(policy, echokv::compression::ParsePolicyKind(absl::GetFlag(FLAGS_policy)));
  b.config.policy = policy;
  b.config.budget = absl::GetFlag(FLAGS_budget);
  if (absl::GetFlag(FLAGS_workspace) > 0) b.config.workspace = absl::GetFlag(FLAGS_workspace);
  std::vector<int> histories;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_histories), ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(s, &v) || v < 1) {
      return echokv::bench::ReportBenchError(absl::InvalidArgumentError(absl::StrCat("histories: bad value ", s)));
    }
    histories.push_back(v);
  }
  const int turn = absl::GetFlag(FLAGS_turn);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  const auto& cfg = b.model->config();
  std::printf("model %s: %d layers, hidden %d, %d/%d heads, vocab %d, max positions %d; policy %s B=%d; load1 %.2f\n",
              dir.c_str(), cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
              cfg.vocab_size, cfg.max_position_embeddings, absl::GetFlag(FLAGS_policy).c_str(), b.config.budget,
              echokv::bench::LoadAverage1());

  // ---- 1. one turn at history L ----
  std::printf("\n%d-token turn at history L (s; tiered and evict: min of %d turns; naive: one-shot create of L+%d)\n",
              turn, repeats, turn);
  std::printf("%-8s %10s %10s %10s %14s %14s %8s\n", "L", "tiered", "evict", "naive", "tiered/evict",
              "naive/tiered", "load1");
  {
    WriteObserver obs;
    BENCH_ASSIGN(engine, Start(b, "", true, &obs));
    for (int L : histories) {
      double best[2] = {1e30, 1e30};
      std::string phases[3];
      for (int m = 0; m < 2; ++m) {
        const MemoryMode mode = m == 0 ? MemoryMode::kTiered : MemoryMode::kEvict;
        BENCH_ASSIGN(s, Create(*engine, b, Ids(L, 0, vocab), mode));
        for (int r = 0; r < repeats; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          BENCH_ASSIGN(a, Append(*engine, s.id, Ids(turn, 11 + r, vocab)));
          const double t = Seconds(t0);
          if (t < best[m]) phases[m] = Phases(a.last_report);
          best[m] = std::min(best[m], t);
        }
        if (absl::Status d = Delete(*engine, s.id); !d.ok()) return echokv::bench::ReportBenchError(d);
      }
      const auto t0 = std::chrono::steady_clock::now();
      BENCH_ASSIGN(n, Create(*engine, b, Ids(L + turn, 0, vocab), MemoryMode::kEvict));
      const double naive = Seconds(t0);
      phases[2] = Phases(n.last_report);
      if (absl::Status d = Delete(*engine, n.id); !d.ok()) return echokv::bench::ReportBenchError(d);
      std::printf("%-8d %10.3f %10.3f %10.3f %13.2fx %13.1fx %8.2f\n", L, best[0], best[1], naive, best[0] / best[1],
                  naive / best[0], echokv::bench::LoadAverage1());
      if (absl::GetFlag(FLAGS_phases)) {
        for (int m = 0; m < 3; ++m) {
          std::printf("    %-6s phases (s): %s\n", m == 0 ? "tiered" : m == 1 ? "evict" : "naive", phases[m].c_str());
        }
      }
      std::fflush(stdout);
    }
  }

  if (absl::GetFlag(FLAGS_turns_only)) return 0;

  // ---- 2. state writes ----
  std::string scratch = absl::GetFlag(FLAGS_state_dir);
  if (scratch.empty()) {
    char tmpl[] = "/tmp/echokv-bench-memory.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return echokv::bench::ReportBenchError(absl::InternalError("mkdtemp failed"));
    scratch = tmpl;
  }
  const std::string saved_dir = scratch + "/saved";
  const int sessions = absl::GetFlag(FLAGS_sessions);
  const int session_tokens = absl::GetFlag(FLAGS_session_tokens);
  std::printf("\nstate writes (tiered sessions, %s)\n", scratch.c_str());
  {
    WriteObserver obs;
    BENCH_ASSIGN(engine, Start(b, saved_dir, /*fsync_always=*/true, &obs));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < sessions; ++i) {
      BENCH_ASSIGN(s, Create(*engine, b, Ids(session_tokens, i, vocab), MemoryMode::kTiered));
    }
    const double wall = Seconds(t0);
    const int64_t bytes = DirBytes(saved_dir);
    std::printf("create %d sessions of %d tokens, --fsync always: %.1f s wall; %d writes, %.1f MB on disk, "
                "%.3f s writing -> %.1f MB/s\n",
                sessions, session_tokens, wall, obs.writes, bytes / 1e6, obs.write_seconds,
                bytes / 1e6 / std::max(obs.write_seconds, 1e-9));
  }
  for (bool always : {true, false}) {
    WriteObserver obs;
    const std::string d = scratch + (always ? "/fsync-always" : "/fsync-none");
    BENCH_ASSIGN(engine, Start(b, d, always, &obs));
    BENCH_ASSIGN(s, Create(*engine, b, Ids(absl::GetFlag(FLAGS_fsync_history), 3, vocab), MemoryMode::kTiered));
    const double w0 = obs.write_seconds;
    const int64_t bytes0 = DirBytes(d);
    std::vector<double> t;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      BENCH_ASSIGN(a, Append(*engine, s.id, Ids(turn, 21 + r, vocab)));
      t.push_back(Seconds(t0));
    }
    std::sort(t.begin(), t.end());
    const int64_t appended = DirBytes(d) - bytes0;
    std::printf("--fsync %-6s %d-token append on %d tokens: median %.3f s (min %.3f, max %.3f); writing %.3f s "
                "for %.1f MB -> %.1f MB/s\n",
                always ? "always" : "none", turn, absl::GetFlag(FLAGS_fsync_history), t[t.size() / 2], t.front(),
                t.back(), obs.write_seconds - w0, appended / 1e6,
                appended / 1e6 / std::max(obs.write_seconds - w0, 1e-9));
    std::fflush(stdout);
  }

  // ---- 3. restart ----
  {
    WriteObserver obs;
    const std::string empty = scratch + "/empty";
    // Start to a ListSessions answer: restored sessions are listed at once (their
    // tensors load on first use).
    double base = 0;
    {
      const auto t0 = std::chrono::steady_clock::now();
      BENCH_ASSIGN(engine, Start(b, empty, true, &obs));
      BENCH_ASSIGN(none, List(*engine));
      base = Seconds(t0);
    }
    const auto t1 = std::chrono::steady_clock::now();
    BENCH_ASSIGN(engine, Start(b, saved_dir, true, &obs));
    BENCH_ASSIGN(listed, List(*engine));
    const double restart = Seconds(t1);
    if (listed.empty()) return echokv::bench::ReportBenchError(absl::InternalError("no session was restored"));
    // Restored sessions load their tensors on first use: time one turn on one of them.
    const auto t2 = std::chrono::steady_clock::now();
    BENCH_ASSIGN(a, Append(*engine, listed.front().id, Ids(turn, 5, vocab)));
    const double first = Seconds(t2);
    std::printf("\nrestart on %d saved sessions: engine start + ListSessions %.3f s (empty state dir %.3f s, "
                "difference %.3f s); "
                "ListSessions shows %zu; first %d-token turn on a restored session %.3f s\n",
                sessions, restart, base, restart - base, listed.size(), turn, first);
  }
  std::printf("load1 at the end %.2f\n", echokv::bench::LoadAverage1());
  std::error_code ec;
  if (absl::GetFlag(FLAGS_state_dir).empty()) fs::remove_all(scratch, ec);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  echokv::ConfigureBlasWorkersOrReexec(argv);
  absl::ParseCommandLine(argc, argv);
  echokv::InitLogging(argv[0]);
  return Run();
}
