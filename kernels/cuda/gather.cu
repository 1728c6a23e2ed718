// Gather / compaction of kept entries (launch.h, part b): the kept rows of K and V of
// every group, and their positions, in one launch per layer. One thread per element
// (2- or 4-byte words); blockIdx.y is the group.
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace echokv::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <typename W>
__global__ void GatherKernel(GatherParams p) {
  const int64_t g = blockIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // over n * d
  if (i >= p.n * p.head_dim) return;
  const int64_t row = i / p.head_dim, t = i % p.head_dim;
  const int64_t src = p.indices[g * p.n + row];
  const bool ok = src >= 0 && src < p.src_n;
  const int64_t from = g * p.src_group_stride + src * p.src_row_stride + t;
  const int64_t to = g * p.dst_group_stride + row * p.dst_row_stride + t;
  const W* sk = static_cast<const W*>(p.src_k);
  const W* sv = static_cast<const W*>(p.src_v);
  static_cast<W*>(p.dst_k)[to] = ok ? sk[from] : W(0);
  static_cast<W*>(p.dst_v)[to] = ok ? sv[from] : W(0);
  if (t == 0 && p.dst_positions != nullptr) {
    p.dst_positions[g * p.n + row] = ok ? p.src_positions[g * p.src_n + src] : -1;
  }
}

}  // namespace

cudaError_t LaunchGather(const GatherParams& p, cudaStream_t stream) {
  if (p.groups < 0 || p.n < 0 || p.src_n < 0 || p.head_dim < 1 || (p.elem_bytes != 2 && p.elem_bytes != 4) ||
      p.groups > 65535 || ((p.src_positions == nullptr) != (p.dst_positions == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (p.groups == 0 || p.n == 0) return cudaSuccess;
  if (p.src_k == nullptr || p.src_v == nullptr || p.dst_k == nullptr || p.dst_v == nullptr || p.indices == nullptr) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>((p.n * p.head_dim + kThreads - 1) / kThreads), static_cast<unsigned>(p.groups));
  if (p.elem_bytes == 4) {
    GatherKernel<uint32_t><<<grid, kThreads, 0, stream>>>(p);
  } else {
    GatherKernel<uint16_t><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace echokv::kernels::cuda
