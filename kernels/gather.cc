#include "kernels/gather.h"

#include <ATen/ATen.h>

namespace echokv::kernels {

at::Tensor GatherEntries(const at::Tensor& x, const at::Tensor& indices) {
  at::Tensor idx = indices.to(x.device(), at::kLong);
  at::Tensor expanded = idx.unsqueeze(-1).expand({idx.size(0), idx.size(1), x.size(2)});
  return at::gather(x, 1, expanded).contiguous();
}

}  // namespace echokv::kernels
