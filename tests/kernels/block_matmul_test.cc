// kernels::BlockMatMulRows (the decode products on Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K
// blocks and F16 / BF16 rows) in every build the CPU has:
//  - against a float64 reference of the dequantized weights times the *quantized*
//    inputs (d * q): only float32 summation error may remain, |err| <= 1e-5 sum|w_j d q_j|;
//  - against the dequantized weights times the float inputs, within the bound the
//    inputs' rounding gives: |err| <= sum_b (d_b / 2) sum_{j in b} |w_j| (d_b the input
//    block's scale; each |x_j - d_b q_j| <= d_b / 2), plus the same float32 slack;
//  - a row's outputs are the same bits for n = 1 and n = 7 and whatever row ranges the
//    rows are split into; the AVX2 and portable builds agree within the float32 bound;
//  - F16 / BF16 (float32 inputs, no int8 rounding) against the float64 product of the
//    widened weights and the inputs: |err| <= (cols / 8 + 3) 2^-24 sum|w_j x_j|;
//  - F16, BF16, Q4_K, Q6_K: the AVX2 and portable builds give the same bits (products and
//    DequantizeBlockRows);
//  - QuantizeActs and DequantizeBlockRows against this file's own decoding of the bytes.
// (The K-quants' decoding is also checked against the `gguf` package's in
// block_ktypes_golden_test.cc.)
#include "kernels/block_matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace echokv::kernels {
namespace {

// A positive normal half 2^(e - 15) (1 + man / 1024) with e in [lo, hi].
uint16_t RandomHalf(std::mt19937& rng, int lo, int hi, bool negative) {
  const uint16_t e = std::uniform_int_distribution<int>(lo, hi)(rng);
  const uint16_t man = std::uniform_int_distribution<int>(0, 1023)(rng);
  return static_cast<uint16_t>((negative ? 0x8000 : 0) | (e << 10) | man);
}

double HalfValue(uint16_t h) {
  const int e = (h >> 10) & 31, man = h & 1023;
  const double v = std::ldexp(1024.0 + man, e - 25);
  return (h & 0x8000) ? -v : v;
}

bool IsKType(BlockType type) { return type == BlockType::kQ4_K || type == BlockType::kQ6_K; }
bool IsFloatType(BlockType type) { return type == BlockType::kF16 || type == BlockType::kBF16; }

// Random bytes of one Q4_K / Q6_K super-block (scales in range, small fp16 d, dmin) and
// their 256 values, decoded here from ggml's layout (ggml-quants.c's
// dequantize_row_q4_K / q6_K, read for the layout).
void RandomSuperBlock(BlockType type, std::mt19937& rng, uint8_t* p, double* out) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t k = 0; k < BlockBytes(type); ++k) p[k] = static_cast<uint8_t>(byte(rng));
  if (type == BlockType::kQ4_K) {
    const uint16_t d = RandomHalf(rng, 4, 10, false), dmin = RandomHalf(rng, 4, 10, false);
    std::memcpy(p, &d, 2);
    std::memcpy(p + 2, &dmin, 2);
    const uint8_t* sc = p + 4;
    for (int s = 0; s < 8; ++s) {
      int scale, min;
      if (s < 4) {
        scale = sc[s] & 63;
        min = sc[s + 4] & 63;
      } else {
        scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
        min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
      }
      for (int l = 0; l < 32; ++l) {
        const uint8_t q = p[16 + 32 * (s / 2) + l];
        const int nib = (s % 2 == 0) ? (q & 15) : (q >> 4);
        out[32 * s + l] = HalfValue(d) * scale * nib - HalfValue(dmin) * min;
      }
    }
    return;
  }
  const uint16_t d = RandomHalf(rng, 4, 10, byte(rng) & 1);
  std::memcpy(p + 208, &d, 2);
  for (int i = 0; i < 256; ++i) {
    const int h = i / 128, g = (i % 128) / 32, l = i % 32;
    const uint8_t ql = p[64 * h + l + 32 * (g % 2)], qh = p[128 + 32 * h + l];
    const int low = g < 2 ? (ql & 15) : (ql >> 4);
    const int q = (low | (((qh >> (2 * g)) & 3) << 4)) - 32;
    out[i] = HalfValue(d) * static_cast<int8_t>(p[192 + i / 16]) * q;
  }
}

// Random blocks of `type` for a [rows, cols] matrix, and their values decoded here.
std::vector<uint8_t> RandomBlocks(BlockType type, int64_t rows, int64_t cols, uint32_t seed, std::vector<double>* w) {
  std::mt19937 rng(seed);
  const int64_t nb = cols / BlockValuesOf(type), bb = BlockBytes(type);
  std::vector<uint8_t> bytes(rows * nb * bb);
  w->assign(rows * cols, 0.0);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* p = bytes.data() + (r * nb + b) * bb;
      double* out = w->data() + r * cols + b * BlockValuesOf(type);
      if (IsKType(type)) {
        RandomSuperBlock(type, rng, p, out);
        continue;
      }
      if (type == BlockType::kF16) {
        for (int j = 0; j < 32; ++j) {
          const uint16_t h = RandomHalf(rng, 1, 17, byte(rng) & 1);  // 2^-14 .. 8
          std::memcpy(p + 2 * j, &h, 2);
          out[j] = HalfValue(h);
        }
        continue;
      }
      if (type == BlockType::kBF16) {
        for (int j = 0; j < 32; ++j) {
          const float f = normal(rng);
          uint32_t bits;
          std::memcpy(&bits, &f, 4);
          const uint16_t h = static_cast<uint16_t>(bits >> 16);
          std::memcpy(p + 2 * j, &h, 2);
          bits = static_cast<uint32_t>(h) << 16;
          float v;
          std::memcpy(&v, &bits, 4);
          out[j] = v;
        }
        continue;
      }
      const uint16_t d = RandomHalf(rng, 8, 14, false);
      std::memcpy(p, &d, 2);
      if (type == BlockType::kQ8_0) {
        for (int j = 0; j < 32; ++j) {
          const int8_t q = static_cast<int8_t>(byte(rng));  // includes -128
          p[2 + j] = static_cast<uint8_t>(q);
          out[j] = HalfValue(d) * q;
        }
        continue;
      }
      if (type == BlockType::kQ5_0) {
        uint32_t qh = 0;
        for (int k = 0; k < 4; ++k) qh |= static_cast<uint32_t>(byte(rng)) << (8 * k);
        std::memcpy(p + 2, &qh, 4);
        for (int j = 0; j < 16; ++j) {
          p[6 + j] = static_cast<uint8_t>(byte(rng));
          out[j] = HalfValue(d) * (static_cast<int>((p[6 + j] & 15) | (((qh >> j) & 1) << 4)) - 16);
          out[16 + j] = HalfValue(d) * (static_cast<int>((p[6 + j] >> 4) | (((qh >> (16 + j)) & 1) << 4)) - 16);
        }
        continue;
      }
      double m = 0;
      if (type == BlockType::kQ4_1) {
        const uint16_t mh = RandomHalf(rng, 8, 14, byte(rng) & 1);
        std::memcpy(p + 2, &mh, 2);
        m = HalfValue(mh);
      }
      uint8_t* qs = p + (type == BlockType::kQ4_1 ? 4 : 2);
      const int off = type == BlockType::kQ4_0 ? 8 : 0;
      for (int j = 0; j < 16; ++j) {
        qs[j] = static_cast<uint8_t>(byte(rng));
        out[j] = HalfValue(d) * ((qs[j] & 15) - off) + m;
        out[16 + j] = HalfValue(d) * ((qs[j] >> 4) - off) + m;
      }
    }
  }
  return bytes;
}

std::vector<float> RandomInputs(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  // A zero block and a block with one large outlier (the scale of a block is its max).
  if (n >= 64) {
    for (int j = 0; j < 32; ++j) v[j] = 0.0f;
    v[40] = 25.0f;
  }
  return v;
}

struct Acts {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  const float* x = nullptr;
  QuantizedActs View() const { return {q.data(), d.data(), s.data(), x}; }
};
Acts Quantize(const std::vector<float>& x, int64_t n, int64_t cols) {
  Acts a;
  a.x = x.data();
  a.q.resize(n * cols);
  a.d.resize(n * cols / 32);
  a.s.resize(n * cols / 32);
  QuantizeActs(x.data(), n, cols, a.q.data(), a.d.data(), a.s.data());
  return a;
}

std::vector<std::string> SupportedIsas() {
  std::vector<std::string> isas;
  for (const char* isa : {"avx2", "scalar"}) {
    if (SetBlockMatMulIsa(isa)) isas.push_back(isa);
  }
  SetBlockMatMulIsa("auto");
  return isas;
}

const BlockType kTypes[] = {BlockType::kQ4_0, BlockType::kQ4_1, BlockType::kQ8_0, BlockType::kQ5_0,
                            BlockType::kF16,  BlockType::kBF16, BlockType::kQ4_K, BlockType::kQ6_K};
// The types whose builds give the same bits.
const BlockType kSameBitsTypes[] = {BlockType::kF16, BlockType::kBF16, BlockType::kQ4_K, BlockType::kQ6_K};

// A row length of the type near `cols` (the K-quants' rows are whole super-blocks).
int64_t ColsFor(BlockType type, int64_t cols) {
  return IsKType(type) ? std::max<int64_t>(256, (cols + 255) / 256 * 256) : cols;
}

class BlockMatMulTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(SetBlockMatMulIsa(GetParam()));
    ASSERT_EQ(BlockMatMulIsa(), GetParam());
  }
  void TearDown() override { SetBlockMatMulIsa("auto"); }
};

TEST_P(BlockMatMulTest, MatchesFloat64ReferenceWithinTheInputRoundingBound) {
  for (BlockType type : kTypes) {
    for (int64_t cols : IsKType(type) ? std::vector<int64_t>{256, 512, 1536} : std::vector<int64_t>{32, 64, 96, 576, 1536}) {
      for (int64_t rows : {1, 2, 3, 5, 7, 9}) {
        for (int64_t n : {1, 2, 3, 4, 5, 7, 16}) {
          SCOPED_TRACE(::testing::Message() << BlockTypeName(type) << " cols " << cols << " rows " << rows << " n " << n);
          std::vector<double> w;
          const std::vector<uint8_t> bytes = RandomBlocks(type, rows, cols, 11 + rows + cols, &w);
          const std::vector<float> x = RandomInputs(n * cols, 5 + n), bias = RandomInputs(rows, 3);
          const bool with_bias = (rows + n) % 2 == 0;
          const Acts a = Quantize(x, n, cols);
          const BlockMatrix m{type, bytes.data(), rows, cols};
          std::vector<float> y(n * rows, NAN);
          BlockMatMulRows(m, a.View(), with_bias ? bias.data() : nullptr, n, y.data(), 0, rows);
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t r = 0; r < rows; ++r) {
              double exact_q = with_bias ? bias[r] : 0.0, exact_x = exact_q, mag = std::abs(exact_q), bound = 0;
              if (IsFloatType(type)) {  // float32 inputs: only the float32 chain's rounding
                double wx = std::abs(exact_x);
                for (int64_t j = 0; j < cols; ++j) {
                  exact_x += w[r * cols + j] * x[i * cols + j];
                  wx += std::abs(w[r * cols + j] * x[i * cols + j]);
                }
                EXPECT_NEAR(y[i * rows + r], exact_x, (cols / 8 + 3) * std::ldexp(wx, -24) + 1e-30)
                    << "row " << r << " input " << i;
                continue;
              }
              for (int64_t b = 0; b < cols / 32; ++b) {
                const double d = a.d[i * (cols / 32) + b];
                double abs_w = 0;
                for (int64_t j = b * 32; j < b * 32 + 32; ++j) {
                  const double wj = w[r * cols + j];
                  exact_q += wj * (d * a.q[i * cols + j]);
                  exact_x += wj * x[i * cols + j];
                  mag += std::abs(wj) * (std::abs(d * a.q[i * cols + j]) + std::abs(x[i * cols + j]));
                  abs_w += std::abs(wj);
                }
                bound += d / 2 * abs_w;
              }
              const double got = y[i * rows + r], slack = 1e-5 * mag + 1e-6;
              EXPECT_NEAR(got, exact_q, slack) << "row " << r << " input " << i;
              EXPECT_NEAR(got, exact_x, bound * (1 + 1e-6) + slack) << "row " << r << " input " << i;
            }
          }
        }
      }
    }
  }
}

TEST_P(BlockMatMulTest, RowOutputsDoNotDependOnTheBatchOrTheRowSplit) {
  for (BlockType type : kTypes) {
    const int64_t rows = 23, cols = ColsFor(type, 576), n = 7;
    std::vector<double> w;
    const std::vector<uint8_t> bytes = RandomBlocks(type, rows, cols, 77, &w);
    const std::vector<float> x = RandomInputs(n * cols, 9), bias = RandomInputs(rows, 4);
    const Acts a = Quantize(x, n, cols);
    const BlockMatrix m{type, bytes.data(), rows, cols};
    std::vector<float> batch(n * rows), split(n * rows);
    BlockMatMulRows(m, a.View(), bias.data(), n, batch.data(), 0, rows);
    // The same rows in uneven ranges (no range a multiple of the tile height).
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 1}, {1, 6}, {6, 13}, {13, 23}}) {
      BlockMatMulRows(m, a.View(), bias.data(), n, split.data(), b, e);
    }
    EXPECT_EQ(0, std::memcmp(batch.data(), split.data(), batch.size() * sizeof(float))) << BlockTypeName(type);
    for (int64_t i = 0; i < n; ++i) {
      const std::vector<float> xi(x.begin() + i * cols, x.begin() + (i + 1) * cols);  // outlives `one`
      const Acts one = Quantize(xi, 1, cols);
      std::vector<float> alone(rows);
      BlockMatMulRows(m, one.View(), bias.data(), 1, alone.data(), 0, rows);
      EXPECT_EQ(0, std::memcmp(alone.data(), batch.data() + i * rows, rows * sizeof(float)))
          << BlockTypeName(type) << " input " << i << " alone vs in a batch of " << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, BlockMatMulTest, ::testing::ValuesIn(SupportedIsas()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(BlockMatMulIsas, Avx2AndScalarAgreeWithinTheFloat32Bound) {
  if (!SetBlockMatMulIsa("avx2")) GTEST_SKIP() << "no AVX2 on this CPU (the portable build is tested above)";
  for (BlockType type : {BlockType::kQ4_0, BlockType::kQ4_1, BlockType::kQ8_0, BlockType::kQ5_0}) {
    const int64_t rows = 37, cols = 1536, n = 5;
    std::vector<double> w;
    const std::vector<uint8_t> bytes = RandomBlocks(type, rows, cols, 5, &w);
    const std::vector<float> x = RandomInputs(n * cols, 6);
    const Acts a = Quantize(x, n, cols);
    const BlockMatrix m{type, bytes.data(), rows, cols};
    std::vector<float> avx2(n * rows), scalar(n * rows);
    ASSERT_TRUE(SetBlockMatMulIsa("avx2"));
    BlockMatMulRows(m, a.View(), nullptr, n, avx2.data(), 0, rows);
    ASSERT_TRUE(SetBlockMatMulIsa("scalar"));
    BlockMatMulRows(m, a.View(), nullptr, n, scalar.data(), 0, rows);
    SetBlockMatMulIsa("auto");
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t r = 0; r < rows; ++r) {
        double mag = 0;
        for (int64_t j = 0; j < cols; ++j) {
          mag += std::abs(w[r * cols + j] * a.d[i * (cols / 32) + j / 32] * a.q[i * cols + j]);
        }
        EXPECT_NEAR(avx2[i * rows + r], scalar[i * rows + r], 2e-5 * mag + 1e-6) << BlockTypeName(type);
      }
    }
  }
}

TEST(BlockMatMulIsas, Avx2AndScalarGiveTheSameBitsForTheNewerTypes) {
  if (!SetBlockMatMulIsa("avx2")) GTEST_SKIP() << "no AVX2 on this CPU (the portable build is tested above)";
  for (BlockType type : kSameBitsTypes) {
    for (int64_t n : {1, 2, 5, 8}) {
      const int64_t rows = 37, cols = 1536;
      std::vector<double> w;
      const std::vector<uint8_t> bytes = RandomBlocks(type, rows, cols, 5 + n, &w);
      const std::vector<float> x = RandomInputs(n * cols, 6), bias = RandomInputs(rows, 2);
      const Acts a = Quantize(x, n, cols);
      const BlockMatrix m{type, bytes.data(), rows, cols};
      std::vector<float> avx2(n * rows), scalar(n * rows);
      ASSERT_TRUE(SetBlockMatMulIsa("avx2"));
      BlockMatMulRows(m, a.View(), bias.data(), n, avx2.data(), 0, rows);
      ASSERT_TRUE(SetBlockMatMulIsa("scalar"));
      BlockMatMulRows(m, a.View(), bias.data(), n, scalar.data(), 0, rows);
      SetBlockMatMulIsa("auto");
      EXPECT_EQ(0, std::memcmp(avx2.data(), scalar.data(), avx2.size() * sizeof(float)))
          << BlockTypeName(type) << " n " << n;
    }
  }
}

TEST(QuantizeActs, RoundsEachBlockToItsScale) {
  const int64_t cols = 96, n = 3;
  const std::vector<float> x = RandomInputs(n * cols, 21);
  const Acts a = Quantize(x, n, cols);
  for (int64_t b = 0; b < n * cols / 32; ++b) {
    float amax = 0;
    int sum = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(x[b * 32 + j]));
    EXPECT_EQ(a.d[b], amax / 127.0f);
    for (int j = 0; j < 32; ++j) {
      const int q = a.q[b * 32 + j];
      sum += q;
      EXPECT_LE(std::abs(q), 127);
      EXPECT_LE(std::abs(x[b * 32 + j] - static_cast<double>(a.d[b]) * q), a.d[b] / 2 * (1 + 1e-6) + 1e-30);
    }
    EXPECT_EQ(a.s[b], a.d[b] * static_cast<float>(sum));
  }
  EXPECT_EQ(a.d[0], 0.0f);  // the all-zero block
  EXPECT_EQ(a.q[40], 127);  // the outlier is its block's maximum
}

TEST(DequantizeBlockRows, GivesTheBlocksValues) {
  for (BlockType type : kTypes) {
    const int64_t rows = 6, cols = ColsFor(type, 64);
    std::vector<double> w;
    const std::vector<uint8_t> bytes = RandomBlocks(type, rows, cols, 3, &w);
    const BlockMatrix m{type, bytes.data(), rows, cols};
    std::vector<float> out((rows - 2) * cols);
    DequantizeBlockRows(m, 2, rows, out.data());
    for (int64_t k = 0; k < (rows - 2) * cols; ++k) {
      // d * q + m: one float32 rounding of the product, one of the sum.
      EXPECT_NEAR(out[k], w[2 * cols + k], 1e-6 * std::abs(w[2 * cols + k]) + 4e-6) << BlockTypeName(type);
    }
  }
}

TEST(DequantizeBlockRows, EveryBuildGivesTheSameBits) {
  for (BlockType type : kTypes) {
    const int64_t rows = 9, cols = ColsFor(type, 576);
    std::vector<double> w;
    const std::vector<uint8_t> bytes = RandomBlocks(type, rows, cols, 8, &w);
    const BlockMatrix m{type, bytes.data(), rows, cols};
    std::vector<float> first;
    for (const std::string& isa : SupportedIsas()) {
      ASSERT_TRUE(SetBlockMatMulIsa(isa));
      std::vector<float> out(rows * cols);
      DequantizeBlockRows(m, 0, rows, out.data());
      if (first.empty()) first = out;
      EXPECT_EQ(0, std::memcmp(first.data(), out.data(), out.size() * sizeof(float))) << BlockTypeName(type) << " " << isa;
    }
    SetBlockMatMulIsa("auto");
  }
}

}  // namespace
}  // namespace echokv::kernels
