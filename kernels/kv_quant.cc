#include "kernels/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace echokv::kernels {
namespace {

// max |x_i| over n values at stride `stride`; NaN when any is not finite.
float AbsMax(const float* x, int64_t n, int64_t stride) {
  float m = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i * stride]);
    finite = finite && std::isfinite(a);
    m = std::max(m, a);
  }
  return finite ? m : std::numeric_limits<float>::quiet_NaN();
}

// round_half_even(x / s) in [-127, 127]; 0 when s is 0 or NaN.
inline int8_t QuantizeOne(float x, float s) {
  if (!(s > 0.0f)) return 0;
  const float r = std::nearbyint(x / s);  // the default rounding mode: half to even
  return static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
}

}  // namespace

const char* KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFloat32:
      return "float32";
    case KvDtype::kBFloat16:
      return "bfloat16";
    case KvDtype::kInt8:
      return "int8";
  }
  return "float32";
}

bool ParseKvDtype(const std::string& name, KvDtype* dtype) {
  for (KvDtype d : {KvDtype::kFloat32, KvDtype::kBFloat16, KvDtype::kInt8}) {
    if (name == KvDtypeName(d)) {
      *dtype = d;
      return true;
    }
  }
  return false;
}

int64_t KvEntryBytes(KvDtype dtype, int64_t head_dim) {
  switch (dtype) {
    case KvDtype::kFloat32:
      return 2 * head_dim * 4;
    case KvDtype::kBFloat16:
      return 2 * head_dim * 2;
    case KvDtype::kInt8:
      return 2 * (head_dim + static_cast<int64_t>(sizeof(float)));
  }
  return 0;
}

void QuantizeRowsInt8(const float* x, int64_t rows, int64_t d, int8_t* q, float* scales) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* xi = x + i * d;
    const float s = AbsMax(xi, d, 1) / 127.0f;
    scales[i] = s;
    for (int64_t c = 0; c < d; ++c) q[i * d + c] = QuantizeOne(xi[c], s);
  }
}

void DequantizeRowsInt8(const int8_t* q, const float* scales, int64_t rows, int64_t d, float* x) {
  for (int64_t i = 0; i < rows; ++i) {
    const float s = scales[i];
    for (int64_t c = 0; c < d; ++c) x[i * d + c] = s * static_cast<float>(q[i * d + c]);
  }
}

void QuantizeChannelBlocksInt8(const float* x, int64_t rows, int64_t d, int64_t block, int8_t* q, float* scales) {
  for (int64_t b0 = 0, b = 0; b0 < rows; b0 += block, ++b) {
    const int64_t m = std::min(block, rows - b0);
    for (int64_t c = 0; c < d; ++c) {
      const float s = AbsMax(x + b0 * d + c, m, d) / 127.0f;
      scales[b * d + c] = s;
      for (int64_t i = b0; i < b0 + m; ++i) q[i * d + c] = QuantizeOne(x[i * d + c], s);
    }
  }
}

void DequantizeChannelBlocksInt8(const int8_t* q, const float* scales, int64_t rows, int64_t d, int64_t block,
                                 float* x) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* s = scales + (i / block) * d;
    for (int64_t c = 0; c < d; ++c) x[i * d + c] = s[c] * static_cast<float>(q[i * d + c]);
  }
}

uint16_t FloatToBFloat16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x0040);  // stays a quiet NaN
  // Round to nearest even on the 16 dropped bits (carries into the exponent as it should;
  // the largest finite values round to infinity, as float -> bfloat16 conversions do).
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

void FloatsToBFloat16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = FloatToBFloat16(x[i]);
}

void BFloat16ToFloats(const uint16_t* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(b[i]);
}

}  // namespace echokv::kernels
