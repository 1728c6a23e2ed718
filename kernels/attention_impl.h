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
// Per work item (group g, block of bq queries): the query tile Q [r*bq, d] (pre-scaled
// by scale * log2 e, so the softmax is a power of 2), then for each block of 64 keys
// the group can show the tile: K^T packed [d, 64], S = Q K^T per row (masked only on
// blocks that straddle the causal edge or the window), online softmax (running max m,
// sum l, output rows O rescaled by 2^(m_old - m_new)), O += P V four rows at a time
// (each value row loaded once for four output rows). Memory: the tile, the
// packed block and O — O(128 * (d + 64)) floats, independent of the context length.
#ifndef ECHOKV_ATTENTION_WIDTH
#error "define ECHOKV_ATTENTION_WIDTH before including kernels/attention_impl.h"
#endif

#include <cstdint>

#include "kernels/attention_isa.h"

namespace echokv::kernels::attention_isa {
namespace {

constexpr int kWidth = ECHOKV_ATTENTION_WIDTH;
constexpr float kNegInf = -__builtin_inff();
constexpr float kLog2e = 1.44269504088896340736f;

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
  // (A one-float "vector" is a plain float in GCC, so lanes are read through memory.)
  static inline float HMax(F v) {
    float x[W];
    __builtin_memcpy(x, &v, sizeof(F));
    float m = x[0];
    for (int i = 1; i < W; ++i) m = x[i] > m ? x[i] : m;
    return m;
  }
  static inline float HSum(F v) {
    float x[W];
    __builtin_memcpy(x, &v, sizeof(F));
    float s = 0.0f;
    for (int i = 0; i < W; ++i) s += x[i];
    return s;
  }
  // 2^x for x <= 0 (the softmax's arguments), relative error ~2e-7; x <= -127
  // (and -inf) gives 0. x = n + f with n = round(x), |f| <= 1/2; 2^f by its degree-7
  // Taylor polynomial in f ln 2 (remainder < 5e-9), 2^n by building the exponent bits.
  static inline F Exp2(F x) {
    x = Max(x, Splat(-127.0f));
    const F magic = Splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
    const F t = x + magic;
    const F n = t - magic;
    const F f = x - n;
    F p = Splat(1.5252733804059840e-05f);
    p = p * f + Splat(1.5403530393381608e-04f);
    p = p * f + Splat(1.3333558146428443e-03f);
    p = p * f + Splat(9.6181291076284772e-03f);
    p = p * f + Splat(5.5504108664821580e-02f);
    p = p * f + Splat(2.4022650695910071e-01f);
    p = p * f + Splat(6.9314718055994531e-01f);
    p = p * f + Splat(1.0f);
    I bits;
    __builtin_memcpy(&bits, &t, sizeof(I));
    // t's low mantissa bits hold n (+ 0x4B400000); n = -127 gives exponent 0: 2^n = 0.
    const I e = (bits - 0x4B400000 + 127) << 23;
    F scale;
    __builtin_memcpy(&scale, &e, sizeof(F));
    return p * scale;
  }
};

using V = Simd<kWidth>;

// Accumulators per pass of the score product: kRows query rows x kCols vectors of keys
// live in registers (AVX-512: 4 x 4 = 16 of 32; AVX2: 4 x 2 = 8 of 16).
constexpr int kScoreRows = kWidth == 1 ? 1 : 4;
constexpr int kScoreCols = kWidth >= 16 ? 4 : (kWidth == 8 ? 2 : 8);
static_assert(kKeyBlock % (kScoreCols * kWidth) == 0, "a key block must be whole passes");

// s[rr][j] = qs[rr] . K_j for kRows query rows (stride d) and the packed block
// kt [d, kKeyBlock] (column j = key j).
template <int kRows>
inline void ScoreRows(const float* qs, const float* kt, int64_t d, float* s) {
  constexpr int kStep = kScoreCols * kWidth;
  for (int64_t c0 = 0; c0 < kKeyBlock; c0 += kStep) {
    typename V::F acc[kRows][kScoreCols] = {};
    for (int64_t t = 0; t < d; ++t) {
      typename V::F kv[kScoreCols];
      for (int c = 0; c < kScoreCols; ++c) kv[c] = V::Load(kt + t * kKeyBlock + c0 + c * kWidth);
      for (int rr = 0; rr < kRows; ++rr) {
        const typename V::F a = V::Splat(qs[rr * d + t]);
        for (int c = 0; c < kScoreCols; ++c) acc[rr][c] += a * kv[c];
      }
    }
    for (int rr = 0; rr < kRows; ++rr) {
      for (int c = 0; c < kScoreCols; ++c) V::Store(s + rr * kKeyBlock + c0 + c * kWidth, acc[rr][c]);
    }
  }
}

// For kRows output rows at once (p rows `p_stride` apart, o rows d apart):
// o[c0 .. c0 + kVecs*W) = alpha_r * o + sum_j p_r[j] * v_j[c0 ..] over the block's bk
// value rows. The rows share each value load: kRows * kVecs accumulators in registers
// (<= 16), one load per kRows FMAs.
template <int W, int kRows, int kVecs>
inline void WeightedSumPass(const float* p, int64_t p_stride, const float* vblock, int64_t bk, int64_t d, int64_t c0,
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
      const typename S::F pj = S::Splat(p[rr * p_stride + j]);
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
inline void WeightedSumRows(const float* p, int64_t p_stride, const float* vblock, int64_t bk, int64_t d,
                            const float* alpha, float* o) {
  constexpr int kMax = 16 / kRows;  // vectors per row per pass: 4 for 4 rows, 16 for 1
  int64_t c0 = 0;
  if constexpr (kMax >= 8) {
    for (; c0 + 8 * W <= d; c0 += 8 * W) WeightedSumPass<W, kRows, 8>(p, p_stride, vblock, bk, d, c0, alpha, o);
  }
  for (; c0 + 4 * W <= d; c0 += 4 * W) WeightedSumPass<W, kRows, 4>(p, p_stride, vblock, bk, d, c0, alpha, o);
  for (; c0 + 2 * W <= d; c0 += 2 * W) WeightedSumPass<W, kRows, 2>(p, p_stride, vblock, bk, d, c0, alpha, o);
  for (; c0 < d; c0 += W) WeightedSumPass<W, kRows, 1>(p, p_stride, vblock, bk, d, c0, alpha, o);
}

// All `rows` output rows of the tile (4 at a time, then one by one).
template <int W>
inline void WeightedSumTile(const float* p, int64_t p_stride, const float* vblock, int64_t bk, int64_t d,
                            const float* alpha, int64_t rows, float* o) {
  int64_t r = 0;
  if constexpr (W > 1) {
    for (; r + 4 <= rows; r += 4) {
      WeightedSumRows<W, 4>(p + r * p_stride, p_stride, vblock, bk, d, alpha + r, o + r * d);
    }
  }
  for (; r < rows; ++r) WeightedSumRows<W, 1>(p + r * p_stride, p_stride, vblock, bk, d, alpha + r, o + r * d);
}

// The widest vector (<= kWidth) that divides the head dim.
inline int ValueWidth(int64_t d) {
  if (kWidth >= 16 && d % 16 == 0) return 16;
  if (kWidth >= 8 && d % 8 == 0) return 8;
  if (kWidth >= 4 && d % 4 == 0) return 4;
  return 1;
}

inline void WeightedSum(int width, const float* p, int64_t p_stride, const float* vblock, int64_t bk, int64_t d,
                        const float* alpha, int64_t rows, float* o) {
  switch (width) {
#if ECHOKV_ATTENTION_WIDTH >= 16
    case 16:
      return WeightedSumTile<16>(p, p_stride, vblock, bk, d, alpha, rows, o);
#endif
#if ECHOKV_ATTENTION_WIDTH >= 8
    case 8:
      return WeightedSumTile<8>(p, p_stride, vblock, bk, d, alpha, rows, o);
#endif
#if ECHOKV_ATTENTION_WIDTH >= 4
    case 4:
      return WeightedSumTile<4>(p, p_stride, vblock, bk, d, alpha, rows, o);
#endif
    default:
      return WeightedSumTile<1>(p, p_stride, vblock, bk, d, alpha, rows, o);
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
  int64_t r, bq, rows, d;
  int64_t q, kt, s, o, m, l, alpha, pos, total;  // offsets into the scratch floats
};

inline Layout MakeLayout(const CausalAttentionArgs& a) {
  Layout L;
  L.d = a.head_dim;
  L.r = a.num_heads / a.num_kv_heads;
  L.bq = QueriesPerItem(L.r);
  L.rows = L.r * L.bq;
  L.q = 0;
  L.kt = L.q + L.rows * L.d;
  L.s = L.kt + L.d * kKeyBlock;
  L.o = L.s + L.rows * kKeyBlock;
  L.m = L.o + L.rows * L.d;
  L.l = L.m + L.rows;
  L.alpha = L.l + L.rows;
  L.pos = L.alpha + L.rows;          // int64 row positions, two floats each
  L.total = L.pos + 2 * L.rows + 16;  // + slack to align the int64 area
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
  float* qs = scratch + L.q;
  float* kt = scratch + L.kt;
  float* s = scratch + L.s;
  float* o = scratch + L.o;
  float* mrow = scratch + L.m;
  float* lrow = scratch + L.l;
  float* alpha = scratch + L.alpha;
  int64_t* pos = reinterpret_cast<int64_t*>(
      reinterpret_cast<uintptr_t>(scratch + L.pos + 1) & ~static_cast<uintptr_t>(7));

  // The query tile, row hh * bq + i = head g*r + hh of query q0 + i, scaled so that
  // scores come out in log2 units.
  const float qscale = a.scale * kLog2e;
  int64_t qmin = a.q_positions[q0], qmax = a.q_positions[q0];
  for (int64_t i = 0; i < bq; ++i) {
    const int64_t p = a.q_positions[q0 + i];
    qmin = p < qmin ? p : qmin;
    qmax = p > qmax ? p : qmax;
  }
  for (int64_t hh = 0; hh < r; ++hh) {
    for (int64_t i = 0; i < bq; ++i) {
      const int64_t row = hh * bq + i;
      const float* src = a.q + (q0 + i) * a.q_row_stride + (g * r + hh) * a.q_head_stride;
      for (int64_t t = 0; t < d; ++t) qs[row * d + t] = src[t] * qscale;
      pos[row] = a.q_positions[q0 + i];
      mrow[row] = kNegInf;
      lrow[row] = 0.0f;
    }
  }
  for (int64_t i = 0; i < rows * d; ++i) o[i] = 0.0f;

  const int64_t* kp = a.key_positions[g];
  const float* kg = a.k + g * a.kv_group_stride;
  const float* vg = a.v + g * a.kv_group_stride;
  const int64_t win = a.sliding_window;
  const int64_t hi = UpperBound(kp, a.n, qmax);
  const int64_t lo = win > 0 ? LowerBound(kp, a.n, qmin - win + 1) : 0;
  const int vwidth = ValueWidth(d);

  for (int64_t j0 = lo; j0 < hi; j0 += kKeyBlock) {
    const int64_t bk = hi - j0 < kKeyBlock ? hi - j0 : kKeyBlock;
    // Pack K^T; the columns past bk are zero and masked below.
    for (int64_t t = 0; t < d; ++t) {
      float* col = kt + t * kKeyBlock;
      for (int64_t j = 0; j < bk; ++j) col[j] = kg[(j0 + j) * d + t];
      for (int64_t j = bk; j < kKeyBlock; ++j) col[j] = 0.0f;
    }
    // Every row sees every key of the block: no mask needed.
    const bool full = kp[j0 + bk - 1] <= qmin && (win <= 0 || qmax - kp[j0] < win);
    int64_t row = 0;
    for (; row + kScoreRows <= rows; row += kScoreRows) ScoreRows<kScoreRows>(qs + row * d, kt, d, s + row * kKeyBlock);
    for (; row < rows; ++row) ScoreRows<1>(qs + row * d, kt, d, s + row * kKeyBlock);

    // Online softmax per row: p = 2^(s - m_new) in place of the scores, alpha =
    // 2^(m_old - m_new) rescales what the row summed so far. A row that sees none of
    // the block's keys (and none before) keeps alpha 1 and p 0.
    for (row = 0; row < rows; ++row) {
      float* sr = s + row * kKeyBlock;
      for (int64_t j = bk; j < kKeyBlock; ++j) sr[j] = kNegInf;
      if (!full) {
        const int64_t p = pos[row];
        for (int64_t j = 0; j < bk; ++j) {
          const int64_t key = kp[j0 + j];
          if (key > p || (win > 0 && p - key >= win)) sr[j] = kNegInf;
        }
      }
      typename V::F mv = V::Load(sr);
      for (int64_t j = kWidth; j < kKeyBlock; j += kWidth) mv = V::Max(mv, V::Load(sr + j));
      const float block_max = V::HMax(mv);
      const float m_new = block_max > mrow[row] ? block_max : mrow[row];
      if (m_new == kNegInf) {
        alpha[row] = 1.0f;
        for (int64_t j = 0; j < kKeyBlock; ++j) sr[j] = 0.0f;
        continue;
      }
      alpha[row] = Simd<1>::HSum(Simd<1>::Exp2(Simd<1>::Splat(mrow[row] - m_new)));
      mrow[row] = m_new;
      const typename V::F mn = V::Splat(m_new);
      typename V::F sum = {};
      for (int64_t j = 0; j < kKeyBlock; j += kWidth) {
        const typename V::F pj = V::Exp2(V::Load(sr + j) - mn);
        V::Store(sr + j, pj);
        sum += pj;
      }
      lrow[row] = lrow[row] * alpha[row] + V::HSum(sum);
    }
    WeightedSum(vwidth, s, kKeyBlock, vg + j0 * d, bk, d, alpha, rows, o);
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
