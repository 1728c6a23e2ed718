#include "kernels/block_matmul.h"

#if defined(ECHOKV_BLOCK_MATMUL_X86)
#include <cpuid.h>
#endif
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/block_matmul_impl.h"
#include "kernels/cpu_isa.h"

namespace echokv::kernels {
namespace {

// IEEE half to float32, exactly.
float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: man * 2^-24, exact in float32
      const float v = static_cast<float>(man) * 5.9604644775390625e-08f;
      std::memcpy(&bits, &v, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// One block's 32 weights as integers (Q4_0: nibble - 8; Q4_1: nibble; Q8_0: q), its
// scale and (Q4_1) minimum.
template <BlockType T>
inline void Unpack(const uint8_t* b, int32_t* v, float* d, float* m) {
  *d = Half(b);
  if constexpr (T == BlockType::kQ8_0) {
    for (int j = 0; j < 32; ++j) v[j] = static_cast<int8_t>(b[2 + j]);
  } else {
    const uint8_t* qs = b + (T == BlockType::kQ4_1 ? 4 : 2);
    const int32_t off = T == BlockType::kQ4_0 ? 8 : 0;
    for (int j = 0; j < 16; ++j) {
      v[j] = (qs[j] & 15) - off;
      v[16 + j] = (qs[j] >> 4) - off;
    }
    if constexpr (T == BlockType::kQ4_1) *m = Half(b + 2);
  }
}

// The portable build: each block's integer dot product exactly, then
// acc += (d_w * d_x) * isum, blocks in order; Q4_1's minimum terms in their own sum.
struct ScalarKernel {
  template <BlockType T, int RT, int CT>
  static inline void Tile(const TileArgs& a) {
    const int64_t bb = BlockBytes(T);
    float acc[RT][CT] = {}, mins[RT][CT] = {};
    for (int64_t b = 0; b < a.blocks; ++b) {
      for (int r = 0; r < RT; ++r) {
        int32_t v[32];
        float dw = 0, mw = 0;
        Unpack<T>(a.w + r * a.row_bytes + b * bb, v, &dw, &mw);
        for (int c = 0; c < CT; ++c) {
          const int8_t* q = a.q + c * a.cols + b * kBlockValues;
          int32_t isum = 0;
          for (int j = 0; j < 32; ++j) isum += v[j] * q[j];
          const float scale = dw * a.d[c * a.blocks + b];
          acc[r][c] = acc[r][c] + scale * static_cast<float>(isum);
          if constexpr (T == BlockType::kQ4_1) mins[r][c] = mins[r][c] + mw * a.s[c * a.blocks + b];
        }
      }
    }
    for (int r = 0; r < RT; ++r) {
      for (int c = 0; c < CT; ++c) {
        float out = acc[r][c];
        if constexpr (T == BlockType::kQ4_1) out = out + mins[r][c];
        if (a.bias != nullptr) out = out + a.bias[r];
        a.y[c * a.rows + r] = out;
      }
    }
  }
};

using Fn = void (*)(const BlockMatrix&, const QuantizedActs&, const float*, int64_t, float*, int64_t, int64_t);
using DequantFn = void (*)(const BlockMatrix&, int64_t, int64_t, float*);

struct Choice {
  const char* isa;
  Fn fn;
  int64_t block;
  DequantFn dequantize;
};

constexpr Choice kScalar{"scalar", BlockMatMulScalar, 2, DequantizeBlockRowsScalar};
#if defined(ECHOKV_BLOCK_MATMUL_X86)
constexpr Choice kAvx2{"avx2", BlockMatMulAvx2, 4, DequantizeBlockRowsAvx2};
// F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c".
bool CpuHasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}
bool CpuRunsAvx2() { return CpuRunsIsa("avx2") && CpuHasF16c(); }
#endif

const Choice* Find(const std::string& isa) {
#if defined(ECHOKV_BLOCK_MATMUL_X86)
  if ((isa == "avx2" || isa == "avx512") && CpuRunsAvx2()) return &kAvx2;
#endif
  if (isa == "scalar") return &kScalar;
  return nullptr;
}

const Choice* Best() {
  const Choice* c = Find("avx2");
  return c != nullptr ? c : &kScalar;
}

// The best build, or ECHOKV_MATMUL_ISA's when this CPU runs it (the variable that also
// picks matmul_rows.h's build).
std::atomic<const Choice*>& Current() {
  static std::atomic<const Choice*> choice = [] {
    const char* env = std::getenv("ECHOKV_MATMUL_ISA");
    const Choice* c = env != nullptr ? Find(env) : nullptr;
    return c != nullptr ? c : Best();
  }();
  return choice;
}

}  // namespace

void BlockMatMulScalar(const BlockMatrix& w, const QuantizedActs& x, const float* bias, int64_t n, float* y,
                       int64_t r0, int64_t r1) {
  DriveAny<ScalarKernel, 2, 2, 2>(w, x, bias, n, y, r0, r1);
}

int64_t BlockBytes(BlockType type) {
  switch (type) {
    case BlockType::kQ4_0:
      return 18;
    case BlockType::kQ4_1:
      return 20;
    case BlockType::kQ8_0:
      return 34;
  }
  return 0;
}

const char* BlockTypeName(BlockType type) {
  switch (type) {
    case BlockType::kQ4_0:
      return "Q4_0";
    case BlockType::kQ4_1:
      return "Q4_1";
    case BlockType::kQ8_0:
      return "Q8_0";
  }
  return "?";
}

bool BlockTypeFromGgml(uint32_t ggml_id, BlockType* type) {
  switch (ggml_id) {
    case 2:
      *type = BlockType::kQ4_0;
      return true;
    case 3:
      *type = BlockType::kQ4_1;
      return true;
    case 8:
      *type = BlockType::kQ8_0;
      return true;
    default:
      return false;
  }
}

void QuantizeActs(const float* x, int64_t n, int64_t cols, int8_t* q, float* d, float* s) {
  const int64_t nb = cols / kBlockValues;
  for (int64_t i = 0; i < n * nb; ++i) {
    const float* xb = x + i * kBlockValues;
    int8_t* qb = q + i * kBlockValues;
    float amax = 0;
    for (int j = 0; j < kBlockValues; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float scale = amax / 127.0f;
    const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < kBlockValues; ++j) {
      // Round to nearest even by the 1.5 * 2^23 shift (|x / d| <= 127 + rounding).
      const float r = (xb[j] * inv + 12582912.0f) - 12582912.0f;
      const int32_t v = std::clamp(static_cast<int32_t>(r), -127, 127);
      qb[j] = static_cast<int8_t>(v);
      sum += v;
    }
    d[i] = scale;
    s[i] = scale * static_cast<float>(sum);
  }
}

void DequantizeBlockRowsScalar(const BlockMatrix& w, int64_t row_begin, int64_t row_end, float* out) {
  const int64_t nb = w.cols / kBlockValues, bb = BlockBytes(w.type), rb = w.RowBytes();
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w.data + r * rb + b * bb;
      float* o = out + (r - row_begin) * w.cols + b * kBlockValues;
      int32_t v[32];
      float dw = 0, mw = 0;
      switch (w.type) {
        case BlockType::kQ4_0:
          Unpack<BlockType::kQ4_0>(blk, v, &dw, &mw);
          for (int j = 0; j < 32; ++j) o[j] = dw * static_cast<float>(v[j]);
          break;
        case BlockType::kQ4_1:
          Unpack<BlockType::kQ4_1>(blk, v, &dw, &mw);
          for (int j = 0; j < 32; ++j) o[j] = dw * static_cast<float>(v[j]) + mw;
          break;
        case BlockType::kQ8_0:
          Unpack<BlockType::kQ8_0>(blk, v, &dw, &mw);
          for (int j = 0; j < 32; ++j) o[j] = dw * static_cast<float>(v[j]);
          break;
      }
    }
  }
}

void BlockMatMulRows(const BlockMatrix& w, const QuantizedActs& x, const float* bias, int64_t n, float* y,
                     int64_t row_begin, int64_t row_end) {
  if (n <= 0 || row_begin >= row_end) return;
  Current().load(std::memory_order_relaxed)->fn(w, x, bias, n, y, row_begin, row_end);
}

void DequantizeBlockRows(const BlockMatrix& w, int64_t row_begin, int64_t row_end, float* out) {
  if (row_begin >= row_end) return;
  Current().load(std::memory_order_relaxed)->dequantize(w, row_begin, row_end, out);
}

int64_t BlockMatMulRowsBlock() { return Current().load(std::memory_order_relaxed)->block; }

std::string BlockMatMulIsa() { return Current().load(std::memory_order_relaxed)->isa; }

bool SetBlockMatMulIsa(const std::string& isa) {
  const Choice* c = isa == "auto" ? Best() : Find(isa);
  if (c == nullptr) return false;
  Current().store(c);
  return true;
}

}  // namespace echokv::kernels
