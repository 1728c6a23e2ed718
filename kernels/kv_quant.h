// The compact storage formats of a retained KV cache (issue 31): int8 with float32
// scales and bfloat16, beside today's float32. Torch-free; one KV group's entries are
// rows of d = head_dim values, in position order, as model/kv_cache.h keeps them.
//
//   int8, per token (values, and the keys: see below):
//     s = max_i |x_i| / 127,  q_i = round_half_even(x_i / s) clamped to [-127, 127],
//     x^_i = s * q_i.  Then |x_i - x^_i| <= s / 2 per element, plus the float rounding
//     of the division and of the product: <= s / 2 + max_i |x_i| * 2^-23. A row of zeros
//     gets s = 0 and q = 0 (exactly reproduced); a row holding a non-finite value gets
//     s = NaN, so attention over it is NaN as over the float32 row. -128 never occurs,
//     so |q| fits a u8 and q * q' (|q'| <= 127) never overflows int16 pair sums.
//   int8, per channel over blocks of B rows (KIVI's keys): the same with one scale per
//     channel per block, s_{b,c} = max over the block's rows of |x_{.,c}| / 127: d
//     floats per B rows, 4d/B bytes per row (4 at d = 64, B = 64: as per token).
//   bfloat16: the upper 16 bits of the float32, rounded to nearest even (NaN stays a
//     quiet NaN, infinities stay infinite); |x - x^| <= 2^-8 |x| (half an ulp of 8 bits).
//
// Which key scaling: per token. Measured on SmolLM2-135M (bench/kv_quant_bench.cc,
// docs/benchmarks/JOURNAL.md "Int8 retained cache"): per channel blocks of 64 keep
// attention closer, mean KL of the attention weights 1.5e-4 vs 4.7e-4 per token (the
// query as the kernel quantizes it), and end to end over 32 decode steps KL 1.5e-4 vs
// 5.9e-4, top-1 32/32 vs 31/32; decode speed is the same (2.0-2.4x float32's tok/s at
// 8,192 positions for both, bench/attention_bench.cc --decode). Per token wins on what
// the retained tier does besides attending: a channel block's scales change with its
// members, so every append needs KIVI's float32 residual (up to 63 newest keys per layer
// and group: at a budget of 128 entries and d = 64 that is up to 16 KiB of float32 keys
// beside 17 KiB of int8 entries, ~1.9x the bytes) or a re-quantization of the partial
// block, and every selection re-quantizes the blocks it changes (exact only where a
// float32 copy exists: the tiered mode's cold tier, not the evict mode). Per-token rows
// move with their scales and never change. Both are in the decode kernel
// (kernels/attention_int8.h, Int8KeyScaling); the fidelity suite decides whether the
// 3-4x in KL is worth those bytes.
//
//   std::vector<int8_t> q(n * d); std::vector<float> s(n);
//   QuantizeRowsInt8(x, n, d, q.data(), s.data());
//   DequantizeRowsInt8(q.data(), s.data(), n, d, x_hat);
//   KvEntryBytes(KvDtype::kInt8, 64);  // 136 = (64 + 4) * 2, vs 512 in float32
#ifndef ECHOKV_KERNELS_KV_QUANT_H_
#define ECHOKV_KERNELS_KV_QUANT_H_

#include <cstdint>
#include <string>

namespace echokv::kernels {

enum class KvDtype { kFloat32, kBFloat16, kInt8 };

// "float32", "bfloat16", "int8".
const char* KvDtypeName(KvDtype dtype);
// The dtype a name gives; false, leaving *dtype alone, for any other name.
bool ParseKvDtype(const std::string& name, KvDtype* dtype);

// Bytes one retained entry costs (its key row and its value row, one KV group),
// scales included: float32 8d, bfloat16 4d, int8 2 (d + 4) (a float32 scale per row).
int64_t KvEntryBytes(KvDtype dtype, int64_t head_dim);

// ---- int8, one scale per row (token x KV group) ----

// Quantizes `rows` rows of d floats (row i at x + i * d) into q (same layout) and
// scales[rows].
void QuantizeRowsInt8(const float* x, int64_t rows, int64_t d, int8_t* q, float* scales);
// x[i * d + c] = scales[i] * q[i * d + c].
void DequantizeRowsInt8(const int8_t* q, const float* scales, int64_t rows, int64_t d, float* x);

// ---- int8, one scale per channel per block of `block` rows (KIVI keys) ----

// scales has ceil(rows / block) * d entries: block b's channel c at scales[b * d + c];
// the last block may be partial.
void QuantizeChannelBlocksInt8(const float* x, int64_t rows, int64_t d, int64_t block, int8_t* q, float* scales);
void DequantizeChannelBlocksInt8(const int8_t* q, const float* scales, int64_t rows, int64_t d, int64_t block,
                                 float* x);

// ---- bfloat16 ----

uint16_t FloatToBFloat16(float x);
float BFloat16ToFloat(uint16_t b);
void FloatsToBFloat16(const float* x, int64_t n, uint16_t* out);
void BFloat16ToFloats(const uint16_t* b, int64_t n, float* out);

}  // namespace echokv::kernels

#endif  // ECHOKV_KERNELS_KV_QUANT_H_
