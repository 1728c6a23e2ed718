// Internal to kernels/attention.cc and its per-instruction-set builds
// (attention_{avx512,avx2,scalar}.cc, each compiling attention_impl.h with its own
// flags). Not for other users.
#ifndef ECHOKV_KERNELS_ATTENTION_ISA_H_
#define ECHOKV_KERNELS_ATTENTION_ISA_H_

#include <cstdint>

#include "kernels/attention.h"

namespace echokv::kernels::attention_isa {

// Query rows (queries x heads of one group) per work item: a 128-row tile keeps the
// query tile, the scores, the packed key block and the output rows in L2 (~112 KiB at
// d = 64) and packs each key block once per 128 rows (5% faster than 64 rows on the
// 40M model's fresh 2048-token prefill).
constexpr int64_t kTileRows = 128;
// Keys per block of the online softmax.
constexpr int64_t kKeyBlock = 64;

// Queries per work item for r = H/G query heads per group (static: every
// instruction-set build gets its own copy, none is shared across builds).
static constexpr int64_t QueriesPerItem(int64_t r) { return r >= kTileRows ? 1 : kTileRows / r; }

struct KernelFns {
  // Floats of scratch one call of `run` needs (any item range).
  int64_t (*scratch_floats)(const CausalAttentionArgs& a);
  void (*run)(const CausalAttentionArgs& a, int64_t item_begin, int64_t item_end, float* scratch);
};

KernelFns Avx512Kernel();
KernelFns Avx2Kernel();
KernelFns ScalarKernel();

}  // namespace echokv::kernels::attention_isa

#endif  // ECHOKV_KERNELS_ATTENTION_ISA_H_
