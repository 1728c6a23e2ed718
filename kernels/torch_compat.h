// What differs between the two LibTorch versions echokv builds against: Debian's 1.13
// (the CPU build) and PyPI's 2.11 with CUDA (the CUDA build, docs/ARCHITECTURE.md).
// Code that must compile with both tests these macros instead of version numbers.
//
//   #if ECHOKV_TORCH_HAS_SDPA_GQA
//     at::Tensor o = at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, scale, true);
//   #endif
//   ::echokv::TorchOptional<double> scale = 0.125;   // c10::optional in 1.13, std::optional in 2.x
#ifndef ECHOKV_KERNELS_TORCH_COMPAT_H_
#define ECHOKV_KERNELS_TORCH_COMPAT_H_

#include <torch/version.h>

#include <optional>

#if TORCH_VERSION_MAJOR < 2
#include <c10/util/Optional.h>
#endif

// at::scaled_dot_product_attention (public from 2.0) and its backends' ops
// (_scaled_dot_product_flash_attention / _efficient_attention, with log-sum-exp).
#define ECHOKV_TORCH_HAS_SDPA (TORCH_VERSION_MAJOR >= 2)
// scaled_dot_product_attention(..., enable_gqa) (from 2.5).
#define ECHOKV_TORCH_HAS_SDPA_GQA (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5))

namespace echokv {

// LibTorch's optional: c10::optional in 1.13; 2.x made c10::optional an alias of
// std::optional and its signatures take std::optional.
#if TORCH_VERSION_MAJOR < 2
template <typename T>
using TorchOptional = c10::optional<T>;
#else
template <typename T>
using TorchOptional = std::optional<T>;
#endif

}  // namespace echokv

#endif  // ECHOKV_KERNELS_TORCH_COMPAT_H_
