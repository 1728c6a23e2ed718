// The exp2 approximation shared by the fused prefill attention (kernels/attention_impl.h)
// and the decode fast path's softmax (model/transformer.cc): 2^t = 2^n * 2^f with
// n = round(t) (by adding kRoundMagic), |f| <= 1/2, and 2^f by the degree-7 Taylor
// polynomial of e^(f ln 2) (remainder < 5e-9; ~2e-7 relative overall in float32).
// Constants only (internal linkage): each user writes the loop its vectoriser wants.
#ifndef ECHOKV_KERNELS_EXP2_POLY_H_
#define ECHOKV_KERNELS_EXP2_POLY_H_

namespace echokv::kernels::exp2_poly {

// 1.5 * 2^23: t + kRoundMagic rounds t to an integer n, which the low mantissa bits of
// the sum then hold (as bits - kRoundMagicBits).
constexpr float kRoundMagic = 12582912.0f;
constexpr int kRoundMagicBits = 0x4B400000;
// Arguments at or below this give 0 (2^-127 has exponent bits 0).
constexpr float kMin = -127.0f;
// (ln 2)^k / k!, highest degree first (Horner), k = 7 .. 0.
constexpr float kCoeffs[8] = {1.5252733804059840e-05f, 1.5403530393381608e-04f, 1.3333558146428443e-03f,
                              9.6181291076284772e-03f, 5.5504108664821580e-02f, 2.4022650695910071e-01f,
                              6.9314718055994531e-01f, 1.0f};
constexpr float kLog2e = 1.44269504088896340736f;

}  // namespace echokv::kernels::exp2_poly

#endif  // ECHOKV_KERNELS_EXP2_POLY_H_
