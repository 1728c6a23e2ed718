#include "kernels/rope.h"

#include <ATen/ATen.h>

#include <vector>

namespace echokv::kernels {

at::Tensor RopeInvFreq(int head_dim, double theta) {
  // HF: 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
  at::Tensor exponent = at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / static_cast<float>(head_dim);
  at::Tensor base = at::full({}, static_cast<float>(theta), at::kFloat);
  return 1.0f / at::pow(base, exponent);
}

void RopeTables(absl::Span<const int64_t> positions, const at::Tensor& inv_freq, at::Device device,
                at::Tensor* cos, at::Tensor* sin) {
  std::vector<int64_t> pos(positions.begin(), positions.end());
  at::Tensor p = at::tensor(pos, at::kLong).to(at::kFloat).unsqueeze(1);  // [n, 1]
  at::Tensor angles = p * inv_freq.to(at::kFloat).cpu().unsqueeze(0);      // [n, d/2], float32 products
  at::Tensor emb = at::cat({angles, angles}, 1);                            // [n, d]
  *cos = emb.cos().to(device);
  *sin = emb.sin().to(device);
}

namespace {
at::Tensor RotateHalf(const at::Tensor& x) {
  int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.narrow(-1, 0, half);
  at::Tensor x2 = x.narrow(-1, half, half);
  return at::cat({-x2, x1}, -1);
}
}  // namespace

at::Tensor ApplyRope(const at::Tensor& x, absl::Span<const int64_t> positions, const at::Tensor& inv_freq) {
  at::Tensor cos, sin;
  RopeTables(positions, inv_freq, x.device(), &cos, &sin);
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor out = xf * cos + RotateHalf(xf) * sin;
  return out.to(x.scalar_type());
}

at::Tensor RotateToPositions(const at::Tensor& anchors, absl::Span<const int64_t> positions,
                             const at::Tensor& inv_freq) {
  const int64_t h = anchors.size(0);
  const int64_t d = anchors.size(1);
  const int64_t t = static_cast<int64_t>(positions.size());
  at::Tensor rep = anchors.unsqueeze(1).expand({h, t, d});
  return ApplyRope(rep, positions, inv_freq);
}

}  // namespace echokv::kernels
