// Scoring primitives of the eviction policies (docs/ALGORITHM.md §2, §4, §8): the Eq. 3
// attention-pooling score, H2O's causal column sums, 1-D max-pooling, per-group
// summing of head scores, and top-k with ties to the lower index. CPU reference
// implementations on ATen; every function is device-generic (CUDA tensors work).
// Memory is O(queries * chunk) and never O(queries * L) or O(L^2).
//
//   ScoreOptions so;                                     // all queries see all keys
//   at::Tensor s = AttentionScores(q, keys, so);         // q [H, nq, d], keys [G, L, d] -> [H, L]
//   at::Tensor g = SumHeadsPerGroup(s, /*num_kv_heads=*/G);            // [G, L]
//   at::Tensor kept = TopKIndices(g, /*k=*/B);                         // [G, B] ascending
#ifndef ECHOKV_KERNELS_SCORE_H_
#define ECHOKV_KERNELS_SCORE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace echokv::kernels {

struct ScoreOptions {
  // Keys per chunk of the two-pass (log-sum-exp, then probabilities) computation.
  int64_t chunk = 1024;
  // Queries per block (scores are additive over queries): peak memory is
  // O(query_chunk * chunk) per head whatever nq and L are.
  int64_t query_chunk = 256;
  // Optional causal rule (docs/ALGORITHM.md §8.1). query_positions: [nq] int64;
  // key_positions: [G, L] int64. A query at position p sees key j of group g iff
  // key_positions[g, j] <= p. Both undefined: every query sees every key.
  at::Tensor query_positions;
  at::Tensor key_positions;
  // Softmax scale; 0 = 1/sqrt(d).
  double scale = 0.0;
};

// Eq. 3 per query head. queries: [H, nq, d] (post-RoPE); keys: [G, L, d]; head h reads
// only group h / (H/G). Returns [H, L] float32:
//   out[h, i] = sum_q exp(q.k_i * scale) / sum_{j visible to q} exp(q.k_j * scale)
// (0 for keys a query cannot see). Computed in float32 with a stable log-sum-exp.
at::Tensor AttentionScores(const at::Tensor& queries, const at::Tensor& keys,
                           const ScoreOptions& options);

// H2O's accumulated attention (docs/ALGORITHM.md §8.5): the column sums of the causal
// softmax of the given context queries, diagonal included, computed block by block.
// queries [H, nq, d] post-RoPE at query_positions [nq]; keys [G, L, d] at
// key_positions [G, L]. Equal to AttentionScores with the causal rule; [H, L] float32.
at::Tensor CausalColumnSums(const at::Tensor& queries, const at::Tensor& query_positions,
                            const at::Tensor& keys, const at::Tensor& key_positions);

// Sums the H/G consecutive head rows of each group: [H, L] -> [G, L].
at::Tensor SumHeadsPerGroup(const at::Tensor& head_scores, int64_t num_kv_heads);

// 1-D max-pool along the last dim, stride 1, "same" size, out-of-range ignored:
// out[r, i] = max(x[r, j] : |j - i| <= kernel/2). kernel odd >= 1. [R, L] -> [R, L].
at::Tensor MaxPool1d(const at::Tensor& x, int64_t kernel);

// The k largest entries of each row of scores [G, L]; ties go to the lower index;
// returned as [G, min(k, L)] int64 CPU, sorted ascending.
at::Tensor TopKIndices(const at::Tensor& scores, int64_t k);

// Device implementations of AttentionScores and TopKIndices, registered by a library
// that has them (kernels/cuda/ops.h's RegisterScoreKernels in the CUDA build): the
// functions above then call them for CUDA inputs, with the same contract. Each returns
// false, leaving *out alone, for inputs it does not take (the ATen path runs instead).
struct DeviceScoreKernels {
  bool (*attention_scores)(const at::Tensor& queries, const at::Tensor& keys, const ScoreOptions& options,
                           at::Tensor* out) = nullptr;
  bool (*top_k_indices)(const at::Tensor& scores, int64_t k, at::Tensor* out) = nullptr;
};
// `kernels` must outlive every later call (a static); null unregisters.
void RegisterDeviceScoreKernels(const DeviceScoreKernels* kernels);

}  // namespace echokv::kernels

#endif  // ECHOKV_KERNELS_SCORE_H_
