// Eq. 3 attention-pooling scores (launch.h, part b): kernels::AttentionScores on CUDA.
//
// Rows are (head of the group, query) pairs: row rho of group g is query rho % nq of
// head g*r + rho / nq, i.e. queries + (g*r*nq + rho) * d. Tiles are 32 rows x 32 keys,
// staged in shared memory as float32 (padded by one float per row: no bank conflicts);
// a block of 8 warps gives each warp 4 rows of the tile and each lane one key.
//  pass 1 (grid: row tiles x groups x key splits): per row an online max / sum over the
//    split's keys (warp max and sum per tile) -> (m, l) per row and split;
//  merge  (one thread per row): the splits in split order -> lse per row;
//  pass 2 (grid: key tiles x groups): the block keeps its 32 keys and walks every query
//    tile of each head, adding exp(logit - lse) per key in a register; the 8 warps' sums
//    are added in warp order and each out[h, j] is written once.
// Both passes compute a logit with the same code, so pass 2's probabilities use the
// same bits as the log-sum-exp they are divided by. No atomics: the same inputs give the
// same bits on every run.
#include <algorithm>

#include "kernels/cuda/device_math.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/launch.h"

namespace echokv::kernels::cuda {
namespace {

using cuda_math::NumSplits;
using cuda_math::ProbFromLse;
using cuda_math::SoftmaxState;

constexpr int kTile = 32;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = kTile / kWarps;  // 4

__host__ __device__ inline int64_t RowCount(const ScoreParams& p) {
  return p.num_heads / p.num_kv_heads * p.num_queries;
}
__host__ __device__ inline int64_t KeySplits(const ScoreParams& p) { return NumSplits(p.num_keys, p.split); }
__host__ inline size_t TileBytes(int64_t d) { return static_cast<size_t>(2 * kTile * (d + 1)) * sizeof(float); }

// The workspace: m and l of [G, rows, splits], then lse [G, rows].
struct ScoreWorkspace {
  float* m;
  float* l;
  float* lse;
};
__device__ inline ScoreWorkspace Split(const ScoreParams& p) {
  const int64_t n = p.num_kv_heads * RowCount(p) * KeySplits(p);
  return ScoreWorkspace{p.workspace, p.workspace + n, p.workspace + 2 * n};
}

// dot(qs row, ks row) over d from shared memory (rows ld floats apart).
__device__ __forceinline__ float TileDot(const float* qrow, const float* krow, int64_t d) {
  float acc = 0.0f;
  for (int64_t t = 0; t < d; ++t) acc += qrow[t] * krow[t];
  return acc;
}

// Stages keys [j0, j0 + 32) of group g (zeros past `end`) into ks.
template <typename T>
__device__ __forceinline__ void LoadKeyTile(const ScoreParams& p, int64_t g, int64_t j0, int64_t end, float* ks) {
  const int64_t d = p.head_dim, ld = d + 1;
  const T* keys = static_cast<const T*>(p.keys) + g * p.key_group_stride;
  for (int64_t i = threadIdx.x; i < kTile * d; i += kThreads) {
    const int64_t kk = i / d, t = i % d, j = j0 + kk;
    ks[kk * ld + t] = j < end ? ToFloat(keys[j * p.key_row_stride + t]) : 0.0f;
  }
}

// Stages rows [row0, row0 + 32) of group g's rows (scaled; zeros past the last row).
__device__ __forceinline__ void LoadRowTile(const ScoreParams& p, int64_t g, int64_t row0, int64_t row_end,
                                            float* qs) {
  const int64_t d = p.head_dim, ld = d + 1;
  const int64_t r = p.num_heads / p.num_kv_heads;
  const float* rows = p.queries + g * r * p.num_queries * d;
  for (int64_t i = threadIdx.x; i < kTile * d; i += kThreads) {
    const int64_t rr = i / d, t = i % d, row = row0 + rr;
    qs[rr * ld + t] = row < row_end ? rows[row * d + t] * p.scale : 0.0f;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ScorePass1Kernel(ScoreParams p) {
  extern __shared__ float smem[];
  const int64_t d = p.head_dim, ld = d + 1;
  float* qs = smem;
  float* ks = smem + kTile * ld;
  const int64_t g = blockIdx.y, s = blockIdx.z;
  const int64_t rows = RowCount(p);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool causal = p.query_positions != nullptr;

  LoadRowTile(p, g, row0, rows, qs);
  int64_t qpos[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int64_t row = row0 + warp * kRowsPerWarp + i;
    qpos[i] = causal && row < rows ? p.query_positions[row % p.num_queries] : 0;
  }
  SoftmaxState st[kRowsPerWarp];
  const int64_t begin = s * p.split;
  const int64_t end = begin + p.split < p.num_keys ? begin + p.split : p.num_keys;
  for (int64_t j0 = begin; j0 < end; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed (and, first, the row tile is staged)
    LoadKeyTile<T>(p, g, j0, end, ks);
    __syncthreads();
    const int64_t j = j0 + lane;
    const bool valid = j < end;
    const int64_t kpos = causal && valid ? p.key_positions[g * p.num_keys + j] : 0;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int rr = warp * kRowsPerWarp + i;
      const float dot = TileDot(qs + rr * ld, ks + lane * ld, d);
      const float logit = valid && (!causal || kpos <= qpos[i]) ? dot : -INFINITY;
      const float mx = WarpMax(logit);
      const float m_new = fmaxf(st[i].m, mx);
      if (m_new == -INFINITY) continue;  // nothing visible yet (uniform across the warp)
      const float w = logit == -INFINITY ? 0.0f : cuda_math::ExpF(logit - m_new);
      const float sum = WarpSum(w);
      st[i].l = st[i].l * SoftmaxState::Rescale(st[i].m, m_new) + sum;
      st[i].m = m_new;
    }
  }
  if (lane == 0) {
    const ScoreWorkspace ws = Split(p);
    const int64_t splits = KeySplits(p);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int64_t row = row0 + warp * kRowsPerWarp + i;
      if (row >= rows) continue;
      const int64_t slot = (g * rows + row) * splits + s;
      ws.m[slot] = st[i].m;
      ws.l[slot] = st[i].l;
    }
  }
}

__global__ void ScoreLseKernel(ScoreParams p) {
  const int64_t total = p.num_kv_heads * RowCount(p);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const ScoreWorkspace ws = Split(p);
  const int64_t splits = KeySplits(p);
  SoftmaxState acc;
  for (int64_t s = 0; s < splits; ++s) {
    SoftmaxState other;
    other.m = ws.m[i * splits + s];
    other.l = ws.l[i * splits + s];
    float a, b;
    acc.Merge(other, &a, &b);
  }
  ws.lse[i] = acc.Lse();
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ScorePass2Kernel(ScoreParams p) {
  extern __shared__ float smem[];
  __shared__ float lse_s[kTile];
  __shared__ int64_t qpos_s[kTile];
  __shared__ float red[kWarps][32];
  const int64_t d = p.head_dim, ld = d + 1;
  float* qs = smem;
  float* ks = smem + kTile * ld;
  const int64_t g = blockIdx.y;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t r = p.num_heads / p.num_kv_heads, nq = p.num_queries, rows = RowCount(p);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool causal = p.query_positions != nullptr;
  const int64_t j = j0 + lane;
  const bool valid = j < p.num_keys;
  const ScoreWorkspace ws = Split(p);

  LoadKeyTile<T>(p, g, j0, p.num_keys, ks);
  const int64_t kpos = causal && valid ? p.key_positions[g * p.num_keys + j] : 0;
  for (int64_t hl = 0; hl < r; ++hl) {
    float acc = 0.0f;
    for (int64_t q0 = 0; q0 < nq; q0 += kTile) {
      __syncthreads();  // the previous query tile (and the key tile's staging) is done
      const int64_t row0 = hl * nq + q0;
      const int64_t row_end = hl * nq + nq;
      LoadRowTile(p, g, row0, row_end, qs);
      if (threadIdx.x < kTile) {
        const int64_t q = q0 + threadIdx.x;
        lse_s[threadIdx.x] = q < nq ? ws.lse[g * rows + row0 + threadIdx.x] : INFINITY;
        qpos_s[threadIdx.x] = causal && q < nq ? p.query_positions[q] : 0;
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const int rr = warp * kRowsPerWarp + i;
        if (q0 + rr >= nq) continue;
        const float dot = TileDot(qs + rr * ld, ks + lane * ld, d);
        const float logit = valid && (!causal || kpos <= qpos_s[rr]) ? dot : -INFINITY;
        acc += ProbFromLse(logit, lse_s[rr]);
      }
    }
    red[warp][lane] = acc;
    __syncthreads();
    if (warp == 0) {
      float total = 0.0f;
      for (int w = 0; w < kWarps; ++w) total += red[w][lane];
      if (valid) p.out[(g * r + hl) * p.num_keys + j] = total;
    }
    __syncthreads();
  }
}

template <typename T>
cudaError_t LaunchTyped(const ScoreParams& p, cudaStream_t stream) {
  const size_t smem = TileBytes(p.head_dim);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(ScorePass1Kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (e == cudaSuccess) {
      e = cudaFuncSetAttribute(ScorePass2Kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem));
    }
    if (e != cudaSuccess) return e;
  }
  const int64_t rows = RowCount(p);
  const dim3 grid1(static_cast<unsigned>((rows + kTile - 1) / kTile), static_cast<unsigned>(p.num_kv_heads),
                   static_cast<unsigned>(KeySplits(p)));
  ScorePass1Kernel<T><<<grid1, kThreads, smem, stream>>>(p);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const int64_t total = p.num_kv_heads * rows;
  ScoreLseKernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(p);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const dim3 grid2(static_cast<unsigned>((p.num_keys + kTile - 1) / kTile), static_cast<unsigned>(p.num_kv_heads));
  ScorePass2Kernel<T><<<grid2, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

int64_t ScoreWorkspaceFloats(const ScoreParams& p) {
  if (p.num_kv_heads < 1 || p.split < 1) return 0;
  const int64_t rows = p.num_kv_heads * RowCount(p);
  return rows * (2 * KeySplits(p) + 1);
}

cudaError_t LaunchAttentionScores(const ScoreParams& p, cudaStream_t stream) {
  if (p.num_kv_heads < 1 || p.num_heads < p.num_kv_heads || p.num_heads % p.num_kv_heads != 0 || p.head_dim < 1 ||
      p.head_dim > 256 || p.num_queries < 0 || p.num_keys < 0 || p.split < 1 || p.out == nullptr ||
      (p.num_queries > 0 && p.queries == nullptr) || (p.num_keys > 0 && p.keys == nullptr) ||
      ((p.query_positions == nullptr) != (p.key_positions == nullptr)) || p.num_kv_heads > 65535 ||
      KeySplits(p) > 65535 || (p.workspace == nullptr && ScoreWorkspaceFloats(p) > 0)) {
    return cudaErrorInvalidValue;
  }
  if (p.num_keys == 0) return cudaSuccess;
  if (p.num_queries == 0) {
    return cudaMemsetAsync(p.out, 0, static_cast<size_t>(p.num_heads * p.num_keys) * sizeof(float), stream);
  }
  switch (p.key_dtype) {
    case DType::kFloat32:
      return LaunchTyped<float>(p, stream);
    case DType::kBFloat16:
      return LaunchTyped<__nv_bfloat16>(p, stream);
    case DType::kFloat16:
      return LaunchTyped<__half>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace echokv::kernels::cuda
