// The decode products on weights kept in their stored form: GGUF's quantized blocks
// (Q8_0, Q4_0, Q4_1, Q5_0: 32 weights per block with an fp16 scale, and Q4_1's fp16
// minimum;
// the K-quants Q4_K and Q6_K: super-blocks of 256 weights with 8 / 16 sub-block scales;
// and 16-bit F16 / BF16 rows) read as they are, no float32 copy. y = x W^T for n input rows x against W [rows, cols],
// like kernels/matmul_rows.h, which stays the exact float32 path.
//
// The inputs are quantized first, per 32-value block, to int8 with a float scale
// (QuantizeActs: d = max|x| / 127, q = round(x / d), and s = d * sum(q) for Q4_1's
// minimum), so a block's product is an integer dot product (exact) times the two
// scales: sum_b (d_w d_x)_b * isum_b (+ m_w,b * s_b for Q4_1). The only error against
// the dequantized weights times the float inputs is the inputs' rounding:
// |y - dot(w, x)| <= sum_b (d_b / 2) sum_{j in b} |w_j| (plus float32 rounding of the
// sums), d_b the block's input scale (tests/kernels/block_matmul_test.cc checks it).
//
// Every output y[i, r] is computed the same way whatever n and whatever register tile
// or row range it falls in (the blocks summed in order, in 8 lanes for AVX2, then a
// fixed tree over the lanes, then Q4_1's minimum terms, then the bias), so a stream's
// logits are the same bits alone or batched. Batches read each weight block once for
// all inputs: register tiles of several weight rows x several inputs, the block's
// nibbles unpacked once per tile. Two builds: AVX2 (+FMA, F16C: _mm256_maddubs_epi16 /
// _mm256_madd_epi16 integer dots, as ggml's q8 x q4 products do) and a portable one
// (exact integer block sums); for Q4_0 / Q4_1 / Q5_0 / Q8_0 they differ only in float32
// summation order, within the bound above. ECHOKV_MATMUL_ISA=avx2|scalar forces one
// (as matmul_rows.h; avx512 selects avx2 here: no AVX-512 build of these).
//
// F16, BF16, Q4_K and Q6_K are the same bits in both builds (the portable one does what
// the AVX2 one does lane by lane: 8 float32 lanes, lane l taking values 4l..4l+3 of
// each 32 for the integer types, value j mod 8 for the 16-bit ones, each lane's terms
// fused-multiply-added in order, then the same fixed tree over the lanes):
//  - F16 / BF16: the inputs stay float32 (QuantizedActs::x; no int8 rounding), the
//    weights widened exactly, float32 FMAs: |y - dot(w, x)| <= (cols / 8 + 3) u
//    sum_j |w_j x_j| (u = 2^-24; the rounding of the chain of each lane and the tree).
//  - Q4_K / Q6_K: the int8 inputs per 32 values as for the other blocks; a sub-block's
//    integer lanes times its 6- / 8-bit scale (exact in int32), times d_w d_x, added in
//    float32; Q4_K's minimums (dmin * m * s_x per 32 values) in their own sum and
//    subtracted. The input-rounding bound above holds as it is.
//
//   kernels::BlockMatrix w{kernels::BlockType::kQ4_1, bytes, rows, cols};
//   std::vector<int8_t> q(n * cols); std::vector<float> d(n * cols / 32), s(n * cols / 32);
//   kernels::QuantizeActs(x, n, cols, q.data(), d.data(), s.data());
//   kernels::BlockMatMulRows(w, {q.data(), d.data(), s.data()}, bias, n, y, 0, rows);
#ifndef ECHOKV_KERNELS_BLOCK_MATMUL_H_
#define ECHOKV_KERNELS_BLOCK_MATMUL_H_

#include <cstdint>
#include <string>

namespace echokv::kernels {

// Values per block of Q4_0 / Q4_1 / Q8_0 and per input block (QuantizeActs's scales);
// the K-quants' super-blocks hold 256 (BlockValuesOf).
constexpr int64_t kBlockValues = 32;
constexpr int64_t kSuperBlockValues = 256;

// The block types, as ggml lays them out (little-endian, fp16 = IEEE half):
//   Q4_0 (ggml id 2): fp16 d, 16 bytes of nibbles: value j < 16 = d * ((q[j] & 15) - 8),
//                     value 16 + j = d * ((q[j] >> 4) - 8)             18 bytes
//   Q4_1 (id 3):      fp16 d, fp16 m, 16 bytes of nibbles: d * nibble + m  20 bytes
//   Q8_0 (id 8):      fp16 d, 32 int8: d * q                           34 bytes
//   Q5_0 (id 6):      fp16 d, 4 bytes qh (bit j: value j's 5th bit), 16 bytes of
//                     nibbles as Q4_0's: d * ((nibble | bit << 4) - 16)  22 bytes
//   F16 (id 1), BF16 (id 30): 32 16-bit values (counted as a block)   64 bytes
//   Q4_K (id 12), 256 values: fp16 d, fp16 dmin, 12 bytes of 8 6-bit scales sc_s and
//                     8 6-bit minimums m_s (s < 4: sc = b[s] & 63, m = b[s + 4] & 63;
//                     else sc = (b[s + 4] & 15) | (b[s - 4] >> 6) << 4,
//                     m = (b[s + 4] >> 4) | (b[s] >> 6) << 4), 128 bytes of nibbles:
//                     sub-block s = 2k (+1) is the low (high) nibbles of bytes
//                     32k..32k+31; value = (d sc_s) * nibble - dmin m_s        144 bytes
//   Q6_K (id 14), 256 values: 128 bytes ql, 64 bytes qh, 16 int8 scales, fp16 d; in
//                     half h (128 values) with ql += 64 h, qh += 32 h, value
//                     128 h + 32 g + l (g < 4, l < 32) is, minus 32, the low (g < 2)
//                     or high nibble of ql[l + 32 (g & 1)] with bits 2g, 2g+1 of qh[l]
//                     as bits 4-5; value i of the 256 is
//                     (d * sc[i / 16]) * q                                    210 bytes
enum class BlockType { kQ4_0, kQ4_1, kQ8_0, kF16, kBF16, kQ4_K, kQ6_K, kQ5_0 };

// Bytes per block; values per block (32, or 256 for Q4_K / Q6_K); "Q4_0", ..., "BF16";
// whether the type takes float32 inputs (F16, BF16: QuantizedActs::x) rather than int8.
int64_t BlockBytes(BlockType type);
int64_t BlockValuesOf(BlockType type);
bool TakesFloatInputs(BlockType type);
const char* BlockTypeName(BlockType type);
// The type of ggml type id `ggml_id`; false for ids these kernels do not read.
bool BlockTypeFromGgml(uint32_t ggml_id, BlockType* type);

// A [rows, cols] matrix stored as rows of cols / BlockValuesOf(type) blocks (cols a
// multiple of it), row r at data + r * RowBytes(). Not owned.
struct BlockMatrix {
  BlockType type = BlockType::kQ8_0;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  // BlockMatMulRows's output row stride: y[i * out_stride + r] (0 = rows). A matrix
  // stacked from parts of different types runs each part with the whole one's rows.
  int64_t out_stride = 0;
  int64_t RowBytes() const { return cols / BlockValuesOf(type) * BlockBytes(type); }
  int64_t Bytes() const { return rows * RowBytes(); }
};

// n input rows quantized by QuantizeActs: q [n, cols] int8, and per block of 32 values
// d [n, cols / 32] (scale) and s [n, cols / 32] (d * sum of the block's q); x [n, cols]
// the float32 inputs themselves, which F16 / BF16 read instead (then q, d, s may be null).
struct QuantizedActs {
  const int8_t* q = nullptr;
  const float* d = nullptr;
  const float* s = nullptr;
  const float* x = nullptr;
};

// Quantizes x [n, cols] (cols a multiple of 32) per 32-value block: d = max|x| / 127,
// q = x / d rounded to nearest (ties to even), s = d * sum(q); an all-zero block gets
// d = 0 and q = 0. The same code and bits in every build.
void QuantizeActs(const float* x, int64_t n, int64_t cols, int8_t* q, float* d, float* s);

// y[i * w.rows + r] (out_stride if set) = dot(W[r, :], x_i) + (bias ? bias[r] : 0) for i < n, r in
// [row_begin, row_end) (disjoint ranges may run on different threads), x as QuantizeActs
// made it from the inputs.
void BlockMatMulRows(const BlockMatrix& w, const QuantizedActs& x, const float* bias, int64_t n, float* y,
                     int64_t row_begin, int64_t row_end);

// Rows per register tile of the build in use (split ranges on multiples of it).
int64_t BlockMatMulRowsBlock();

// Writes rows [row_begin, row_end) of W as float32 to out [(row_end - row_begin), cols]:
// d * q (+ m), each one float32 rounding, the bits the `gguf` package's dequantization
// (and model/ggml_types.h) gives, in every build (prefill's panels: AVX2 when the CPU
// has it).
void DequantizeBlockRows(const BlockMatrix& w, int64_t row_begin, int64_t row_end, float* out);

// The build in use: "avx2" or "scalar"; SetBlockMatMulIsa as SetMatMulRowsIsa
// ("auto" = the best the CPU has; false when it lacks the one named).
std::string BlockMatMulIsa();
bool SetBlockMatMulIsa(const std::string& isa);

}  // namespace echokv::kernels

#endif  // ECHOKV_KERNELS_BLOCK_MATMUL_H_
