// Top-k keys (launch.h, part b): one int64 per score that orders like kernels::TopKIndices
// (cuda_math::TopKKey), so that an exact top-k of the keys is TopKIndices' set.
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/launch.h"

namespace echokv::kernels::cuda {
namespace {

__global__ void TopKKeysKernel(const float* scores, int64_t total, int64_t n, int64_t* keys) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < total) keys[i] = cuda_math::TopKKey(scores[i], i % n);
}

__global__ void TopKKeyIndicesKernel(const int64_t* keys, int64_t count, int64_t* indices) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) indices[i] = cuda_math::TopKKeyIndex(keys[i]);
}

constexpr int kThreads = 256;

unsigned Blocks(int64_t count) { return static_cast<unsigned>((count + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t LaunchTopKKeys(const float* scores, int64_t rows, int64_t n, int64_t* keys, cudaStream_t stream) {
  if (rows < 0 || n < 0 || n > 0x7fffffff || (rows * n > 0 && (scores == nullptr || keys == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (rows * n == 0) return cudaSuccess;
  TopKKeysKernel<<<Blocks(rows * n), kThreads, 0, stream>>>(scores, rows * n, n, keys);
  return cudaGetLastError();
}

cudaError_t LaunchTopKKeyIndices(const int64_t* keys, int64_t count, int64_t* indices, cudaStream_t stream) {
  if (count < 0 || (count > 0 && (keys == nullptr || indices == nullptr))) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  TopKKeyIndicesKernel<<<Blocks(count), kThreads, 0, stream>>>(keys, count, indices);
  return cudaGetLastError();
}

}  // namespace echokv::kernels::cuda
