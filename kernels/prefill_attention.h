// Attention of a prefill chunk over its layer's cache through scaled_dot_product_attention's
// fused backends on CUDA (FlashAttention for bf16 / fp16, the memory-efficient kernel for
// float32: no score matrix is ever stored, so memory is O((m + n) d), never O(L^2)),
// and the same algorithm on plain ATen elsewhere (the reference the CPU build tests).
//
// The cache holds n entries per group, the chunk's own m last (at positions p0 ..
// p0+m-1 in every group) and n - m older ones, all at positions < p0 (whatever a
// compression kept): every chunk query sees every older entry and the chunk's entries
// up to its own. So the attention is two parts with no mask of their own, merged by
// their log-sum-exp:
//   A: the older entries, the group's r heads folded into the query length
//      (q as [G, r m, d] against [G, n - m, d]: each KV read once per group);
//   B: the chunk against itself, causal (is_causal: a square tril, diagonal included).
//
//   ECHOKV_ASSIGN_OR_RETURN(at::Tensor o, ChunkAttention(q, k, v, /*scale=*/0));  // [H, m, d]
#ifndef ECHOKV_KERNELS_PREFILL_ATTENTION_H_
#define ECHOKV_KERNELS_PREFILL_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <string>

#include "absl/status/statusor.h"

namespace echokv::kernels {

// q [H, m, d] (post-RoPE), k and v [G, n, d] with n >= m, as above; H % G == 0; one
// dtype and device. scale 0 = 1/sqrt(d). Returns [H, m, d] in q's dtype. No sliding
// window (a model with one keeps the ATen composition with its mask).
absl::StatusOr<at::Tensor> ChunkAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          double scale = 0.0);

// The path ChunkAttention takes for q's device, dtype and head dim: "flash",
// "efficient" or "reference".
std::string ChunkAttentionBackend(const at::Tensor& q);

}  // namespace echokv::kernels

#endif  // ECHOKV_KERNELS_PREFILL_ATTENTION_H_
