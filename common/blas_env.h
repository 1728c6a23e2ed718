// Makes OpenBLAS's worker threads sleep right after each call instead of spinning.
//
// Debian's OpenBLAS (pthread build) keeps its workers spinning for ~0.1 s after every
// matrix product (THREAD_TIMEOUT = 2^28 cycles). echokv alternates batched prefill
// (OpenBLAS threads) with its own decode loops (OpenMP threads), and the spinning
// workers then steal the cores the decode needs (measured on 2 cores: decode right
// after a prefill ran at ~60% speed). OpenBLAS reads OPENBLAS_THREAD_TIMEOUT only when
// it is loaded, so a main calls this first thing: when the variable is unset it sets
// it and re-executes the program once (same argv); otherwise it returns.
//
//   int main(int argc, char** argv) {
//     echokv::ConfigureBlasWorkersOrReexec(argv);
//     ...
#ifndef ECHOKV_COMMON_BLAS_ENV_H_
#define ECHOKV_COMMON_BLAS_ENV_H_

namespace echokv {

// Sets OPENBLAS_THREAD_TIMEOUT=4 (the minimum: workers sleep after 2^4 cycles) and
// re-execs this program (the path /proc/self/exe points to, so the process keeps its
// name) when it was unset. Returns (without re-exec) when it was
// already set, when ECHOKV_NO_REEXEC is set, or when the exec fails.
void ConfigureBlasWorkersOrReexec(char** argv);

}  // namespace echokv

#endif  // ECHOKV_COMMON_BLAS_ENV_H_
