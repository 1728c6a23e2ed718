// The fused attention kernel (attention_impl.h) built for avx2: 8 float(s) per vector;
// kernels/CMakeLists.txt gives this file its instruction-set flags.
#define ECHOKV_ATTENTION_WIDTH 8
#define ECHOKV_ATTENTION_NAME Avx2Kernel
#include "kernels/attention_impl.h"
