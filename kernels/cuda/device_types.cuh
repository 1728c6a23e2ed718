// Loads and stores of the kernels' element types (float, bf16, fp16) through float32,
// and the warp reductions the kernels share. Device code only (.cu files).
#ifndef ECHOKV_KERNELS_CUDA_DEVICE_TYPES_CUH_
#define ECHOKV_KERNELS_CUDA_DEVICE_TYPES_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace echokv::kernels::cuda {

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}

// Butterfly reductions: every lane ends with the same bits (each step adds the same two
// values in either order), so lanes can branch on the result together.
__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float WarpMax(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

}  // namespace echokv::kernels::cuda

#endif  // ECHOKV_KERNELS_CUDA_DEVICE_TYPES_CUH_
