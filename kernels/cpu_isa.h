// The instruction sets the kernels are built for (attention.h, matmul_rows.h), and
// whether this CPU runs each: "avx512" needs AVX-512F and FMA, "avx2" AVX2 and FMA,
// "scalar" runs anywhere. Callers only ask about builds they compiled.
#ifndef ECHOKV_KERNELS_CPU_ISA_H_
#define ECHOKV_KERNELS_CPU_ISA_H_

#include <string>

namespace echokv::kernels {

inline bool CpuRunsIsa(const std::string& isa) {
#if defined(__x86_64__)
  if (isa == "avx512") return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return isa == "scalar";
}

}  // namespace echokv::kernels

#endif  // ECHOKV_KERNELS_CPU_ISA_H_
