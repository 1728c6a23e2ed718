#include "kernels/attention_int8.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu_isa.h"
#include "kernels/kv_quant.h"
#include "kernels/softmax.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define ECHOKV_INT8_X86 1
#endif

namespace echokv::kernels {
namespace {

// Entries per block of scores: every head of the group scores the block while its keys
// are in L1 (64 keys of d = 64 are 4 KiB), as the float32 decode path does.
constexpr int64_t kKeyBlock = 64;

// The query's two int8 halves: hi = round(x / s), lo = round((x / s - hi) * kLoSteps),
// so x^ = s (hi + lo / kLoSteps), |x - x^| <= s / (2 kLoSteps) (plus float rounding):
// the dot product with an int8 key is (kLoSteps hi + lo) . k^, exact in int32
// (|.| <= 255 * 127 * 127 * d < 2^31 for d <= 512), scaled by s / kLoSteps. One int8
// query alone (steps of s) doubled the mean KL of SmolLM2's attention weights
// (docs/benchmarks/JOURNAL.md, "Int8 retained cache"); the halves leave the keys'
// error alone (KL within 0.1% of a float32 query's).
constexpr int32_t kLoSteps = 254;

// One group's query heads: per head 4 d bytes, [hi | |hi| | lo | |lo|] (the signed
// halves for sign(), their magnitudes as maddubs' unsigned operand), and
// c = scale * s / kLoSteps per head.
struct QueryInt8 {
  std::vector<int8_t> q;
  std::vector<float> c;
};

#if defined(ECHOKV_INT8_X86)
bool QuantizeHeadAvx2(const float* x, const float* channel_scales, int64_t d, int8_t* out, float* s_out);
#endif

// Quantizes r query heads (head h at q + h * stride), each scaled channel-wise by
// `channel_scales` first when that is not nullptr (keys per channel block). With avx2
// (d % 32 == 0) the same bits 8 channels at a time: keys per channel block quantize
// their query once per block of 64 keys, where the scalar divisions cost ~25% of the
// decode.
void QuantizeQueries(const float* q, int64_t stride, int64_t r, int64_t d, float scale, const float* channel_scales,
                     bool avx2, QueryInt8* out) {
  out->q.resize(r * 4 * d);
  out->c.resize(r);
  thread_local std::vector<float> scaled;
  scaled.resize(d);
  for (int64_t h = 0; h < r; ++h) {
    const float* qh = q + h * stride;
#if defined(ECHOKV_INT8_X86)
    float s_avx2;
    if (avx2 && QuantizeHeadAvx2(qh, channel_scales, d, out->q.data() + h * 4 * d, &s_avx2)) {
      out->c[h] = scale * s_avx2 / static_cast<float>(kLoSteps);
      continue;
    }
#endif
    (void)avx2;
    if (channel_scales != nullptr) {
      for (int64_t i = 0; i < d; ++i) scaled[i] = qh[i] * channel_scales[i];
      qh = scaled.data();
    }
    int8_t* hi = out->q.data() + h * 4 * d;
    float s;
    QuantizeRowsInt8(qh, 1, d, hi, &s);
    out->c[h] = scale * s / static_cast<float>(kLoSteps);
    for (int64_t i = 0; i < d; ++i) {
      const float rest = s > 0.0f ? qh[i] / s - static_cast<float>(hi[i]) : 0.0f;
      const float lo = std::clamp(std::nearbyint(rest * static_cast<float>(kLoSteps)), -127.0f, 127.0f);
      hi[2 * d + i] = static_cast<int8_t>(lo);
      hi[d + i] = static_cast<int8_t>(std::abs(hi[i]));
      hi[3 * d + i] = static_cast<int8_t>(std::abs(hi[2 * d + i]));
    }
  }
}

// scores[j] = float((kLoSteps hi + lo) . k^_j) * (k_scales[j] * c) for m entries (* c
// when k_scales is nullptr: keys scaled per channel block, the scales folded into the
// query). q: one head's [hi | |hi| | lo | |lo|].
void ScoresScalar(const int8_t* q, float c, const int8_t* keys, const float* k_scales, int64_t m, int64_t d,
                  float* scores) {
  for (int64_t j = 0; j < m; ++j) {
    const int8_t* k = keys + j * d;
    int32_t hi = 0, lo = 0;
    for (int64_t i = 0; i < d; ++i) {
      hi += static_cast<int32_t>(q[i]) * static_cast<int32_t>(k[i]);
      lo += static_cast<int32_t>(q[2 * d + i]) * static_cast<int32_t>(k[i]);
    }
    const int32_t dot = kLoSteps * hi + lo;
    scores[j] = static_cast<float>(dot) * (k_scales != nullptr ? k_scales[j] * c : c);
  }
}

// out[c] = sum_j w[j] * float(values[j * d + c]), one fma per entry in entry order.
void WeightedSumScalar(const float* w, const int8_t* values, int64_t n, int64_t d, float* out) {
  for (int64_t i = 0; i < d; ++i) out[i] = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const int8_t* v = values + j * d;
    for (int64_t i = 0; i < d; ++i) out[i] = std::fma(w[j], static_cast<float>(v[i]), out[i]);
  }
}

#if defined(ECHOKV_INT8_X86)
#define ECHOKV_AVX2 __attribute__((target("avx2,fma")))

// QuantizeQueries' per-head step for d % 32 == 0, 8 channels at a time: the same
// operations as the scalar code (x * s_c, max |.|, s = max / 127, division, round half
// to even, clamps), so the same bits. False (nothing usable written) when a value is not
// finite: the scalar code handles that row.
ECHOKV_AVX2 bool QuantizeHeadAvx2(const float* x, const float* channel_scales, int64_t d, int8_t* out,
                                  float* s_out) {
  alignas(32) float scaled[512];
  if (d > 512) return false;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
  for (int64_t i = 0; i < d; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if (channel_scales != nullptr) v = _mm256_mul_ps(v, _mm256_loadu_ps(channel_scales + i));
    _mm256_store_ps(scaled + i, v);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, amax);
  float m = 0.0f;
  for (float l : lanes) m = std::max(m, l);
  if (_mm256_movemask_ps(nan) != 0 || !std::isfinite(m)) return false;
  const float s = m / 127.0f;
  *s_out = s;
  if (!(s > 0.0f)) {
    std::memset(out, 0, 4 * d);
    return true;
  }
  const __m256 sv = _mm256_set1_ps(s), lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
  const __m256 steps = _mm256_set1_ps(static_cast<float>(kLoSteps));
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int64_t i = 0; i < d; i += 8) {
    const __m256 q = _mm256_div_ps(_mm256_load_ps(scaled + i), sv);
    const __m256 hi = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(q, kRound), nlim), lim);
    const __m256 rest = _mm256_sub_ps(q, hi);
    const __m256 lo = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(_mm256_mul_ps(rest, steps), kRound), nlim), lim);
    alignas(32) int32_t h32[8], l32[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(h32), _mm256_cvtps_epi32(hi));
    _mm256_store_si256(reinterpret_cast<__m256i*>(l32), _mm256_cvtps_epi32(lo));
    for (int t = 0; t < 8; ++t) {
      out[i + t] = static_cast<int8_t>(h32[t]);
      out[d + i + t] = static_cast<int8_t>(std::abs(h32[t]));
      out[2 * d + i + t] = static_cast<int8_t>(l32[t]);
      out[3 * d + i + t] = static_cast<int8_t>(std::abs(l32[t]));
    }
  }
  return true;
}

// The int32 sum of each of 8 vectors, as one vector (sums[t] = sum of acc[t]'s lanes).
ECHOKV_AVX2 inline __m256i Reduce8(const __m256i* acc) {
  const __m256i s01 = _mm256_hadd_epi32(acc[0], acc[1]);
  const __m256i s23 = _mm256_hadd_epi32(acc[2], acc[3]);
  const __m256i s45 = _mm256_hadd_epi32(acc[4], acc[5]);
  const __m256i s67 = _mm256_hadd_epi32(acc[6], acc[7]);
  const __m256i t0 = _mm256_hadd_epi32(s01, s23);  // [0123 of a0..a3 | 4567 of a0..a3]
  const __m256i t1 = _mm256_hadd_epi32(s45, s67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(t0, t1, 0x20), _mm256_permute2x128_si256(t0, t1, 0x31));
}

// (kLoSteps hi + lo) . k^ of one key over kVecs chunks of 32 channels, as 8 int32
// partial sums: maddubs(|hi|, sign(k^, hi)) = pairs of hi_c k^_c in int16 (|.| <= 2 *
// 127^2, no saturation), madd with kLoSteps widens and scales them to int32; the same
// for lo with ones.
template <int kVecs>
ECHOKV_AVX2 inline __m256i DotChunks(const __m256i* hi_abs, const __m256i* hi, const __m256i* lo_abs,
                                     const __m256i* lo, const int8_t* k) {
  const __m256i ones = _mm256_set1_epi16(1), steps = _mm256_set1_epi16(kLoSteps);
  __m256i acc = _mm256_setzero_si256();
  for (int i = 0; i < kVecs; ++i) {
    const __m256i kv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + 32 * i));
    const __m256i ph = _mm256_maddubs_epi16(hi_abs[i], _mm256_sign_epi8(kv, hi[i]));
    const __m256i pl = _mm256_maddubs_epi16(lo_abs[i], _mm256_sign_epi8(kv, lo[i]));
    acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(ph, steps), _mm256_madd_epi16(pl, ones)));
  }
  return acc;
}

template <int kVecs>
ECHOKV_AVX2 void ScoresAvx2Fixed(const int8_t* q, float c, const int8_t* keys, const float* k_scales, int64_t m,
                                 float* scores) {
  constexpr int64_t d = 32 * kVecs;
  __m256i hi[kVecs], hi_abs[kVecs], lo[kVecs], lo_abs[kVecs];
  for (int i = 0; i < kVecs; ++i) {
    hi[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * i));
    hi_abs[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + d + 32 * i));
    lo[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 2 * d + 32 * i));
    lo_abs[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 3 * d + 32 * i));
  }
  const __m256 cv = _mm256_set1_ps(c);
  int64_t j = 0;
  for (; j + 8 <= m; j += 8) {
    __m256i acc[8];
    for (int t = 0; t < 8; ++t) acc[t] = DotChunks<kVecs>(hi_abs, hi, lo_abs, lo, keys + (j + t) * d);
    const __m256 dots = _mm256_cvtepi32_ps(Reduce8(acc));
    const __m256 ks = k_scales != nullptr ? _mm256_mul_ps(_mm256_loadu_ps(k_scales + j), cv) : cv;
    _mm256_storeu_ps(scores + j, _mm256_mul_ps(dots, ks));
  }
  for (; j < m; ++j) {
    const __m256i acc = DotChunks<kVecs>(hi_abs, hi, lo_abs, lo, keys + j * d);
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
    int32_t dot = 0;
    for (int t = 0; t < 8; ++t) dot += lanes[t];
    scores[j] = static_cast<float>(dot) * (k_scales != nullptr ? k_scales[j] * c : c);
  }
}

ECHOKV_AVX2 void ScoresAvx2(const int8_t* q, float c, const int8_t* keys, const float* k_scales, int64_t m,
                            int64_t d, float* scores) {
  switch (d) {
    case 32:
      return ScoresAvx2Fixed<1>(q, c, keys, k_scales, m, scores);
    case 64:
      return ScoresAvx2Fixed<2>(q, c, keys, k_scales, m, scores);
    case 128:
      return ScoresAvx2Fixed<4>(q, c, keys, k_scales, m, scores);
    case 256:
      return ScoresAvx2Fixed<8>(q, c, keys, k_scales, m, scores);
  }
  return ScoresScalar(q, c, keys, k_scales, m, d, scores);
}

// Channels [c0, c0 + 8 kVecs) of the weighted sum: 8 kVecs float accumulators, each
// entry's int8 row widened to float in registers (vpmovsxbd + vcvtdq2ps) and FMA'd.
template <int kVecs>
ECHOKV_AVX2 void WeightedSumAvx2Chunk(const float* w, const int8_t* values, int64_t n, int64_t d, float* out) {
  __m256 acc[kVecs];
  for (int i = 0; i < kVecs; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const __m256 wj = _mm256_broadcast_ss(w + j);
    const int8_t* v = values + j * d;
    for (int i = 0; i < kVecs; ++i) {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + 8 * i));
      acc[i] = _mm256_fmadd_ps(wj, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), acc[i]);
    }
  }
  for (int i = 0; i < kVecs; ++i) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

ECHOKV_AVX2 void WeightedSumAvx2(const float* w, const int8_t* values, int64_t n, int64_t d, float* out) {
  // 64 channels (8 accumulators) at a time; d % 32 == 0 here.
  int64_t c0 = 0;
  for (; c0 + 64 <= d; c0 += 64) WeightedSumAvx2Chunk<8>(w, values + c0, n, d, out + c0);
  if (c0 < d) WeightedSumAvx2Chunk<4>(w, values + c0, n, d, out + c0);
}
#endif  // ECHOKV_INT8_X86

enum class Isa { kScalar, kAvx2 };

bool Supported(Isa isa) {
#if defined(ECHOKV_INT8_X86)
  if (isa == Isa::kAvx2) return CpuRunsIsa("avx2");
#endif
  return isa == Isa::kScalar;
}

Isa Best() { return Supported(Isa::kAvx2) ? Isa::kAvx2 : Isa::kScalar; }

std::atomic<Isa>& Current() {
  static std::atomic<Isa> isa = [] {
    const char* env = std::getenv("ECHOKV_ATTENTION_INT8_ISA");
    if (env != nullptr && std::strcmp(env, "scalar") == 0) return Isa::kScalar;
    return Best();
  }();
  return isa;
}

void RunGroup(const DecodeAttentionInt8Args& a, int64_t g, Isa isa) {
  const int64_t d = a.head_dim, n = a.n, r = a.num_heads / a.num_kv_heads, h0 = g * r;
  const bool avx2 = isa == Isa::kAvx2 && d % 32 == 0;
  (void)avx2;  // (read only in the x86 build)
  const int8_t* keys = a.k + g * a.kv_group_stride;
  const int8_t* values = a.v + g * a.kv_group_stride;
  const float* k_scales = a.k_scales + g * a.k_scale_group_stride;
  const float* v_scales = a.v_scales + g * a.v_scale_group_stride;
  const bool per_channel = a.key_scaling == Int8KeyScaling::kPerChannelBlock;
  const float* q0 = a.q + h0 * a.q_head_stride;
  thread_local QueryInt8 query;
  thread_local std::vector<float> scores_buffer;
  if (!per_channel) QuantizeQueries(q0, a.q_head_stride, r, d, a.scale, nullptr, avx2, &query);
  if (static_cast<int64_t>(scores_buffer.size()) < r * n) scores_buffer.resize(r * n);
  float* scores = scores_buffer.data();
  static_assert(kKeyBlock == kInt8KeyBlock, "a block of scores is one block of per-channel key scales");
  for (int64_t j0 = 0; j0 < n; j0 += kKeyBlock) {
    const int64_t m = std::min(kKeyBlock, n - j0);
    // Per channel block: this block's query, the key scales folded in.
    if (per_channel) {
      QuantizeQueries(q0, a.q_head_stride, r, d, a.scale, k_scales + (j0 / kKeyBlock) * d, avx2, &query);
    }
    const float* ks = per_channel ? nullptr : k_scales + j0;
    for (int64_t h = 0; h < r; ++h) {
      const int8_t* q = query.q.data() + h * 4 * d;
      float* s = scores + h * n + j0;
#if defined(ECHOKV_INT8_X86)
      if (avx2) {
        ScoresAvx2(q, query.c[h], keys + j0 * d, ks, m, d, s);
        continue;
      }
#endif
      ScoresScalar(q, query.c[h], keys + j0 * d, ks, m, d, s);
    }
  }
  const int64_t* kpos = a.key_positions != nullptr ? a.key_positions[g] : nullptr;
  for (int64_t h = 0; h < r; ++h) {
    float* s = scores + h * n;
    float* out = a.out + (h0 + h) * a.out_head_stride;
    if (kpos != nullptr) {
      for (int64_t j = 0; j < n; ++j) {
        const int64_t kp = kpos[j];
        if (kp > a.q_position || (a.sliding_window > 0 && a.q_position - kp >= a.sliding_window)) {
          s[j] = -std::numeric_limits<float>::infinity();
        }
      }
    }
    const float mx = MaxOf(s, n);
    if (n == 0 || mx == -std::numeric_limits<float>::infinity()) {
      std::fill(out, out + d, 0.0f);
      continue;
    }
    const float den = ExpShiftSum(s, n, mx);  // masked scores (-inf) give 0
    ScaleInPlace(s, n, 1.0f / den);
    for (int64_t j = 0; j < n; ++j) s[j] *= v_scales[j];  // w_j = p_j * s_v[j]
#if defined(ECHOKV_INT8_X86)
    if (avx2) {
      WeightedSumAvx2(s, values, n, d, out);
      continue;
    }
#endif
    WeightedSumScalar(s, values, n, d, out);
  }
}

}  // namespace

int64_t DecodeAttentionInt8WorkItems(const DecodeAttentionInt8Args& a) {
  if (a.num_kv_heads <= 0 || a.num_heads % a.num_kv_heads != 0) return 0;
  return a.num_kv_heads;
}

void DecodeAttentionInt8(const DecodeAttentionInt8Args& a, int64_t item_begin, int64_t item_end) {
  const Isa isa = Current().load(std::memory_order_relaxed);
  for (int64_t g = item_begin; g < item_end; ++g) RunGroup(a, g, isa);
}

std::string DecodeAttentionInt8Isa() { return Current().load() == Isa::kAvx2 ? "avx2" : "scalar"; }

bool SetDecodeAttentionInt8Isa(const std::string& isa) {
  Isa want;
  if (isa == "auto") {
    want = Best();
  } else if (isa == "avx2") {
    want = Isa::kAvx2;
  } else if (isa == "scalar") {
    want = Isa::kScalar;
  } else {
    return false;
  }
  if (!Supported(want)) return false;
  Current().store(want);
  return true;
}

}  // namespace echokv::kernels
