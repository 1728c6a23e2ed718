// The one logging facade of echokv: glog underneath (c10 uses glog too in Debian's
// LibTorch, so the macros agree). Never define bare LOG/CHECK elsewhere.
//
//   #include "common/logging.h"
//   ECHOKV_LOG(INFO) << "loaded " << n << " tensors";
//   ECHOKV_LOG(WARNING) << "session expired";
//   echokv::InitLogging(argv[0]);   // once, in a main
#ifndef ECHOKV_COMMON_LOGGING_H_
#define ECHOKV_COMMON_LOGGING_H_

#include <glog/logging.h>

#define ECHOKV_LOG(severity) LOG(severity)
#define ECHOKV_VLOG(level) VLOG(level)

namespace echokv {

// Initialises glog for a main: logs to stderr, no log files. Safe to call twice.
void InitLogging(const char* argv0);

}  // namespace echokv

#endif  // ECHOKV_COMMON_LOGGING_H_
