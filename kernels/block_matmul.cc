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
  } else if constexpr (T == BlockType::kQ5_0) {
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    for (int j = 0; j < 16; ++j) {
      v[j] = static_cast<int32_t>((b[6 + j] & 15) | (((qh >> j) & 1) << 4)) - 16;
      v[16 + j] = static_cast<int32_t>((b[6 + j] >> 4) | (((qh >> (16 + j)) & 1) << 4)) - 16;
    }
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

inline float Bf16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A Q6_K super-block's 256 values as integers (-32..31), block_matmul.h's layout.
inline void UnpackQ6K(const uint8_t* b, int32_t* v) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b + 64 * h;
    const uint8_t* qh = b + 128 + 32 * h;
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) {
        const int low = g < 2 ? ql[l + 32 * (g & 1)] & 15 : ql[l + 32 * (g & 1)] >> 4;
        v[128 * h + 32 * g + l] = (low | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
      }
    }
  }
}

// A Q4_K super-block's 256 nibbles (0..15), in value order.
inline void UnpackQ4K(const uint8_t* b, int32_t* v) {
  const uint8_t* qs = b + 16;
  for (int k = 0; k < 4; ++k) {
    for (int l = 0; l < 32; ++l) {
      v[64 * k + l] = qs[32 * k + l] & 15;
      v[64 * k + 32 + l] = qs[32 * k + l] >> 4;
    }
  }
}

// The portable build of the types that are the same bits in both builds: what the AVX2
// build does in its 8 lanes, lane by lane (block_matmul.h).
struct ScalarLanes {
  // F16 / BF16: lane j % 8 takes w_j x_j by an FMA, values in order.
  template <BlockType T, int RT, int CT>
  static inline void FloatTile(const TileArgs& a) {
    float acc[RT][CT][8] = {};
    for (int64_t b = 0; b < a.blocks; ++b) {
      for (int r = 0; r < RT; ++r) {
        const uint8_t* p = a.w + r * a.row_bytes + b * 64;
        float wv[32];
        for (int j = 0; j < 32; ++j) wv[j] = T == BlockType::kF16 ? Half(p + 2 * j) : Bf16(p + 2 * j);
        for (int c = 0; c < CT; ++c) {
          const float* x = a.x + c * a.cols + b * kBlockValues;
          for (int j = 0; j < 32; ++j) acc[r][c][j & 7] = std::fma(wv[j], x[j], acc[r][c][j & 7]);
        }
      }
    }
    for (int r = 0; r < RT; ++r) {
      for (int c = 0; c < CT; ++c) {
        float out = LaneTree(acc[r][c]);
        if (a.bias != nullptr) out = out + a.bias[r];
        a.y[c * a.rows + r] = out;
      }
    }
  }

  // Q4_K / Q6_K: per 32 values, lane l = (sum of the products of values 4l..4l+3) times
  // the sub-block's scale (int32, exact), then acc_l = fma(lane, d_w * d_x, acc_l).
  template <BlockType T, int RT, int CT>
  static inline void KTile(const TileArgs& a) {
    const int64_t bb = BlockBytes(T);
    float acc[RT][CT][8] = {}, mins[RT][CT] = {};
    for (int64_t b = 0; b < a.blocks; ++b) {
      for (int r = 0; r < RT; ++r) {
        const uint8_t* p = a.w + r * a.row_bytes + b * bb;
        int32_t v[256], sc[16], mn[8] = {};
        float dw, dmin = 0;
        if constexpr (T == BlockType::kQ4_K) {
          dw = Half(p);
          dmin = Half(p + 2);
          for (int j = 0; j < 8; ++j) {
            int scale, min;
            Q4KScaleMin(p + 4, j, &scale, &min);
            sc[2 * j] = sc[2 * j + 1] = scale;  // per 16 values, as Q6_K's
            mn[j] = min;
          }
          UnpackQ4K(p, v);
        } else {
          dw = Half(p + 208);
          for (int j = 0; j < 16; ++j) sc[j] = static_cast<int8_t>(p[192 + j]);
          UnpackQ6K(p, v);
        }
        for (int c = 0; c < CT; ++c) {
          for (int s = 0; s < 8; ++s) {
            const int64_t ab = b * 8 + s;
            const int8_t* q = a.q + c * a.cols + ab * kBlockValues;
            const float scale = dw * a.d[c * a.act_blocks + ab];
            for (int l = 0; l < 8; ++l) {
              int32_t isum = 0;
              for (int k = 0; k < 4; ++k) isum += v[32 * s + 4 * l + k] * q[4 * l + k];
              isum *= sc[2 * s + l / 4];
              acc[r][c][l] = std::fma(static_cast<float>(isum), scale, acc[r][c][l]);
            }
            if constexpr (T == BlockType::kQ4_K) {
              mins[r][c] = mins[r][c] + (dmin * static_cast<float>(mn[s])) * a.s[c * a.act_blocks + ab];
            }
          }
        }
      }
    }
    for (int r = 0; r < RT; ++r) {
      for (int c = 0; c < CT; ++c) {
        float out = LaneTree(acc[r][c]);
        if constexpr (T == BlockType::kQ4_K) out = out - mins[r][c];
        if (a.bias != nullptr) out = out + a.bias[r];
        a.y[c * a.rows + r] = out;
      }
    }
  }
};

// The portable build: each block's integer dot product exactly, then
// acc += (d_w * d_x) * isum, blocks in order; Q4_1's minimum terms in their own sum.
struct ScalarKernel {
  template <BlockType T, int RT, int CT>
  static inline void Tile(const TileArgs& a) {
    if constexpr (T == BlockType::kF16 || T == BlockType::kBF16) {
      ScalarLanes::FloatTile<T, RT, CT>(a);
    } else if constexpr (T == BlockType::kQ4_K || T == BlockType::kQ6_K) {
      ScalarLanes::KTile<T, RT, CT>(a);
    } else {
      BlockTile<T, RT, CT>(a);
    }
  }

  template <BlockType T, int RT, int CT>
  static inline void BlockTile(const TileArgs& a) {
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
          const float scale = dw * a.d[c * a.act_blocks + b];
          acc[r][c] = acc[r][c] + scale * static_cast<float>(isum);
          if constexpr (T == BlockType::kQ4_1) mins[r][c] = mins[r][c] + mw * a.s[c * a.act_blocks + b];
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
    case BlockType::kQ5_0:
      return 22;
    case BlockType::kF16:
    case BlockType::kBF16:
      return 64;
    case BlockType::kQ4_K:
      return 144;
    case BlockType::kQ6_K:
      return 210;
  }
  return 0;
}

int64_t BlockValuesOf(BlockType type) {
  return type == BlockType::kQ4_K || type == BlockType::kQ6_K ? kSuperBlockValues : kBlockValues;
}

bool TakesFloatInputs(BlockType type) { return type == BlockType::kF16 || type == BlockType::kBF16; }

const char* BlockTypeName(BlockType type) {
  switch (type) {
    case BlockType::kQ4_0:
      return "Q4_0";
    case BlockType::kQ4_1:
      return "Q4_1";
    case BlockType::kQ8_0:
      return "Q8_0";
    case BlockType::kQ5_0:
      return "Q5_0";
    case BlockType::kF16:
      return "F16";
    case BlockType::kBF16:
      return "BF16";
    case BlockType::kQ4_K:
      return "Q4_K";
    case BlockType::kQ6_K:
      return "Q6_K";
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
    case 6:
      *type = BlockType::kQ5_0;
      return true;
    case 1:
      *type = BlockType::kF16;
      return true;
    case 30:
      *type = BlockType::kBF16;
      return true;
    case 12:
      *type = BlockType::kQ4_K;
      return true;
    case 14:
      *type = BlockType::kQ6_K;
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
  const int64_t nb = w.cols / BlockValuesOf(w.type), bb = BlockBytes(w.type), rb = w.RowBytes();
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w.data + r * rb + b * bb;
      float* o = out + (r - row_begin) * w.cols + b * BlockValuesOf(w.type);
      int32_t v[256];
      float dw = 0, mw = 0;
      switch (w.type) {
        case BlockType::kF16:
          for (int j = 0; j < 32; ++j) o[j] = Half(blk + 2 * j);
          break;
        case BlockType::kBF16:
          for (int j = 0; j < 32; ++j) o[j] = Bf16(blk + 2 * j);
          break;
        case BlockType::kQ4_K: {
          // (d * sc) * q - dmin * m: ggml's (and the gguf package's) order; d * sc and
          // dmin * m are exact, the product too (11 + 6 + 4 bits), one rounding.
          dw = Half(blk);
          const float dmin = Half(blk + 2);
          UnpackQ4K(blk, v);
          for (int s = 0; s < 8; ++s) {
            int scale, min;
            Q4KScaleMin(blk + 4, s, &scale, &min);
            const float d1 = dw * static_cast<float>(scale), m1 = dmin * static_cast<float>(min);
            for (int j = 32 * s; j < 32 * s + 32; ++j) o[j] = d1 * static_cast<float>(v[j]) - m1;
          }
          break;
        }
        case BlockType::kQ6_K:
          dw = Half(blk + 208);
          UnpackQ6K(blk, v);
          for (int j = 0; j < 256; ++j) {
            o[j] = (dw * static_cast<float>(static_cast<int8_t>(blk[192 + j / 16]))) * static_cast<float>(v[j]);
          }
          break;
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
        case BlockType::kQ5_0:
          Unpack<BlockType::kQ5_0>(blk, v, &dw, &mw);
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
