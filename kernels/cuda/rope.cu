// RoPE at given positions (launch.h, part c): one thread per (row, pair i < d/2), the
// angle, cos and sin and the rotation by cuda_math (the CPU's float32 angle and
// roundings). Reads both elements of its pair before writing them: in place is safe.
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/launch.h"

namespace echokv::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void RopeKernel(RopeParams p) {
  const int64_t half = p.head_dim / 2;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.rows * half) return;
  const int64_t row = i / half, k = i % half;
  const int64_t pos = p.positions[(row / p.rows_per_position) % p.num_positions];
  float c, s;
  cuda_math::RopeCosSin(pos, p.inv_freq[k], &c, &s);
  const T* in = static_cast<const T*>(p.in) + row * p.row_stride;
  T* out = static_cast<T*>(p.out) + row * p.row_stride;
  const float x1 = ToFloat(in[k]), x2 = ToFloat(in[k + half]);
  float o1, o2;
  cuda_math::RopeRotate(x1, x2, c, s, &o1, &o2);
  out[k] = FromFloat<T>(o1);
  out[k + half] = FromFloat<T>(o2);
}

}  // namespace

cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.head_dim < 2 || p.head_dim % 2 != 0 || p.row_stride < p.head_dim || p.num_positions < 1 ||
      p.rows_per_position < 1) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  if (p.in == nullptr || p.out == nullptr || p.positions == nullptr || p.inv_freq == nullptr) {
    return cudaErrorInvalidValue;
  }
  const unsigned blocks = static_cast<unsigned>((p.rows * (p.head_dim / 2) + kThreads - 1) / kThreads);
  switch (p.dtype) {
    case DType::kFloat32:
      RopeKernel<float><<<blocks, kThreads, 0, stream>>>(p);
      break;
    case DType::kBFloat16:
      RopeKernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(p);
      break;
    case DType::kFloat16:
      RopeKernel<__half><<<blocks, kThreads, 0, stream>>>(p);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace echokv::kernels::cuda
