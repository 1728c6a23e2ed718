// echokv-bench-prefill: where prefill time goes, per operation (Transformer::Forward's
// PrefillProfile: RoPE, norms, QKV, cache append, attention, output projection, MLP,
// LM head), at several context lengths, with prefill tok/s and the peak memory above
// the loaded model (which must grow O(L): the KV cache, not an L x L score matrix).
// Each context is prefilled `--repeats` times into a fresh cache; the fastest run is
// shown.
//
//   echokv-bench-prefill --random40m /tmp/echokv-m40 --contexts 512,2048,8192 --threads 1
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "common/blas_env.h"
#include "common/env.h"
#include "common/flag_names.h"
#include "common/logging.h"
#include "kernels/attention.h"
#include "model/transformer.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, random40m, "", "write (once) and use the random ~40M llama in this directory");
ABSL_FLAG(std::string, contexts, "512,2048,8192", "context lengths, comma-separated");
ABSL_FLAG(int, chunk, 256, "prefill chunk size");
ABSL_FLAG(int, threads, 0, "compute threads (0 = the default for this model)");
ABSL_FLAG(int, repeats, 3, "prefills per context (the fastest is shown)");

namespace {

// Resets VmHWM to the current RSS (Linux >= 4.0), so the next PeakRssBytes is this
// prefill's peak; false where the kernel does not allow it.
bool ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  return static_cast<bool>(f.flush());
}

}  // namespace

int main(int argc, char** argv) {
  echokv::ConfigureBlasWorkersOrReexec(argv);
  echokv::DashedFlagArgs dashed(argc, argv);
  absl::ParseCommandLine(dashed.argc(), dashed.argv());
  echokv::InitLogging(argv[0]);
  std::string dir;
  auto model = echokv::bench::LoadBenchModel(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_random40m),
                                             absl::GetFlag(FLAGS_threads), &dir);
  if (!model.ok()) return echokv::bench::ReportBenchError(model.status());
  const auto& cfg = (*model)->config();
  const auto trace = (*model)->pool_trace();
  std::vector<int> contexts;
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_contexts), ',')) {
    int context = 0;
    if (!absl::SimpleAtoi(c, &context) || context < 1 || context > cfg.max_position_embeddings) {
      std::fprintf(stderr, "error: --contexts entry '%s' must be in [1, %d]\n", std::string(c).c_str(),
                   cfg.max_position_embeddings);
      return 2;
    }
    contexts.push_back(context);
  }
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (repeats < 1) {
    std::fprintf(stderr, "error: --repeats must be >= 1\n");
    return 2;
  }
  std::printf("model %s: %d layers, hidden %d, %d/%d heads (d %d), vocab %d; %d threads; chunk %d; best of %d\n",
              dir.c_str(), cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
              cfg.vocab_size, trace.threads, absl::GetFlag(FLAGS_chunk), repeats);
  std::printf("%s; attention kernel %s\n", echokv::DescribeBlasSetup().c_str(),
              echokv::kernels::AttentionIsa().c_str());
  struct Row {
    const char* name;
    double echokv::model::PrefillProfile::*field;
  };
  const Row rows[] = {{"rope", &echokv::model::PrefillProfile::rope},
                      {"norms", &echokv::model::PrefillProfile::norms},
                      {"qkv gemm", &echokv::model::PrefillProfile::qkv},
                      {"kv append", &echokv::model::PrefillProfile::cache},
                      {"attention", &echokv::model::PrefillProfile::attention},
                      {"out proj", &echokv::model::PrefillProfile::out_proj},
                      {"mlp", &echokv::model::PrefillProfile::mlp},
                      {"lm head", &echokv::model::PrefillProfile::lm_head},
                      {"embed", &echokv::model::PrefillProfile::embed}};
  std::vector<echokv::model::PrefillProfile> best(contexts.size());
  std::vector<double> wall(contexts.size()), peak_mib(contexts.size(), -1), kv_mib(contexts.size()),
      load(contexts.size());
  for (size_t ci = 0; ci < contexts.size(); ++ci) {
    const std::vector<int> ids = echokv::bench::BenchContext(contexts[ci], cfg.vocab_size);
    wall[ci] = 1e30;
    for (int r = 0; r < repeats; ++r) {
      echokv::model::KvCache cache = (*model)->NewCache();
      echokv::model::PrefillProfile prof;
      echokv::model::ForwardOptions fo;
      fo.chunk_size = absl::GetFlag(FLAGS_chunk);
      fo.profile = &prof;
      const int64_t rss0 = echokv::bench::CurrentRssBytes();
      const bool reset = ResetPeakRss();
      const auto t0 = std::chrono::steady_clock::now();
      auto pre = (*model)->Forward(ids, &cache, fo);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!pre.ok()) {
        std::fprintf(stderr, "error: %s\n", pre.status().ToString().c_str());
        return 1;
      }
      if (reset) {
        peak_mib[ci] = std::max(peak_mib[ci], (echokv::bench::PeakRssBytes() - rss0) / 1048576.0);
      }
      kv_mib[ci] = cache.KvBytes() / 1048576.0;
      if (s < wall[ci]) {
        wall[ci] = s;
        best[ci] = prof;
      }
    }
    load[ci] = echokv::bench::LoadAverage1();
    std::fprintf(stderr, "context %d done (%.3f s)\n", contexts[ci], wall[ci]);
  }
  std::printf("%-12s", "op (ms, %)");
  for (int c : contexts) std::printf("  %18s", ("L=" + std::to_string(c)).c_str());
  std::printf("\n");
  for (const Row& row : rows) {
    std::printf("%-12s", row.name);
    for (size_t ci = 0; ci < contexts.size(); ++ci) {
      const double ms = best[ci].*row.field * 1e3;
      std::printf("  %10.1f (%5.1f%%)", ms, 100.0 * ms / (best[ci].Total() * 1e3));
    }
    std::printf("\n");
  }
  // One row of figures per context; a negative value (peak memory where the kernel does
  // not let the bench reset VmHWM) prints as n/a.
  auto line = [&](const char* label, const char* format, auto value) {
    std::printf("%-12s", label);
    for (size_t ci = 0; ci < contexts.size(); ++ci) {
      char buf[32] = "n/a";
      const double v = value(ci);
      if (v >= 0) std::snprintf(buf, sizeof buf, format, v);
      std::printf("  %18s", buf);
    }
    std::printf("\n");
  };
  line("total ms", "%.1f", [&](size_t ci) { return best[ci].Total() * 1e3; });
  line("wall ms", "%.1f", [&](size_t ci) { return wall[ci] * 1e3; });
  line("tok/s", "%.1f", [&](size_t ci) { return contexts[ci] / wall[ci]; });
  line("KV MiB", "%.1f", [&](size_t ci) { return kv_mib[ci]; });
  line("peak +MiB", "%.1f", [&](size_t ci) { return peak_mib[ci]; });
  line("load1", "%.2f", [&](size_t ci) { return load[ci]; });
  return 0;
}
