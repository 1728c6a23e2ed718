// Decode attention's weighted sum of value rows, out[i] = sum_j p[j] * values[j * d + i],
// for the head dims whose loop runs best as a fixed sequence of separately rounded
// products and sums (d = 8: stories260K; d = 128: Llama-7B-class models).
//
// Every build gives the same bits: each product p[j] * v is rounded, then added (no
// fused multiply-add) to one of kChains accumulators (d = 8: four, row j going to chain
// j mod 4 while four rows remain, the last n mod 4 rows to chain 0; d = 128: one), and
// the chains are summed ((c0 + c1) + c2) + c3. The AVX-512 build keeps chains 0|1 and
// 2|3 side by side in 16-lane registers (two rows per load), the portable one is plain
// loops; the CPU picks one, and WeightedSumRowsChainsWith runs either (for the tests).
//
//   kernels::WeightedSumRowsChains(probs, values, n, /*d=*/8, out);   // out [8]
#ifndef ECHOKV_KERNELS_WEIGHTED_SUM_H_
#define ECHOKV_KERNELS_WEIGHTED_SUM_H_

#include <cstdint>

namespace echokv::kernels {

// True for the head dims WeightedSumRowsChains handles (8 and 128).
inline bool WeightedSumRowsChainsHandles(int64_t d) { return d == 8 || d == 128; }

// out[d] = sum over j < n of p[j] * values[j * d, (j + 1) * d), in the order above, with
// the fastest build this CPU runs. d must be one WeightedSumRowsChainsHandles accepts.
void WeightedSumRowsChains(const float* p, const float* values, int64_t n, int64_t d, float* out);

// The same with a given build: "portable" or "avx512" (false if this CPU or binary lacks
// it, or d is not handled). For tests and benchmarks.
bool WeightedSumRowsChainsWith(const char* isa, const float* p, const float* values, int64_t n, int64_t d,
                               float* out);

}  // namespace echokv::kernels

#endif  // ECHOKV_KERNELS_WEIGHTED_SUM_H_
