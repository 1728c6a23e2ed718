// Prefill and decode speed of echokv's transformer, optionally side by side with
// llama2.c's `run` on the same weights (--llama2c-bin): binaries you built yourself from
// karpathy/llama2.c at commit 350e04fe with its own Makefile (`make run`, `make runfast`
// or `make runomp`; each runs with OMP_NUM_THREADS = --threads, which only the OpenMP
// build reads). The peer decodes the same positions (bench/llama2c_peer.h
// says how it is driven and timed); before timing, each peer's greedy continuation of a
// short prompt is compared with echokv's, so a peer that computes another model shows.
//
//   echokv-bench-model --model /work/shared/models/stories260K --contexts 128,448 --decode 256
//       --llama2c-bin runfast=$HOME/llama2.c-runfast/run,runomp=$HOME/llama2.c-runomp/run
//   echokv-bench-model --random40m /tmp/echokv-m40 --contexts 512,2048 --decode 64
//   echokv-bench-model --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf --contexts 512,2048,8128
//
// It also prints the load time (Transformer::Load: for a .gguf file that includes the
// dequantization to float32) and the peak resident set (VmHWM) after loading and at the end.
#include <ATen/Parallel.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/blas_env.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/llama2c_peer.h"
#include "bench/roofline.h"
#include "common/env.h"
#include "common/flag_names.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "model/sampler.h"
#include "model/transformer.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory or .gguf file");
ABSL_FLAG(std::string, random40m, "", "write (once) and use the random ~40M llama in this directory");
ABSL_FLAG(std::string, contexts, "512,2048", "context lengths, comma-separated");
ABSL_FLAG(int, decode, 64, "tokens to decode after each context");
ABSL_FLAG(int, chunk, 256, "prefill chunk size");
ABSL_FLAG(int, threads, 0, "LibTorch threads (0 = all cores)");
ABSL_FLAG(std::string, weights, "float32", "float32 | native (a GGUF file's quantized blocks as stored)");
ABSL_FLAG(std::string, batches, "",
          "also decode this many streams together (Transformer::DecodeBatch, as the server's engine step), "
          "comma-separated, each after a --batch_context-token context; prints tok/s and dense GFLOP/s");
ABSL_FLAG(bool, roofline, false,
          "with --batches: measure the GEMM peak and the read bandwidth first (bench/roofline.h) and print each "
          "step's bytes read and the GFLOP/s no step can exceed");
ABSL_FLAG(std::string, llama2c_bin, "",
          "peers: llama2.c `run` binaries you built from karpathy/llama2.c (commit 350e04fe) with its own Makefile "
          "(make run / runfast / runomp), comma-separated [LABEL=]PATH (label: the file name); empty = none");
ABSL_FLAG(bool, cache_dtypes, false,
          "issue 31: after the contexts table, decode from each context's one prefill with its cache in float32 "
          "and in int8 (KvCache::ToStorage), --repeats interleaved pairs, median tok/s each and the ratio");
ABSL_FLAG(int, repeats, 3, "pairs per context for --cache_dtypes");
ABSL_FLAG(std::string, batch_cache_dtype, "float32", "float32 | int8: the batched table's caches (--batches)");
ABSL_FLAG(int, batch_context, 256,
          "context of every stream in the batched tables (--batches; with --cache_dtypes also paired float32 / "
          "int8 batched decode)");
ABSL_FLAG(std::string, llama2c_dir, "",
          "where the peers' input files (model.bin, tok.bin) are written; empty = a fresh directory under $TMPDIR");

namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The 1-minute load average: these figures are only as good as the machine was idle.
std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  return in >> one ? one : "?";
}

// `repeats` pairs of run(0) and run(1), the order alternating from pair to pair; the
// median of each side's results (tok/s).
absl::StatusOr<std::array<double, 2>> PairedMedians(int repeats,
                                                    const std::function<absl::StatusOr<double>(int)>& run) {
  std::vector<double> got[2];
  for (int r = 0; r < repeats; ++r) {
    for (int k = 0; k < 2; ++k) {
      const int which = (r % 2 == 0) ? k : 1 - k;
      ECHOKV_ASSIGN_OR_RETURN(const double v, run(which));
      got[which].push_back(v);
    }
  }
  for (auto& v : got) std::sort(v.begin(), v.end());
  return std::array<double, 2>{got[0][got[0].size() / 2], got[1][got[1].size() / 2]};
}

// Issue 31: single-stream decode from one prefill per context, its cache in float32 and
// in int8 (the same rows quantized), `repeats` pairs in alternating order.
absl::Status CacheDtypePairs(const echokv::model::Transformer& model, const std::vector<int>& contexts, int decode,
                             int chunk, int repeats) {
  const auto& cfg = model.config();
  std::printf("\ncache dtypes: %d greedy Decode steps from one prefill per context, the cache as float32 and as int8 "
              "(ToStorage), %d interleaved pairs (order alternating), median tok/s; KiB = the cache after the "
              "prefill\n", decode, repeats);
  std::printf("%-8s %14s %14s %8s %12s %12s %6s\n", "context", "f32 tok/s", "int8 tok/s", "ratio", "f32 KiB",
              "int8 KiB", "load1");
  for (const int context : contexts) {
    echokv::model::KvCache cache = model.NewCache();
    echokv::model::ForwardOptions fo;
    fo.chunk_size = chunk;
    auto pre = model.Forward(echokv::bench::BenchContext(context, cfg.vocab_size), &cache, fo);
    if (!pre.ok()) return pre.status();
    ECHOKV_ASSIGN_OR_RETURN(echokv::model::KvCache int8, cache.ToStorage(echokv::kernels::KvDtype::kInt8));
    const int first = echokv::model::Argmax(absl::MakeConstSpan(pre->logits.data_ptr<float>(), pre->logits.numel()));
    ECHOKV_ASSIGN_OR_RETURN(const auto tps, PairedMedians(repeats, [&](int which) -> absl::StatusOr<double> {
      echokv::model::KvCache run = (which == 0 ? cache : int8).Clone();
      int next = first;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < decode; ++i) {
        ECHOKV_ASSIGN_OR_RETURN(auto step, model.Decode(next, &run));
        next = echokv::model::Argmax(absl::MakeConstSpan(step.logits.data_ptr<float>(), step.logits.numel()));
      }
      return decode / Seconds(t0, std::chrono::steady_clock::now());
    }));
    const double f = tps[0], q = tps[1];
    std::printf("%-8d %14.1f %14.1f %7.2fx %12.1f %12.1f %6s\n", context, f, q, q / f, cache.KvBytes() / 1024.0,
                int8.KvBytes() / 1024.0, LoadAverage().c_str());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

// N streams decoded together (DecodeBatch) with float32 and with int8 caches, each from
// its own copy of one `context`-token prefill: `repeats` interleaved pairs (order
// alternating), median tok/s over all streams. The server's engine step with N sessions.
absl::Status BatchedDtypePairs(const echokv::model::Transformer& model, const std::vector<int>& batches, int context,
                               int steps, int repeats) {
  const auto& cfg = model.config();
  echokv::model::KvCache prefilled = model.NewCache();
  auto pre = model.Forward(echokv::bench::BenchContext(context, cfg.vocab_size), &prefilled,
                           echokv::model::ForwardOptions());
  if (!pre.ok()) return pre.status();
  ECHOKV_ASSIGN_OR_RETURN(echokv::model::KvCache int8, prefilled.ToStorage(echokv::kernels::KvDtype::kInt8));
  const echokv::model::KvCache* base[2] = {&prefilled, &int8};
  const int first = echokv::model::Argmax(absl::MakeConstSpan(pre->logits.data_ptr<float>(), pre->logits.numel()));
  std::printf("\nbatched cache dtypes: N streams per step (DecodeBatch), %d steps after a %d-token context, caches "
              "float32 vs int8, %d interleaved pairs (order alternating), median tok/s over all streams; MiB = all "
              "N caches after the prefill\n",
              steps, context, repeats);
  std::printf("%-8s %14s %14s %8s %12s %12s %6s\n", "streams", "f32 tok/s", "int8 tok/s", "ratio", "f32 MiB",
              "int8 MiB", "load1");
  for (const int n : batches) {
    ECHOKV_ASSIGN_OR_RETURN(const auto tps, PairedMedians(repeats, [&](int which) -> absl::StatusOr<double> {
      std::vector<echokv::model::KvCache> caches;
      for (int i = 0; i < n; ++i) caches.push_back(base[which]->Clone());
      std::vector<echokv::model::DecodeRow> rows(n);
      for (int i = 0; i < n; ++i) rows[i] = {(first + i) % cfg.vocab_size, &caches[i], false};
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) {
        ECHOKV_ASSIGN_OR_RETURN(auto out, model.DecodeBatch(rows));
        for (int i = 0; i < n; ++i) {
          const at::Tensor& l = out[i].logits;
          rows[i].token = echokv::model::Argmax(absl::MakeConstSpan(l.data_ptr<float>(), l.numel()));
        }
      }
      return static_cast<double>(n) * steps / Seconds(t0, std::chrono::steady_clock::now());
    }));
    const double f = tps[0], q = tps[1];
    std::printf("%-8d %14.1f %14.1f %7.2fx %12.1f %12.1f %6s\n", n, f, q, q / f,
                n * prefilled.KvBytes() / 1048576.0, n * int8.KvBytes() / 1048576.0, LoadAverage().c_str());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> ParseBatches(const std::string& batches) {
  std::vector<int> out;
  if (batches.empty()) return out;
  for (absl::string_view b : absl::StrSplit(batches, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(b, &n) || n < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--batches: bad entry '", b, "' (want positive integers)"));
    }
    out.push_back(n);
  }
  return out;
}

}  // namespace

// N streams decoded together for `steps` steps: each starts from its own copy of one
// --batch_context-token prefill and feeds back its own greedy token (so rows differ after step 1).
// FLOPs are the dense products (2 x multiply-adds of QKV, output, MLP and LM head).
// With `roofline`: the bytes a step reads (every weight once, as held (float32 or native blocks), and every row's
// keys and values) and the GFLOP/s that bytes and FLOPs allow on this machine.
int BatchedDecode(const echokv::model::Transformer& model, const std::vector<int>& batches, int context, int steps,
                  const std::optional<echokv::bench::Roofline>& roofline) {
  if (batches.empty()) return 0;
  const auto& c = model.config();
  const double D = c.hidden_size, Hd = static_cast<double>(c.num_heads) * c.head_dim,
               Gd = static_cast<double>(c.num_kv_heads) * c.head_dim;
  const double flops = 2.0 * (c.num_layers * (D * (Hd + 2 * Gd) + Hd * D + 3 * D * c.intermediate_size) +
                              D * c.vocab_size);
  const double weight_bytes = static_cast<double>(model.DecodeWeightBytes());  // as held: float32 or blocks
  echokv::model::KvCache prefilled = model.NewCache();
  auto pre = model.Forward(echokv::bench::BenchContext(context, c.vocab_size), &prefilled, echokv::model::ForwardOptions());
  if (!pre.ok()) return echokv::bench::ReportBenchError(pre.status());
  echokv::kernels::KvDtype dtype = echokv::kernels::KvDtype::kFloat32;
  if (!echokv::kernels::ParseKvDtype(absl::GetFlag(FLAGS_batch_cache_dtype), &dtype)) {
    std::fprintf(stderr, "error: --batch_cache_dtype must be float32 or int8\n");
    return 2;
  }
  auto converted = prefilled.ToStorage(dtype);
  if (!converted.ok()) return echokv::bench::ReportBenchError(converted.status());
  const echokv::model::KvCache base = std::move(*converted);
  std::printf("\nbatched decode: N streams per step (DecodeBatch; N = 1 is Decode), %d steps after a %d-token "
              "context, %.1f MFLOP per token; caches %s (%.1f KiB per row)\n",
              steps, context, flops / 1e6, echokv::kernels::KvDtypeName(dtype), base.KvBytes() / 1024.0);
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
  const int first = echokv::model::Argmax(absl::MakeConstSpan(pre->logits.data_ptr<float>(), pre->logits.numel()));
  for (const int n : batches) {
    std::vector<echokv::model::KvCache> caches;
    for (int i = 0; i < n; ++i) caches.push_back(base.Clone());  // each row its own storage
    std::vector<echokv::model::DecodeRow> rows(n);
    for (int i = 0; i < n; ++i) rows[i] = {(first + i) % c.vocab_size, &caches[i], false};
    double kv_bytes = 0;  // summed over the steps
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) {
      if (roofline.has_value()) {
        for (const echokv::model::KvCache& cache : caches) {
          // Bytes of one entry over the groups as the cache stores it (int8: scales too).
          const double entry = cache.is_int8() ? c.num_kv_heads * static_cast<double>(echokv::kernels::KvEntryBytes(
                                                     echokv::kernels::KvDtype::kInt8, c.head_dim))
                                               : Gd * 2 * sizeof(float);
          for (int l = 0; l < c.num_layers; ++l) kv_bytes += (cache.size(l) + 1) * entry;
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

// Writes the peers' input files and checks each peer before any timing: it must run,
// and its greedy continuation of a short prompt is compared with echokv's (the same
// weights should give the same ids; run.c hard-codes rms_norm_eps 1e-5 and rope_theta
// 10000, and -Ofast reorders its sums, so a difference is reported, not fatal).
absl::Status PreparePeers(const echokv::model::Transformer& model, const std::string& model_dir,
                          const std::vector<int>& contexts, int decode, int threads,
                          const std::vector<echokv::bench::Llama2cBinary>& peers,
                          echokv::bench::Llama2cInputs* inputs, std::string* made_dir) {
  constexpr int kPromptAs = 14, kCheckTokens = 32;  // a 16-token prompt, 32 greedy ids
  int64_t seq_len = kPromptAs + 2 + kCheckTokens;
  for (int c : contexts) seq_len = std::max<int64_t>(seq_len, c + decode);
  std::string work = absl::GetFlag(FLAGS_llama2c_dir);
  if (work.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/echokv-llama2c-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) return absl::InternalError("cannot create a directory for the peers");
    work = pattern;
    *made_dir = work;  // removed at exit (the 40M model's checkpoint is 160 MB)
  }
  absl::StatusOr<echokv::bench::Llama2cInputs> in = echokv::bench::WriteLlama2cInputs(model_dir, work, seq_len);
  if (!in.ok()) return in.status();
  *inputs = *in;
  const auto& cfg = model.config();
  std::printf("peers: llama2.c `run` on %s (context %lld), your builds of karpathy/llama2.c:", work.c_str(),
              static_cast<long long>(seq_len));
  for (const auto& p : peers) std::printf(" %s=%s", p.label.c_str(), p.path.c_str());
  std::printf("\n");
  if (cfg.rms_norm_eps != 1e-5 || cfg.rope_theta != 10000.0) {
    std::printf("note: this model has rms_norm_eps %g and rope_theta %g; run.c uses 1e-5 and 10000\n",
                static_cast<double>(cfg.rms_norm_eps), static_cast<double>(cfg.rope_theta));
  }
  // echokv's greedy continuation of the prompt the peers get.
  const std::vector<int> prompt = echokv::bench::Llama2cPromptIds(kPromptAs);
  std::vector<int> ours;
  {
    echokv::model::KvCache cache = model.NewCache();
    auto pre = model.Forward(prompt, &cache, echokv::model::ForwardOptions());
    if (!pre.ok()) return pre.status();
    at::Tensor logits = pre->logits;
    for (int i = 0; i < kCheckTokens; ++i) {
      ours.push_back(echokv::model::Argmax(absl::MakeConstSpan(logits.data_ptr<float>(), logits.numel())));
      if (i + 1 == kCheckTokens) break;
      auto step = model.Decode(ours.back(), &cache);
      if (!step.ok()) return step.status();
      logits = step->logits;
    }
  }
  for (const auto& p : peers) {
    absl::StatusOr<std::vector<int>> theirs =
        echokv::bench::Llama2cGreedy(*inputs, p, threads, kPromptAs, kCheckTokens);
    if (!theirs.ok()) {
      return absl::Status(theirs.status().code(),
                          absl::StrCat("--llama2c-bin ", p.label, ": ", theirs.status().message()));
    }
    size_t same = 0;
    while (same < theirs->size() && same < ours.size() && (*theirs)[same] == ours[same]) ++same;
    // run.c stops where it samples BOS (1) and never prints it.
    const bool stopped_at_bos = same == theirs->size() && same < ours.size() && ours[same] == 1;
    if (same == ours.size() || stopped_at_bos) {
      std::printf("%s: greedy continuation of a %zu-token prompt: the same %zu ids as echokv\n", p.label.c_str(),
                  prompt.size(), same);
    } else {
      std::printf("%s: WARNING: greedy continuation of a %zu-token prompt differs from echokv's at id %zu "
                  "(echokv %d, %s %d): it may not compute the same model\n",
                  p.label.c_str(), prompt.size(), same, ours[same], p.label.c_str(),
                  same < theirs->size() ? (*theirs)[same] : -1);
    }
  }
  return absl::OkStatus();
}

int main(int argc, char** argv) {
  echokv::ConfigureBlasWorkersOrReexec(argv);
  echokv::DashedFlagArgs dashed(argc, argv);
  absl::ParseCommandLine(dashed.argc(), dashed.argv());
  echokv::InitLogging(argv[0]);
  const absl::StatusOr<std::vector<int>> batches = ParseBatches(absl::GetFlag(FLAGS_batches));
  if (!batches.ok()) return echokv::bench::ReportBenchError(batches.status());
  const int batch_context = absl::GetFlag(FLAGS_batch_context);
  if (batch_context < 1) {  // before the model loads and the contexts table runs
    std::fprintf(stderr, "error: --batch_context must be >= 1 (got %d)\n", batch_context);
    return 2;
  }
  std::optional<echokv::bench::Roofline> roofline;
  if (absl::GetFlag(FLAGS_roofline) && !batches->empty()) {
    // Before the model exists: its pool switching remembers what it last set.
    const int t = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : echokv::DefaultThreadCount();
    roofline = echokv::bench::MeasureRoofline(t, 2.0);
  }
  std::string dir;
  const auto load_start = std::chrono::steady_clock::now();
  auto model = echokv::bench::LoadBenchModel(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_random40m),
                                             absl::GetFlag(FLAGS_threads), &dir, absl::GetFlag(FLAGS_weights));
  const double load_seconds = Seconds(load_start, std::chrono::steady_clock::now());
  if (!model.ok()) return echokv::bench::ReportBenchError(model.status());
  const auto& cfg = (*model)->config();
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : echokv::DefaultThreadCount();
  std::printf("model %s: %d layers, hidden %d, %d/%d heads, vocab %d; %d threads\n",
              dir.c_str(), cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size, threads);
  std::printf("load: %.3f s (Transformer::Load); peak RSS after load: %.1f MiB (VmHWM)\n", load_seconds,
              static_cast<double>(echokv::bench::PeakRssBytes()) / (1 << 20));
  std::vector<int> contexts;
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_contexts), ',')) {
    int context = 0;
    if (!absl::SimpleAtoi(c, &context) || context < 1) {
      std::fprintf(stderr, "error: bad --contexts entry '%s'\n", std::string(c).c_str());
      return 2;
    }
    contexts.push_back(context);
  }
  const int decode = absl::GetFlag(FLAGS_decode);
  absl::StatusOr<std::vector<echokv::bench::Llama2cBinary>> peers =
      echokv::bench::ParseLlama2cBinaries(absl::GetFlag(FLAGS_llama2c_bin), "--llama2c-bin");
  if (!peers.ok()) return echokv::bench::ReportBenchError(peers.status());
  echokv::bench::Llama2cInputs peer_inputs;
  struct RemoveDir {
    std::string path;
    ~RemoveDir() {
      std::error_code ec;
      if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
  } made_dir;
  if (!peers->empty()) {
    absl::Status s = PreparePeers(**model, dir, contexts, decode, threads, *peers, &peer_inputs, &made_dir.path);
    if (!s.ok()) return echokv::bench::ReportBenchError(s);
  }
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("prefill: one batched Forward (chunk %d); decode: %d greedy tokens after it, one Decode each%s. "
              "OPENBLAS_CORETYPE=%s\n",
              absl::GetFlag(FLAGS_chunk), decode,
              peers->empty() ? "" : "; a peer's tok/s: the same positions, one forward pass each (OMP_NUM_THREADS = "
                                    "--threads); ratio = echokv decode tok/s / peer tok/s",
              coretype != nullptr ? coretype : "(unset)");
  std::printf("%-8s %14s %14s", "context", "prefill tok/s", "decode tok/s");
  for (const echokv::bench::Llama2cBinary& p : *peers) {
    std::printf(" %14s %8s", (p.label + " tok/s").c_str(), "ratio");
  }
  std::printf(" %6s\n", "load1");
  for (const int context : contexts) {
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
    for (const echokv::bench::Llama2cBinary& p : *peers) {
      absl::StatusOr<echokv::bench::Llama2cTiming> t =
          echokv::bench::TimeLlama2c(peer_inputs, p, threads, context, decode);
      if (t.ok()) {
        std::printf(" %14.1f %7.2fx", t->decode_tokens_per_second, decode_tps / t->decode_tokens_per_second);
      } else {
        std::printf(" %14s %8s", "-", "-");
        std::fprintf(stderr, "%s at context %d: %s\n", p.label.c_str(), context,
                     std::string(t.status().message()).c_str());
      }
    }
    std::printf(" %6s\n", LoadAverage().c_str());
    std::fflush(stdout);
  }
  if (absl::GetFlag(FLAGS_cache_dtypes)) {
    absl::Status s = CacheDtypePairs(**model, contexts, decode, absl::GetFlag(FLAGS_chunk), absl::GetFlag(FLAGS_repeats));
    if (!s.ok()) return echokv::bench::ReportBenchError(s);
  }
  std::printf("peak RSS: %.1f MiB (VmHWM, after the contexts)\n",
              static_cast<double>(echokv::bench::PeakRssBytes()) / (1 << 20));
  if (absl::GetFlag(FLAGS_cache_dtypes) && !batches->empty()) {
    absl::Status s = BatchedDtypePairs(**model, *batches, batch_context, decode, absl::GetFlag(FLAGS_repeats));
    if (!s.ok()) return echokv::bench::ReportBenchError(s);
  }
  return BatchedDecode(**model, *batches, batch_context, decode, roofline);
}
