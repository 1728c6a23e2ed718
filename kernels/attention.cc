#include "kernels/attention.h"

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/attention_isa.h"
#include "kernels/cpu_isa.h"

namespace echokv::kernels {
namespace {

using attention_isa::KernelFns;

struct Choice {
  std::string name;
  KernelFns fns;
};

// The x86 builds exist only where CMake compiled them (ECHOKV_ATTENTION_X86).
bool Supported(const std::string& isa) {
#if defined(ECHOKV_ATTENTION_X86)
  return CpuRunsIsa(isa);
#else
  return isa == "scalar";
#endif
}

Choice Make(const std::string& isa) {
#if defined(ECHOKV_ATTENTION_X86)
  if (isa == "avx512") return {isa, attention_isa::Avx512Kernel()};
  if (isa == "avx2") return {isa, attention_isa::Avx2Kernel()};
#endif
  return {"scalar", attention_isa::ScalarKernel()};
}

Choice Best() {
  for (const char* isa : {"avx512", "avx2"}) {
    if (Supported(isa)) return Make(isa);
  }
  return Make("scalar");
}

std::mutex& ChoiceMutex() {
  static std::mutex mu;
  return mu;
}

// The kernel every call uses: the best the CPU has, or ECHOKV_ATTENTION_ISA when that
// names one it supports (benchmarks compare the builds on one machine).
Choice& Current() {
  static Choice choice = [] {
    const char* env = std::getenv("ECHOKV_ATTENTION_ISA");
    if (env != nullptr && Supported(env)) return Make(env);
    return Best();
  }();
  return choice;
}

}  // namespace

int64_t CausalAttentionWorkItems(const CausalAttentionArgs& a) {
  if (a.m <= 0 || a.num_kv_heads <= 0 || a.num_heads % a.num_kv_heads != 0) return 0;
  const int64_t bq = attention_isa::QueriesPerItem(a.num_heads / a.num_kv_heads);
  return a.num_kv_heads * ((a.m + bq - 1) / bq);
}

void CausalAttention(const CausalAttentionArgs& a, int64_t item_begin, int64_t item_end) {
  if (item_begin >= item_end) return;
  KernelFns fns;
  {
    std::lock_guard<std::mutex> lock(ChoiceMutex());
    fns = Current().fns;
  }
  // One scratch area per thread, reused across calls (a prefill makes one call per
  // layer and chunk on each thread).
  thread_local std::vector<float> scratch;
  const int64_t need = fns.scratch_floats(a);
  if (static_cast<int64_t>(scratch.size()) < need) scratch.resize(need);
  fns.run(a, item_begin, item_end, scratch.data());
}

std::string AttentionIsa() {
  std::lock_guard<std::mutex> lock(ChoiceMutex());
  return Current().name;
}

bool SetAttentionIsa(const std::string& isa) {
  if (isa != "auto" && !Supported(isa)) return false;
  std::lock_guard<std::mutex> lock(ChoiceMutex());
  Current() = isa == "auto" ? Best() : Make(isa);
  return true;
}

}  // namespace echokv::kernels
