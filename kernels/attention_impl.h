// The fused causal attention kernel, written once over GCC vector extensions and
// compiled three times (attention_avx512.cc, attention_avx2.cc, attention_scalar.cc),
// each defining ECHOKV_ATTENTION_WIDTH (floats per vector) and ECHOKV_ATTENTION_NAME
// (the KernelFns factory it exports) and compiled with its own -m flags.
//
// Everything below has internal linkage (anonymous namespace) and no std:: template
// is used: an inline function compiled with -mavx512f in one build and shared through
// the linker's COMDAT folding could otherwise end up called by the scalar build on a
// CPU without AVX-512.
//
// Per work item (group g, block of bq queries): the query tile transposed, Q^T [d, r*bq]
// (pre-scaled by scale * log2 e, so the softmax is a power of 2), then for each block of
// 64 keys the group can show the tile: S^T = K Q^T (masked only on blocks that straddle
// the causal edge or the window), an online softmax vectorised over query rows (running
// max m, sum l, output rows O rescaled by 2^(m_old - m_new)), O += P V four rows at a
// time (each value row loaded once for four output rows). Memory: the tile, the scores
// and O — O(128 * (d + 64)) floats, independent of the context length.
#ifndef ECHOKV_ATTENTION_WIDTH
#error "define ECHOKV_ATTENTION_WIDTH before including kernels/attention_impl.h"
#endif

#include <cstdint>

#include "kernels/attention_isa.h"
#include "kernels/exp2_poly.h"

namespace echokv::kernels::attention_isa {
namespace {

constexpr int kWidth = ECHOKV_ATTENTION_WIDTH;
constexpr float kNegInf = -__builtin_inff();
constexpr float kLog2e = exp2_poly::kLog2e;

template <int W>
struct Simd {
  typedef float F __attribute__((vector_size(4 * W)));
  typedef int32_t I __attribute__((vector_size(4 * W)));
  static inline F Load(const float* p) {
    F v;
    __builtin_memcpy(&v, p, sizeof(F));
    return v;
  }
  static inline void Store(float* p, F v) { __builtin_memcpy(p, &v, sizeof(F)); }
  // Lane by lane, not {} + x: that keeps a real add (0 + -0 is +0), one extra
  // instruction per broadcast in the inner loops.
  static inline F Splat(float x) {
    float lanes[W];
    for (int i = 0; i < W; ++i) lanes[i] = x;
    F v;
    __builtin_memcpy(&v, lanes, sizeof(F));
    return v;
  }
  static inline F Max(F a, F b) { return a > b ? a : b; }
  // 2^x for x <= 0 (the softmax's arguments), kernels/exp2_poly.h; x <= -127 (and
  // -inf) gives 0; 2^n by building the exponent bits.
  static inline F Exp2(F x) {
    namespace e = exp2_poly;
    x = Max(x, Splat(e::kMin));
    const F magic = Splat(e::kRoundMagic);
    const F t = x + magic;
    const F n = t - magic;
    const F f = x - n;
    F p = Splat(e::kCoeffs[0]);
    for (int k = 1; k < 8; ++k) p = p * f + Splat(e::kCoeffs[k]);
    I bits;
    __builtin_memcpy(&bits, &t, sizeof(I));
    // t's low mantissa bits hold n (+ 0x4B400000); n = -127 gives exponent 0: 2^n = 0.
    const I ebits = (bits - exp2_poly::kRoundMagicBits + 127) << 23;
    F scale;
    __builtin_memcpy(&scale, &ebits, sizeof(F));
    return p * scale;
  }
};

using V = Simd<kWidth>;

// The score product S^T = K_block Q^T: scores of kKeys keys x kVecs vectors of query
// rows live in registers (AVX-512: 4 x 4 = 16 of 32; AVX2: 4 x 2 = 8 of 16), each
// query vector loaded once per kKeys keys and each key element broadcast once per kVecs
// vectors. Vectorising over query rows needs the query tile transposed (Q^T, packed
// once per work item), not the keys (which would be packed again for every key block).
constexpr int kScoreKeys = kWidth == 1 ? 1 : 4;
constexpr int kScoreVecs = kWidth >= 16 ? 4 : (kWidth == 8 ? 2 : 8);
constexpr int kRowPad = kScoreVecs * kWidth;  // query rows per pass; the tile is padded to it

// st[j][rows] = K_j . Q^T for kKeys keys (rows d apart from key0) and one pass of
// kScoreVecs vectors of rows starting at qt + c0 (Q^T rows `rows_pad` apart).
template <int kKeys>
inline void ScoreKeys(const float* key0, const float* qt, int64_t rows_pad, int64_t c0, int64_t d, float* st) {
  typename V::F acc[kKeys][kScoreVecs] = {};
  for (int64_t t = 0; t < d; ++t) {
    typename V::F qv[kScoreVecs];
    for (int c = 0; c < kScoreVecs; ++c) qv[c] = V::Load(qt + t * rows_pad + c0 + c * kWidth);
    for (int kk = 0; kk < kKeys; ++kk) {
      const typename V::F kb = V::Splat(key0[kk * d + t]);
      for (int c = 0; c < kScoreVecs; ++c) acc[kk][c] += kb * qv[c];
    }
  }
  for (int kk = 0; kk < kKeys; ++kk) {
    for (int c = 0; c < kScoreVecs; ++c) V::Store(st + kk * rows_pad + c0 + c * kWidth, acc[kk][c]);
  }
}

// For kRows output rows at once (row rr's weight of key j at p[rr * p_row + j * p_key],
// o rows d apart):
// o[c0 .. c0 + kVecs*W) = alpha_r * o + sum_j p_r[j] * v_j[c0 ..] over the block's bk
// value rows. The rows share each value load: kRows * kVecs accumulators in registers
// (<= 16), one load per kRows FMAs.
template <int W, int kRows, int kVecs>
inline void WeightedSumPass(const float* p, int64_t p_row, int64_t p_key, const float* vblock, int64_t bk, int64_t d,
                            int64_t c0,
                            const float* alpha, float* o) {
  using S = Simd<W>;
  typename S::F acc[kRows][kVecs];
  for (int rr = 0; rr < kRows; ++rr) {
    const typename S::F a = S::Splat(alpha[rr]);
    for (int c = 0; c < kVecs; ++c) acc[rr][c] = S::Load(o + rr * d + c0 + c * W) * a;
  }
  for (int64_t j = 0; j < bk; ++j) {
    typename S::F v[kVecs];
    const float* vr = vblock + j * d + c0;
    for (int c = 0; c < kVecs; ++c) v[c] = S::Load(vr + c * W);
    for (int rr = 0; rr < kRows; ++rr) {
      const typename S::F pj = S::Splat(p[rr * p_row + j * p_key]);
      for (int c = 0; c < kVecs; ++c) acc[rr][c] += pj * v[c];
    }
  }
  for (int rr = 0; rr < kRows; ++rr) {
    for (int c = 0; c < kVecs; ++c) S::Store(o + rr * d + c0 + c * W, acc[rr][c]);
  }
}

// kRows output rows over the whole head dim (d % W == 0), in passes of at most 16 / kRows
// vectors per row, so the accumulators stay in registers for any d.
template <int W, int kRows>
inline void WeightedSumRows(const float* p, int64_t p_row, int64_t p_key, const float* vblock, int64_t bk, int64_t d,
                            const float* alpha, float* o) {
  constexpr int kMax = 16 / kRows;  // vectors per row per pass: 4 for 4 rows, 16 for 1
  int64_t c0 = 0;
  if constexpr (kMax >= 8) {
    for (; c0 + 8 * W <= d; c0 += 8 * W) WeightedSumPass<W, kRows, 8>(p, p_row, p_key, vblock, bk, d, c0, alpha, o);
  }
  for (; c0 + 4 * W <= d; c0 += 4 * W) WeightedSumPass<W, kRows, 4>(p, p_row, p_key, vblock, bk, d, c0, alpha, o);
  for (; c0 + 2 * W <= d; c0 += 2 * W) WeightedSumPass<W, kRows, 2>(p, p_row, p_key, vblock, bk, d, c0, alpha, o);
  for (; c0 < d; c0 += W) WeightedSumPass<W, kRows, 1>(p, p_row, p_key, vblock, bk, d, c0, alpha, o);
}

// All `rows` output rows of the tile (4 at a time, then one by one).
template <int W>
inline void WeightedSumTile(const float* p, int64_t p_row, int64_t p_key, const float* vblock, int64_t bk, int64_t d,
                            const float* alpha, int64_t rows, float* o) {
  int64_t r = 0;
  if constexpr (W > 1) {
    for (; r + 4 <= rows; r += 4) {
      WeightedSumRows<W, 4>(p + r * p_row, p_row, p_key, vblock, bk, d, alpha + r, o + r * d);
    }
  }
  for (; r < rows; ++r) WeightedSumRows<W, 1>(p + r * p_row, p_row, p_key, vblock, bk, d, alpha + r, o + r * d);
}

// The widest vector (<= kWidth) that divides the head dim.
inline int ValueWidth(int64_t d) {
  if (kWidth >= 16 && d % 16 == 0) return 16;
  if (kWidth >= 8 && d % 8 == 0) return 8;
  if (kWidth >= 4 && d % 4 == 0) return 4;
  return 1;
}

inline void WeightedSum(int width, const float* p, int64_t p_row, int64_t p_key, const float* vblock, int64_t bk,
                        int64_t d,
                        const float* alpha, int64_t rows, float* o) {
  switch (width) {
#if ECHOKV_ATTENTION_WIDTH >= 16
    case 16:
      return WeightedSumTile<16>(p, p_row, p_key, vblock, bk, d, alpha, rows, o);
#endif
#if ECHOKV_ATTENTION_WIDTH >= 8
    case 8:
      return WeightedSumTile<8>(p, p_row, p_key, vblock, bk, d, alpha, rows, o);
#endif
#if ECHOKV_ATTENTION_WIDTH >= 4
    case 4:
      return WeightedSumTile<4>(p, p_row, p_key, vblock, bk, d, alpha, rows, o);
#endif
    default:
      return WeightedSumTile<1>(p, p_row, p_key, vblock, bk, d, alpha, rows, o);
  }
}

// First index in sorted kp[0, n) with kp[i] > x (upper) / >= x (lower).
inline int64_t UpperBound(const int64_t* kp, int64_t n, int64_t x) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (kp[mid] <= x) lo = mid + 1; else hi = mid;
  }
  return lo;
}
inline int64_t LowerBound(const int64_t* kp, int64_t n, int64_t x) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (kp[mid] < x) lo = mid + 1; else hi = mid;
  }
  return lo;
}

struct Layout {
  int64_t r, bq, rows, rows_pad, d;
  int64_t qt, st, o, m, l, alpha, pos, total;  // offsets into the scratch floats
};

inline Layout MakeLayout(const CausalAttentionArgs& a) {
  Layout L;
  L.d = a.head_dim;
  L.r = a.num_heads / a.num_kv_heads;
  L.bq = QueriesPerItem(L.r);
  L.rows = L.r * L.bq;
  L.rows_pad = (L.rows + kRowPad - 1) / kRowPad * kRowPad;
  L.qt = 0;
  L.st = L.qt + L.d * L.rows_pad;
  L.o = L.st + kKeyBlock * L.rows_pad;
  L.m = L.o + L.rows_pad * L.d;
  L.l = L.m + L.rows_pad;
  L.alpha = L.l + L.rows_pad;
  L.pos = L.alpha + L.rows_pad;          // int64 row positions, two floats each
  L.total = L.pos + 2 * L.rows_pad + 16;  // + slack to align the int64 area
  return L;
}

int64_t ScratchFloats(const CausalAttentionArgs& a) { return MakeLayout(a).total; }

void RunItem(const CausalAttentionArgs& a, const Layout& L, int64_t item, float* scratch) {
  const int64_t d = L.d, r = L.r;
  const int64_t blocks = (a.m + L.bq - 1) / L.bq;
  const int64_t g = item / blocks;
  const int64_t q0 = (item % blocks) * L.bq;
  const int64_t bq = a.m - q0 < L.bq ? a.m - q0 : L.bq;
  const int64_t rows = r * bq;
  // Rows padded to whole passes (rp): the padding rows have zero queries and are never
  // written out.
  const int64_t rp = (rows + kRowPad - 1) / kRowPad * kRowPad;
  float* qt = scratch + L.qt;
  float* st = scratch + L.st;
  float* o = scratch + L.o;
  float* mrow = scratch + L.m;
  float* lrow = scratch + L.l;
  float* alpha = scratch + L.alpha;
  int64_t* pos = reinterpret_cast<int64_t*>(
      reinterpret_cast<uintptr_t>(scratch + L.pos + 1) & ~static_cast<uintptr_t>(7));

  // Q^T of the tile: column hh * bq + i = head g*r + hh of query q0 + i, scaled so that
  // scores come out in log2 units.
  const float qscale = a.scale * kLog2e;
  int64_t qmin = a.q_positions[q0], qmax = a.q_positions[q0];
  for (int64_t i = 0; i < bq; ++i) {
    const int64_t p = a.q_positions[q0 + i];
    qmin = p < qmin ? p : qmin;
    qmax = p > qmax ? p : qmax;
  }
  for (int64_t i = 0; i < rp * d; ++i) qt[i] = 0.0f;
  for (int64_t hh = 0; hh < r; ++hh) {
    for (int64_t i = 0; i < bq; ++i) {
      const int64_t row = hh * bq + i;
      const float* src = a.q + (q0 + i) * a.q_row_stride + (g * r + hh) * a.q_head_stride;
      for (int64_t t = 0; t < d; ++t) qt[t * rp + row] = src[t] * qscale;
      pos[row] = a.q_positions[q0 + i];
    }
  }
  for (int64_t row = 0; row < rp; ++row) {
    mrow[row] = kNegInf;
    lrow[row] = 0.0f;
  }
  for (int64_t i = 0; i < rp * d; ++i) o[i] = 0.0f;

  const int64_t* kp = a.key_positions[g];
  const float* kg = a.k + g * a.kv_group_stride;
  const float* vg = a.v + g * a.kv_group_stride;
  const int64_t win = a.sliding_window;
  const int64_t hi = UpperBound(kp, a.n, qmax);
  const int64_t lo = win > 0 ? LowerBound(kp, a.n, qmin - win + 1) : 0;
  const int vwidth = ValueWidth(d);

  for (int64_t j0 = lo; j0 < hi; j0 += kKeyBlock) {
    const int64_t bk = hi - j0 < kKeyBlock ? hi - j0 : kKeyBlock;
    // S^T for the block's keys; the key rows past bk are -inf (no key).
    for (int64_t c0 = 0; c0 < rp; c0 += kRowPad) {
      int64_t j = 0;
      for (; j + kScoreKeys <= bk; j += kScoreKeys) {
        ScoreKeys<kScoreKeys>(kg + (j0 + j) * d, qt, rp, c0, d, st + j * rp);
      }
      for (; j < bk; ++j) ScoreKeys<1>(kg + (j0 + j) * d, qt, rp, c0, d, st + j * rp);
    }
    for (int64_t j = bk; j < kKeyBlock; ++j) {
      for (int64_t row = 0; row < rp; ++row) st[j * rp + row] = kNegInf;
    }
    // Mask only blocks some row cannot see whole (the causal edge, the window's start).
    if (!(kp[j0 + bk - 1] <= qmin && (win <= 0 || qmax - kp[j0] < win))) {
      for (int64_t j = 0; j < bk; ++j) {
        const int64_t key = kp[j0 + j];
        for (int64_t row = 0; row < rows; ++row) {
          const int64_t p = pos[row];
          if (key > p || (win > 0 && p - key >= win)) st[j * rp + row] = kNegInf;
        }
      }
    }
    // Online softmax, a vector of rows at a time: p = 2^(s - m_new) in place of the
    // scores, alpha = 2^(m_old - m_new) rescales what each row summed so far. A row that
    // has seen no key yet (m_new = -inf) subtracts 0 instead: p = 0, alpha = 0 on a zero
    // row, no NaN.
    const typename V::F neg_inf = V::Splat(kNegInf);
    const typename V::F zero = V::Splat(0.0f);
    for (int64_t c = 0; c < rp; c += kWidth) {
      typename V::F mx = V::Load(st + c);
      for (int64_t j = 1; j < kKeyBlock; ++j) mx = V::Max(mx, V::Load(st + j * rp + c));
      const typename V::F m_old = V::Load(mrow + c);
      const typename V::F m_new = V::Max(m_old, mx);
      const typename V::F m_sub = m_new > neg_inf ? m_new : zero;
      const typename V::F al = V::Exp2(m_old - m_sub);
      typename V::F sum = zero;
      for (int64_t j = 0; j < kKeyBlock; ++j) {
        const typename V::F pj = V::Exp2(V::Load(st + j * rp + c) - m_sub);
        V::Store(st + j * rp + c, pj);
        sum += pj;
      }
      V::Store(mrow + c, m_new);
      V::Store(lrow + c, V::Load(lrow + c) * al + sum);
      V::Store(alpha + c, al);
    }
    WeightedSum(vwidth, st, 1, rp, vg + j0 * d, bk, d, alpha, rows, o);
  }

  for (int64_t hh = 0; hh < r; ++hh) {
    for (int64_t i = 0; i < bq; ++i) {
      const int64_t row = hh * bq + i;
      const float inv = lrow[row] > 0.0f ? 1.0f / lrow[row] : 0.0f;
      float* dst = a.out + (q0 + i) * a.out_row_stride + (g * r + hh) * a.out_head_stride;
      for (int64_t t = 0; t < d; ++t) dst[t] = o[row * d + t] * inv;
    }
  }
}

void Run(const CausalAttentionArgs& a, int64_t item_begin, int64_t item_end, float* scratch) {
  const Layout L = MakeLayout(a);
  for (int64_t item = item_begin; item < item_end; ++item) RunItem(a, L, item, scratch);
}

}  // namespace

KernelFns ECHOKV_ATTENTION_NAME() { return KernelFns{&ScratchFloats, &Run}; }

}  // namespace echokv::kernels::attention_isa
