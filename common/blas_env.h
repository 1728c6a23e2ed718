// Sets up OpenBLAS before it is used: worker threads that sleep right after each call,
// and the CPU kernels this machine deserves.
//
// 1. Debian's OpenBLAS (pthread build) keeps its workers spinning for ~0.1 s after
//    every matrix product (THREAD_TIMEOUT = 2^28 cycles). echokv alternates batched
//    products (OpenBLAS threads) with its own loops (OpenMP threads), and the spinning
//    workers then steal the cores those need (measured on 2 cores: decode right after a
//    prefill ran at ~60% speed). Fix: OPENBLAS_THREAD_TIMEOUT=4.
// 2. OpenBLAS 0.3.21 (Debian bookworm) does not know newer Xeons and falls back to its
//    Prescott (SSE3) kernels: 33 GFLOP/s on a 2048^3 product on 2 cores of this
//    AVX-512 machine, against 86 with the Haswell (AVX2) kernels and 166 with SkylakeX
//    (AVX-512). Fix: OPENBLAS_CORETYPE=SkylakeX (or Haswell on an AVX2-only CPU) when
//    the variable is unset and OpenBLAS fell back to a pre-AVX2 core; a value the user
//    set is always kept.
// OpenBLAS reads both only when it is initialised, before main (and a setenv before
// that cannot stick: a .preinit_array entry runs before libc's initialiser, which
// resets environ; a constructor runs after OpenBLAS's). So a main calls this first
// thing: when OPENBLAS_THREAD_TIMEOUT is unset it sets both and re-executes the program
// once (same argv); otherwise it returns at once. The container entrypoint exports both
// (deploy/docker-entrypoint.sh), so the server never re-execs there.
//
//   int main(int argc, char** argv) {
//     echokv::ConfigureBlasWorkersOrReexec(argv);
//     ...
//     LOG(INFO) << echokv::DescribeBlasSetup();
#ifndef ECHOKV_COMMON_BLAS_ENV_H_
#define ECHOKV_COMMON_BLAS_ENV_H_

#include <string>

namespace echokv {

// When OPENBLAS_THREAD_TIMEOUT is unset: sets it to 4, sets OPENBLAS_CORETYPE per
// ChooseBlasCoretype (from OpenBLAS's own choice) and GOMP_SPINCOUNT=3000 (LibTorch's
// OpenMP team spins only briefly after each region instead of ~300000 times; not when
// OMP_WAIT_POLICY is set) when those are unset too, and re-execs
// this program (the path /proc/self/exe points to, so the process keeps its name).
// Returns without re-exec when OPENBLAS_THREAD_TIMEOUT is already set (an environment
// set up on purpose starts ~0.7 s sooner; DescribeBlasSetup then says what to export
// if OpenBLAS fell back to an old core), when ECHOKV_NO_REEXEC is set, or when the
// exec fails (then only speed is affected).
void ConfigureBlasWorkersOrReexec(char** argv);

// The core OPENBLAS_CORETYPE should name, or "" to leave OpenBLAS's own choice:
// "SkylakeX" when OpenBLAS chose a pre-AVX2 core (`openblas_core`, case-insensitive:
// Prescott, Core2, Penryn, Dunnington, Nehalem, Atom, Sandybridge, ...) and the CPU
// has AVX-512 F/CD/BW/DQ/VL; "Haswell" in that case on a CPU with AVX2 and FMA.
struct CpuFeatures {
  bool avx2 = false, fma = false;
  bool avx512f = false, avx512cd = false, avx512bw = false, avx512dq = false, avx512vl = false;
};
std::string ChooseBlasCoretype(const std::string& openblas_core, const CpuFeatures& cpu);
// The widest core the CPU can run, whatever OpenBLAS chose: "SkylakeX" with AVX-512
// F/CD/BW/DQ/VL, "Haswell" with AVX2 and FMA, else "" (the container entrypoint's rule).
std::string BestBlasCoretype(const CpuFeatures& cpu);
CpuFeatures DetectCpuFeatures();

// One line for the startup log: the OpenBLAS core in use, the two variables, and which
// of them this process set (and why), e.g. "OpenBLAS core SkylakeX; OPENBLAS_CORETYPE=
// SkylakeX (set by echokv: OpenBLAS chose Prescott on an AVX-512 CPU); OPENBLAS_THREAD_
// TIMEOUT=4 (set by echokv)". "no OpenBLAS" when another BLAS is linked.
std::string DescribeBlasSetup();

}  // namespace echokv

#endif  // ECHOKV_COMMON_BLAS_ENV_H_
