// Per-phase wall time of EchoKV vs LAQ vs SnapKV against prefill, side by side in one
// run, plus the peak RSS added during compression vs the full KV size.
//
//   echokv-bench-compression --model /work/shared/models/stories260K --contexts 450
//       --budget 128 --lookahead 8 --workspace 128
//   echokv-bench-compression --random40m /tmp/echokv-m40 --contexts 2048,8192
//       --budget 128 --lookahead 8 --workspace 1024
//
// The context is prefilled once (keeping what every policy needs); each policy then
// compresses the same context. "compress/prefill" is (compression time excluding
// prefill) / (prefill time); "vs LAQ" is that policy's compression time / LAQ's.
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/blas_env.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "common/flag_names.h"
#include "common/logging.h"
#include "compression/config.h"
#include "compression/policy.h"
#include "compression/transformer_decoder.h"
#include "model/transformer.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, random40m, "", "write (once) and use the random ~40M llama in this directory");
ABSL_FLAG(std::string, contexts, "2048", "context lengths, comma-separated");
ABSL_FLAG(std::string, policies, "echokv,laq,snapkv", "policies to time");
ABSL_FLAG(int, budget, 128, "B");
ABSL_FLAG(int, lookahead, 8, "T");
ABSL_FLAG(int, workspace, 1024, "EchoKV workspace B1 (LAQ keeps its default B1 = B)");
ABSL_FLAG(int, repeats, 3, "compression runs per policy (the median is reported)");
ABSL_FLAG(int, threads, 0, "LibTorch threads (0 = all cores)");

namespace {

using Clock = std::chrono::steady_clock;
namespace cmp = echokv::compression;

// Resets the kernel's peak-RSS mark (VmHWM) of this process; false if unsupported.
bool ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  return static_cast<bool>(f);
}

}  // namespace

int main(int argc, char** argv) {
  echokv::ConfigureBlasWorkersOrReexec(argv);
  echokv::DashedFlagArgs dashed(argc, argv);
  absl::ParseCommandLine(dashed.argc(), dashed.argv());
  FLAGS_minloglevel = 1;
  echokv::InitLogging(argv[0]);
  std::string dir;
  auto model_or = echokv::bench::LoadBenchModel(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_random40m),
                                                absl::GetFlag(FLAGS_threads), &dir);
  if (!model_or.ok()) return echokv::bench::ReportBenchError(model_or.status());
  const auto& model = **model_or;
  const auto& mc = model.config();
  std::vector<cmp::PolicyKind> policies;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_policies), ',')) {
    auto k = cmp::ParsePolicyKind(name);
    if (!k.ok()) {
      std::fprintf(stderr, "error: %s\n", k.status().ToString().c_str());
      return 2;
    }
    policies.push_back(*k);
  }
  std::printf("model %s: %d layers, hidden %d, %d/%d heads, vocab %d; LibTorch threads %d\n", dir.c_str(),
              mc.num_layers, mc.hidden_size, mc.num_heads, mc.num_kv_heads, mc.vocab_size, at::get_num_threads());
  for (absl::string_view cs : absl::StrSplit(absl::GetFlag(FLAGS_contexts), ',')) {
    int L = 0;
    if (!absl::SimpleAtoi(cs, &L) || L < 2) {
      std::fprintf(stderr, "error: bad --contexts entry\n");
      return 2;
    }
    const std::vector<int> ids = echokv::bench::BenchContext(L, mc.vocab_size);
    echokv::model::KvCache cache = model.NewCache();
    echokv::model::ForwardOptions fo;
    fo.return_anchor_queries = true;
    fo.keep_last_queries = 32;  // SnapKV's window; LAQ uses the last 8 of them
    const auto t0 = Clock::now();
    auto pre = model.Forward(ids, &cache, fo);
    const double prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!pre.ok()) {
      std::fprintf(stderr, "error: %s\n", pre.status().ToString().c_str());
      return 1;
    }
    const double full_kv_mb = cache.KvBytes() / 1048576.0;
    std::printf("\nL = %d: prefill %.3f s (%.0f tok/s); full KV %.1f MiB; B = %d, T = %d, EchoKV B1 = %d\n", L,
                prefill_s, L / prefill_s, full_kv_mb, absl::GetFlag(FLAGS_budget), absl::GetFlag(FLAGS_lookahead),
                absl::GetFlag(FLAGS_workspace));
    std::printf("%-8s %9s %9s %9s %9s %9s %9s %10s %12s %8s %14s\n", "policy", "bootstrap", "round1", "repair",
                "round2", "final", "select", "total s", "compr/prefill", "vs LAQ", "peak +RSS MiB");
    std::vector<double> totals(policies.size(), 0);
    std::vector<std::string> rows(policies.size());
    double laq_total = 0;
    for (size_t pi = 0; pi < policies.size(); ++pi) {
      cmp::CompressionConfig cfg;
      cfg.policy = policies[pi];
      cfg.budget = absl::GetFlag(FLAGS_budget);
      cfg.lookahead = absl::GetFlag(FLAGS_lookahead);
      if (cfg.policy == cmp::PolicyKind::kEchoKv) cfg.workspace = absl::GetFlag(FLAGS_workspace);
      std::vector<cmp::CompressionReport> reports;
      double peak_extra_mb = 0;
      for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
        cmp::TransformerDecoder decoder(&model);
        cmp::CompressionInput in;
        in.context = &cache;
        in.anchor_queries = pre->anchor_queries;
        in.last_queries = pre->queries;
        in.last_query_positions = pre->query_positions;
        in.last_logits = pre->logits;
        in.rope_inv_freq = model.RopeInvFreq();
        in.decoder = &decoder;
        const int64_t rss_before = echokv::bench::CurrentRssBytes();
        const bool reset = ResetPeakRss();
        auto r = cmp::Compress(cfg, in);
        if (!r.ok()) {
          std::fprintf(stderr, "error: %s\n", r.status().ToString().c_str());
          return 1;
        }
        if (reset) peak_extra_mb = std::max(peak_extra_mb, (echokv::bench::PeakRssBytes() - rss_before) / 1048576.0);
        reports.push_back(r->report);
      }
      std::sort(reports.begin(), reports.end(), [](const auto& a, const auto& b) {
        return a.TotalSeconds(false) < b.TotalSeconds(false);
      });
      const cmp::CompressionReport& m = reports[reports.size() / 2];
      totals[pi] = m.TotalSeconds(false);
      if (cfg.policy == cmp::PolicyKind::kLaq) laq_total = totals[pi];
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%-8s %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %10.4f %11.2f%% ",
                    std::string(cmp::PolicyName(cfg.policy)).c_str(), m.SecondsOf("bootstrap"), m.SecondsOf("round1"),
                    m.SecondsOf("repair"), m.SecondsOf("round2"), m.SecondsOf("final"), m.SecondsOf("select"),
                    totals[pi], 100.0 * totals[pi] / prefill_s);
      rows[pi] = buf;
      char tail[64];
      std::snprintf(tail, sizeof(tail), " %14.1f", peak_extra_mb);
      rows[pi] += std::string("%VSLAQ%") + tail;
    }
    for (size_t pi = 0; pi < policies.size(); ++pi) {
      char ratio[32];
      if (laq_total > 0) {
        std::snprintf(ratio, sizeof(ratio), "%7.2fx", totals[pi] / laq_total);
      } else {
        std::snprintf(ratio, sizeof(ratio), "%8s", "-");
      }
      std::string row = rows[pi];
      row.replace(row.find("%VSLAQ%"), 7, ratio);
      std::printf("%s\n", row.c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}
