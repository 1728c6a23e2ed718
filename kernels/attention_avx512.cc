// The fused attention kernel (attention_impl.h) built for avx512: 16 float(s) per vector;
// kernels/CMakeLists.txt gives this file its instruction-set flags.
#define ECHOKV_ATTENTION_WIDTH 16
#define ECHOKV_ATTENTION_NAME Avx512Kernel
#include "kernels/attention_impl.h"
