#include "kernels/prefill_attention.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "kernels/torch_compat.h"

namespace echokv::kernels {
namespace {

enum class Backend { kFlash, kEfficient, kReference };

Backend Choose(const at::Tensor& q) {
#if ECHOKV_TORCH_HAS_SDPA
  if (q.is_cuda()) {
    const int64_t d = q.size(-1);
    const at::ScalarType t = q.scalar_type();
    if ((t == at::kHalf || t == at::kBFloat16) && d % 8 == 0 && d <= 256) return Backend::kFlash;
    // The memory-efficient kernel needs 16-byte rows: d % 4 for float32, % 8 for 16 bits.
    const int64_t align = t == at::kFloat ? 4 : 8;
    if (d % align == 0 && d <= 256) return Backend::kEfficient;
  }
#endif
  return Backend::kReference;
}

struct Part {
  at::Tensor out;  // [1, Hq, M, d], q's dtype
  at::Tensor lse;  // [1, Hq, M] float32
};

// softmax(scale q k^T (+ causal tril)) v with its log-sum-exp; q [1, Hq, M, d], k, v
// [1, Hq, N, d]; causal needs M == N. The reference computes in float32 (float64 for
// float64 inputs: the tests' oracle).
Part AttentionWithLse(Backend backend, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                      double scale) {
  const int64_t m = q.size(2);
#if ECHOKV_TORCH_HAS_SDPA
  if (backend == Backend::kFlash) {
    auto r = at::_scaled_dot_product_flash_attention(q, k, v, /*dropout_p=*/0.0, causal,
                                                     /*return_debug_mask=*/false, TorchOptional<double>(scale));
    return Part{std::get<0>(r), std::get<1>(r)};
  }
  if (backend == Backend::kEfficient) {
    auto r = at::_scaled_dot_product_efficient_attention(q, k, v, /*attn_bias=*/TorchOptional<at::Tensor>(),
                                                         /*compute_log_sumexp=*/true, /*dropout_p=*/0.0, causal,
                                                         TorchOptional<double>(scale));
    // The kernel pads the log-sum-exp's query dimension (to a multiple of 32).
    return Part{std::get<0>(r), std::get<1>(r).narrow(2, 0, m)};
  }
#endif
  // Reference: the [M, N] logits of the chunk (O(chunk x cache) memory, as the ATen
  // composition of the transformer).
  const at::ScalarType acc = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor logits = at::matmul(q.to(acc), k.to(acc).transpose(2, 3)).mul_(scale);
  if (causal) {
    at::Tensor keep = at::ones({m, k.size(2)}, q.options().dtype(at::kBool)).tril();
    logits.masked_fill_(keep.logical_not(), -std::numeric_limits<float>::infinity());
  }
  at::Tensor lse = at::logsumexp(logits, -1);                          // [1, Hq, M]
  at::Tensor probs = (logits - lse.unsqueeze(-1)).exp_();
  return Part{at::matmul(probs, v.to(acc)).to(q.scalar_type()), lse};
}

}  // namespace

std::string ChunkAttentionBackend(const at::Tensor& q) {
  switch (Choose(q)) {
    case Backend::kFlash:
      return "flash";
    case Backend::kEfficient:
      return "efficient";
    case Backend::kReference:
      break;
  }
  return "reference";
}

absl::StatusOr<at::Tensor> ChunkAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          double scale) {
  if (!q.defined() || q.dim() != 3) return absl::InvalidArgumentError("ChunkAttention: q must be [H, m, d]");
  if (!k.defined() || k.dim() != 3 || !v.defined() || !v.sizes().equals(k.sizes())) {
    return absl::InvalidArgumentError("ChunkAttention: k and v must be [G, n, d] of one shape");
  }
  const int64_t h = q.size(0), m = q.size(1), d = q.size(2), g = k.size(0), n = k.size(1);
  if (g < 1 || h % g != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ChunkAttention: H=", h, " is not a multiple of G=", g));
  }
  if (k.size(2) != d) {
    return absl::InvalidArgumentError(absl::StrCat("ChunkAttention: head dim of k (", k.size(2), ") != q's (", d, ")"));
  }
  if (n < m) {
    return absl::InvalidArgumentError(
        absl::StrCat("ChunkAttention: the cache holds n=", n, " entries, fewer than the chunk's m=", m));
  }
  if (q.scalar_type() != k.scalar_type() || q.scalar_type() != v.scalar_type() || q.device() != k.device() ||
      q.device() != v.device()) {
    return absl::InvalidArgumentError("ChunkAttention: q, k and v must share one dtype and device");
  }
  if (!std::isfinite(scale) || scale < 0) return absl::InvalidArgumentError("ChunkAttention: scale must be >= 0");
  const double s = scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(d));
  if (m == 0) return at::empty({h, 0, d}, q.options());
  try {
    const int64_t r = h / g, old = n - m;
    const Backend backend = Choose(q);
    // B: the chunk's own entries, causal; K and V repeated to the H query heads.
    at::Tensor kb = k.narrow(1, old, m).repeat_interleave(r, 0).unsqueeze(0);  // [1, H, m, d]
    at::Tensor vb = v.narrow(1, old, m).repeat_interleave(r, 0).unsqueeze(0);
    Part b = AttentionWithLse(backend, q.contiguous().unsqueeze(0), kb.contiguous(), vb.contiguous(),
                              /*causal=*/true, s);
    if (old == 0) return b.out.squeeze(0);
    // A: the older entries; the r heads of a group as r*m queries of one head.
    at::Tensor qa = q.contiguous().view({1, g, r * m, d});
    at::Tensor ka = k.narrow(1, 0, old).unsqueeze(0).contiguous();  // [1, G, old, d]
    at::Tensor va = v.narrow(1, 0, old).unsqueeze(0).contiguous();
    Part a = AttentionWithLse(backend, qa, ka, va, /*causal=*/false, s);
    const at::ScalarType acc = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    at::Tensor lse_a = a.lse.reshape({h, m, 1}).to(acc);
    at::Tensor lse_b = b.lse.reshape({h, m, 1}).to(acc);
    at::Tensor top = at::maximum(lse_a, lse_b);  // finite: every query sees its own key
    at::Tensor wa = (lse_a - top).exp_();
    at::Tensor wb = (lse_b - top).exp_();
    at::Tensor out = (a.out.reshape({h, m, d}).to(acc) * wa + b.out.reshape({h, m, d}).to(acc) * wb) / (wa + wb);
    return out.to(q.scalar_type());
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("ChunkAttention failed: ", e.what_without_backtrace()));
  }
}

}  // namespace echokv::kernels
