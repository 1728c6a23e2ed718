// Rotary position embedding in Hugging Face's rotate_half layout: for x of head dim
// d, x' = x * cos(a) + rotate_half(x) * sin(a), a_i = float32(pos * inv_freq_i),
// with the angle computed in float32 exactly as the reference implementations do.
//
//   at::Tensor inv = RopeInvFreq(/*head_dim=*/64, /*theta=*/10000.0);   // [32]
//   at::Tensor q_rot = ApplyRope(q, positions, inv);   // q: [..., n, d], positions: n
//   at::Tensor props = RotateToPositions(anchor, {L, L+1, ..., L+T-1}, inv);  // [H, T, d]
#ifndef ECHOKV_KERNELS_ROPE_H_
#define ECHOKV_KERNELS_ROPE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "absl/types/span.h"

namespace echokv::kernels {

// inv_freq_i = 1 / theta^(2i/d), i = 0 .. d/2-1, as float32 [d/2] CPU (computed as
// HF does: theta ** (arange(0, d, 2) / d) in float32).
at::Tensor RopeInvFreq(int head_dim, double theta);

// cos/sin tables [n, d] (float32, on `device`) for the given positions.
void RopeTables(absl::Span<const int64_t> positions, const at::Tensor& inv_freq,
                at::Device device, at::Tensor* cos, at::Tensor* sin);

// x: [..., n, d] (any float dtype); returns x rotated to positions[i] along dim -2,
// computed in float32 and cast back to x's dtype.
at::Tensor ApplyRope(const at::Tensor& x, absl::Span<const int64_t> positions,
                     const at::Tensor& inv_freq);

// anchors: [H, d] pre-RoPE vectors; returns [H, T, d] with row t rotated to positions[t]
// (EchoKV's future-position proposals, docs/ALGORITHM.md §3 step 2).
at::Tensor RotateToPositions(const at::Tensor& anchors, absl::Span<const int64_t> positions,
                             const at::Tensor& inv_freq);

}  // namespace echokv::kernels

#endif  // ECHOKV_KERNELS_ROPE_H_
