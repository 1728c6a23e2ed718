#include "model/transformer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/blas_env.h"
#include "common/env.h"
#include "common/huge_pages.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/attention.h"
#include "kernels/matmul_rows.h"
#include "kernels/softmax.h"
#include "kernels/vec16.h"
#include "kernels/rope.h"
#include "kernels/weighted_sum.h"
#include "model/weights.h"

namespace echokv::model {
namespace {

// Upper bound on the float32 attention-score block of one prefill step
// ([H, query_block, context]); larger chunks are split along the queries.
constexpr int64_t kMaxScoreElements = int64_t{32} << 20;  // 128 MiB of float32

absl::StatusOr<at::ScalarType> ParseDType(const std::string& dtype) {
  if (dtype == "float32") return at::kFloat;
  if (dtype == "bfloat16") return at::kBFloat16;
  if (dtype == "float16") return at::kHalf;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype must be one of float32, bfloat16, float16; got '", dtype, "'"));
}

at::ScalarType ToScalarType(DType d) {
  switch (d) {
    case DType::kF32:
      return at::kFloat;
    case DType::kF16:
      return at::kHalf;
    case DType::kBF16:
      return at::kBFloat16;
  }
  return at::kFloat;
}

std::string ErrorText(const c10::Error& e) { return e.what_without_backtrace(); }

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

// ---- CPU float32 decode fast path: plain loops, no per-op dispatch. ----

// Per-thread float buffers reused across decode steps, one per use (a step's own
// buffers, and one per attention head's scores on whichever pool thread runs it).
enum ScratchSlot { kDecodeScratch, kScoresScratch, kScratchSlots };
float* Scratch(ScratchSlot slot, int64_t n) {
  thread_local std::vector<float> buffers[kScratchSlots];
  std::vector<float>& b = buffers[slot];
  if (static_cast<int64_t>(b.size()) < n) b.resize(n);
  return b.data();
}

// scores[j] = scale * q . k_j for n rows k_j = keys + j * d, and the weighted sum
// out[d] = sum_j p[j] * v_j. One call per head, so the clone dispatch is paid once,
// not per entry; head dims 8, 64 and 128 get loops with the dimension known at
// compile time (fully unrolled rows), others the generic loop.
// Head dims of 16 and more: 16-lane accumulators, four keys at a time (independent FMA
// chains), each summed by vec16::Reduce; smaller ones: one lane per dimension. Always
// inlined into ScoreRows' clones, so each is compiled for that clone's instruction set.
template <int kDim>
__attribute__((always_inline)) inline void ScoreRowsFixed(const float* q, const float* keys, int64_t n, float scale,
                                                          float* scores) {
  if constexpr (kDim % 16 == 0) {
    using kernels::vec16::V16;
    constexpr int kVecs = kDim / 16, kKeys = 4;
    V16 qv[kVecs];
    for (int i = 0; i < kVecs; ++i) qv[i] = kernels::vec16::Load(q + 16 * i);
    int64_t j = 0;
    for (; j + kKeys <= n; j += kKeys) {
      V16 acc[kKeys] = {};
      for (int i = 0; i < kVecs; ++i) {
        for (int t = 0; t < kKeys; ++t) acc[t] += qv[i] * kernels::vec16::Load(keys + (j + t) * kDim + 16 * i);
      }
      for (int t = 0; t < kKeys; ++t) scores[j + t] = kernels::vec16::Reduce(acc[t]) * scale;
    }
    for (; j < n; ++j) {
      V16 acc = {};
      for (int i = 0; i < kVecs; ++i) acc += qv[i] * kernels::vec16::Load(keys + j * kDim + 16 * i);
      scores[j] = kernels::vec16::Reduce(acc) * scale;
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      const float* k = keys + j * kDim;
      float acc[kDim] = {};
      for (int t = 0; t < kDim; ++t) acc[t] += q[t] * k[t];
      float s = 0;
      for (int t = 0; t < kDim; ++t) s += acc[t];
      scores[j] = s * scale;
    }
  }
}

// d = 64: one accumulator row, compiled into each of WeightedSumRows' clones. Head dims
// 8 and 128 go to kernels/weighted_sum.h: this template, not inlined, ran them in the
// baseline (SSE) build on every CPU (GCC's own AVX-512 build of the d = 8 loop had
// halved stories260K's decode); that kernel gives the same bits with AVX-512 registers.
template <int kDim>
inline void WeightedSumRowsFixed(const float* p, const float* values, int64_t n, float* out) {
  float acc[kDim] = {};
  for (int64_t j = 0; j < n; ++j) {
    const float w = p[j];
    const float* v = values + j * kDim;
    for (int i = 0; i < kDim; ++i) acc[i] += w * v[i];
  }
  for (int i = 0; i < kDim; ++i) out[i] = acc[i];
}

__attribute__((target_clones("default", "arch=haswell", "arch=x86-64-v4"))) void ScoreRows(
    const float* q, const float* keys, int64_t n, int64_t d, float scale, float* scores) {
  switch (d) {
    case 8:
      return ScoreRowsFixed<8>(q, keys, n, scale, scores);
    case 64:
      return ScoreRowsFixed<64>(q, keys, n, scale, scores);
    case 128:
      return ScoreRowsFixed<128>(q, keys, n, scale, scores);
  }
  for (int64_t j = 0; j < n; ++j) {
    const float* k = keys + j * d;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
      for (int t = 0; t < 8; ++t) acc[t] += q[i + t] * k[i + t];
    }
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < d; ++i) s += q[i] * k[i];
    scores[j] = s * scale;
  }
}

__attribute__((target_clones("default", "arch=haswell", "arch=x86-64-v4"))) void WeightedSumRows(
    const float* p, const float* values, int64_t n, int64_t d, float* out) {
  if (kernels::WeightedSumRowsChainsHandles(d)) return kernels::WeightedSumRowsChains(p, values, n, d, out);
  if (d == 64) return WeightedSumRowsFixed<64>(p, values, n, out);
  for (int64_t i = 0; i < d; ++i) out[i] = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float w = p[j];
    const float* v = values + j * d;
    for (int64_t i = 0; i < d; ++i) out[i] += w * v[i];
  }
}

// Multiply-adds below which a decode-path loop stays on the calling thread (a fork/join
// of the OpenMP team costs a few microseconds). Measured on stories260K with 2 threads:
// 2^12–2^13 decode fastest, 2^16 is 5-10% slower, 2^18 (no attention split) 35% slower.
constexpr int64_t kMinParallelWork = int64_t{1} << 13;

// y[rows] = W[rows, cols] x[cols] (+ bias) by kernels::MatMulRows (the batched decode
// products' kernel, so Decode and DecodeBatch agree bit for bit); rows split over the
// OpenMP pool when `may_split` and the matrix is large enough to pay for it.
void MatVec(const float* w, const float* x, const float* bias, int64_t rows, int64_t cols, float* y,
            bool may_split) {
  if (!may_split || rows * cols < kMinParallelWork) return kernels::MatMulRows(w, x, bias, 1, rows, cols, y, 0, rows);
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t block = kernels::MatMulRowsBlock();
    const int64_t blocks = (rows + block - 1) / block;
    const int64_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
    kernels::MatMulRows(w, x, bias, 1, rows, cols, y, b0 * block, std::min(rows, b1 * block));
  }
}

void RmsNormRow(const float* x, const float* w, int64_t n, double eps, float* out) {
  float ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * inv);
}

// rotate_half RoPE of one head vector with precomputed cos/sin [d/2].
void RopeRow(float* v, const float* cos, const float* sin, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = v[i], b = v[i + half];
    v[i] = a * cos[i] - b * sin[i];
    v[i + half] = b * cos[i] + a * sin[i];
  }
}

}  // namespace

absl::Status DeviceOptions::Validate() const {
  ECHOKV_ASSIGN_OR_RETURN(at::ScalarType st, ParseDType(dtype));
  try {
    c10::Device dev(device);
    if (dev.is_cuda() && !at::hasCUDA()) {
      return absl::FailedPreconditionError(
          absl::StrCat("device '", device, "' requested but this LibTorch build has no CUDA support"));
    }
    if (!dev.is_cpu() && !dev.is_cuda()) {
      return absl::InvalidArgumentError(absl::StrCat("device must be cpu or cuda[:N], got '", device, "'"));
    }
    if (dev.is_cpu() && st == at::kHalf) {
      return absl::InvalidArgumentError(
          "dtype float16 needs device cuda: LibTorch's CPU kernels have no float16 matrix products "
          "(use float32 or bfloat16 on cpu)");
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("device must be cpu or cuda[:N], got '", device, "'"));
  }
  if (num_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_threads must be >= 0, got ", num_threads));
  }
  return absl::OkStatus();
}

struct Transformer::Impl {
  struct Layer {
    at::Tensor input_norm;   // [D]
    at::Tensor wqkv;         // [(H + 2G) d, D] fused q/k/v projection
    at::Tensor bqkv;         // [(H + 2G) d] or undefined
    at::Tensor wo;           // [D, H d]
    at::Tensor bo;           // [D] or undefined
    at::Tensor post_norm;    // [D]
    at::Tensor w_gate_up;    // [2 I, D] fused gate/up projection
    at::Tensor w_down;       // [D, I]
  };

  ModelConfig config;
  DeviceOptions device_options;
  at::TensorOptions options;       // model dtype + device
  at::Tensor embed;                // [V, D]
  std::vector<Layer> layers;
  at::Tensor final_norm;           // [D]
  at::Tensor lm_head;              // [V, D] (the embedding when tied)
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

  at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight) const {
    // HF LlamaRMSNorm: normalise in float32, cast back, then scale.
    at::Tensor xf = x.to(at::kFloat);
    at::Tensor var = xf.pow(2).mean(-1, /*keepdim=*/true);
    at::Tensor normed = xf * at::rsqrt(var + config.rms_norm_eps);
    return weight * normed.to(x.scalar_type());
  }

  // Rotates x [N, m, d] (rows are heads) with tables cos/sin [m, d] float32.
  static at::Tensor Rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    at::Tensor xf = x.to(at::kFloat);
    const int64_t half = xf.size(-1) / 2;
    at::Tensor rotated = at::cat({-xf.narrow(-1, half, half), xf.narrow(-1, 0, half)}, -1);
    return (xf * cos + rotated * sin).to(x.scalar_type());
  }

  // Attention of queries q [H, m, d] (post-RoPE, at positions qpos) over the layer's
  // cache entries k, v [G, n, d] at kpos [G, n]. Returns [m, H d].
  at::Tensor Attention(int layer, const at::Tensor& q, const std::vector<int64_t>& qpos, const at::Tensor& k,
                       const at::Tensor& v, const at::Tensor& kpos) const {
    const int64_t H = config.num_heads, G = config.num_kv_heads, r = H / G, d = config.head_dim;
    const int64_t m = q.size(1), n = k.size(1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const bool window = config.UsesSlidingWindow(layer);
    at::Tensor kpos_dev = kpos.to(q.device());                       // [G, n]
    at::Tensor qpos_all = at::tensor(qpos, at::kLong).to(q.device());  // [m]
    at::Tensor out = at::empty({H, m, d}, q.options());
    const int64_t block = std::max<int64_t>(1, std::min<int64_t>(m, kMaxScoreElements / std::max<int64_t>(1, H * n)));
    at::Tensor kt = k.transpose(1, 2);  // [G, d, n]
    for (int64_t s = 0; s < m; s += block) {
      const int64_t b = std::min(block, m - s);
      at::Tensor qb = q.narrow(1, s, b).reshape({G, r * b, d});           // heads of a group together
      at::Tensor scores = at::bmm(qb, kt).to(at::kFloat).mul_(scale);   // [G, r*b, n]
      at::Tensor qp = qpos_all.narrow(0, s, b).view({1, b, 1});          // [1, b, 1]
      at::Tensor kp = kpos_dev.view({G, 1, n});                          // [G, 1, n]
      at::Tensor allowed = kp <= qp;                                     // [G, b, n]
      if (window) allowed = allowed & ((qp - kp) < config.sliding_window);
      allowed = allowed.unsqueeze(1).expand({G, r, b, n}).reshape({G, r * b, n});
      scores.masked_fill_(allowed.logical_not(), -std::numeric_limits<float>::infinity());
      at::Tensor probs = at::softmax(scores, -1).to(v.scalar_type());
      at::Tensor ob = at::bmm(probs, v);                                 // [G, r*b, d]
      out.narrow(1, s, b).copy_(ob.view({H, b, d}));
    }
    return out.transpose(0, 1).reshape({m, H * d});
  }

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
                            const KvCache& cache) const {
    const int64_t H = config.num_heads, G = config.num_kv_heads, d = config.head_dim, m = q.size(1);
    at::Tensor qc = q.stride(2) == 1 ? q : q.contiguous();
    at::Tensor out = at::empty({m, H * d}, q.options());
    std::vector<const int64_t*> kpos(G);
    for (int64_t g = 0; g < G; ++g) kpos[g] = cache.cells().positions(layer, static_cast<int>(g)).data();
    kernels::CausalAttentionArgs a;
    a.num_heads = H;
    a.num_kv_heads = G;
    a.head_dim = d;
    a.q = qc.data_ptr<float>();
    a.q_row_stride = qc.stride(1);
    a.q_head_stride = qc.stride(0);
    a.m = m;
    a.q_positions = qpos.data();
    a.k = cache.KeyData(layer);
    a.v = cache.ValueData(layer);
    a.kv_group_stride = cache.GroupStride(layer);
    a.n = cache.size(layer);
    a.key_positions = kpos.data();
    a.sliding_window = config.UsesSlidingWindow(layer) ? config.sliding_window : 0;
    a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    a.out = out.data_ptr<float>();
    a.out_row_stride = H * d;
    a.out_head_stride = d;
    pools->ForDecodeLoops();
    at::parallel_for(0, kernels::CausalAttentionWorkItems(a), 1,
                     [&](int64_t b, int64_t e) { kernels::CausalAttention(a, b, e); });
    pools->ForBatched();
    return out;
  }

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
                   int64_t pos, bool window, float scale, float* out_row) const {
    constexpr int64_t kKeyBlock = 64;
    const int64_t n = cache.size(layer), d = config.head_dim;
    const int64_t h0 = split.HeadBegin(t), heads = split.HeadEnd(t) - h0, g = split.Group(t);
    const float* q = q_row + h0 * d;
    float* out = out_row + h0 * d;
    const int64_t stride = cache.GroupStride(layer);
    const float* keys = cache.KeyData(layer) + g * stride;
    const float* values = cache.ValueData(layer) + g * stride;
    float* scores = Scratch(kScoresScratch, heads * n);
    for (int64_t j0 = 0; j0 < n; j0 += kKeyBlock) {
      const int64_t m = std::min(kKeyBlock, n - j0);
      for (int64_t h = 0; h < heads; ++h) ScoreRows(q + h * d, keys + j0 * d, m, d, scale, scores + h * n + j0);
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* s = scores + h * n;
      if (window) {
        const std::vector<int64_t>& kpos = cache.cells().positions(layer, static_cast<int>(g));
        for (int64_t j = 0; j < n; ++j) {
          if (pos - kpos[j] >= config.sliding_window) s[j] = -std::numeric_limits<float>::infinity();
        }
      }
      const float mx = kernels::MaxOf(s, n);
      // exp by kernels/exp2_poly.h, vectorised: libm's expf, one call per score, was 8%
      // of stories260K's decode (40 heads x every position per token).
      const float den = kernels::ExpShiftSum(s, n, mx);  // masked scores (-inf) give 0
      const float inv_den = 1.0f / den;
      kernels::ScaleInPlace(s, n, inv_den);
      // The group's values are still in L2 for the next head.
      WeightedSumRows(s, values, n, d, out + h * d);
    }
  }

  // DecodeBatch on CPU float32 for N > 1 validated rows (distinct caches).
  absl::StatusOr<std::vector<DecodeResult>> DecodeBatchCpu(absl::Span<const DecodeRow> rows) const;
  // The whole step for `rows` on the pools as they are set (DecodeBatchCpu's body).
  // `blas`: products through OpenBLAS, the rest on this thread; otherwise our loops,
  // split over the OpenMP pool when `split_ops` (each on this thread when not).
  absl::StatusOr<std::vector<DecodeResult>> DecodeBatchRows(absl::Span<const DecodeRow> rows, bool blas,
                                                            bool split_ops) const;

  // One token on CPU float32 with plain loops (same math as Forward, which the tests
  // compare it with). Appends the token's KV to `cache`.
  absl::StatusOr<DecodeResult> DecodeCpu(int token, KvCache* cache, bool return_queries) const {
    const ModelConfig& c = config;
    const int64_t D = c.hidden_size, H = c.num_heads, G = c.num_kv_heads, d = c.head_dim;
    const int64_t I = c.intermediate_size, V = c.vocab_size;
    const int64_t pos = cache->next_position();
    // Every buffer of the step carved from this thread's scratch (nothing is allocated
    // per token but the returned logits).
    float *x, *h, *qkv, *attn, *o, *gu, *act, *down, *cos, *sin;
    const std::pair<float**, int64_t> parts[] = {{&x, D},         {&h, D},       {&qkv, (H + 2 * G) * d},
                                                 {&attn, H * d},  {&o, D},       {&gu, 2 * I},
                                                 {&act, I},       {&down, D},    {&cos, d / 2},
                                                 {&sin, d / 2}};
    int64_t total = 0;
    for (const auto& [ptr, n] : parts) total += n;
    float* next = Scratch(kDecodeScratch, total);
    for (const auto& [ptr, n] : parts) *ptr = std::exchange(next, next + n);
    std::copy(embed.data_ptr<float>() + token * D, embed.data_ptr<float>() + (token + 1) * D, x);
    const float* inv = inv_freq.data_ptr<float>();
    for (int64_t i = 0; i < d / 2; ++i) {
      const float angle = static_cast<float>(pos) * inv[i];  // float32 angle, as the reference
      cos[i] = std::cos(angle);
      sin[i] = std::sin(angle);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    DecodeResult result;
    for (int l = 0; l < c.num_layers; ++l) {
      const Layer& w = layers[l];
      RmsNormRow(x, w.input_norm.data_ptr<float>(), D, c.rms_norm_eps, h);
      MatVec(w.wqkv.data_ptr<float>(), h, w.bqkv.defined() ? w.bqkv.data_ptr<float>() : nullptr, (H + 2 * G) * d, D,
             qkv, !small_model);
      float* q = qkv;
      float* k = q + H * d;
      float* v = k + G * d;
      for (int64_t i = 0; i < H; ++i) RopeRow(q + i * d, cos, sin, d);
      for (int64_t i = 0; i < G; ++i) RopeRow(k + i * d, cos, sin, d);
      ECHOKV_RETURN_IF_ERROR(cache->AppendRow(l, k, v, pos));
      if (return_queries) {
        result.queries.push_back(at::from_blob(q, {H, d}, at::kFloat).clone());
      }
      const int64_t n = cache->size(l);
      const bool window = c.UsesSlidingWindow(l);
      // KV groups (or runs of their heads) split over the OpenMP pool when there is
      // enough work.
      const GroupSplit split = SplitGroups(1, omp_get_max_threads());
#pragma omp parallel for schedule(static) if (!small_model && H * n * d >= kMinParallelWork)
      for (int64_t t = 0; t < split.Items(G); ++t) AttendGroup(*cache, l, split, t, q, pos, window, scale, attn);
      MatVec(w.wo.data_ptr<float>(), attn, w.bo.defined() ? w.bo.data_ptr<float>() : nullptr, D, H * d, o,
             !small_model);
      for (int64_t i = 0; i < D; ++i) x[i] += o[i];
      RmsNormRow(x, w.post_norm.data_ptr<float>(), D, c.rms_norm_eps, h);
      MatVec(w.w_gate_up.data_ptr<float>(), h, nullptr, 2 * I, D, gu, !small_model);
      for (int64_t i = 0; i < I; ++i) {
        const float g = gu[i];
        act[i] = g / (1.0f + std::exp(-g)) * gu[I + i];
      }
      MatVec(w.w_down.data_ptr<float>(), act, nullptr, D, I, down, !small_model);
      for (int64_t i = 0; i < D; ++i) x[i] += down[i];
    }
    cache->set_next_position(pos + 1);
    RmsNormRow(x, final_norm.data_ptr<float>(), D, c.rms_norm_eps, h);
    result.logits = at::empty({V}, at::kFloat);
    MatVec(lm_head.data_ptr<float>(), h, nullptr, V, D, result.logits.data_ptr<float>(), !small_model);
    return result;
  }
};

namespace {

// A copy of CPU tensor `t` in huge-page memory (common/huge_pages.h) when it holds
// 1 MiB or more and the mapping succeeds (else `t` itself); adds the bytes the kernel
// accepted the advice for to *advised_bytes.
at::Tensor OnHugePages(const at::Tensor& t, int64_t* advised_bytes) {
  if (!t.device().is_cpu() || !t.is_contiguous() || t.nbytes() < (size_t{1} << 20)) return t;
  HugePageBuffer buffer = HugePageBuffer::Allocate(t.nbytes());
  if (!buffer.ok()) return t;
  std::memcpy(buffer.data(), t.data_ptr(), t.nbytes());
  const size_t size = buffer.size();
  if (buffer.advised()) *advised_bytes += static_cast<int64_t>(size);
  return at::from_blob(
      buffer.Release(), t.sizes(), [size](void* data) { HugePageBuffer::Free(data, size); }, t.options());
}

// Row i of a [N, cols] float32 matrix.
inline float* RowPtr(at::Tensor& m, int64_t i) { return m.data_ptr<float>() + i * m.size(1); }

// y[n, rows] = x[n, cols] W[rows, cols]^T (+ bias) by kernels::MatMulRows: every output
// is the bits the single-row Decode computes, but each weight row is read from memory
// once for all n inputs, in register tiles of rows x inputs. Row blocks are handed out
// on demand: on a shared machine one of the team's threads is often descheduled, and a
// static half would hold the whole step until it runs again.
void MatMulRows(const float* w, const float* x, const float* bias, int64_t n, int64_t rows, int64_t cols, float* y,
                bool may_split) {
  const int64_t block = kernels::MatMulRowsBlock() * 8;
  const int64_t blocks = (rows + block - 1) / block;
#pragma omp parallel for schedule(dynamic, 1) if (may_split && n * rows * cols >= kMinParallelWork)
  for (int64_t b = 0; b < blocks; ++b) {
    kernels::MatMulRows(w, x, bias, n, rows, cols, y, b * block, std::min(rows, (b + 1) * block));
  }
}

// out [N, rows] = in [N, cols] W[rows, cols]^T (+ bias) for every row of the batch at
// once: our loops (MatMulRows, OpenMP pool) or one OpenBLAS product (batched pool).
void BatchedLinear(bool blas, bool may_split, const at::Tensor& in, const at::Tensor& w, const at::Tensor& bias,
                   at::Tensor& out) {
  if (!blas) {
    return MatMulRows(w.data_ptr<float>(), in.data_ptr<float>(), bias.defined() ? bias.data_ptr<float>() : nullptr,
                      in.size(0), w.size(0), w.size(1), out.data_ptr<float>(), may_split);
  }
  if (bias.defined()) {
    at::addmm_out(out, bias, in, w.t());
  } else {
    at::mm_out(out, in, w.t());
  }
}

}  // namespace

absl::StatusOr<std::vector<DecodeResult>> Transformer::Impl::DecodeBatchCpu(absl::Span<const DecodeRow> rows) const {
  // Products: by default our own loops on the OpenMP pool (MatMulRows), the whole step
  // in the decode-loop setting, attention parallel over (row, head). Measured on the
  // 2-core bench machine (docs/BENCHMARKS.md), OpenBLAS's small-row products were no
  // faster than N single-row decodes up to N ~ 8 with the core OpenBLAS detects here
  // (Prescott kernels on a CPU with AVX-512), and they sum in another order than
  // Decode. ECHOKV_DECODE_BATCH_BLAS=1 (read at load) selects the OpenBLAS products in
  // the batched setting instead, with the per-row loops on this thread (handing the
  // cores over twice per layer costs more than those loops).
  const bool blas = decode_batch_blas;
  if (blas) {
    pools->ForBatched();
  } else {
    pools->ForDecodeLoops();
  }
  RecordPools(&PoolTrace::decode_batches, &PoolTrace::decode_batch);
  // A small model's step is split by rows: each thread runs the whole step for its share
  // of the rows (the weights fit in each core's cache), one fork/join per step instead of
  // ~6 per layer, and its operations stay on that thread. Each row's bits do not depend
  // on the rows it is batched with. stories260K, 2 threads, `echokv-bench-model --batches
  // 1,16`, 3 interleaved pairs: 16 rows 0.88-0.95 ms per step vs 0.95-0.96 split by
  // operation (the 40M model's products would read its weights once per thread instead).
  const int64_t N = static_cast<int64_t>(rows.size());
  const int64_t T = std::min<int64_t>(N, omp_get_max_threads());
  if (blas || !small_model || T < 2) return DecodeBatchRows(rows, blas, /*split_ops=*/!small_model);
  std::vector<absl::StatusOr<std::vector<DecodeResult>>> parts(T);
#pragma omp parallel for schedule(static, 1) num_threads(T)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t b = N * t / T, e = N * (t + 1) / T;
    try {
      parts[t] = DecodeBatchRows(rows.subspan(b, e - b), blas, /*split_ops=*/false);
    } catch (const c10::Error& err) {  // nothing may leave an OpenMP region
      parts[t] = absl::InternalError(absl::StrCat("batched decode failed: ", ErrorText(err)));
    } catch (const std::exception& err) {
      parts[t] = absl::InternalError(absl::StrCat("batched decode failed: ", err.what()));
    }
  }
  std::vector<DecodeResult> results;
  results.reserve(N);
  for (auto& part : parts) {
    if (!part.ok()) return part.status();
    for (DecodeResult& r : *part) results.push_back(std::move(r));
  }
  return results;
}

absl::StatusOr<std::vector<DecodeResult>> Transformer::Impl::DecodeBatchRows(absl::Span<const DecodeRow> rows,
                                                                             bool blas, bool split_ops) const {
  const ModelConfig& c = config;
  const bool loops_split = !blas && split_ops;
  const int64_t N = static_cast<int64_t>(rows.size());
  const int64_t D = c.hidden_size, H = c.num_heads, G = c.num_kv_heads, d = c.head_dim;
  const int64_t I = c.intermediate_size, V = c.vocab_size, QKV = (H + 2 * G) * d, half = d / 2;
  const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat);
  at::Tensor x = at::empty({N, D}, f32), h = at::empty({N, D}, f32), qkv = at::empty({N, QKV}, f32);
  at::Tensor attn = at::empty({N, H * d}, f32), o = at::empty({N, D}, f32), gu = at::empty({N, 2 * I}, f32);
  at::Tensor act = at::empty({N, I}, f32), down = at::empty({N, D}, f32);
  std::vector<int64_t> pos(N);
  std::vector<float> cos(N * half), sin(N * half);
  const float* inv = inv_freq.data_ptr<float>();
  for (int64_t i = 0; i < N; ++i) {
    const float* e = embed.data_ptr<float>() + rows[i].token * D;
    std::copy(e, e + D, RowPtr(x, i));
    pos[i] = rows[i].cache->next_position();
    for (int64_t j = 0; j < half; ++j) {
      const float angle = static_cast<float>(pos[i]) * inv[j];  // float32 angle, as DecodeCpu
      cos[i * half + j] = std::cos(angle);
      sin[i * half + j] = std::sin(angle);
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<DecodeResult> results(N);
  for (int l = 0; l < c.num_layers; ++l) {
    const Layer& w = layers[l];
    for (int64_t i = 0; i < N; ++i) {
      RmsNormRow(RowPtr(x, i), w.input_norm.data_ptr<float>(), D, c.rms_norm_eps, RowPtr(h, i));
    }
    BatchedLinear(blas, loops_split, h, w.wqkv, w.bqkv, qkv);
    const bool window = c.UsesSlidingWindow(l);
    for (int64_t i = 0; i < N; ++i) {
      float* q = RowPtr(qkv, i);
      float* k = q + H * d;
      float* v = k + G * d;
      const float* ci = cos.data() + i * half;
      const float* si = sin.data() + i * half;
      for (int64_t hh = 0; hh < H; ++hh) RopeRow(q + hh * d, ci, si, d);
      for (int64_t g = 0; g < G; ++g) RopeRow(k + g * d, ci, si, d);
      KvCache* cache = rows[i].cache;
      ECHOKV_RETURN_IF_ERROR(cache->AppendRow(l, k, v, pos[i]));
      if (rows[i].return_queries) results[i].queries.push_back(at::from_blob(q, {H, d}, at::kFloat).clone());
    }
    // Attention per (row, KV group) after every row's entry is appended; the rows'
    // caches are distinct, so the pairs are independent. A group's heads stay on one
    // thread: split over threads, each would read the group's keys and values from
    // memory (at 16 streams of the 40M model attention took 4.0 ms of a 16.8 ms step
    // with one item per head).
    int64_t work = 0;
    for (int64_t i = 0; i < N; ++i) work += rows[i].cache->size(l) * H * d;
    const GroupSplit split = SplitGroups(N, loops_split ? omp_get_max_threads() : 1);
    const int64_t items = split.Items(G);
#pragma omp parallel for schedule(dynamic, 1) if (loops_split && work >= kMinParallelWork)
    for (int64_t p = 0; p < N * items; ++p) {
      const int64_t i = p / items;
      AttendGroup(*rows[i].cache, l, split, p % items, RowPtr(qkv, i), pos[i], window, scale, RowPtr(attn, i));
    }
    BatchedLinear(blas, loops_split, attn, w.wo, w.bo, o);
    x.add_(o);
    for (int64_t i = 0; i < N; ++i) {
      RmsNormRow(RowPtr(x, i), w.post_norm.data_ptr<float>(), D, c.rms_norm_eps, RowPtr(h, i));
    }
    BatchedLinear(blas, loops_split, h, w.w_gate_up, at::Tensor(), gu);
    // SiLU rows split over the pool (std::exp per entry: 0.6 ms of a 16-row step of the
    // 40M model on one thread).
#pragma omp parallel for schedule(static) if (loops_split && N * I >= kMinParallelWork)
    for (int64_t i = 0; i < N; ++i) {
      const float* gi = RowPtr(gu, i);
      float* ai = RowPtr(act, i);
      for (int64_t j = 0; j < I; ++j) {
        const float g = gi[j];
        ai[j] = g / (1.0f + std::exp(-g)) * gi[I + j];
      }
    }
    BatchedLinear(blas, loops_split, act, w.w_down, at::Tensor(), down);
    x.add_(down);
  }
  for (int64_t i = 0; i < N; ++i) {
    rows[i].cache->set_next_position(pos[i] + 1);
    RmsNormRow(RowPtr(x, i), final_norm.data_ptr<float>(), D, c.rms_norm_eps, RowPtr(h, i));
  }
  at::Tensor logits = at::empty({N, V}, f32);
  BatchedLinear(blas, loops_split, h, lm_head, at::Tensor(), logits);
  // Each row's logits are a contiguous view of the batch's [N, V] block.
  for (int64_t i = 0; i < N; ++i) results[i].logits = logits.select(0, i);
  return results;
}

at::Tensor ComputeRopeInvFreq(const ModelConfig& config) {
  return ApplyRopeScaling(kernels::RopeInvFreq(config.head_dim, config.rope_theta), config.rope_scaling);
}

at::Tensor ApplyRopeScaling(const at::Tensor& inv_freq, const RopeScaling& rs) {
  const at::Tensor inv = inv_freq.to(at::kFloat);  // [d/2]
  switch (rs.type) {
    case RopeScalingType::kNone:
      return inv;
    case RopeScalingType::kLinear:
      // HF: inv_freq /= factor (float32 division by the float32-rounded factor).
      return inv / rs.factor;
    case RopeScalingType::kLlama3: {
      // Each line mirrors one line of transformers' _compute_llama3_parameters; Python
      // scalars become float32 inside the tensor op, and `scalar / t` is
      // t.reciprocal() * scalar (torch's Tensor.__rtruediv__), as here.
      const double original = rs.original_max_position_embeddings;
      const double low_freq_wavelen = original / rs.low_freq_factor;    // Python float
      const double high_freq_wavelen = original / rs.high_freq_factor;  // Python float
      at::Tensor wavelen = inv.reciprocal() * (2.0 * M_PI);            // 2 * math.pi / inv_freq
      at::Tensor inv_llama = at::where(wavelen > low_freq_wavelen, inv / rs.factor, inv);
      at::Tensor smooth = (wavelen.reciprocal() * original - rs.low_freq_factor) /
                          (rs.high_freq_factor - rs.low_freq_factor);
      at::Tensor smoothed = at::rsub(smooth, 1.0) * inv_llama / rs.factor + smooth * inv_llama;
      at::Tensor medium = (wavelen < high_freq_wavelen).logical_not() & (wavelen > low_freq_wavelen).logical_not();
      return at::where(medium, smoothed, inv_llama);
    }
  }
  return inv;
}

Transformer::Transformer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Transformer::~Transformer() = default;

const ModelConfig& Transformer::config() const { return impl_->config; }
const DeviceOptions& Transformer::device_options() const { return impl_->device_options; }
at::Tensor Transformer::RopeInvFreq() const { return impl_->inv_freq; }

KvCache Transformer::NewCache() const {
  return KvCache(impl_->config.num_layers, impl_->config.num_kv_heads, impl_->config.head_dim, impl_->options);
}

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Load(const std::string& dir, const DeviceOptions& device) {
  ECHOKV_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(dir));
  return Create(config, *checkpoint, device);
}

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Create(const ModelConfig& config,
                                                                 const Checkpoint& checkpoint,
                                                                 const DeviceOptions& device) {
  ECHOKV_RETURN_IF_ERROR(config.Validate());
  ECHOKV_RETURN_IF_ERROR(device.Validate());
  ECHOKV_RETURN_IF_ERROR(ValidateCheckpoint(checkpoint, config));
  ECHOKV_ASSIGN_OR_RETURN(at::ScalarType dtype, ParseDType(device.dtype));
  // Parameters (embedding, attention, MLP, LM head) for the small-model thread default.
  const int64_t D = config.hidden_size, Hd = int64_t{config.num_heads} * config.head_dim,
                Gd = int64_t{config.num_kv_heads} * config.head_dim;
  const int64_t parameters =
      int64_t{config.vocab_size} * D * (config.tie_word_embeddings ? 1 : 2) +
      int64_t{config.num_layers} * (D * Hd + 2 * D * Gd + Hd * D + 3 * D * int64_t{config.intermediate_size});
  const ThreadChoice chosen = CapForModelSize(ChooseThreadCount(), parameters);
  const int threads = device.num_threads > 0 ? device.num_threads : chosen.threads;
  const std::string threads_why = device.num_threads > 0 ? std::string("--threads") : chosen.reason;

  auto impl = std::make_unique<Impl>();
  impl->pools = std::make_unique<ThreadPools>(threads);
  const char* blas_env = std::getenv("ECHOKV_DECODE_BATCH_BLAS");
  impl->decode_batch_blas = blas_env != nullptr && std::string(blas_env) == "1";
  // ECHOKV_DECODE_SPLIT=rows or =ops (read at load) overrides the choice by size.
  const char* split_env = std::getenv("ECHOKV_DECODE_SPLIT");
  const std::string split = split_env != nullptr ? split_env : "";
  if (!split.empty() && split != "rows" && split != "ops") {
    return absl::InvalidArgumentError(
        absl::StrCat("ECHOKV_DECODE_SPLIT is '", split, "'; expected 'rows', 'ops' or unset (by model size)"));
  }
  impl->small_model = split.empty() ? parameters < kSmallModelParameters : split == "rows";
  impl->pools->ForBatched();
  impl->config = config;
  impl->device_options = device;
  int64_t huge_page_bytes = 0;
  try {
    impl->options = at::TensorOptions().dtype(dtype).device(c10::Device(device.device));
    auto load = [&](const std::string& name) -> at::Tensor {
      const TensorView* t = checkpoint.Find(name);  // present: ValidateCheckpoint passed
      at::Tensor raw = at::from_blob(const_cast<uint8_t*>(t->data), t->shape,
                                     at::TensorOptions().dtype(ToScalarType(t->dtype)));
      return raw.to(impl->options, /*non_blocking=*/false, /*copy=*/true).contiguous();
    };
    // Matrices of 1 MiB and more go to huge-page memory (common/huge_pages.h): decode
    // streams them once per token.
    auto big = [&](const at::Tensor& t) { return OnHugePages(t, &huge_page_bytes); };
    const std::string p = "model.layers.";
    impl->embed = big(load("model.embed_tokens.weight"));
    for (int l = 0; l < config.num_layers; ++l) {
      const std::string b = absl::StrCat(p, l, ".");
      Impl::Layer layer;
      layer.input_norm = load(b + "input_layernorm.weight");
      layer.post_norm = load(b + "post_attention_layernorm.weight");
      layer.wqkv = big(at::cat({load(b + "self_attn.q_proj.weight"), load(b + "self_attn.k_proj.weight"),
                                load(b + "self_attn.v_proj.weight")},
                               0));
      if (config.qkv_bias) {
        layer.bqkv = at::cat({load(b + "self_attn.q_proj.bias"), load(b + "self_attn.k_proj.bias"),
                              load(b + "self_attn.v_proj.bias")},
                             0);
      }
      layer.wo = big(load(b + "self_attn.o_proj.weight"));
      if (config.o_bias) layer.bo = load(b + "self_attn.o_proj.bias");
      layer.w_gate_up = big(at::cat({load(b + "mlp.gate_proj.weight"), load(b + "mlp.up_proj.weight")}, 0));
      layer.w_down = big(load(b + "mlp.down_proj.weight"));
      impl->layers.push_back(std::move(layer));
    }
    impl->final_norm = load("model.norm.weight");
    impl->lm_head = config.tie_word_embeddings ? impl->embed : big(load("lm_head.weight"));
    impl->inv_freq = ComputeRopeInvFreq(config).contiguous();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("loading weights failed: ", ErrorText(e)));
  }
  ECHOKV_LOG(INFO) << "loaded " << ModelTypeName(config.type) << " model: " << config.num_layers << " layers, "
                   << config.num_heads << "/" << config.num_kv_heads << " heads, d=" << config.head_dim
                   << ", rope_scaling " << RopeScalingTypeName(config.rope_scaling.type) << ", vocab " << config.vocab_size << " on " << device.device << " " << device.dtype << ", "
                   << threads << " threads [" << threads_why << "] (" << impl->pools->Describe() << "; decode "
                   << (impl->small_model ? "loops on one thread, batches split by rows" : "loops split")
                   << (split.empty() ? "" : " [ECHOKV_DECODE_SPLIT]") << "); "
                   << DescribeBlasSetup() << "; attention kernel " << kernels::AttentionIsa() << "; "
                   << (huge_page_bytes >> 20) << " MiB of weights on huge pages";
  return std::unique_ptr<Transformer>(new Transformer(std::move(impl)));
}

absl::StatusOr<ForwardResult> Transformer::Forward(absl::Span<const int> tokens, KvCache* cache,
                                                   const ForwardOptions& options) const {
  const ModelConfig& c = impl_->config;
  if (tokens.empty()) return absl::InvalidArgumentError("tokens: at least one token is required");
  if (cache == nullptr) return absl::InvalidArgumentError("cache must not be null");
  if (cache->num_layers() != c.num_layers || cache->num_kv_heads() != c.num_kv_heads ||
      cache->head_dim() != c.head_dim) {
    return absl::InvalidArgumentError("cache shape does not match the model (use Transformer::NewCache)");
  }
  if (options.chunk_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_size must be >= 1, got ", options.chunk_size));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", tokens[i], " at index ", i,
                                                     " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  const int64_t total = static_cast<int64_t>(tokens.size());
  const int64_t start = cache->next_position();
  const int64_t H = c.num_heads, G = c.num_kv_heads, d = c.head_dim;
  const int64_t keep = options.keep_last_queries < 0 ? total : std::min<int64_t>(options.keep_last_queries, total);
  const int64_t keep_from = total - keep;  // token index of the first kept query

  // CPU float32 (model and cache) attends with the fused kernel; other devices and
  // dtypes with the ATen composition (Impl::Attention).
  const bool fused = impl_->CanUseCpuKernels(*cache);
  impl_->pools->ForBatched();
  // Per-op laps for options.profile (nothing is timed without it).
  auto lap_start = std::chrono::steady_clock::now();
  auto lap = [&](double PrefillProfile::*field) {
    if (options.profile == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    if (field != nullptr) options.profile->*field += std::chrono::duration<double>(now - lap_start).count();
    lap_start = now;
  };
  ForwardResult result;
  std::vector<std::vector<at::Tensor>> kept_queries(c.num_layers);
  try {
    const at::Device dev = impl_->options.device();
    at::Tensor last_hidden;
    for (int64_t s = 0; s < total; s += options.chunk_size) {
      if (options.cancel != nullptr && options.cancel->load()) return absl::CancelledError("forward cancelled");
      const int64_t m = std::min<int64_t>(options.chunk_size, total - s);
      const bool last_chunk = s + m == total;
      // Per chunk, not once per call: whatever ran since the last chunk (a decode step
      // of the engine, say) may have handed the threads to the other pool.
      impl_->pools->ForBatched();
      impl_->RecordPools(&PoolTrace::prefill_chunks, &PoolTrace::prefill_chunk);
      std::vector<int64_t> pos(m);
      for (int64_t i = 0; i < m; ++i) pos[i] = start + s + i;
      at::Tensor cos, sin;
      kernels::RopeTables(pos, impl_->inv_freq, dev, &cos, &sin);  // [m, d]
      lap(&PrefillProfile::rope);
      std::vector<int64_t> ids(tokens.begin() + s, tokens.begin() + s + m);
      at::Tensor x = impl_->embed.index_select(0, at::tensor(ids, at::kLong).to(dev));  // [m, D]
      lap(&PrefillProfile::embed);

      for (int l = 0; l < c.num_layers; ++l) {
        const Impl::Layer& w = impl_->layers[l];
        at::Tensor h = impl_->RmsNorm(x, w.input_norm);
        lap(&PrefillProfile::norms);
        at::Tensor qkv = w.bqkv.defined() ? at::linear(h, w.wqkv, w.bqkv) : at::linear(h, w.wqkv);
        lap(&PrefillProfile::qkv);
        at::Tensor q = qkv.narrow(1, 0, H * d).view({m, H, d}).transpose(0, 1);          // [H, m, d]
        at::Tensor k = qkv.narrow(1, H * d, G * d).view({m, G, d}).transpose(0, 1);      // [G, m, d]
        at::Tensor v = qkv.narrow(1, (H + G) * d, G * d).view({m, G, d}).transpose(0, 1);
        if (last_chunk && options.return_anchor_queries) {
          result.anchor_queries.push_back(q.select(1, m - 1).to(at::kFloat).to(at::kCPU).clone());  // [H, d]
        }
        q = Impl::Rope(q, cos, sin);
        k = Impl::Rope(k, cos, sin);
        lap(&PrefillProfile::rope);
        ECHOKV_RETURN_IF_ERROR(cache->Append(l, k, v, pos));
        if (s + m > keep_from) {
          const int64_t from = std::max<int64_t>(keep_from - s, 0);
          kept_queries[l].push_back(q.narrow(1, from, m - from).to(at::kFloat));
        }
        lap(&PrefillProfile::cache);
        at::Tensor attn = fused ? impl_->FusedAttention(l, q, pos, *cache)
                                : impl_->Attention(l, q, pos, cache->keys(l), cache->values(l), cache->positions(l));
        lap(&PrefillProfile::attention);
        at::Tensor o = w.bo.defined() ? at::linear(attn, w.wo, w.bo) : at::linear(attn, w.wo);
        x = x + o;
        lap(&PrefillProfile::out_proj);
        at::Tensor h2 = impl_->RmsNorm(x, w.post_norm);
        lap(&PrefillProfile::norms);
        at::Tensor gu = at::linear(h2, w.w_gate_up);  // [m, 2I]
        const int64_t inter = c.intermediate_size;
        at::Tensor act = at::silu(gu.narrow(1, 0, inter)) * gu.narrow(1, inter, inter);
        x = x + at::linear(act, w.w_down);
        lap(&PrefillProfile::mlp);
      }
      cache->set_next_position(start + s + m);
      if (last_chunk) last_hidden = x.select(0, m - 1);
      if (options.progress) options.progress(s + m, total);
      lap(nullptr);  // the progress callback is the caller's time
    }
    at::Tensor normed = impl_->RmsNorm(last_hidden, impl_->final_norm);
    lap(&PrefillProfile::norms);
    result.logits = at::linear(normed, impl_->lm_head).to(at::kFloat).to(at::kCPU).contiguous();
    lap(&PrefillProfile::lm_head);
    if (keep > 0) {
      for (int l = 0; l < c.num_layers; ++l) result.queries.push_back(at::cat(kept_queries[l], 1));
      for (int64_t i = keep_from; i < total; ++i) result.query_positions.push_back(start + i);
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("forward failed: ", ErrorText(e)));
  }
  return result;
}

absl::StatusOr<DecodeResult> Transformer::Decode(int token, KvCache* cache, bool return_queries) const {
  if (cache != nullptr && impl_->CanUseCpuKernels(*cache) && cache->num_layers() == impl_->config.num_layers &&
      cache->num_kv_heads() == impl_->config.num_kv_heads && cache->head_dim() == impl_->config.head_dim) {
    if (token < 0 || token >= impl_->config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", token, " at index 0 is outside the vocabulary [0, ",
                                                     impl_->config.vocab_size, ")"));
    }
    try {
      impl_->pools->ForDecodeLoops();
      impl_->RecordPools(&PoolTrace::decodes, &PoolTrace::decode);
      return impl_->DecodeCpu(token, cache, return_queries);
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("decode failed: ", ErrorText(e)));
    }
  }
  return DecodeWithForward(token, cache, return_queries);
}

absl::StatusOr<DecodeResult> Transformer::DecodeWithForward(int token, KvCache* cache, bool return_queries) const {
  ForwardOptions options;
  options.keep_last_queries = return_queries ? 1 : 0;
  const int tokens[1] = {token};
  ECHOKV_ASSIGN_OR_RETURN(ForwardResult r, Forward(absl::MakeConstSpan(tokens, 1), cache, options));
  DecodeResult out;
  out.logits = std::move(r.logits);
  if (return_queries) {
    for (at::Tensor& q : r.queries) out.queries.push_back(q.select(1, 0));  // [H, d]
  }
  return out;
}

absl::StatusOr<std::vector<DecodeResult>> Transformer::DecodeBatch(absl::Span<const DecodeRow> rows) const {
  const ModelConfig& c = impl_->config;
  bool fast = true;
  for (size_t i = 0; i < rows.size(); ++i) {
    const KvCache* cache = rows[i].cache;
    if (cache == nullptr) return absl::InvalidArgumentError(absl::StrCat("rows[", i, "].cache must not be null"));
    if (cache->num_layers() != c.num_layers || cache->num_kv_heads() != c.num_kv_heads ||
        cache->head_dim() != c.head_dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows[", i, "].cache shape does not match the model (use Transformer::NewCache)"));
    }
    if (rows[i].token < 0 || rows[i].token >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("rows[", i, "].token id ", rows[i].token,
                                                     " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
    for (size_t j = 0; j < i; ++j) {
      // Two rows appending to one cache would each attend without the other's entry.
      if (rows[j].cache == cache) {
        return absl::InvalidArgumentError(absl::StrCat("rows[", j, "] and rows[", i, "] share one cache"));
      }
    }
    fast = fast && impl_->CanUseCpuKernels(*cache);
  }
  std::vector<DecodeResult> out;
  if (rows.empty()) return out;
  if (rows.size() == 1 || !fast) {
    // The single-stream fast path unchanged; other devices/dtypes row by row.
    for (const DecodeRow& row : rows) {
      ECHOKV_ASSIGN_OR_RETURN(DecodeResult r, Decode(row.token, row.cache, row.return_queries));
      out.push_back(std::move(r));
    }
    return out;
  }
  try {
    return impl_->DecodeBatchCpu(rows);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("batched decode failed: ", ErrorText(e)));
  }
}

PoolTrace Transformer::pool_trace() const {
  std::lock_guard<std::mutex> lock(impl_->trace_mu);
  PoolTrace t = impl_->trace;
  t.threads = impl_->pools->threads();
  return t;
}

}  // namespace echokv::model
