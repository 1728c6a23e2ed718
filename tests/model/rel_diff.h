// Relative differences of logits, keys and values for the model tests: the largest
// absolute difference divided by max(1, max |reference|), so one bound means the same for
// every family, seed and magnitude (transformer_test.cc explains the bounds used).
#ifndef ECHOKV_TESTS_MODEL_REL_DIFF_H_
#define ECHOKV_TESTS_MODEL_REL_DIFF_H_

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace echokv::testing {

// a (any float dtype) against a float64 reference b (e.g. NaiveModel's logits).
inline double RelDiff(const at::Tensor& a, const std::vector<double>& b) {
  const at::Tensor af = a.to(at::kFloat).contiguous();
  const float* p = af.data_ptr<float>();
  double m = 0, scale = 1.0;
  for (size_t i = 0; i < b.size(); ++i) {
    m = std::max(m, std::abs(static_cast<double>(p[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return m / scale;
}

// Two computations of the same tensor; b is the reference.
inline double RelDiff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bd = b.to(at::kDouble);
  return (a.to(at::kDouble) - bd).abs().max().item<double>() / std::max(1.0, bd.abs().max().item<double>());
}

}  // namespace echokv::testing

#endif  // ECHOKV_TESTS_MODEL_REL_DIFF_H_
