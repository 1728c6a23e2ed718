// The CUDA kernels' launchers: raw device pointers and a stream, no torch (the .cu
// files compile in seconds and without LibTorch's headers). kernels/cuda/ops.h wraps
// them for ATen tensors; that is the interface the rest of echokv uses.
//
//   DecodeAttentionParams p;  // shapes, spans, q, out (see the fields)
//   std::vector<float> ws(DecodeAttentionWorkspaceFloats(p));  // on the device
//   cudaError_t e = LaunchDecodeAttention(p, stream);
//
// Every launcher returns the launch's error (cudaGetLastError after it); none
// synchronises. Element types: DType below; accumulation is float32 throughout.
#ifndef ECHOKV_KERNELS_CUDA_LAUNCH_H_
#define ECHOKV_KERNELS_CUDA_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace echokv::kernels::cuda {

enum class DType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// ---- (a) batched decode attention over ragged compact caches ----
// The entries that one (row, KV group) attends to: entry j's key starts at
// k + j * row_stride elements (head_dim contiguous), its value likewise at v.
struct KvSpan {
  const void* k = nullptr;
  const void* v = nullptr;
  // n positions on the device (with DecodeAttentionParams::window > 0), or null.
  const int64_t* positions = nullptr;
  int64_t n = 0;
  int64_t row_stride = 0;
};

// One query token per row: out[b, h] = softmax(scale * q[b, h] . K^T) V over the
// entries of span (b, h / (H/G)); a row whose span holds no visible entry gets zeros.
// Each span's keys and values are read once for all H/G heads of its group, in splits
// of `split` keys (independent blocks, partial outputs merged by their log-sum-exp in
// split order). The split is fixed, not derived from the batch: a row's result is the
// same bits whatever else is in the batch.
struct DecodeAttentionParams {
  DType dtype = DType::kFloat32;  // of q, out and every span's k and v
  int64_t batch = 0;              // B
  int64_t num_heads = 0;          // H
  int64_t num_kv_heads = 0;       // G, H % G == 0
  int64_t head_dim = 0;           // d <= 256
  const void* q = nullptr;        // [B, H, d] contiguous (post-RoPE)
  void* out = nullptr;            // [B, H, d] contiguous
  const KvSpan* spans = nullptr;  // device, [B * G], row-major
  const int64_t* q_positions = nullptr;  // device [B]; read only with window > 0
  int64_t window = 0;             // sliding window (0: none)
  float scale = 0.0f;
  int64_t max_n = 0;              // the largest span n (the grid's splits)
  int64_t split = 512;            // keys per split
  float* workspace = nullptr;     // device, DecodeAttentionWorkspaceFloats(*this) floats
};
int64_t DecodeAttentionWorkspaceFloats(const DecodeAttentionParams& p);
cudaError_t LaunchDecodeAttention(const DecodeAttentionParams& p, cudaStream_t stream);

// ---- (b) Eq. 3 attention-pooling scores (kernels::AttentionScores) ----
// queries [H, nq, d] float32 contiguous (post-RoPE); keys [G, L, d] (dtype, rows
// key_row_stride elements apart, groups key_group_stride apart). Out [H, L] float32:
// out[h, j] = sum_q exp(scale q.k_j - lse_q), lse over the keys query q sees (with
// positions: key_positions[g, j] <= query_positions[q]; without: all). Two passes, no
// atomics: pass 1 the per-query log-sum-exp over key splits (merged in split order),
// pass 2 one block per key tile summing over every query, so the sums are the same
// bits on every run.
struct ScoreParams {
  DType key_dtype = DType::kFloat32;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;  // d <= 256
  int64_t num_queries = 0;     // nq
  int64_t num_keys = 0;        // L
  const float* queries = nullptr;
  const void* keys = nullptr;
  int64_t key_row_stride = 0;
  int64_t key_group_stride = 0;
  const int64_t* query_positions = nullptr;  // device [nq], or null (no causal rule)
  const int64_t* key_positions = nullptr;    // device [G, L] contiguous, or null
  float scale = 0.0f;
  int64_t split = 1024;        // keys per pass-1 split
  float* out = nullptr;        // [H, L] float32
  float* workspace = nullptr;  // device, ScoreWorkspaceFloats(*this) floats
};
int64_t ScoreWorkspaceFloats(const ScoreParams& p);
cudaError_t LaunchAttentionScores(const ScoreParams& p, cudaStream_t stream);

// ---- (b) top-k keys ----
// keys[r, i] = cuda_math::TopKKey(scores[r, i], i) for rows x n float32 scores.
cudaError_t LaunchTopKKeys(const float* scores, int64_t rows, int64_t n, int64_t* keys, cudaStream_t stream);
// indices[i] = cuda_math::TopKKeyIndex(keys[i]) for count keys.
cudaError_t LaunchTopKKeyIndices(const int64_t* keys, int64_t count, int64_t* indices, cudaStream_t stream);

// ---- (b) gather / compaction of kept entries ----
// For G groups: dst_k[g, i] = src_k[g, indices[g, i]] (and v, and positions when both
// position pointers are set) for i < n; rows of d elements of `elem_bytes` each.
// Strides in elements; an index outside [0, src_n) writes zeros (and position -1).
struct GatherParams {
  int64_t groups = 0, n = 0, src_n = 0, head_dim = 0;
  int64_t elem_bytes = 4;
  const void* src_k = nullptr;
  const void* src_v = nullptr;
  int64_t src_group_stride = 0, src_row_stride = 0;
  void* dst_k = nullptr;
  void* dst_v = nullptr;
  int64_t dst_group_stride = 0, dst_row_stride = 0;
  const int64_t* indices = nullptr;        // device [G, n] contiguous
  const int64_t* src_positions = nullptr;  // device [G, src_n] contiguous, or null
  int64_t* dst_positions = nullptr;        // device [G, n] contiguous, or null
};
cudaError_t LaunchGather(const GatherParams& p, cudaStream_t stream);

// ---- (c) RoPE at given positions ----
// rows x d elements (row_stride apart; in and out may be the same memory): row i is
// rotated to positions[(i / rows_per_position) % num_positions] with inv_freq [d/2]
// (HF rotate_half; cuda_math::RopeCosSin / RopeRotate).
struct RopeParams {
  DType dtype = DType::kFloat32;
  int64_t rows = 0, head_dim = 0, row_stride = 0;
  const void* in = nullptr;
  void* out = nullptr;
  const int64_t* positions = nullptr;  // device
  int64_t num_positions = 0;
  int64_t rows_per_position = 1;
  const float* inv_freq = nullptr;     // device [d/2]
};
cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream);

}  // namespace echokv::kernels::cuda

#endif  // ECHOKV_KERNELS_CUDA_LAUNCH_H_
