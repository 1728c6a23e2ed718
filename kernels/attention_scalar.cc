// The fused attention kernel (attention_impl.h) built for scalar: 1 float(s) per vector;
// kernels/CMakeLists.txt gives this file its instruction-set flags.
#define ECHOKV_ATTENTION_WIDTH 1
#define ECHOKV_ATTENTION_NAME ScalarKernel
#include "kernels/attention_impl.h"
