// Gathers per-group entries: the compact cache's K/V and the workspace views of the
// lookahead policies are built with it.
//
//   at::Tensor kept_k = GatherEntries(keys, idx);   // keys [G, L, d], idx [G, n] -> [G, n, d]
#ifndef ECHOKV_KERNELS_GATHER_H_
#define ECHOKV_KERNELS_GATHER_H_

#include <ATen/core/Tensor.h>

namespace echokv::kernels {

// x: [G, L, d] any dtype/device; indices: [G, n] int64 (any device), each in [0, L).
// Returns a new contiguous [G, n, d] tensor on x's device: out[g, i] = x[g, indices[g, i]].
at::Tensor GatherEntries(const at::Tensor& x, const at::Tensor& indices);

}  // namespace echokv::kernels

#endif  // ECHOKV_KERNELS_GATHER_H_
