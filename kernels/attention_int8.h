// Decode attention over an int8 retained cache (kernels/kv_quant.h's per-token format):
// one query per head attends to the n entries of its KV group, reading the int8 keys
// and values where they lie. GQA-aware as kernels/attention.h: one work item is one KV
// group with all of its H/G query heads, so each key and value row is read by one
// thread for its heads.
//
// Per head h and entry j (keys per token, see Int8KeyScaling for the per-channel
// variant):
//   query   two int8 halves per element (the integer dot products need int8 on both
//           sides): hi = QuantizeRowsInt8(q_h) with scale s, lo = round((q_h / s - hi)
//           * 254), so q^ = s (hi + lo / 254), steps of s / 254 (one int8 query, steps
//           of s, doubled the attention weights' KL on SmolLM2); c = scale * s / 254;
//   score_j = float(sum_c (254 hi_c + lo_c) k^_jc) * (k_scales[j] * c)   (the dot
//           product exact in int32);
//   p       = float32 softmax of the visible scores (kernels/softmax.h, as the float32
//             decode path), a masked entry -inf;
//   w_j     = p_j * v_scales[j];  out_c = sum_j w_j * float(v^_jc), an FMA per entry in
//             entry order.
// The AVX2 build (integer dot products by _mm256_maddubs_epi16 on |hi| and sign(k^, hi),
// the same for lo, then _mm256_madd_epi16 by 254 and 1; values widened to float in
// registers) computes the same bits
// as the scalar build (each lane is one channel's chain; std::fma in the scalar build).
// AVX2 runs head dims that are multiples of 32; others run the scalar build.
//
//   DecodeAttentionInt8Args a;  // shapes, pointers and strides (see the fields)
//   const int64_t items = DecodeAttentionInt8WorkItems(a);
//   parallel_for(0, items, [&](int64_t b, int64_t e) { DecodeAttentionInt8(a, b, e); });
#ifndef ECHOKV_KERNELS_ATTENTION_INT8_H_
#define ECHOKV_KERNELS_ATTENTION_INT8_H_

#include <cstdint>
#include <string>

namespace echokv::kernels {

// How the keys are scaled (kernels/kv_quant.h): one scale per entry (QuantizeRowsInt8),
// or one per channel over blocks of kInt8KeyBlock entries (QuantizeChannelBlocksInt8
// with block kInt8KeyBlock, entry 0 starting block 0; the last block may be partial).
// With channel blocks the query is scaled by the block's channel scales, then quantized
// (in two halves) per block and head: score_j = float(q'^ . k^_j) * c_b, no key scale.
enum class Int8KeyScaling { kPerToken, kPerChannelBlock };
constexpr int64_t kInt8KeyBlock = 64;

struct DecodeAttentionInt8Args {
  int64_t num_heads = 0;     // H (query heads)
  int64_t num_kv_heads = 0;  // G (key/value groups); H % G == 0, head h reads group h / (H/G)
  int64_t head_dim = 0;      // d <= 512 (the int32 dot products: 255 * 127^2 * d < 2^31)
  // The query (post-RoPE): head h at q + h * q_head_stride (d contiguous floats), at
  // position q_position.
  const float* q = nullptr;
  int64_t q_head_stride = 0;
  int64_t q_position = 0;
  // Keys and values, n entries per group: group g's entry j starts at
  // k + g * kv_group_stride + j * d (same for v). Value scales: v_scales[g *
  // v_scale_group_stride + j]. Key scales: per token at k_scales[g * k_scale_group_stride
  // + j]; per channel block at k_scales[g * k_scale_group_stride + (j / kInt8KeyBlock) * d + c].
  Int8KeyScaling key_scaling = Int8KeyScaling::kPerToken;
  const int8_t* k = nullptr;
  const float* k_scales = nullptr;
  const int8_t* v = nullptr;
  const float* v_scales = nullptr;
  int64_t kv_group_stride = 0;
  int64_t k_scale_group_stride = 0;
  int64_t v_scale_group_stride = 0;
  int64_t n = 0;
  // key_positions[g] points at group g's n positions; the query sees key position kp
  // iff kp <= q_position and, with sliding_window > 0, q_position - kp < sliding_window.
  // nullptr: every entry is visible.
  const int64_t* const* key_positions = nullptr;
  int64_t sliding_window = 0;
  float scale = 0.0f;  // softmax scale (1/sqrt(d) for these models)
  // Output: head h written at out + h * out_head_stride (d floats). A head that sees no
  // entry gets zeros.
  float* out = nullptr;
  int64_t out_head_stride = 0;
};

// Independent work items of `a` (one per KV group); DecodeAttentionInt8(a, b, e) runs
// items [b, e) and may be called from several threads on disjoint ranges.
int64_t DecodeAttentionInt8WorkItems(const DecodeAttentionInt8Args& a);
void DecodeAttentionInt8(const DecodeAttentionInt8Args& a, int64_t item_begin, int64_t item_end);

// The instruction set the kernel runs with: "avx2" or "scalar" (the best the CPU
// supports, unless ECHOKV_ATTENTION_INT8_ISA or SetDecodeAttentionInt8Isa chose another).
std::string DecodeAttentionInt8Isa();
// Selects "avx2", "scalar" or "auto" (the best available) for every later call. Returns
// false, changing nothing, when the CPU lacks it.
bool SetDecodeAttentionInt8Isa(const std::string& isa);

}  // namespace echokv::kernels

#endif  // ECHOKV_KERNELS_ATTENTION_INT8_H_
