// The AVX2 build of the block products (block_matmul.h); kernels/CMakeLists.txt gives
// this file -mavx2 -mfma -mf16c. Per block and (weight row, input) pair: the weight
// nibbles (or int8s) unpacked once per tile row, _mm256_maddubs_epi16 of unsigned weight
// bytes by signed input bytes (signed weights: their magnitudes by the inputs carrying
// their signs, _mm256_sign_epi8), _mm256_madd_epi16 to 8 int32 lanes, converted and
// fused-multiply-added with d_w * d_x into 8 float lanes; after the last block a fixed
// tree over the lanes, then Q4_1's minimum terms (their own sum), then the bias.
#include <immintrin.h>

#include <cstring>

#include "kernels/block_matmul_impl.h"

namespace echokv::kernels {
namespace {

inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline float Sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// A block's weights as maddubs wants them: `u` unsigned bytes (Q4_1's nibbles; the
// magnitudes of signed weights) and `sgn` the signed weights (for _mm256_sign_epi8).
template <BlockType T>
inline void Unpack(const uint8_t* b, __m256i* u, __m256i* sgn, float* d, float* m) {
  *d = Half(b);
  if constexpr (T == BlockType::kQ8_0) {
    *sgn = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    *u = _mm256_sign_epi8(*sgn, *sgn);
  } else if constexpr (T == BlockType::kQ5_0) {
    // Bit j of qh to byte j (0 or 16): byte j takes qh's byte j / 8, tests bit j % 8.
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(static_cast<int>(qh)),
        _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0));
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
    const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6));
    const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
    *sgn = _mm256_sub_epi8(_mm256_or_si256(nib, high), _mm256_set1_epi8(16));
    *u = _mm256_sign_epi8(*sgn, *sgn);
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (T == BlockType::kQ4_1 ? 4 : 2)));
    const __m256i nib =
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
    if constexpr (T == BlockType::kQ4_1) {
      *u = nib;
      *m = Half(b + 2);
    } else {
      *sgn = _mm256_sub_epi8(nib, _mm256_set1_epi8(8));
      *u = _mm256_sign_epi8(*sgn, *sgn);
    }
  }
}

#ifndef ECHOKV_BLOCK_PREFETCH_TILES
#define ECHOKV_BLOCK_PREFETCH_TILES 2
#endif
constexpr int64_t kPrefetchTiles = ECHOKV_BLOCK_PREFETCH_TILES;
// The 4 x 1 tile of single-input products (BlockMatMulAvx2's RV).
template <int RT, int CT>
constexpr bool kSingleInputTile = RT == 4 && CT == 1;

// 8 F16 / BF16 values widened to float32 (both exact).
template <BlockType T>
inline __m256 Widen8(const uint8_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (T == BlockType::kF16) {
    return _mm256_cvtph_ps(h);
  } else {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

struct Avx2Kernel {
  template <BlockType T, int RT, int CT>
  static inline void Tile(const TileArgs& a) {
    if constexpr (T == BlockType::kF16 || T == BlockType::kBF16) {
      FloatTile<T, RT, CT>(a);
    } else if constexpr (T == BlockType::kQ4_K || T == BlockType::kQ6_K) {
      KTile<T, RT, CT>(a);
    } else {
      BlockTile<T, RT, CT>(a);
    }
  }

  // F16 / BF16 rows against float32 inputs: per 8 values one FMA into the pair's lanes.
  template <BlockType T, int RT, int CT>
  static inline void FloatTile(const TileArgs& a) {
    __m256 acc[RT][CT];
    for (int r = 0; r < RT; ++r) {
      for (int c = 0; c < CT; ++c) acc[r][c] = _mm256_setzero_ps();
    }
    const uint8_t* ahead = a.w + kPrefetchTiles * RT * a.row_bytes;
    for (int64_t b = 0; b < a.blocks; ++b) {
      if constexpr (kSingleInputTile<RT, CT>) {
        for (int64_t o = 0; o < RT * 64; o += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(ahead + b * RT * 64 + o), _MM_HINT_T0);
        }
      }
      for (int r = 0; r < RT; ++r) {
        const uint8_t* p = a.w + r * a.row_bytes + b * 64;
        const __m256 w0 = Widen8<T>(p), w1 = Widen8<T>(p + 16), w2 = Widen8<T>(p + 32), w3 = Widen8<T>(p + 48);
        for (int c = 0; c < CT; ++c) {
          const float* x = a.x + c * a.cols + b * kBlockValues;
          __m256 v = acc[r][c];
          v = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), v);
          v = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), v);
          v = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + 16), v);
          acc[r][c] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + 24), v);
        }
      }
    }
    for (int r = 0; r < RT; ++r) {
      for (int c = 0; c < CT; ++c) {
        float out = Sum8(acc[r][c]);
        if (a.bias != nullptr) out = out + a.bias[r];
        a.y[c * a.rows + r] = out;
      }
    }
  }

  // Q4_K / Q6_K: per 32 values, maddubs of the weights' bytes by the inputs', then
  // _mm256_madd_epi16 by the sub-block scale (16 values' worth per 128-bit half) gives
  // the 8 int32 lanes of the portable build; one FMA with d_w * d_x.
  template <BlockType T, int RT, int CT>
  static inline void KTile(const TileArgs& a) {
    const int64_t bb = BlockBytes(T);
    __m256 acc[RT][CT];
    float mins[RT][CT];
    for (int r = 0; r < RT; ++r) {
      for (int c = 0; c < CT; ++c) {
        acc[r][c] = _mm256_setzero_ps();
        mins[r][c] = 0.0f;
      }
    }
    const __m256i low4 = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3), c32 = _mm256_set1_epi8(32);
    const uint8_t* ahead = a.w + kPrefetchTiles * RT * a.row_bytes;
    for (int64_t b = 0; b < a.blocks; ++b) {
      if constexpr (kSingleInputTile<RT, CT>) {
        for (int64_t o = 0; o < RT * bb; o += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(ahead + b * RT * bb + o), _MM_HINT_T0);
        }
      }
      int16_t sc[RT][16];
      float dw[RT], dm[RT][8];
      for (int r = 0; r < RT; ++r) {
        const uint8_t* p = a.w + r * a.row_bytes + b * bb;
        if constexpr (T == BlockType::kQ4_K) {
          dw[r] = Half(p);
          const float dmin = Half(p + 2);
          for (int j = 0; j < 8; ++j) {
            int scale, min;
            Q4KScaleMin(p + 4, j, &scale, &min);
            sc[r][2 * j] = sc[r][2 * j + 1] = static_cast<int16_t>(scale);
            dm[r][j] = dmin * static_cast<float>(min);
          }
        } else {
          dw[r] = Half(p + 208);
          for (int j = 0; j < 16; ++j) sc[r][j] = static_cast<int8_t>(p[192 + j]);
        }
      }
      for (int s = 0; s < 8; ++s) {
        const int64_t ab = b * 8 + s;
        __m256i xv[CT];
        for (int c = 0; c < CT; ++c) {
          xv[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + c * a.cols + ab * kBlockValues));
        }
        for (int r = 0; r < RT; ++r) {
          const uint8_t* p = a.w + r * a.row_bytes + b * bb;
          const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[r][2 * s + 1]), _mm_set1_epi16(sc[r][2 * s]));
          __m256i u, sgn = _mm256_setzero_si256();
          if constexpr (T == BlockType::kQ4_K) {
            const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * (s / 2)));
            u = _mm256_and_si256((s & 1) ? _mm256_srli_epi16(raw, 4) : raw, low4);
          } else {
            const int h = s / 4, g = s % 4;
            const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * h + 32 * (g & 1)));
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h));
            const __m256i lo = _mm256_and_si256(g < 2 ? ql : _mm256_srli_epi16(ql, 4), low4);
            const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), three);
            sgn = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), c32);
            u = _mm256_sign_epi8(sgn, sgn);
          }
          for (int c = 0; c < CT; ++c) {
            const __m256i xs = T == BlockType::kQ4_K ? xv[c] : _mm256_sign_epi8(xv[c], sgn);
            const __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(u, xs), scv);
            const float scale = dw[r] * a.d[c * a.act_blocks + ab];
            acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(scale), acc[r][c]);
            if constexpr (T == BlockType::kQ4_K) mins[r][c] = mins[r][c] + dm[r][s] * a.s[c * a.act_blocks + ab];
          }
        }
      }
    }
    for (int r = 0; r < RT; ++r) {
      for (int c = 0; c < CT; ++c) {
        float out = Sum8(acc[r][c]);
        if constexpr (T == BlockType::kQ4_K) out = out - mins[r][c];
        if (a.bias != nullptr) out = out + a.bias[r];
        a.y[c * a.rows + r] = out;
      }
    }
  }

  template <BlockType T, int RT, int CT>
  static inline void BlockTile(const TileArgs& a) {
    const int64_t bb = BlockBytes(T);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[RT][CT];
    float mins[RT][CT];
    for (int r = 0; r < RT; ++r) {
      for (int c = 0; c < CT; ++c) {
        acc[r][c] = _mm256_setzero_ps();
        mins[r][c] = 0.0f;
      }
    }
    // The tile's rows are contiguous (RT row_bytes); the next tiles' rows follow. Each
    // block step prefetches its share of the rows kPrefetchTiles tiles ahead, so their
    // bytes arrive while this tile computes (the hardware prefetcher alone left the
    // n = 1 products at ~55 % of the read bandwidth: RT short interleaved streams).
    // Only in the n = 1 tile: a batch's row tile is revisited per input block, and the
    // extra prefetches slowed 4 inputs by ~1.3x.
    const uint8_t* ahead = a.w + kPrefetchTiles * RT * a.row_bytes;
    for (int64_t b = 0; b < a.blocks; ++b) {
      if constexpr (kSingleInputTile<RT, CT>) {
        for (int64_t o = 0; o < RT * bb; o += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(ahead + b * RT * bb + o), _MM_HINT_T0);
        }
      }
      __m256i xv[CT];
      for (int c = 0; c < CT; ++c) {
        xv[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + c * a.cols + b * kBlockValues));
      }
      for (int r = 0; r < RT; ++r) {
        __m256i u, sgn = _mm256_setzero_si256();
        float dw = 0, mw = 0;
        Unpack<T>(a.w + r * a.row_bytes + b * bb, &u, &sgn, &dw, &mw);
        for (int c = 0; c < CT; ++c) {
          const __m256i xs = T == BlockType::kQ4_1 ? xv[c] : _mm256_sign_epi8(xv[c], sgn);
          const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, xs), ones);
          const float scale = dw * a.d[c * a.act_blocks + b];
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(scale), acc[r][c]);
          if constexpr (T == BlockType::kQ4_1) mins[r][c] = mins[r][c] + mw * a.s[c * a.act_blocks + b];
        }
      }
    }
    for (int r = 0; r < RT; ++r) {
      for (int c = 0; c < CT; ++c) {
        float out = Sum8(acc[r][c]);
        if constexpr (T == BlockType::kQ4_1) out = out + mins[r][c];
        if (a.bias != nullptr) out = out + a.bias[r];
        a.y[c * a.rows + r] = out;
      }
    }
  }
};

// One block's 32 values: d * q (+ m) in float32, a product then a sum (no FMA), the bits
// of the portable DequantizeBlockRows.
template <BlockType T>
inline void DequantizeBlock(const uint8_t* b, float* o) {
  const __m256 d = _mm256_set1_ps(Half(b));
  __m128i q8[2];  // the 32 values as int8 (Q4_0: nibble - 8; Q4_1: nibble)
  if constexpr (T == BlockType::kQ8_0) {
    q8[0] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
    q8[1] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18));
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (T == BlockType::kQ4_1 ? 4 : 2)));
    const __m128i mask = _mm_set1_epi8(15);
    q8[0] = _mm_and_si128(raw, mask);
    q8[1] = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    if constexpr (T == BlockType::kQ4_0) {
      q8[0] = _mm_sub_epi8(q8[0], _mm_set1_epi8(8));
      q8[1] = _mm_sub_epi8(q8[1], _mm_set1_epi8(8));
    }
  }
  const __m256 m = T == BlockType::kQ4_1 ? _mm256_set1_ps(Half(b + 2)) : _mm256_setzero_ps();
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 2; ++k) {
      const __m128i part = k == 0 ? q8[h] : _mm_srli_si128(q8[h], 8);
      __m256 v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part)));
      if constexpr (T == BlockType::kQ4_1) v = _mm256_add_ps(v, m);
      _mm256_storeu_ps(o + 16 * h + 8 * k, v);
    }
  }
}

template <BlockType T>
void WidenRowsAvx2(const BlockMatrix& w, int64_t r0, int64_t r1, float* out) {
  const uint8_t* src = w.data + r0 * w.RowBytes();
  for (int64_t k = 0; k < (r1 - r0) * w.cols; k += 8) _mm256_storeu_ps(out + k, Widen8<T>(src + 2 * k));
}

template <BlockType T>
void DequantizeRowsAvx2(const BlockMatrix& w, int64_t r0, int64_t r1, float* out) {
  const int64_t nb = w.cols / kBlockValues, bb = BlockBytes(T);
  const uint8_t* src = w.data + r0 * w.RowBytes();
  for (int64_t k = 0; k < (r1 - r0) * nb; ++k) DequantizeBlock<T>(src + k * bb, out + k * kBlockValues);
}

}  // namespace

void DequantizeBlockRowsAvx2(const BlockMatrix& w, int64_t r0, int64_t r1, float* out) {
  switch (w.type) {
    case BlockType::kQ4_0:
      return DequantizeRowsAvx2<BlockType::kQ4_0>(w, r0, r1, out);
    case BlockType::kQ4_1:
      return DequantizeRowsAvx2<BlockType::kQ4_1>(w, r0, r1, out);
    case BlockType::kQ8_0:
      return DequantizeRowsAvx2<BlockType::kQ8_0>(w, r0, r1, out);
    case BlockType::kF16:
      return WidenRowsAvx2<BlockType::kF16>(w, r0, r1, out);
    case BlockType::kBF16:
      return WidenRowsAvx2<BlockType::kBF16>(w, r0, r1, out);
    case BlockType::kQ4_K:
    case BlockType::kQ6_K:
    case BlockType::kQ5_0:
      return DequantizeBlockRowsScalar(w, r0, r1, out);  // prefill panels: not yet vectorized
  }
}

// Tiles: 2 weight rows x 3 inputs for batches (6 accumulators, 3 input vectors, the
// unpacked weights: within AVX2's 16 registers), 4 rows x 1 input for n = 1.
void BlockMatMulAvx2(const BlockMatrix& w, const QuantizedActs& x, const float* bias, int64_t n, float* y,
                     int64_t r0, int64_t r1) {
  DriveAny<Avx2Kernel, 2, 3, 4>(w, x, bias, n, y, r0, r1);
}

}  // namespace echokv::kernels
