// kernels::MatMulRows against a float64 reference, in every build the CPU has, and the
// property the engine's batching rests on: a row's outputs are the same bits whatever
// the batch around it, the tile it falls in and the row range a thread takes.
#include "kernels/matmul_rows.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace echokv::kernels {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

std::vector<std::string> SupportedIsas() {
  std::vector<std::string> isas;
  for (const char* isa : {"avx512", "avx2", "scalar"}) {
    if (SetMatMulRowsIsa(isa)) isas.push_back(isa);
  }
  SetMatMulRowsIsa("auto");
  return isas;
}

class MatMulRowsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(SetMatMulRowsIsa(GetParam()));
    ASSERT_EQ(MatMulRowsIsa(), GetParam());
  }
  void TearDown() override { SetMatMulRowsIsa("auto"); }
};

// Shapes: columns below, at and around the 16-lane step (tails of every length), rows
// that leave every tile remainder, batches 1..17.
TEST_P(MatMulRowsTest, MatchesFloat64Reference) {
  for (int64_t cols : {1, 5, 15, 16, 17, 31, 33, 64, 95, 512, 1376}) {
    for (int64_t rows : {1, 2, 3, 7, 8, 9, 25}) {
      for (int64_t n : {1, 2, 3, 4, 5, 7, 16, 17}) {
        for (bool with_bias : {false, true}) {
          const std::vector<float> w = Random(rows * cols, 1 + rows), x = Random(n * cols, 2 + n),
                                   bias = Random(rows, 3);
          std::vector<float> y(n * rows, NAN);
          MatMulRows(w.data(), x.data(), with_bias ? bias.data() : nullptr, n, rows, cols, y.data(), 0, rows);
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t r = 0; r < rows; ++r) {
              double ref = with_bias ? bias[r] : 0.0, mag = std::abs(ref);
              for (int64_t k = 0; k < cols; ++k) {
                ref += static_cast<double>(w[r * cols + k]) * x[i * cols + k];
                mag += std::abs(static_cast<double>(w[r * cols + k]) * x[i * cols + k]);
              }
              // float32 accumulation over `cols` terms: a few ulps of the magnitude sum.
              ASSERT_NEAR(y[i * rows + r], ref, 4e-7 * mag + 1e-30)
                  << "cols " << cols << " rows " << rows << " n " << n << " i " << i << " r " << r;
            }
          }
        }
      }
    }
  }
}

TEST_P(MatMulRowsTest, RowBitsDoNotDependOnBatchTileOrRange) {
  const int64_t rows = 29, cols = 517, max_n = 19;
  const std::vector<float> w = Random(rows * cols, 7), x = Random(max_n * cols, 8), bias = Random(rows, 9);
  // Each input alone, all rows in one call: the single-row decode's results.
  std::vector<float> alone(max_n * rows);
  for (int64_t i = 0; i < max_n; ++i) {
    MatMulRows(w.data(), x.data() + i * cols, bias.data(), 1, rows, cols, alone.data() + i * rows, 0, rows);
  }
  for (int64_t n = 2; n <= max_n; ++n) {
    // The first n inputs as one batch, rows split into ranges of every size 1..rows.
    for (int64_t split : {int64_t{1}, int64_t{2}, int64_t{5}, rows}) {
      std::vector<float> y(n * rows, NAN);
      for (int64_t r0 = 0; r0 < rows; r0 += split) {
        MatMulRows(w.data(), x.data(), bias.data(), n, rows, cols, y.data(), r0, std::min(rows, r0 + split));
      }
      ASSERT_EQ(std::memcmp(y.data(), alone.data(), n * rows * sizeof(float)), 0) << "n " << n << " split " << split;
    }
  }
}

TEST_P(MatMulRowsTest, EmptyRangesWriteNothing) {
  const std::vector<float> w = Random(12, 1), x = Random(12, 2);
  std::vector<float> y(4, -1.0f);
  MatMulRows(w.data(), x.data(), nullptr, 0, 4, 3, y.data(), 0, 4);
  MatMulRows(w.data(), x.data(), nullptr, 1, 4, 3, y.data(), 2, 2);
  for (float v : y) EXPECT_EQ(v, -1.0f);
}

INSTANTIATE_TEST_SUITE_P(EveryBuild, MatMulRowsTest, ::testing::ValuesIn(SupportedIsas()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// The builds with FMA sum every output in the same order (16 lanes, same tree), so they
// agree bit for bit: a server may run the AVX2 build on one machine and AVX-512 on
// another and sessions moved between them decode alike.
TEST(MatMulRowsBuilds, FmaBuildsAgreeBitForBit) {
  if (!SetMatMulRowsIsa("avx512") || !SetMatMulRowsIsa("avx2")) {
    SetMatMulRowsIsa("auto");
    // Only one FMA build on this CPU: nothing to compare (the reference test covers it).
    EXPECT_FALSE(SupportedIsas().empty());
    return;
  }
  const int64_t rows = 37, cols = 1000, n = 9;
  const std::vector<float> w = Random(rows * cols, 11), x = Random(n * cols, 12);
  std::vector<float> a(n * rows), b(n * rows);
  SetMatMulRowsIsa("avx512");
  MatMulRows(w.data(), x.data(), nullptr, n, rows, cols, a.data(), 0, rows);
  SetMatMulRowsIsa("avx2");
  MatMulRows(w.data(), x.data(), nullptr, n, rows, cols, b.data(), 0, rows);
  SetMatMulRowsIsa("auto");
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace echokv::kernels
