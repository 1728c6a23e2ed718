// The CPU float32 decode fast path (Decode's plain loops, no per-op dispatch) and the
// batched decode step (DecodeBatch: each weight row read once for all rows).
#include "model/transformer_impl.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
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
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/attention_int8.h"
#include "kernels/block_matmul.h"
#include "kernels/matmul_rows.h"
#include "kernels/softmax.h"
#include "kernels/vec16.h"
#include "kernels/weighted_sum.h"

namespace echokv::model {
namespace {

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

// The same on a WeightMatrix: float32 tensors as above, native blocks by NativeMatMul.
void MatVec(const WeightMatrix& w, const float* x, const float* bias, float* y, bool may_split) {
  if (w.native()) return NativeMatMul(w, x, 1, bias, y, may_split);
  MatVec(w.tensor.data_ptr<float>(), x, bias, w.rows(), w.cols(), y, may_split);
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
// Native weights always go through the block kernel (OpenBLAS has no such product).
void BatchedLinear(bool blas, bool may_split, const at::Tensor& in, const WeightMatrix& wm, const at::Tensor& bias,
                   at::Tensor& out) {
  const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
  if (wm.native()) return NativeMatMul(wm, in.data_ptr<float>(), in.size(0), b, out.data_ptr<float>(), may_split);
  const at::Tensor& w = wm.tensor;
  if (!blas) {
    return MatMulRows(w.data_ptr<float>(), in.data_ptr<float>(), b, in.size(0), w.size(0), w.size(1),
                      out.data_ptr<float>(), may_split);
  }
  if (bias.defined()) {
    at::addmm_out(out, bias, in, w.t());
  } else {
    at::mm_out(out, in, w.t());
  }
}

// Row `token` of the embedding as float32 into x [D].
void EmbedRow(const WeightMatrix& embed, int64_t token, float* x) {
  if (embed.native()) return kernels::DequantizeBlockRows(embed.blocks, token, token + 1, x);
  const int64_t D = embed.cols();
  const float* e = embed.tensor.data_ptr<float>() + token * D;
  std::copy(e, e + D, x);
}

}  // namespace

void DequantizeWeightRows(const WeightMatrix& w, int64_t r0, int64_t r1, float* out) {
  if (w.parts.empty()) return kernels::DequantizeBlockRows(w.blocks, r0, r1, out);
  int64_t first = 0;  // the part's first row in the whole matrix
  for (const kernels::BlockMatrix& p : w.parts) {
    const int64_t b = std::max(r0, first), e = std::min(r1, first + p.rows);
    if (b < e) kernels::DequantizeBlockRows(p, b - first, e - first, out + (b - r0) * p.cols);
    first += p.rows;
  }
}

namespace {

// One BlockMatrix (a whole matrix, or a part with m.out_stride the whole one's rows).
void NativePartMatMul(const kernels::BlockMatrix& m, const kernels::QuantizedActs& acts, int64_t n, const float* bias,
                      float* y, bool may_split) {
  const int64_t work = n * m.rows * m.cols;
  if (!may_split || work < kMinParallelWork) return kernels::BlockMatMulRows(m, acts, bias, n, y, 0, m.rows);
  const int64_t block = kernels::BlockMatMulRowsBlock();
  if (n == 1) {
    // As MatVec: one contiguous share of the row blocks per thread.
#pragma omp parallel
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t blocks = (m.rows + block - 1) / block;
      const int64_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
      kernels::BlockMatMulRows(m, acts, bias, 1, y, b0 * block, std::min(m.rows, b1 * block));
    }
    return;
  }
  // As MatMulRows: row blocks handed out on demand.
  const int64_t step = block * 8, steps = (m.rows + step - 1) / step;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < steps; ++b) {
    kernels::BlockMatMulRows(m, acts, bias, n, y, b * step, std::min(m.rows, (b + 1) * step));
  }
}

}  // namespace

void NativeMatMul(const WeightMatrix& w, const float* x, int64_t n, const float* bias, float* y, bool may_split) {
  const int64_t cols = w.cols(), nb = cols / kernels::kBlockValues;
  bool ints = !kernels::TakesFloatInputs(w.blocks.type);
  for (const kernels::BlockMatrix& p : w.parts) ints = ints || !kernels::TakesFloatInputs(p.type);
  // The inputs' int8 blocks, this thread's scratch (reused across products); F16 / BF16
  // rows take the float32 inputs as they are.
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> ds;
  kernels::QuantizedActs acts{nullptr, nullptr, nullptr, x};
  if (ints) {
    if (static_cast<int64_t>(q.size()) < n * cols) q.resize(n * cols);
    if (static_cast<int64_t>(ds.size()) < 2 * n * nb) ds.resize(2 * n * nb);
    kernels::QuantizeActs(x, n, cols, q.data(), ds.data(), ds.data() + n * nb);
    acts = kernels::QuantizedActs{q.data(), ds.data(), ds.data() + n * nb, x};
  }
  if (w.parts.empty()) return NativePartMatMul(w.blocks, acts, n, bias, y, may_split);
  // Parts: each writes its rows of y [n, rows] (out_stride = the whole matrix's rows).
  const int64_t rows = w.rows();
  int64_t first = 0;
  for (kernels::BlockMatrix p : w.parts) {
    p.out_stride = rows;
    NativePartMatMul(p, acts, n, bias != nullptr ? bias + first : nullptr, y + first, may_split);
    first += p.rows;
  }
}

void Transformer::Impl::AttendGroup(const KvCache& cache, int layer, const GroupSplit& split, int64_t t,
                                    const float* q_row, int64_t pos, bool window, float scale, float* out_row) const {
  constexpr int64_t kKeyBlock = 64;
  const int64_t n = cache.size(layer), d = config.head_dim;
  const int64_t h0 = split.HeadBegin(t), heads = split.HeadEnd(t) - h0, g = split.Group(t);
  const float* q = q_row + h0 * d;
  float* out = out_row + h0 * d;
  if (cache.is_int8()) {
    // An int8 cache (issue 31): the group's rows read where they lie, these heads alone
    // (kernels/attention_int8.h: one work item = one group with the heads it is given).
    thread_local std::vector<const int64_t*> kpos;
    kernels::DecodeAttentionInt8Args a = cache.Int8AttentionArgs(layer, &kpos);
    if (a.n == 0) {
      std::fill(out, out + heads * d, 0.0f);
      return;
    }
    a.num_heads = heads;
    a.num_kv_heads = 1;
    a.k += g * a.kv_group_stride;
    a.v += g * a.kv_group_stride;
    a.k_scales += g * a.k_scale_group_stride;
    a.v_scales += g * a.v_scale_group_stride;
    a.key_positions = kpos.data() + g;
    a.q = q;
    a.q_head_stride = d;
    a.q_position = pos;
    a.sliding_window = window ? config.sliding_window : 0;
    a.scale = scale;
    a.out = out;
    a.out_head_stride = d;
    kernels::DecodeAttentionInt8(a, 0, 1);
    return;
  }
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

absl::StatusOr<DecodeResult> Transformer::Impl::DecodeCpu(int token, KvCache* cache, bool return_queries) const {
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
  EmbedRow(embed, token, x);
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
    MatVec(w.wqkv, h, w.bqkv.defined() ? w.bqkv.data_ptr<float>() : nullptr, qkv, !small_model);
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
    MatVec(w.wo, attn, w.bo.defined() ? w.bo.data_ptr<float>() : nullptr, o, !small_model);
    for (int64_t i = 0; i < D; ++i) x[i] += o[i];
    RmsNormRow(x, w.post_norm.data_ptr<float>(), D, c.rms_norm_eps, h);
    MatVec(w.w_gate_up, h, nullptr, gu, !small_model);
    for (int64_t i = 0; i < I; ++i) {
      const float g = gu[i];
      act[i] = g / (1.0f + std::exp(-g)) * gu[I + i];
    }
    MatVec(w.w_down, act, nullptr, down, !small_model);
    for (int64_t i = 0; i < D; ++i) x[i] += down[i];
  }
  cache->set_next_position(pos + 1);
  RmsNormRow(x, final_norm.data_ptr<float>(), D, c.rms_norm_eps, h);
  result.logits = at::empty({V}, at::kFloat);
  MatVec(lm_head, h, nullptr, result.logits.data_ptr<float>(), !small_model);
  return result;
}

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
    EmbedRow(embed, rows[i].token, RowPtr(x, i));
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

}  // namespace echokv::model
