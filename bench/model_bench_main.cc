// Prefill and decode speed of echokv's transformer, side by side with llama2.c's run.c
// forward pass (bench/llama2c_ref.cc) built per llama2.c's Makefile recipes `runomp`
// (the headline: -Ofast -fopenmp -march=native, same thread count as echokv), `run`
// (-O3) and `runfast` (-Ofast), on the same weights and context. The baselines are
// found next to this binary unless given.
//
//   echokv-bench-model --model /work/shared/models/stories260K --contexts 512,2048 --decode 256
//   echokv-bench-model --random40m /tmp/echokv-m40 --contexts 512,2048 --decode 64
#include <ATen/Parallel.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/blas_env.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/roofline.h"
#include "common/env.h"
#include "common/flag_names.h"
#include "common/logging.h"
#include "model/sampler.h"
#include "model/transformer.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, random40m, "", "write (once) and use the random ~40M llama in this directory");
ABSL_FLAG(std::string, contexts, "512,2048", "context lengths, comma-separated");
ABSL_FLAG(int, decode, 64, "tokens to decode after each context");
ABSL_FLAG(int, chunk, 256, "prefill chunk size");
ABSL_FLAG(int, threads, 0, "LibTorch threads (0 = all cores)");
ABSL_FLAG(std::string, batches, "",
          "also decode this many streams together (Transformer::DecodeBatch, as the server's engine step), "
          "comma-separated, each after a 256-token context; prints tok/s and dense GFLOP/s");
ABSL_FLAG(bool, roofline, false,
          "with --batches: measure the GEMM peak and the read bandwidth first (bench/roofline.h) and print each "
          "step's bytes read and the GFLOP/s no step can exceed");
ABSL_FLAG(std::string, llama2c_runomp, "auto",
          "echokv-bench-llama2c-runomp (llama2.c `make runomp`: -Ofast -fopenmp -march=native), the headline "
          "baseline; auto = next to this binary, empty = skip");
ABSL_FLAG(std::string, llama2c_run, "auto", "echokv-bench-llama2c-run (llama2.c `make run`: -O3, one thread)");
ABSL_FLAG(std::string, llama2c_runfast, "auto",
          "echokv-bench-llama2c-runfast (llama2.c `make runfast`: -Ofast, one thread)");

namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Runs the C reference and returns its decode tokens/s (0 on failure).
double RunLlama2c(const std::string& bin, const std::string& dir, int context, int decode, int threads) {
  std::string cmd = "OMP_NUM_THREADS=" + std::to_string(threads) + " " + bin + " --model '" + dir + "' --context " + std::to_string(context) + " --decode " +
                    std::to_string(decode) + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return 0;
  char line[4096];
  double decode_tps = 0;
  while (fgets(line, sizeof(line), p) != nullptr) {
    std::string s(line);
    auto at = s.find("decode ");
    if (s.rfind("llama2c-style", 0) == 0 && at != std::string::npos) decode_tps = std::atof(s.c_str() + at + 7);
  }
  pclose(p);
  return decode_tps;
}

// A baseline flag's binary: "auto" is the one next to this binary (if it exists).
std::string BaselinePath(const std::string& flag, const std::string& recipe) {
  if (flag != "auto") return flag;
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, static_cast<size_t>(n));
  path = path.substr(0, path.rfind('/')) + "/echokv-bench-llama2c-" + recipe;
  return access(path.c_str(), X_OK) == 0 ? path : "";
}

// The 1-minute load average: these figures are only as good as the machine was idle.
std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  return in >> one ? one : "?";
}

}  // namespace

// N streams decoded together for `steps` steps: each starts from its own copy of one
// 256-token prefill and feeds back its own greedy token (so rows differ after step 1).
// FLOPs are the dense products (2 x multiply-adds of QKV, output, MLP and LM head).
// With `roofline`: the bytes a step reads (every weight once, float32, and every row's
// keys and values) and the GFLOP/s that bytes and FLOPs allow on this machine.
int BatchedDecode(const echokv::model::Transformer& model, const std::string& batches, int steps,
                  const std::optional<echokv::bench::Roofline>& roofline) {
  if (batches.empty()) return 0;
  const auto& c = model.config();
  const double D = c.hidden_size, Hd = static_cast<double>(c.num_heads) * c.head_dim,
               Gd = static_cast<double>(c.num_kv_heads) * c.head_dim;
  const double flops = 2.0 * (c.num_layers * (D * (Hd + 2 * Gd) + Hd * D + 3 * D * c.intermediate_size) +
                              D * c.vocab_size);
  const double weight_bytes = flops / 2 * sizeof(float);  // one multiply-add per weight
  std::printf("\nbatched decode: N streams per step (DecodeBatch; N = 1 is Decode), %d steps after a 256-token "
              "context, %.1f MFLOP per token\n",
              steps, flops / 1e6);
  if (roofline.has_value()) {
    std::printf("roofline (%d threads): GEMM peak %.1f GFLOP/s (2048^3 OpenBLAS product), read %.1f GB/s (160 MiB "
                "on huge pages); bound = FLOP per step / max(FLOP / peak, bytes read / bandwidth), bytes = weights "
                "%.1f MB + every row's keys and values, from memory (a step whose bytes stay in cache can pass "
                "it)\n",
                roofline->threads, roofline->peak_gflops, roofline->read_gbs, weight_bytes / 1e6);
    std::printf("%-8s %14s %12s %10s %12s %12s %10s %10s %6s\n", "streams", "tok/s (all)", "step ms", "GFLOP/s",
                "MB/step", "bound GF/s", "% peak", "% bound", "load1");
  } else {
    std::printf("%-8s %14s %12s %10s %6s\n", "streams", "tok/s (all)", "step ms", "GFLOP/s", "load1");
  }
  echokv::model::KvCache base = model.NewCache();
  auto pre = model.Forward(echokv::bench::BenchContext(256, c.vocab_size), &base, echokv::model::ForwardOptions());
  if (!pre.ok()) return echokv::bench::ReportBenchError(pre.status());
  const int first = echokv::model::Argmax(absl::MakeConstSpan(pre->logits.data_ptr<float>(), pre->logits.numel()));
  for (absl::string_view b : absl::StrSplit(batches, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(b, &n) || n < 1) {
      std::fprintf(stderr, "error: bad --batches entry '%s'\n", std::string(b).c_str());
      return 2;
    }
    std::vector<echokv::model::KvCache> caches(n, base);
    std::vector<echokv::model::DecodeRow> rows(n);
    for (int i = 0; i < n; ++i) rows[i] = {(first + i) % c.vocab_size, &caches[i], false};
    double kv_bytes = 0;  // summed over the steps
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) {
      if (roofline.has_value()) {
        for (const echokv::model::KvCache& cache : caches) {
          for (int l = 0; l < c.num_layers; ++l) kv_bytes += (cache.size(l) + 1) * Gd * 2 * sizeof(float);
        }
      }
      auto out = model.DecodeBatch(rows);
      if (!out.ok()) return echokv::bench::ReportBenchError(out.status());
      for (int i = 0; i < n; ++i) {
        const at::Tensor& l = (*out)[i].logits;
        rows[i].token = echokv::model::Argmax(absl::MakeConstSpan(l.data_ptr<float>(), l.numel()));
      }
    }
    const double sec = Seconds(t0, std::chrono::steady_clock::now());
    const double gflops = flops * n * steps / sec / 1e9;
    if (roofline.has_value()) {
      const double bytes = weight_bytes + kv_bytes / steps;  // per step
      const double bound = echokv::bench::BoundGflops(flops * n, bytes, *roofline);
      std::printf("%-8d %14.1f %12.3f %10.1f %12.1f %12.1f %10.1f %10.1f %6s\n", n, n * steps / sec,
                  1e3 * sec / steps, gflops, bytes / 1e6, bound, 100 * gflops / roofline->peak_gflops,
                  100 * gflops / bound, LoadAverage().c_str());
    } else {
      std::printf("%-8d %14.1f %12.3f %10.1f %6s\n", n, n * steps / sec, 1e3 * sec / steps, gflops,
                  LoadAverage().c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

int main(int argc, char** argv) {
  echokv::ConfigureBlasWorkersOrReexec(argv);
  echokv::DashedFlagArgs dashed(argc, argv);
  absl::ParseCommandLine(dashed.argc(), dashed.argv());
  echokv::InitLogging(argv[0]);
  std::optional<echokv::bench::Roofline> roofline;
  if (absl::GetFlag(FLAGS_roofline) && !absl::GetFlag(FLAGS_batches).empty()) {
    // Before the model exists: its pool switching remembers what it last set.
    const int t = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : echokv::DefaultThreadCount();
    roofline = echokv::bench::MeasureRoofline(t, 2.0);
  }
  std::string dir;
  auto model = echokv::bench::LoadBenchModel(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_random40m),
                                             absl::GetFlag(FLAGS_threads), &dir);
  if (!model.ok()) return echokv::bench::ReportBenchError(model.status());
  const auto& cfg = (*model)->config();
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : echokv::DefaultThreadCount();
  std::printf("model %s: %d layers, hidden %d, %d/%d heads, vocab %d; %d threads\n",
              dir.c_str(), cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size, threads);
  struct Baseline {
    const char* label;
    std::string bin;
  };
  const Baseline baselines[] = {
      {"runomp", BaselinePath(absl::GetFlag(FLAGS_llama2c_runomp), "runomp")},
      {"run", BaselinePath(absl::GetFlag(FLAGS_llama2c_run), "run")},
      {"runfast", BaselinePath(absl::GetFlag(FLAGS_llama2c_runfast), "runfast")},
  };
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("baselines: llama2.c run.c built as `make runomp` (-Ofast -fopenmp -march=native, OMP_NUM_THREADS=%d: "
              "the headline), `make run` (-O3) and `make runfast` (-Ofast), the last two single-threaded as in "
              "llama2.c; ratio = echokv decode tok/s / baseline decode tok/s. OPENBLAS_CORETYPE=%s\n",
              threads, coretype != nullptr ? coretype : "(unset)");
  std::printf("%-8s %14s %14s %14s %8s %14s %8s %14s %8s %6s\n", "context", "prefill tok/s", "decode tok/s",
              "runomp tok/s", "ratio", "run tok/s", "ratio", "runfast tok/s", "ratio", "load1");
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_contexts), ',')) {
    int context = 0;
    if (!absl::SimpleAtoi(c, &context) || context < 1) {
      std::fprintf(stderr, "error: bad --contexts entry '%s'\n", std::string(c).c_str());
      return 2;
    }
    const int decode = absl::GetFlag(FLAGS_decode);
    std::vector<int> ids = echokv::bench::BenchContext(context, cfg.vocab_size);
    echokv::model::KvCache cache = (*model)->NewCache();
    echokv::model::ForwardOptions fo;
    fo.chunk_size = absl::GetFlag(FLAGS_chunk);
    auto t0 = std::chrono::steady_clock::now();
    auto pre = (*model)->Forward(ids, &cache, fo);
    auto t1 = std::chrono::steady_clock::now();
    if (!pre.ok()) {
      std::fprintf(stderr, "error: %s\n", pre.status().ToString().c_str());
      return 1;
    }
    at::Tensor logits = pre->logits;
    for (int i = 0; i < decode; ++i) {
      int next = echokv::model::Argmax(absl::MakeConstSpan(logits.data_ptr<float>(), logits.numel()));
      auto step = (*model)->Decode(next, &cache);
      if (!step.ok()) {
        std::fprintf(stderr, "error: %s\n", step.status().ToString().c_str());
        return 1;
      }
      logits = step->logits;
    }
    auto t2 = std::chrono::steady_clock::now();
    const double prefill_tps = context / Seconds(t0, t1);
    const double decode_tps = decode / Seconds(t1, t2);
    std::printf("%-8d %14.1f %14.1f", context, prefill_tps, decode_tps);
    for (const Baseline& b : baselines) {
      const double ref = b.bin.empty() ? 0 : RunLlama2c(b.bin, dir, context, decode, threads);
      if (ref > 0) {
        std::printf(" %14.1f %7.2fx", ref, decode_tps / ref);
      } else {
        std::printf(" %14s %8s", "-", "-");
      }
    }
    std::printf(" %6s\n", LoadAverage().c_str());
    std::fflush(stdout);
  }
  return BatchedDecode(**model, absl::GetFlag(FLAGS_batches), absl::GetFlag(FLAGS_decode), roofline);
}
