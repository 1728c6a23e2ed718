// Prefill and decode speed of echokv's transformer, side by side with the plain C
// llama2.c-style reference (echokv-bench-llama2c) on the same weights and context.
//
//   echokv-bench-model --model /work/shared/models/stories260K --contexts 128,448
//       --decode 64 --llama2c build/bin/echokv-bench-llama2c
//   echokv-bench-model --random40m /tmp/echokv-m40 --contexts 512,2048 --decode 64 ...
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/blas_env.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
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
ABSL_FLAG(std::string, llama2c, "", "path of echokv-bench-llama2c to run on the same weights");
ABSL_FLAG(std::string, llama2c_fast, "", "path of echokv-bench-llama2c-fast (-Ofast -march=native build)");

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
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : echokv::DefaultThreadCount();
  std::printf("model %s: %d layers, hidden %d, %d/%d heads, vocab %d; %d threads (the C baseline gets the same)\n",
              dir.c_str(), cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size, threads);
  std::printf("%-8s %14s %14s %16s %8s %16s %8s\n", "context", "prefill tok/s", "decode tok/s", "llama2c -O3",
              "ratio", "llama2c -Ofast", "ratio");
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
    for (const std::string& bin : {absl::GetFlag(FLAGS_llama2c), absl::GetFlag(FLAGS_llama2c_fast)}) {
      const double ref = bin.empty() ? 0 : RunLlama2c(bin, dir, context, decode, threads);
      if (ref > 0) {
        std::printf(" %16.1f %7.2fx", ref, decode_tps / ref);
      } else {
        std::printf(" %16s %8s", "-", "-");
      }
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}
