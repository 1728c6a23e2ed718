// echokv's CUDA kernels (kernels/cuda/launch.h) for ATen tensors on a CUDA device, each
// with the CPU function it mirrors as its reference (the `cuda` tests compare them):
//   DecodeAttentionBatch  ~ kernels::CausalAttention, one query per row, over ragged
//                           per-(row, group) caches in one launch;
//   AttentionScores       = kernels::AttentionScores (Eq. 3, causal rule optional);
//   TopKIndices           = kernels::TopKIndices (ties to the lower index, NaN as -inf);
//   GatherKv              ~ kernels::GatherEntries for K, V and positions at once, into a
//                           compact layer with room to append;
//   RopeAtPositions       ~ kernels::ApplyRope at per-row positions.
// Work goes on the current CUDA stream; nothing synchronises with the host except where
// a function says so. Bad input gives InvalidArgument naming the field; a CUDA error
// gives Internal with the error's name. Only the CUDA build (ECHOKV_CUDA) has this file.
//
//   DecodeBatchInput in;
//   in.q = q;                                  // [B, H, d] post-RoPE
//   in.keys = {k0, k1};  in.values = {v0, v1};  // each [G, n_b, d], n_b may differ
//   ECHOKV_ASSIGN_OR_RETURN(at::Tensor o, DecodeAttentionBatch(in));   // [B, H, d]
//   ECHOKV_ASSIGN_OR_RETURN(at::Tensor keep, TopKIndices(group_scores, /*k=*/B));
#ifndef ECHOKV_KERNELS_CUDA_OPS_H_
#define ECHOKV_KERNELS_CUDA_OPS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/score.h"

namespace echokv::kernels::cuda {

// Whether LibTorch sees a CUDA device (false on a machine without one).
bool DeviceAvailable();

struct DecodeBatchInput {
  at::Tensor q;                         // [B, H, d] float32 / bfloat16 / float16, CUDA
  std::vector<at::Tensor> keys;         // B tensors [G, n_b, d]: q's dtype and device, stride(2) == 1
  std::vector<at::Tensor> values;       // B tensors, each with its keys' shape and strides
  // Optional [B, G] int64 (any device): group g of row b attends to its first
  // group_lengths[b][g] <= n_b entries (ragged groups); undefined: all n_b.
  at::Tensor group_lengths;
  // With window > 0 only: B tensors [G, n_b] int64 (the entries' positions) and the
  // rows' query positions [B] int64 (any device).
  std::vector<at::Tensor> key_positions;
  at::Tensor q_positions;
  int64_t window = 0;
  double scale = 0.0;   // 0 = 1/sqrt(d)
  int64_t split = 512;  // keys per split (launch.h: fixed, so batching changes no bits)
};
// out[b, h] = softmax(scale q[b, h] . K_b,g^T) V_b,g, g = h / (H/G): [B, H, d] in q's dtype.
absl::StatusOr<at::Tensor> DecodeAttentionBatch(const DecodeBatchInput& in);

// kernels::AttentionScores' contract for CUDA keys (float32, bfloat16 or float16; head
// dim <= 256): [H, L] float32 on the keys' device. options.chunk and query_chunk are
// not used (the kernel's tiles bound its memory).
absl::StatusOr<at::Tensor> AttentionScores(const at::Tensor& queries, const at::Tensor& keys,
                                           const ScoreOptions& options);

// kernels::TopKIndices' selection for CUDA scores [G, L] (L < 2^31): [G, min(k, L)] int64
// on the scores' device, ascending per row.
absl::StatusOr<at::Tensor> TopKIndices(const at::Tensor& scores, int64_t k);

// A compact layer: k, v [G, capacity, d] whose first n rows per group are the kept
// entries (the rest unwritten, room for appends); positions [G, n] int64.
struct CompactLayer {
  at::Tensor k;
  at::Tensor v;
  at::Tensor positions;
};
// Gathers entries indices[g] ([G, n] int64, each in [0, L); checked on the host when
// indices are a CPU tensor) of k, v [G, L, d] (CUDA, one dtype of 2 or 4 bytes, the
// same strides, stride(2) == 1) and positions [G, L] int64 (any device) into a new
// compact layer of `capacity` >= n rows.
absl::StatusOr<CompactLayer> GatherKv(const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                                      const at::Tensor& indices, int64_t capacity);

// x [..., R, d] rows on CUDA (float32 / bfloat16 / float16) rotated by HF's
// rotate_half RoPE: the i-th row of the flattened [N, d] view (N = x.numel() / d) to
// positions[(i / rows_per_position) % P] (positions [P] int64, any device) with
// inv_freq [d/2] float32. Returns a new tensor of x's shape and dtype. Examples:
// q [B, H, d] at B row positions: rows_per_position = H; q [H, m, d] at m positions: 1.
absl::StatusOr<at::Tensor> RopeAtPositions(const at::Tensor& x, const at::Tensor& positions,
                                           int64_t rows_per_position, const at::Tensor& inv_freq);

// Makes kernels::AttentionScores and kernels::TopKIndices (and so every policy of
// compression/) run the functions above for CUDA inputs (kernels::DeviceScoreKernels);
// inputs they do not take (head dim > 256, other dtypes) keep the ATen path. A CUDA
// error is thrown as c10::Error, as those functions report theirs. Idempotent.
void RegisterScoreKernels();

}  // namespace echokv::kernels::cuda

#endif  // ECHOKV_KERNELS_CUDA_OPS_H_
