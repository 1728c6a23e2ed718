#include "common/blas_env.h"

#include <unistd.h>

#include <cstdlib>

namespace echokv {

void ConfigureBlasWorkersOrReexec(char** argv) {
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") != nullptr || std::getenv("ECHOKV_NO_REEXEC") != nullptr) return;
  if (setenv("OPENBLAS_THREAD_TIMEOUT", "4", /*overwrite=*/1) != 0) return;
  execv("/proc/self/exe", argv);
  // exec failed (no /proc?): carry on with spinning workers; only speed is affected.
}

}  // namespace echokv
