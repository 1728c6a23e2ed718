// The decode products: y = x W^T for a few input rows x (one per stream of a decode
// step) against a weight matrix W [rows, cols] in the layout of a linear layer.
//
// Every output y[i, r] = dot(w_r, x_i) (+ bias[r]) is computed the same way whatever the
// number of inputs and whatever register tile it falls in: 16 lanes accumulated over
// the columns (fused multiply-adds where the CPU has them), a fixed pairwise tree over
// the lanes, then the remaining columns one by one. So a stream's logits are identical
// bit for bit whether it decodes alone (n = 1) or in a batch of 64, which is what lets
// the engine batch streams without changing anybody's tokens.
//
// The batch is where the speed comes from: register tiles of several weight rows x
// several inputs (4 x 6 with AVX-512: 24 accumulators, each weight vector loaded once
// for 6 inputs) keep the FMA units busy instead of waiting on loads, and each weight
// row is read from memory once per step for all inputs. AVX-512, AVX2 and a portable
// build; the CPU picks one at load (ECHOKV_MATMUL_ISA=avx512|avx2|scalar forces one it
// supports, for benchmarks and tests).
//
//   kernels::MatMulRows(w, x, bias, /*n=*/16, rows, cols, y, 0, rows);   // y [16, rows]
#ifndef ECHOKV_KERNELS_MATMUL_ROWS_H_
#define ECHOKV_KERNELS_MATMUL_ROWS_H_

#include <cstdint>
#include <string>

namespace echokv::kernels {

// y[i * rows + r] = dot(W[r, :], x[i * cols, :]) + (bias ? bias[r] : 0) for i < n and
// r in [row_begin, row_end) (disjoint ranges may run on different threads).
void MatMulRows(const float* w, const float* x, const float* bias, int64_t n, int64_t rows, int64_t cols, float* y,
                int64_t row_begin, int64_t row_end);

// Rows per block that keeps MatMulRows' register tiles whole (split ranges on it).
int64_t MatMulRowsBlock();

// The build in use: "avx512", "avx2" or "scalar".
std::string MatMulRowsIsa();

// Selects a build for every later call ("auto" = the best the CPU has); false when the
// CPU lacks it. For tests and benchmarks: not meant to change while products run.
bool SetMatMulRowsIsa(const std::string& isa);

}  // namespace echokv::kernels

#endif  // ECHOKV_KERNELS_MATMUL_ROWS_H_
