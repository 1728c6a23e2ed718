// Fused causal attention for prefill on CPU float32 (FlashAttention-style): queries
// at given positions attend to the keys/values a cache holds, one block of keys at a
// time with an online softmax, so no score matrix larger than one tile
// ([query rows of a group] x 64 keys) ever exists, whatever the context length.
// GQA-aware: one work item is one KV group and a block of queries of all of that
// group's query heads, so each key and value row is read once for its H/G heads.
// Vectorised for AVX-512 and AVX2+FMA (chosen at run time from the CPU), scalar
// fallback; no torch in this header.
//
//   CausalAttentionArgs a;  // shapes, pointers and strides (see the fields)
//   const int64_t items = CausalAttentionWorkItems(a);
//   parallel_for(0, items, [&](int64_t b, int64_t e) { CausalAttention(a, b, e); });
#ifndef ECHOKV_KERNELS_ATTENTION_H_
#define ECHOKV_KERNELS_ATTENTION_H_

#include <cstdint>
#include <string>

namespace echokv::kernels {

struct CausalAttentionArgs {
  int64_t num_heads = 0;     // H (query heads)
  int64_t num_kv_heads = 0;  // G (key/value groups); H % G == 0, head h reads group h / (H/G)
  int64_t head_dim = 0;      // d
  // Queries (post-RoPE): m of them; query i, head h starts at
  // q + i * q_row_stride + h * q_head_stride (d contiguous floats).
  const float* q = nullptr;
  int64_t q_row_stride = 0;
  int64_t q_head_stride = 0;
  int64_t m = 0;
  const int64_t* q_positions = nullptr;  // [m]
  // Keys and values: n entries per group; group g's entry j starts at
  // k + g * kv_group_stride + j * d (same for v).
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t kv_group_stride = 0;
  int64_t n = 0;
  // key_positions[g] points at group g's n positions, strictly increasing (a cache
  // keeps its entries in position order). A query at position p sees key position kp
  // iff kp <= p and, with sliding_window > 0, p - kp < sliding_window.
  const int64_t* const* key_positions = nullptr;
  int64_t sliding_window = 0;
  float scale = 0.0f;  // softmax scale (1/sqrt(d) for these models)
  // Output: query i, head h written at out + i * out_row_stride + h * out_head_stride.
  // A query that sees no key gets zeros.
  float* out = nullptr;
  int64_t out_row_stride = 0;
  int64_t out_head_stride = 0;
};

// Independent work items of `a` (group x query block); CausalAttention(a, b, e) runs
// items [b, e) and may be called from several threads on disjoint ranges.
int64_t CausalAttentionWorkItems(const CausalAttentionArgs& a);
void CausalAttention(const CausalAttentionArgs& a, int64_t item_begin, int64_t item_end);

// The instruction set the kernel runs with: "avx512", "avx2" or "scalar" (the best
// the CPU supports, unless ECHOKV_ATTENTION_ISA or SetAttentionIsa chose another).
std::string AttentionIsa();
// Selects an instruction set for every later call ("avx512", "avx2", "scalar", or
// "auto" for the best available). Returns false, changing nothing, when the CPU lacks it.
bool SetAttentionIsa(const std::string& isa);

}  // namespace echokv::kernels

#endif  // ECHOKV_KERNELS_ATTENTION_H_
