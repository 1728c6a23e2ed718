// Batched decode attention over ragged compact caches (launch.h, part a).
//
// Grid: (split, group x head chunk, row). A block of 4 warps takes one split of one
// (row, group) span; each warp walks every 4th key of the split. Per key, each lane
// holds E = ceil(d/32) of the key's elements (a row's loads are contiguous across the
// warp), the R heads' dot products are warp sums, and an online softmax per head keeps
// m, l and the lane's E output elements in registers: the key and value rows are read
// once for the group's R heads (R = H/G up to 8 per block; more heads take more head
// chunks). The 4 warps' states merge in warp order in shared memory; a span of one split
// writes its output, longer spans write partial (m, l, o) and DecodeMergeKernel combines
// them in split order. No atomics: every output is the same bits on every run.
#include <algorithm>

#include "kernels/cuda/device_math.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/launch.h"

namespace echokv::kernels::cuda {
namespace {

using cuda_math::KeyVisible;
using cuda_math::NumSplits;
using cuda_math::SoftmaxState;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

struct Workspace {
  float* o;  // [count, d]
  float* m;  // [count]
  float* l;  // [count]
};

__device__ __forceinline__ int64_t SlotCount(const DecodeAttentionParams& p) {
  return p.batch * p.num_heads * NumSplits(p.max_n, p.split);
}

__device__ __forceinline__ Workspace Slots(const DecodeAttentionParams& p) {
  const int64_t count = SlotCount(p);
  return Workspace{p.workspace, p.workspace + count * p.head_dim, p.workspace + count * (p.head_dim + 1)};
}

// Slot of (row b, head h, split s): [B, H, S_max].
__device__ __forceinline__ int64_t Slot(const DecodeAttentionParams& p, int64_t b, int64_t h, int64_t s) {
  return (b * p.num_heads + h) * NumSplits(p.max_n, p.split) + s;
}

template <typename T, int R, int E>
__global__ void __launch_bounds__(kThreads) DecodeSplitKernel(DecodeAttentionParams p) {
  const int64_t b = blockIdx.z;
  const int64_t num_g = p.num_kv_heads, r = p.num_heads / num_g, d = p.head_dim;
  const int64_t chunks = (r + R - 1) / R;
  const int64_t g = blockIdx.y / chunks;
  const int64_t h0 = (blockIdx.y % chunks) * R;  // first head of the chunk, within the group
  const int nh = static_cast<int>(r - h0 < R ? r - h0 : R);
  const int64_t s = blockIdx.x;
  KvSpan span = p.spans[b * num_g + g];
  span.n = span.n < p.max_n ? span.n : p.max_n;  // never past the grid and the workspace
  const int64_t splits = NumSplits(span.n, p.split);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  T* out = static_cast<T*>(p.out) + (b * p.num_heads + g * r + h0) * d;

  if (splits == 0) {  // no entries: zeros, as the CPU kernels give
    if (s == 0) {
      for (int64_t i = threadIdx.x; i < nh * d; i += kThreads) out[i] = FromFloat<T>(0.0f);
    }
    return;
  }
  if (s >= splits) return;

  const T* qrow = static_cast<const T*>(p.q) + (b * p.num_heads + g * r + h0) * d;
  float q[R][E];
#pragma unroll
  for (int h = 0; h < R; ++h) {
#pragma unroll
    for (int t = 0; t < E; ++t) {
      const int64_t e = lane * E + t;
      q[h][t] = (h < nh && e < d) ? ToFloat(qrow[h * d + e]) * p.scale : 0.0f;
    }
  }
  SoftmaxState st[R];
  float o[R][E];
#pragma unroll
  for (int h = 0; h < R; ++h) {
#pragma unroll
    for (int t = 0; t < E; ++t) o[h][t] = 0.0f;
  }

  const bool masked = p.window > 0 && span.positions != nullptr;
  const int64_t qpos = masked ? p.q_positions[b] : 0;
  const int64_t j_begin = s * p.split;
  const int64_t j_end = j_begin + p.split < span.n ? j_begin + p.split : span.n;
  const T* kbase = static_cast<const T*>(span.k);
  const T* vbase = static_cast<const T*>(span.v);
  for (int64_t j = j_begin + warp; j < j_end; j += kWarps) {
    const T* kr = kbase + j * span.row_stride;
    const T* vr = vbase + j * span.row_stride;
    float kf[E], vf[E];
#pragma unroll
    for (int t = 0; t < E; ++t) {
      const int64_t e = lane * E + t;
      kf[t] = e < d ? ToFloat(kr[e]) : 0.0f;
      vf[t] = e < d ? ToFloat(vr[e]) : 0.0f;
    }
    const bool visible = !masked || KeyVisible(span.positions[j], qpos, p.window);
#pragma unroll
    for (int h = 0; h < R; ++h) {
      float part = 0.0f;
#pragma unroll
      for (int t = 0; t < E; ++t) part += q[h][t] * kf[t];
      const float logit = visible ? WarpSum(part) : -INFINITY;
      if (h < nh) {
        float alpha;
        const float w = st[h].Add(logit, &alpha);
#pragma unroll
        for (int t = 0; t < E; ++t) o[h][t] = o[h][t] * alpha + w * vf[t];
      }
    }
  }

  // Merge the warps' states in warp order.
  __shared__ float sm_o[kWarps][R][E * 32];
  __shared__ float sm_m[kWarps][R];
  __shared__ float sm_l[kWarps][R];
#pragma unroll
  for (int h = 0; h < R; ++h) {
#pragma unroll
    for (int t = 0; t < E; ++t) sm_o[warp][h][lane * E + t] = o[h][t];
    if (lane == 0) {
      sm_m[warp][h] = st[h].m;
      sm_l[warp][h] = st[h].l;
    }
  }
  __syncthreads();
  const Workspace ws = Slots(p);
  for (int64_t i = threadIdx.x; i < nh * d; i += kThreads) {
    const int h = static_cast<int>(i / d);
    const int64_t e = i % d;
    SoftmaxState acc;
    float oe = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      SoftmaxState other;
      other.m = sm_m[w][h];
      other.l = sm_l[w][h];
      float self_scale, other_scale;
      acc.Merge(other, &self_scale, &other_scale);
      oe = oe * self_scale + sm_o[w][h][e] * other_scale;
    }
    if (splits == 1) {
      out[i] = FromFloat<T>(acc.l > 0.0f ? oe / acc.l : 0.0f);
    } else {
      const int64_t slot = Slot(p, b, g * r + h0 + h, s);
      ws.o[slot * d + e] = oe;
      if (e == 0) {
        ws.m[slot] = acc.m;
        ws.l[slot] = acc.l;
      }
    }
  }
}

// One block per (head, row) of a span with more than one split: the splits' partial
// outputs combined in split order.
template <typename T>
__global__ void __launch_bounds__(kThreads) DecodeMergeKernel(DecodeAttentionParams p) {
  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int64_t r = p.num_heads / p.num_kv_heads, d = p.head_dim;
  const KvSpan span = p.spans[b * p.num_kv_heads + h / r];
  const int64_t splits = NumSplits(span.n < p.max_n ? span.n : p.max_n, p.split);
  if (splits <= 1) return;
  const Workspace ws = Slots(p);
  T* out = static_cast<T*>(p.out) + (b * p.num_heads + h) * d;
  for (int64_t e = threadIdx.x; e < d; e += kThreads) {
    SoftmaxState acc;
    float oe = 0.0f;
    for (int64_t s = 0; s < splits; ++s) {
      const int64_t slot = Slot(p, b, h, s);
      SoftmaxState other;
      other.m = ws.m[slot];
      other.l = ws.l[slot];
      float self_scale, other_scale;
      acc.Merge(other, &self_scale, &other_scale);
      oe = oe * self_scale + ws.o[slot * d + e] * other_scale;
    }
    out[e] = FromFloat<T>(acc.l > 0.0f ? oe / acc.l : 0.0f);
  }
}

template <typename T, int R, int E>
cudaError_t LaunchTyped(const DecodeAttentionParams& p, cudaStream_t stream) {
  const int64_t r = p.num_heads / p.num_kv_heads;
  const int64_t chunks = (r + R - 1) / R;
  const int64_t splits = std::max<int64_t>(NumSplits(p.max_n, p.split), 1);
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.num_kv_heads * chunks),
                  static_cast<unsigned>(p.batch));
  DecodeSplitKernel<T, R, E><<<grid, kThreads, 0, stream>>>(p);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || NumSplits(p.max_n, p.split) <= 1) return e;
  const dim3 merge_grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.batch));
  DecodeMergeKernel<T><<<merge_grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int R>
cudaError_t DispatchE(const DecodeAttentionParams& p, cudaStream_t stream) {
  const int64_t d = p.head_dim;
  if (d <= 32) return LaunchTyped<T, R, 1>(p, stream);
  if (d <= 64) return LaunchTyped<T, R, 2>(p, stream);
  if (d <= 128) return LaunchTyped<T, R, 4>(p, stream);
  return LaunchTyped<T, R, 8>(p, stream);
}

template <typename T>
cudaError_t DispatchR(const DecodeAttentionParams& p, cudaStream_t stream) {
  const int64_t r = p.num_heads / p.num_kv_heads;
  if (r <= 1) return DispatchE<T, 1>(p, stream);
  if (r <= 2) return DispatchE<T, 2>(p, stream);
  if (r <= 4) return DispatchE<T, 4>(p, stream);
  return DispatchE<T, 8>(p, stream);
}

}  // namespace

int64_t DecodeAttentionWorkspaceFloats(const DecodeAttentionParams& p) {
  if (p.split <= 0) return 0;
  const int64_t splits = NumSplits(p.max_n, p.split);
  if (splits <= 1) return 0;
  return p.batch * p.num_heads * splits * (p.head_dim + 2);
}

cudaError_t LaunchDecodeAttention(const DecodeAttentionParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.num_kv_heads < 1 || p.num_heads < p.num_kv_heads || p.num_heads % p.num_kv_heads != 0 ||
      p.head_dim < 1 || p.head_dim > 256 || p.split < 1 || p.max_n < 0 || p.q == nullptr || p.out == nullptr ||
      p.spans == nullptr || (p.window > 0 && p.q_positions == nullptr) ||
      (NumSplits(p.max_n, p.split) > 1 && p.workspace == nullptr) || p.batch > 65535 ||
      NumSplits(p.max_n, p.split) > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kFloat32:
      return DispatchR<float>(p, stream);
    case DType::kBFloat16:
      return DispatchR<__nv_bfloat16>(p, stream);
    case DType::kFloat16:
      return DispatchR<__half>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace echokv::kernels::cuda
