// GGML tensor types as GGUF files store them: the type ids, block sizes, bytes per
// block, and dequantization to float32. Torch-free.
//
// Dequantization reproduces the `gguf` Python package's numpy code
// (gguf/quants.py, `dequantize_blocks` of each type) operation for operation: every
// product and sum is one float32 rounding in the same order (this file is compiled with
// -ffp-contract=off, so no fused multiply-add merges two of them), so the results are
// the same bits (tests/model/gguf_golden_test.cc checks that against golden files the
// package made, tools/oracle/).
//
//   const GgmlTypeInfo* t = FindGgmlType(3);            // Q4_1: 32 values in 20 bytes
//   std::vector<float> out(n);
//   ECHOKV_RETURN_IF_ERROR(DequantizeGgml(3, bytes, n, out.data()));
#ifndef ECHOKV_MODEL_GGML_TYPES_H_
#define ECHOKV_MODEL_GGML_TYPES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace echokv::model {

// The ids of ggml's `enum ggml_type` (ids 4, 5 and 31-33 were removed types).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct GgmlTypeInfo {
  GgmlType type;
  const char* name;     // ggml's name: "F32", "Q4_1", "Q6_K", ...
  int64_t block_size;   // values per block (1 for plain types)
  int64_t type_size;    // bytes per block
  bool dequantizable;   // DequantizeGgml supports it
};

// The type with ggml id `id`; nullptr when no ggml type has that id.
const GgmlTypeInfo* FindGgmlType(uint32_t id);

// Bytes of `n` values of `info` (n must be a multiple of its block size); false on
// overflow of int64.
bool GgmlRowBytes(const GgmlTypeInfo& info, int64_t n, int64_t* bytes);

// Writes `n` float32 values decoded from `src` (GgmlRowBytes(type, n) bytes, any
// alignment) to `dst`. Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
// Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS. Other ggml types -> Unimplemented naming the
// type; unknown ids and an `n` that is not a whole number of blocks -> InvalidArgument.
absl::Status DequantizeGgml(uint32_t type, const uint8_t* src, int64_t n, float* dst);

// IEEE half and bfloat16 bit patterns to float32, exactly (NaN payloads kept, as
// numpy's conversion keeps them).
float HalfToFloat(uint16_t h);
float BFloat16ToFloat(uint16_t b);

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_GGML_TYPES_H_
