// Shared helpers of the bench/ programs: deterministic random checkpoints of a given
// size and the synthetic context every speed bench uses.
//
//   BenchModelSpec spec = Bench40M();                       // d=512, 8 layers, 8/4 heads, vocab 32000
//   ECHOKV_RETURN_IF_ERROR(WriteRandomLlama("/tmp/m40", spec, /*seed=*/7));
//   std::vector<int> ctx = BenchContext(2048, spec.vocab);  // BOS + fixed pattern
#ifndef ECHOKV_BENCH_BENCH_UTIL_H_
#define ECHOKV_BENCH_BENCH_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/transformer.h"

namespace echokv::bench {

struct BenchModelSpec {
  int hidden = 512;
  int intermediate = 1376;
  int layers = 8;
  int heads = 8;
  int kv_heads = 4;
  int vocab = 32000;
  int max_positions = 16384;
  bool tied = true;  // ~40M parameters with tied embeddings
};

// The "random ~40M-parameter llama" of the issues.
inline BenchModelSpec Bench40M() { return BenchModelSpec(); }

// Writes config.json + model.safetensors (F32, N(0, 0.02) weights, unit norms) unless
// `dir`/model.safetensors already exists with the same config.
absl::Status WriteRandomLlama(const std::string& dir, const BenchModelSpec& spec, uint64_t seed);

// The model directory a bench runs on: `random40m_dir` (written once with
// WriteRandomLlama(Bench40M(), seed 7)) when non-empty, else `model_dir`; an error
// naming both flags when neither is given.
absl::StatusOr<std::string> ResolveBenchModelDir(const std::string& model_dir, const std::string& random40m_dir);

// ResolveBenchModelDir, then Transformer::Load on CPU with `threads` (0 = default);
// the directory used is stored in *dir.
// `weights`: model::DeviceOptions::weights ("float32" or "native").
absl::StatusOr<std::unique_ptr<model::Transformer>> LoadBenchModel(const std::string& model_dir,
                                                                   const std::string& random40m_dir, int threads,
                                                                   std::string* dir,
                                                                   const std::string& weights = "float32");

// Prints "error: <status>" to stderr and returns a main's exit code: 2 for a usage
// error (InvalidArgument), 1 otherwise.
int ReportBenchError(const absl::Status& status);

// BOS (1) then (i * 7919 + 13) % vocab: the context every speed bench feeds.
std::vector<int> BenchContext(int length, int vocab);

// Peak resident set size of this process so far, in bytes (VmHWM).
int64_t PeakRssBytes();
// Current resident set size in bytes (VmRSS).
int64_t CurrentRssBytes();
// The 1-minute load average (/proc/loadavg), -1 when unreadable: every bench prints it
// beside its figures, which are only as good as the machine was idle.
double LoadAverage1();

}  // namespace echokv::bench

#endif  // ECHOKV_BENCH_BENCH_UTIL_H_
