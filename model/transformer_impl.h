// Internal to model/transformer*.cc (not for other users): Transformer::Impl, the
// loaded weights and the thread pools, and what its files share. The files:
//   transformer.cc        the public methods: prefill (Forward), decode dispatch
//   transformer_load.cc   DeviceOptions, RoPE frequencies, Load / Create (weights)
//   decode_cpu.cc         the CPU float32 decode fast path and the batched decode step
#ifndef ECHOKV_MODEL_TRANSFORMER_IMPL_H_
#define ECHOKV_MODEL_TRANSFORMER_IMPL_H_

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/block_matmul.h"
#include "model/transformer.h"

namespace echokv::model {

inline std::string ErrorText(const c10::Error& e) { return e.what_without_backtrace(); }

// One busy thread pool at a time. Debian's LibTorch runs its intra-op work on OpenMP
// and its matrix products on OpenBLAS (pthread build), whose workers spin after each
// call. With both pools sized to the cores they fight for them: on 2 cores, prefill of
// the 40M bench model ran at 557 tok/s with 2+2 threads vs 2221 tok/s with OpenMP 1 +
// OpenBLAS 2 (the eval run: 187 s vs 21 s). So the batched path (Forward: matrix
// products) gives OpenBLAS the threads and OpenMP one, and the decode fast path (our
// own loops, no BLAS) gives OpenMP the threads. Only the engine thread computes, so
// switching per call is safe; without OpenBLAS, LibTorch's pool always has them.
class ThreadPools {
 public:
  explicit ThreadPools(int threads)
      : threads_(threads),
        openblas_set_(reinterpret_cast<SetThreadsFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))),
        openblas_get_(reinterpret_cast<GetThreadsFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"))) {}
  void ForBatched() {
    if (openblas_set_ == nullptr) return SetOpenMp(threads_);
    SetOpenMp(1);
    SetOpenBlas(threads_);
  }
  void ForDecodeLoops() {
    SetOpenMp(threads_);
    if (openblas_set_ != nullptr) SetOpenBlas(1);
  }
  // What the libraries report now (not what was last asked of them).
  PoolUse Current() const {
    PoolUse u;
    u.openmp = at::get_num_threads();
    u.openblas = openblas_get_ != nullptr ? openblas_get_() : 0;
    return u;
  }
  int threads() const { return threads_; }
  const char* Describe() const {
    return openblas_set_ != nullptr ? "OpenBLAS pool for batched products, OpenMP pool for decode loops"
                                    : "LibTorch pool";
  }

 private:
  using SetThreadsFn = void (*)(int);
  using GetThreadsFn = int (*)();
  // OpenMP's team size for this (the computing) thread. Not at::set_num_threads: in
  // LibTorch 1.13 that also re-creates caffe2's pthreadpool on every call (its old
  // threads joined, new ones started, and those spin ~10^6 iterations waiting for work
  // nobody gives them), and the pools switch twice per layer of every prefill chunk:
  // the spinning threads were 13 % of a server's samples during CreateSession.
  // at::get_num_threads() first runs LibTorch's once-per-thread set-up, which would
  // otherwise undo this at the thread's first parallel region.
  static void SetOpenMp(int n) {
    if (at::get_num_threads() != n) omp_set_num_threads(n);
  }
  void SetOpenBlas(int n) {
    if (openblas_threads_ != n) openblas_set_(n);
    openblas_threads_ = n;
  }
  int threads_;                   // threads the user asked for
  SetThreadsFn openblas_set_;     // openblas_set_num_threads, or null for another BLAS
  GetThreadsFn openblas_get_;     // openblas_get_num_threads, or null
  int openblas_threads_ = -1;     // last value given to OpenBLAS
};

// A weight matrix [rows, cols] of the products: a tensor in the model's dtype (the
// float32 path), or with DeviceOptions::weights = "native" the file's blocks
// (kernels/block_matmul.h) in memory this holds.
struct WeightMatrix {
  at::Tensor tensor;              // defined unless native()
  kernels::BlockMatrix blocks;    // blocks.data != nullptr when native(); parts[0] if parts
  // A matrix stacked by rows from tensors of different stored types (a fused q/k/v of
  // Q5_0, Q5_0 and Q8_0 rows): the parts in row order; empty when the matrix is one type.
  std::vector<kernels::BlockMatrix> parts;
  std::shared_ptr<void> storage;  // owns blocks.data (and the parts')
  bool native() const { return blocks.data != nullptr; }
  int64_t rows() const {
    if (!native()) return tensor.size(0);
    int64_t r = parts.empty() ? blocks.rows : 0;
    for (const kernels::BlockMatrix& p : parts) r += p.rows;
    return r;
  }
  int64_t cols() const { return native() ? blocks.cols : tensor.size(1); }
  // The stored bytes of a native matrix.
  int64_t NativeBytes() const {
    int64_t b = parts.empty() ? blocks.Bytes() : 0;
    for (const kernels::BlockMatrix& p : parts) b += p.Bytes();
    return b;
  }
};

// Rows [r0, r1) of a native matrix as float32 into out [(r1 - r0), cols] (across its
// parts), by kernels::DequantizeBlockRows (decode_cpu.cc).
void DequantizeWeightRows(const WeightMatrix& w, int64_t r0, int64_t r1, float* out);

// y [n, w.rows] = x [n, w.cols] W^T (+ bias) on native weights (decode_cpu.cc): the
// inputs quantized once (kernels::QuantizeActs; not for F16 / BF16 rows, which take the
// float32 inputs), then the rows in blocks, split over the
// OpenMP pool when `may_split` and the work is large enough. Every output's bits are
// independent of n and of the split (kernels/block_matmul.h).
void NativeMatMul(const WeightMatrix& w, const float* x, int64_t n, const float* bias, float* y, bool may_split);

struct Transformer::Impl {
  struct Layer {
    at::Tensor input_norm;   // [D]
    WeightMatrix wqkv;       // [(H + 2G) d, D] fused q/k/v projection
    at::Tensor bqkv;         // [(H + 2G) d] or undefined
    WeightMatrix wo;         // [D, H d]
    at::Tensor bo;           // [D] or undefined
    at::Tensor post_norm;    // [D]
    WeightMatrix w_gate_up;  // [2 I, D] fused gate/up projection
    WeightMatrix w_down;     // [D, I]
  };

  ModelConfig config;
  DeviceOptions device_options;
  at::TensorOptions options;       // model dtype + device
  WeightMatrix embed;              // [V, D]
  std::vector<Layer> layers;
  at::Tensor final_norm;           // [D]
  WeightMatrix lm_head;            // [V, D] (the embedding when tied)
  at::Tensor inv_freq;             // [d/2] float32 CPU
  std::unique_ptr<ThreadPools> pools;  // which pool gets the threads, per path
  // A model with fewer parameters than kSmallModelParameters (common/env.h), or
  // ECHOKV_DECODE_SPLIT=rows: a decode token is a few dozen fork/joins' worth of work, so
  // Decode keeps its loops on the calling thread and DecodeBatch splits its rows, not its
  // operations, over the pool. With its loops split, a 2-thread stories260K stream in a
  // busy hour (echokv-bench-server, 1 client) fell to 268-580 tokens/s (2-4 ms per token:
  // each fork/join waits for a descheduled thread). 3 interleaved pairs, 2 threads, loops
  // on one thread vs split: server, 1 client, inter-token p99 0.17-0.32 vs 1.0-1.5 ms at
  // the same tokens/s; the model alone (echokv-bench-model) 16.4-18.2 vs 11.9-17.2 K
  // tokens/s at 128 positions, 9.0-9.6 vs 8.5-12.3 K at 448 (the split's one gain).
  bool small_model = false;
  bool decode_batch_blas = false;      // DecodeBatch's products through OpenBLAS (env, see there)
  mutable std::mutex trace_mu;         // guards trace (read by tests on other threads)
  mutable PoolTrace trace;

  // Records what the pools look like right now into one of trace's slots.
  void RecordPools(int64_t PoolTrace::*count, PoolUse PoolTrace::*use) const {
    const PoolUse now = pools->Current();
    std::lock_guard<std::mutex> lock(trace_mu);
    ++(trace.*count);
    trace.*use = now;
  }

  // Rows `ids` of the embedding [m, D] on the model's device and dtype (native: decoded).
  at::Tensor EmbedRows(const std::vector<int64_t>& ids) const;
  // x [m, cols] W^T (+ bias) for prefill: at::linear on the float32 path; native weights
  // are decoded into a float32 scratch (a panel of rows at a time) for the product, or for
  // m <= 4 rows (the LM head of the last position) go through the block kernel.
  at::Tensor Linear(const at::Tensor& x, const WeightMatrix& w, const at::Tensor& bias) const;

  // HF LlamaRMSNorm: normalise in float32, cast back, then scale.
  at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight) const;
  // Rotates x [N, m, d] (rows are heads) with tables cos/sin [m, d] float32.
  static at::Tensor Rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  // Attention of queries q [H, m, d] (post-RoPE, at positions qpos) over the layer's
  // cache entries k, v [G, n, d] at kpos [G, n]. Returns [m, H d].
  at::Tensor Attention(int layer, const at::Tensor& q, const std::vector<int64_t>& qpos, const at::Tensor& k,
                       const at::Tensor& v, const at::Tensor& kpos) const;

  bool CanUseCpuFastPath() const {
    return options.device().is_cpu() && options.dtype() == at::kFloat;
  }
  // The raw-pointer CPU paths (decode fast path, batched decode, fused prefill attention)
  // need the model and the cache on CPU in float32.
  bool CanUseCpuKernels(const KvCache& cache) const {
    return CanUseCpuFastPath() && cache.options().dtype() == at::kFloat && cache.options().device().is_cpu();
  }

  // Attention of a prefill chunk on CPU float32: the fused kernel (kernels/attention.h:
  // online softmax over 64-key blocks, no score matrix beyond one tile) over the cache
  // entries of `layer`, which already hold the chunk's own. q [H, m, d] post-RoPE with
  // unit stride along d. Returns [m, H d]. The kernel's loops run on LibTorch's OpenMP
  // pool (our own loops, like decode), the surrounding products on OpenBLAS's.
  at::Tensor FusedAttention(int layer, const at::Tensor& q, const std::vector<int64_t>& qpos,
                            const KvCache& cache) const;

  // Attention work items of one decode row: each KV group's heads in `split` runs of
  // consecutive heads (split = 1 unless there are fewer groups x rows than threads).
  // Item t covers group t / split, heads [HeadBegin(t), HeadEnd(t)) of the row.
  struct GroupSplit {
    int64_t r, split;
    int64_t Items(int64_t groups) const { return groups * split; }
    int64_t Group(int64_t t) const { return t / split; }
    int64_t HeadBegin(int64_t t) const { return (t / split) * r + (t % split) * r / split; }
    int64_t HeadEnd(int64_t t) const { return (t / split) * r + (t % split + 1) * r / split; }
  };
  GroupSplit SplitGroups(int64_t rows, int threads) const {
    const int64_t G = config.num_kv_heads, r = config.num_heads / G;
    return GroupSplit{r, std::clamp<int64_t>((threads + rows * G - 1) / (rows * G), 1, r)};
  }

  // Attention of work item t of `split` for one row: its heads' post-RoPE queries (of
  // q_row [H, d]) at position `pos` over their KV group's entries of `layer` in `cache`
  // (which already holds the token's own entry); writes each head's weighted sum of
  // values to its place in out_row [H, d]. Shared by Decode and DecodeBatch, so both
  // attend exactly alike. The group's keys are scored in blocks of kKeyBlock against
  // every head while the block is in L1 (a GQA group's keys come from memory once, not
  // once per head); each (head, key) score is the bits ScoreRows gives for that key
  // alone, so neither the blocking nor the number of heads per item changes a result.
  void AttendGroup(const KvCache& cache, int layer, const GroupSplit& split, int64_t t, const float* q_row,
                   int64_t pos, bool window, float scale, float* out_row) const;

  // DecodeBatch on CPU float32 for N > 1 validated rows (distinct caches).
  absl::StatusOr<std::vector<DecodeResult>> DecodeBatchCpu(absl::Span<const DecodeRow> rows) const;
  // The whole step for `rows` on the pools as they are set (DecodeBatchCpu's body).
  // `blas`: products through OpenBLAS, the rest on this thread; otherwise our loops,
  // split over the OpenMP pool when `split_ops` (each on this thread when not).
  absl::StatusOr<std::vector<DecodeResult>> DecodeBatchRows(absl::Span<const DecodeRow> rows, bool blas,
                                                            bool split_ops) const;

  // One token on CPU float32 with plain loops (same math as Forward, which the tests
  // compare it with). Appends the token's KV to `cache`.
  absl::StatusOr<DecodeResult> DecodeCpu(int token, KvCache* cache, bool return_queries) const;
};

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_TRANSFORMER_IMPL_H_
