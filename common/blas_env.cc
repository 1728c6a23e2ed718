#include "common/blas_env.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>

namespace echokv {

void ConfigureBlasWorkersOrReexec(char** argv) {
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") != nullptr || std::getenv("ECHOKV_NO_REEXEC") != nullptr) return;
  // Exec the resolved path, not /proc/self/exe: the process name (comm, what ps, top
  // and pkill show) is taken from the executed path's basename.
  char self[PATH_MAX];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return;
  self[len] = '\0';
  if (setenv("OPENBLAS_THREAD_TIMEOUT", "4", /*overwrite=*/1) != 0) return;
  execv(self, argv);
  // exec failed (no /proc?): carry on with spinning workers; only speed is affected.
}

}  // namespace echokv
