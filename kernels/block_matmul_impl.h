// Internal to kernels/block_matmul*.cc: the loop over register tiles that both builds
// share (each build supplies its Tile), and the builds' entry points. Everything here
// has internal linkage per file, so the AVX2 file's copies never serve the portable one.
#ifndef ECHOKV_KERNELS_BLOCK_MATMUL_IMPL_H_
#define ECHOKV_KERNELS_BLOCK_MATMUL_IMPL_H_

#include <algorithm>
#include <cstdint>

#include "kernels/block_matmul.h"

namespace echokv::kernels {

// The builds' entry points (block_matmul.cc: scalar; block_matmul_avx2.cc: avx2).
void BlockMatMulScalar(const BlockMatrix& w, const QuantizedActs& x, const float* bias, int64_t n, float* y,
                       int64_t r0, int64_t r1);
void BlockMatMulAvx2(const BlockMatrix& w, const QuantizedActs& x, const float* bias, int64_t n, float* y,
                     int64_t r0, int64_t r1);
void DequantizeBlockRowsScalar(const BlockMatrix& w, int64_t r0, int64_t r1, float* out);
void DequantizeBlockRowsAvx2(const BlockMatrix& w, int64_t r0, int64_t r1, float* out);

namespace {

// A Q4_K super-block's 6-bit scale and minimum of sub-block j (block_matmul.h's layout).
inline void Q4KScaleMin(const uint8_t* sc, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = sc[j] & 63;
    *min = sc[j + 4] & 63;
  } else {
    *scale = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
    *min = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
  }
}

// What a tile is handed: its first weight row, the matrix's row stride and block count
// (blocks of the type: 32 or 256 values), the inputs' 32-value block count (the stride
// of d and s), its first input's quantized values / scales / sums and float values,
// and y shifted to (row, input).
struct TileArgs {
  const uint8_t* w;
  int64_t row_bytes, blocks, act_blocks, cols, rows;  // rows: y's row stride
  const int8_t* q;
  const float* d;
  const float* s;
  const float* x;
  const float* bias;  // at the tile's first row, or null
  float* y;
};

// The fixed tree over 8 float32 lanes of both builds (the AVX2 build's horizontal sum):
// ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)).
inline float LaneTree(const float* v) {
  const float s0 = v[0] + v[4], s1 = v[1] + v[5], s2 = v[2] + v[6], s3 = v[3] + v[7];
  return (s0 + s2) + (s1 + s3);
}

// The inputs left after whole CT-wide tiles (fewer than CT) as one tile of that width.
template <class K, BlockType T, int RT, int CT>
inline void RestTile(int64_t left, const TileArgs& a) {
  if constexpr (CT > 1) {
    if (left == CT - 1) return K::template Tile<T, RT, CT - 1>(a);
    return RestTile<K, T, RT, CT - 1>(left, a);
  }
}

// Rows [r0, r1) against all n inputs: RV x 1 tiles for n = 1, RT x CT tiles for batches
// with the inputs in blocks of 2 CT (a block's inputs stay in L1 while the rows pass).
// Which tile a (row, input) pair lands in never changes its bits (each build's Tile
// computes every pair alike).
template <class K, BlockType T, int RT, int CT, int RV>
inline void DriveBlocks(const BlockMatrix& w, const QuantizedActs& x, const float* bias, int64_t n, float* y,
                        int64_t r0, int64_t r1) {
  const int64_t rb = w.RowBytes(), nb = w.cols / BlockValuesOf(T), na = w.cols / kBlockValues;
  const int64_t stride = w.out_stride > 0 ? w.out_stride : w.rows;  // y's row stride
  const bool floats = TakesFloatInputs(T);
  auto args = [&](int64_t r, int64_t i) {
    return TileArgs{w.data + r * rb,
                    rb,
                    nb,
                    na,
                    w.cols,
                    stride,
                    floats ? nullptr : x.q + i * w.cols,
                    floats ? nullptr : x.d + i * na,
                    floats ? nullptr : x.s + i * na,
                    floats ? x.x + i * w.cols : nullptr,
                    bias ? bias + r : nullptr,
                    y + i * stride + r};
  };
  if (n == 1) {
    int64_t r = r0;
    for (; r + RV <= r1; r += RV) K::template Tile<T, RV, 1>(args(r, 0));
    for (; r < r1; ++r) K::template Tile<T, 1, 1>(args(r, 0));
    return;
  }
  constexpr int64_t kInputs = 2 * CT;
  for (int64_t i0 = 0; i0 < n; i0 += kInputs) {
    const int64_t i1 = std::min(n, i0 + kInputs);
    int64_t r = r0;
    for (; r + RT <= r1; r += RT) {
      int64_t i = i0;
      for (; i + CT <= i1; i += CT) K::template Tile<T, RT, CT>(args(r, i));
      if (i < i1) RestTile<K, T, RT, CT>(i1 - i, args(r, i));
    }
    for (; r < r1; ++r) {
      int64_t i = i0;
      for (; i + CT <= i1; i += CT) K::template Tile<T, 1, CT>(args(r, i));
      if (i < i1) RestTile<K, T, 1, CT>(i1 - i, args(r, i));
    }
  }
}

template <class K, int RT, int CT, int RV>
inline void DriveAny(const BlockMatrix& w, const QuantizedActs& x, const float* bias, int64_t n, float* y,
                     int64_t r0, int64_t r1) {
  switch (w.type) {
    case BlockType::kQ4_0:
      return DriveBlocks<K, BlockType::kQ4_0, RT, CT, RV>(w, x, bias, n, y, r0, r1);
    case BlockType::kQ4_1:
      return DriveBlocks<K, BlockType::kQ4_1, RT, CT, RV>(w, x, bias, n, y, r0, r1);
    case BlockType::kQ8_0:
      return DriveBlocks<K, BlockType::kQ8_0, RT, CT, RV>(w, x, bias, n, y, r0, r1);
    case BlockType::kQ5_0:
      return DriveBlocks<K, BlockType::kQ5_0, RT, CT, RV>(w, x, bias, n, y, r0, r1);
    case BlockType::kF16:
      return DriveBlocks<K, BlockType::kF16, RT, CT, RV>(w, x, bias, n, y, r0, r1);
    case BlockType::kBF16:
      return DriveBlocks<K, BlockType::kBF16, RT, CT, RV>(w, x, bias, n, y, r0, r1);
    case BlockType::kQ4_K:
      return DriveBlocks<K, BlockType::kQ4_K, RT, CT, RV>(w, x, bias, n, y, r0, r1);
    case BlockType::kQ6_K:
      return DriveBlocks<K, BlockType::kQ6_K, RT, CT, RV>(w, x, bias, n, y, r0, r1);
  }
}

}  // namespace
}  // namespace echokv::kernels

#endif  // ECHOKV_KERNELS_BLOCK_MATMUL_IMPL_H_
