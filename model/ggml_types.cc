#include "model/ggml_types.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace echokv::model {
namespace {

constexpr int64_t kQK = 256;  // QK_K: values per block of the K-quants and IQ4_XS

constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::kF32, "F32", 1, 4, true},
    {GgmlType::kF16, "F16", 1, 2, true},
    {GgmlType::kQ4_0, "Q4_0", 32, 2 + 16, true},
    {GgmlType::kQ4_1, "Q4_1", 32, 2 + 2 + 16, true},
    {GgmlType::kQ5_0, "Q5_0", 32, 2 + 4 + 16, true},
    {GgmlType::kQ5_1, "Q5_1", 32, 2 + 2 + 4 + 16, true},
    {GgmlType::kQ8_0, "Q8_0", 32, 2 + 32, true},
    {GgmlType::kQ8_1, "Q8_1", 32, 4 + 4 + 32, false},
    {GgmlType::kQ2_K, "Q2_K", kQK, 2 + 2 + kQK / 16 + kQK / 4, true},
    {GgmlType::kQ3_K, "Q3_K", kQK, 2 + kQK / 4 + kQK / 8 + 12, true},
    {GgmlType::kQ4_K, "Q4_K", kQK, 2 + 2 + kQK / 2 + 12, true},
    {GgmlType::kQ5_K, "Q5_K", kQK, 2 + 2 + kQK / 2 + kQK / 8 + 12, true},
    {GgmlType::kQ6_K, "Q6_K", kQK, 2 + kQK / 2 + kQK / 4 + kQK / 16, true},
    {GgmlType::kQ8_K, "Q8_K", kQK, 4 + kQK + kQK / 8, false},
    {GgmlType::kIQ2_XXS, "IQ2_XXS", kQK, 2 + kQK / 4, false},
    {GgmlType::kIQ2_XS, "IQ2_XS", kQK, 2 + kQK / 4 + kQK / 32, false},
    {GgmlType::kIQ3_XXS, "IQ3_XXS", kQK, 2 + kQK / 4 + kQK / 8, false},
    {GgmlType::kIQ1_S, "IQ1_S", kQK, 2 + kQK / 8 + kQK / 16, false},
    {GgmlType::kIQ4_NL, "IQ4_NL", 32, 2 + 16, true},
    {GgmlType::kIQ3_S, "IQ3_S", kQK, 2 + kQK / 4 + kQK / 8 + kQK / 32 + 4, false},
    {GgmlType::kIQ2_S, "IQ2_S", kQK, 2 + kQK / 4 + kQK / 16, false},
    {GgmlType::kIQ4_XS, "IQ4_XS", kQK, 2 + 2 + kQK / 2 + kQK / 64, true},
    {GgmlType::kI8, "I8", 1, 1, false},
    {GgmlType::kI16, "I16", 1, 2, false},
    {GgmlType::kI32, "I32", 1, 4, false},
    {GgmlType::kI64, "I64", 1, 8, false},
    {GgmlType::kF64, "F64", 1, 8, false},
    {GgmlType::kIQ1_M, "IQ1_M", kQK, kQK / 8 + kQK / 16 + kQK / 32, false},
    {GgmlType::kBF16, "BF16", 1, 2, true},
    {GgmlType::kTQ1_0, "TQ1_0", kQK, 2 + 4 * 13, false},
    {GgmlType::kTQ2_0, "TQ2_0", kQK, 2 + 64, false},
    {GgmlType::kMXFP4, "MXFP4", 32, 1 + 16, false},
};

// IQ4_NL's non-linear 4-bit code book (also IQ4_XS's).
constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

uint16_t U16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t U32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
float F16At(const uint8_t* p) { return HalfToFloat(U16(p)); }

// One block each. The comments give the numpy expression they reproduce; `q` is the
// small integer code as float32 (exact), so only the products/sums shown round.

void Q4_0Block(const uint8_t* b, float* y) {  // d * (q - 8)
  const float d = F16At(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

void Q4_1Block(const uint8_t* b, float* y) {  // (d * q) + m
  const float d = F16At(b), m = F16At(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

void Q5_0Block(const uint8_t* b, float* y) {  // d * ((ql | qh << 4) - 16)
  const float d = F16At(b);
  const uint32_t qh = U32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 32; ++j) {
    const int ql = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
    const int q = ql | static_cast<int>(((qh >> j) & 1u) << 4);
    y[j] = d * static_cast<float>(q - 16);
  }
}

void Q5_1Block(const uint8_t* b, float* y) {  // (d * (ql | qh << 4)) + m
  const float d = F16At(b), m = F16At(b + 2);
  const uint32_t qh = U32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 32; ++j) {
    const int ql = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
    const int q = ql | static_cast<int>(((qh >> j) & 1u) << 4);
    y[j] = d * static_cast<float>(q) + m;
  }
}

void Q8_0Block(const uint8_t* b, float* y) {  // x * d
  const float d = F16At(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Q2_K: scales[16] | qs[64] | d | dmin. Sub-block i (16 values): dl = d * (sc & 15),
// ml = dmin * (sc >> 4); value = dl * q - ml with q = 2 bits of qs.
void Q2_KBlock(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = F16At(b + 16 + 64), dmin = F16At(b + 16 + 64 + 2);
  for (int e = 0; e < kQK; ++e) {
    const int i = e / 16, g = e / 128, s = (e % 128) / 32, c = e % 32;
    const float dl = d * static_cast<float>(scales[i] & 0x0F);
    const float ml = dmin * static_cast<float>(scales[i] >> 4);
    const int q = (qs[g * 32 + c] >> (2 * s)) & 3;
    y[e] = dl * static_cast<float>(q) - ml;
  }
}

// Q3_K: hmask[32] | qs[64] | scales[12] | d. 6-bit signed scales per 16 values;
// q = (2 low bits) - 4 * (1 - hmask bit); value = (d * scale) * q.
void Q3_KBlock(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 32 + 64;
  const float d = F16At(b + 32 + 64 + 12);
  float dl[16];
  for (int k = 0; k < 16; ++k) {
    const int low = (sc[k % 8] >> (4 * (k / 8))) & 0x0F;
    const int high = (sc[8 + k % 4] >> (2 * (k / 4))) & 0x03;
    const int scale = static_cast<int8_t>(static_cast<uint8_t>(low | (high << 4))) - 32;
    dl[k] = d * static_cast<float>(scale);
  }
  for (int e = 0; e < kQK; ++e) {
    const int g = e / 128, s = (e % 128) / 32, c = e % 32;
    const int ql = (qs[g * 32 + c] >> (2 * s)) & 3;
    const int hbit = ((hmask[c] >> (e / 32)) & 1) ^ 1;
    y[e] = dl[e / 16] * static_cast<float>(ql - (hbit << 2));
  }
}

// The 6-bit scales and mins of Q4_K / Q5_K (8 sub-blocks of 32 values).
void KScaleMin(const uint8_t* s, int sc[8], int mn[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 0x3F;
    mn[j] = s[4 + j] & 0x3F;
    sc[4 + j] = (s[8 + j] & 0x0F) | ((s[j] >> 2) & 0x30);
    mn[4 + j] = (s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30);
  }
}

// Q4_K: d | dmin | scales[12] | qs[128]; value = (d * sc) * q - (dmin * m).
void Q4_KBlock(const uint8_t* b, float* y) {
  const float d = F16At(b), dmin = F16At(b + 2);
  int sc[8], mn[8];
  KScaleMin(b + 4, sc, mn);
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    const float dj = d * static_cast<float>(sc[j]);
    const float mj = dmin * static_cast<float>(mn[j]);
    const int g = j / 2, t = j % 2;
    for (int c = 0; c < 32; ++c) {
      const int q = (qs[g * 32 + c] >> (4 * t)) & 0x0F;
      y[j * 32 + c] = dj * static_cast<float>(q) - mj;
    }
  }
}

// Q5_K: d | dmin | scales[12] | qh[32] | qs[128]; q gains bit j of qh[c] as its 5th bit.
void Q5_KBlock(const uint8_t* b, float* y) {
  const float d = F16At(b), dmin = F16At(b + 2);
  int sc[8], mn[8];
  KScaleMin(b + 4, sc, mn);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 16 + 32;
  for (int j = 0; j < 8; ++j) {
    const float dj = d * static_cast<float>(sc[j]);
    const float mj = dmin * static_cast<float>(mn[j]);
    const int g = j / 2, t = j % 2;
    for (int c = 0; c < 32; ++c) {
      const int q = ((qs[g * 32 + c] >> (4 * t)) & 0x0F) | (((qh[c] >> j) & 1) << 4);
      y[j * 32 + c] = dj * static_cast<float>(q) - mj;
    }
  }
}

// Q6_K: ql[128] | qh[64] | scales[16] (int8) | d; value = (d * scale) * (q - 32).
void Q6_KBlock(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 128 + 64);
  const float d = F16At(b + 128 + 64 + 16);
  for (int e = 0; e < kQK; ++e) {
    const int g = e / 128, r = e % 128;
    const int low = (ql[g * 64 + r % 64] >> (4 * (r / 64))) & 0x0F;
    const int high = (qh[g * 32 + r % 32] >> (2 * (r / 32))) & 0x03;
    const int q = static_cast<int8_t>(static_cast<uint8_t>(low | (high << 4))) - 32;
    y[e] = (d * static_cast<float>(scales[e / 16])) * static_cast<float>(q);
  }
}

void IQ4_NLBlock(const uint8_t* b, float* y) {  // d * kvalues[q]
  const float d = F16At(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kIq4Values[qs[j] & 0x0F]);
    y[j + 16] = d * static_cast<float>(kIq4Values[qs[j] >> 4]);
  }
}

// IQ4_XS: d | scales_h (u16) | scales_l[4] | qs[128]; 8 sub-blocks of 32 with 6-bit
// signed scales; value = (d * scale) * kvalues[q].
void IQ4_XSBlock(const uint8_t* b, float* y) {
  const float d = F16At(b);
  const uint16_t scales_h = U16(b + 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int k = 0; k < 8; ++k) {
    const int low = (scales_l[k / 2] >> (4 * (k % 2))) & 0x0F;
    const int high = (scales_h >> (2 * k)) & 0x03;
    const int scale = static_cast<int8_t>(static_cast<uint8_t>(low | (high << 4))) - 32;
    const float dl = d * static_cast<float>(scale);
    for (int c = 0; c < 32; ++c) {
      const int q = (qs[k * 16 + c % 16] >> (4 * (c / 16))) & 0x0F;
      y[k * 32 + c] = dl * static_cast<float>(kIq4Values[q]);
    }
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn BlockFunction(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_0: return Q4_0Block;
    case GgmlType::kQ4_1: return Q4_1Block;
    case GgmlType::kQ5_0: return Q5_0Block;
    case GgmlType::kQ5_1: return Q5_1Block;
    case GgmlType::kQ8_0: return Q8_0Block;
    case GgmlType::kQ2_K: return Q2_KBlock;
    case GgmlType::kQ3_K: return Q3_KBlock;
    case GgmlType::kQ4_K: return Q4_KBlock;
    case GgmlType::kQ5_K: return Q5_KBlock;
    case GgmlType::kQ6_K: return Q6_KBlock;
    case GgmlType::kIQ4_NL: return IQ4_NLBlock;
    case GgmlType::kIQ4_XS: return IQ4_XSBlock;
    default: return nullptr;
  }
}

}  // namespace

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf, NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal half: normalise into a float32 normal.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

const GgmlTypeInfo* FindGgmlType(uint32_t id) {
  for (const GgmlTypeInfo& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == id) return &t;
  }
  return nullptr;
}

bool GgmlRowBytes(const GgmlTypeInfo& info, int64_t n, int64_t* bytes) {
  if (n < 0 || n % info.block_size != 0) return false;
  const int64_t blocks = n / info.block_size;
  if (blocks > std::numeric_limits<int64_t>::max() / info.type_size) return false;
  *bytes = blocks * info.type_size;
  return true;
}

absl::Status DequantizeGgml(uint32_t type, const uint8_t* src, int64_t n, float* dst) {
  const GgmlTypeInfo* info = FindGgmlType(type);
  if (info == nullptr) return absl::InvalidArgumentError(absl::StrCat("tensor type id ", type, " is not a GGML type"));
  if (!info->dequantizable) {
    return absl::UnimplementedError(absl::StrCat("tensor type ", info->name, " is not supported"));
  }
  if (n < 0 || n % info->block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " values are not a whole number of ", info->name, " blocks of ", info->block_size));
  }
  switch (info->type) {
    case GgmlType::kF32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return absl::OkStatus();
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(U16(src + 2 * i));
      return absl::OkStatus();
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16ToFloat(U16(src + 2 * i));
      return absl::OkStatus();
    default:
      break;
  }
  const BlockFn fn = BlockFunction(info->type);
  const int64_t blocks = n / info->block_size;
  for (int64_t i = 0; i < blocks; ++i) fn(src + i * info->type_size, dst + i * info->block_size);
  return absl::OkStatus();
}

}  // namespace echokv::model
