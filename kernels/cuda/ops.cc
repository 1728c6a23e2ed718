#include "kernels/cuda/ops.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/launch.h"

namespace echokv::kernels::cuda {
namespace {

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

absl::Status TorchStatus(const c10::Error& e, const char* what) {
  return absl::InternalError(absl::StrCat(what, " failed: ", e.what_without_backtrace()));
}

bool KernelDType(at::ScalarType t, DType* out) {
  switch (t) {
    case at::kFloat:
      *out = DType::kFloat32;
      return true;
    case at::kBFloat16:
      *out = DType::kBFloat16;
      return true;
    case at::kHalf:
      *out = DType::kFloat16;
      return true;
    default:
      return false;
  }
}

cudaStream_t CurrentStream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// A host array of trivially copyable structs on `device`, through pinned memory (the
// copy is asynchronous on the current stream; the caching host allocator keeps the
// pinned block until the copy is done).
template <typename T>
at::Tensor ToDevice(const std::vector<T>& host, at::Device device) {
  const int64_t bytes = static_cast<int64_t>(host.size() * sizeof(T));
  at::Tensor pinned = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(pinned.data_ptr(), host.data(), static_cast<size_t>(bytes));
  return pinned.to(device, /*non_blocking=*/true);
}

at::Tensor LongOn(const at::Tensor& t, at::Device device) { return t.to(device, at::kLong).contiguous(); }

}  // namespace

bool DeviceAvailable() {
  try {
    return c10::cuda::device_count() > 0;
  } catch (const c10::Error&) {
    return false;
  }
}

absl::StatusOr<at::Tensor> DecodeAttentionBatch(const DecodeBatchInput& in) {
  const at::Tensor& q0 = in.q;
  if (!q0.defined() || q0.dim() != 3 || !q0.is_cuda()) {
    return absl::InvalidArgumentError("DecodeAttentionBatch: q must be a CUDA tensor [B, H, d]");
  }
  DType dtype;
  if (!KernelDType(q0.scalar_type(), &dtype)) {
    return absl::InvalidArgumentError("DecodeAttentionBatch: q must be float32, bfloat16 or float16");
  }
  const int64_t batch = q0.size(0), h = q0.size(1), d = q0.size(2);
  if (static_cast<int64_t>(in.keys.size()) != batch || static_cast<int64_t>(in.values.size()) != batch) {
    return absl::InvalidArgumentError(absl::StrCat("DecodeAttentionBatch: keys and values must hold B=", batch,
                                                   " tensors, got ", in.keys.size(), " and ", in.values.size()));
  }
  if (d < 1 || d > 256) return absl::InvalidArgumentError(absl::StrCat("DecodeAttentionBatch: head dim ", d, " not in [1, 256]"));
  if (in.split < 1) return absl::InvalidArgumentError("DecodeAttentionBatch: split must be >= 1");
  if (!std::isfinite(in.scale) || in.scale < 0) return absl::InvalidArgumentError("DecodeAttentionBatch: scale must be >= 0");
  if (batch == 0) return at::empty_like(q0);
  const int64_t g = in.keys[0].defined() && in.keys[0].dim() == 3 ? in.keys[0].size(0) : 0;
  if (g < 1 || h % g != 0) {
    return absl::InvalidArgumentError(absl::StrCat("DecodeAttentionBatch: keys[0] must be [G, n, d] with H=", h,
                                                   " a multiple of G"));
  }
  if (batch > 65535) return absl::InvalidArgumentError("DecodeAttentionBatch: at most 65535 rows");
  try {
    c10::cuda::CUDAGuard guard(q0.device());
    const at::Device device = q0.device();
    at::Tensor q = q0.contiguous();
    at::Tensor lengths;
    if (in.group_lengths.defined()) {
      if (in.group_lengths.dim() != 2 || in.group_lengths.size(0) != batch || in.group_lengths.size(1) != g) {
        return absl::InvalidArgumentError(
            absl::StrCat("DecodeAttentionBatch: group_lengths must be [B, G] = [", batch, ", ", g, "]"));
      }
      lengths = in.group_lengths.to(at::kCPU, at::kLong).contiguous();
    }
    const bool windowed = in.window > 0;
    std::vector<at::Tensor> kpos(batch);
    at::Tensor qpos;
    if (windowed) {
      if (static_cast<int64_t>(in.key_positions.size()) != batch || !in.q_positions.defined() ||
          in.q_positions.numel() != batch) {
        return absl::InvalidArgumentError(
            "DecodeAttentionBatch: window > 0 needs key_positions (B tensors) and q_positions [B]");
      }
      qpos = LongOn(in.q_positions.reshape({batch}), device);
    }
    std::vector<KvSpan> spans(batch * g);
    int64_t max_n = 0;
    const int64_t elem = q.element_size();
    for (int64_t b = 0; b < batch; ++b) {
      const at::Tensor& k = in.keys[b];
      const at::Tensor& v = in.values[b];
      const std::string where = absl::StrCat("DecodeAttentionBatch: keys[", b, "]/values[", b, "]");
      if (!k.defined() || !v.defined() || k.dim() != 3 || !k.sizes().equals(v.sizes()) || !k.strides().equals(v.strides())) {
        return absl::InvalidArgumentError(absl::StrCat(where, " must be [G, n, d] tensors of one shape and strides"));
      }
      if (k.size(0) != g || k.size(2) != d) {
        return absl::InvalidArgumentError(absl::StrCat(where, " must be [", g, ", n, ", d, "], got [", k.size(0), ", ",
                                                       k.size(1), ", ", k.size(2), "]"));
      }
      if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type() || k.device() != device ||
          v.device() != device) {
        return absl::InvalidArgumentError(absl::StrCat(where, " must have q's dtype and device"));
      }
      if (k.stride(2) != 1 || (k.size(1) > 1 && k.stride(1) < d)) {
        return absl::InvalidArgumentError(absl::StrCat(where, " must have contiguous rows (stride(2) == 1)"));
      }
      const int64_t n = k.size(1);
      if (windowed) {
        const at::Tensor& p = in.key_positions[b];
        if (!p.defined() || p.dim() != 2 || p.size(0) != g || p.size(1) != n) {
          return absl::InvalidArgumentError(absl::StrCat("DecodeAttentionBatch: key_positions[", b, "] must be [", g,
                                                         ", ", n, "]"));
        }
        kpos[b] = LongOn(p, device);
      }
      for (int64_t gg = 0; gg < g; ++gg) {
        KvSpan& s = spans[b * g + gg];
        s.k = static_cast<const char*>(k.data_ptr()) + gg * k.stride(0) * elem;
        s.v = static_cast<const char*>(v.data_ptr()) + gg * v.stride(0) * elem;
        s.n = n;
        if (lengths.defined()) {
          const int64_t len = lengths.data_ptr<int64_t>()[b * g + gg];
          if (len < 0 || len > n) {
            return absl::InvalidArgumentError(absl::StrCat("DecodeAttentionBatch: group_lengths[", b, "][", gg, "] = ",
                                                           len, " not in [0, ", n, "]"));
          }
          s.n = len;
        }
        s.row_stride = k.stride(1);
        s.positions = windowed ? kpos[b].data_ptr<int64_t>() + gg * n : nullptr;
        max_n = std::max(max_n, s.n);
      }
    }
    at::Tensor spans_dev = ToDevice(spans, device);
    at::Tensor out = at::empty_like(q);
    DecodeAttentionParams p;
    p.dtype = dtype;
    p.batch = batch;
    p.num_heads = h;
    p.num_kv_heads = g;
    p.head_dim = d;
    p.q = q.data_ptr();
    p.out = out.data_ptr();
    p.spans = static_cast<const KvSpan*>(spans_dev.data_ptr());
    p.q_positions = windowed ? qpos.data_ptr<int64_t>() : nullptr;
    p.window = in.window;
    p.scale = static_cast<float>(in.scale != 0.0 ? in.scale : 1.0 / std::sqrt(static_cast<double>(d)));
    p.max_n = max_n;
    p.split = in.split;
    at::Tensor ws;
    const int64_t ws_floats = DecodeAttentionWorkspaceFloats(p);
    if (ws_floats > 0) {
      ws = at::empty({ws_floats}, q.options().dtype(at::kFloat));
      p.workspace = ws.data_ptr<float>();
    }
    const absl::Status st = CudaStatus(LaunchDecodeAttention(p, CurrentStream()), "DecodeAttentionBatch");
    if (!st.ok()) return st;
    return out;
  } catch (const c10::Error& e) {
    return TorchStatus(e, "DecodeAttentionBatch");
  }
}

absl::StatusOr<at::Tensor> AttentionScores(const at::Tensor& queries, const at::Tensor& keys,
                                           const ScoreOptions& options) {
  if (!queries.defined() || queries.dim() != 3) return absl::InvalidArgumentError("AttentionScores: queries must be [H, nq, d]");
  if (!keys.defined() || keys.dim() != 3 || !keys.is_cuda()) {
    return absl::InvalidArgumentError("AttentionScores: keys must be a CUDA tensor [G, L, d]");
  }
  DType dtype;
  if (!KernelDType(keys.scalar_type(), &dtype)) {
    return absl::InvalidArgumentError("AttentionScores: keys must be float32, bfloat16 or float16");
  }
  if (!at::isFloatingType(queries.scalar_type())) return absl::InvalidArgumentError("AttentionScores: queries must be floating point");
  const int64_t h = queries.size(0), nq = queries.size(1), d = queries.size(2);
  const int64_t g = keys.size(0), num_keys = keys.size(1);
  if (g < 1 || h < 1 || h % g != 0) {
    return absl::InvalidArgumentError(absl::StrCat("AttentionScores: query heads H=", h,
                                                   " must be a positive multiple of key groups G=", g));
  }
  if (keys.size(2) != d) {
    return absl::InvalidArgumentError(absl::StrCat("AttentionScores: head dim of queries (", d, ") != head dim of keys (",
                                                   keys.size(2), ")"));
  }
  if (d > 256) return absl::InvalidArgumentError(absl::StrCat("AttentionScores: head dim ", d, " > 256"));
  if (num_keys > 0x7fffffff || g > 65535) return absl::InvalidArgumentError("AttentionScores: too many keys or groups");
  if (!std::isfinite(options.scale)) return absl::InvalidArgumentError("ScoreOptions.scale must be finite");
  const bool causal = options.query_positions.defined();
  if (causal != options.key_positions.defined()) {
    return absl::InvalidArgumentError("ScoreOptions: query_positions and key_positions must be both set or both unset");
  }
  if (causal) {
    if (options.query_positions.dim() != 1 || options.query_positions.size(0) != nq) {
      return absl::InvalidArgumentError(absl::StrCat("ScoreOptions.query_positions must be [nq] = [", nq, "]"));
    }
    if (options.key_positions.dim() != 2 || options.key_positions.size(0) != g || options.key_positions.size(1) != num_keys) {
      return absl::InvalidArgumentError(
          absl::StrCat("ScoreOptions.key_positions must be [G, L] = [", g, ", ", num_keys, "]"));
    }
  }
  try {
    c10::cuda::CUDAGuard guard(keys.device());
    const at::Device device = keys.device();
    at::Tensor k = keys.stride(2) == 1 ? keys : keys.contiguous();
    at::Tensor q = queries.to(device, at::kFloat).contiguous();
    at::Tensor qpos, kpos;
    ScoreParams p;
    if (causal) {
      qpos = LongOn(options.query_positions, device);
      kpos = LongOn(options.key_positions, device);
      p.query_positions = qpos.data_ptr<int64_t>();
      p.key_positions = kpos.data_ptr<int64_t>();
    }
    at::Tensor out = at::empty({h, num_keys}, q.options());
    p.key_dtype = dtype;
    p.num_heads = h;
    p.num_kv_heads = g;
    p.head_dim = d;
    p.num_queries = nq;
    p.num_keys = num_keys;
    p.queries = q.data_ptr<float>();
    p.keys = k.data_ptr();
    p.key_row_stride = k.stride(1);
    p.key_group_stride = k.stride(0);
    p.scale = static_cast<float>(options.scale != 0.0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(d)));
    p.out = out.data_ptr<float>();
    at::Tensor ws;
    const int64_t ws_floats = ScoreWorkspaceFloats(p);
    if (ws_floats > 0) {
      ws = at::empty({ws_floats}, q.options());
      p.workspace = ws.data_ptr<float>();
    }
    const absl::Status st = CudaStatus(LaunchAttentionScores(p, CurrentStream()), "AttentionScores");
    if (!st.ok()) return st;
    return out;
  } catch (const c10::Error& e) {
    return TorchStatus(e, "AttentionScores");
  }
}

absl::StatusOr<at::Tensor> TopKIndices(const at::Tensor& scores, int64_t k) {
  if (!scores.defined() || scores.dim() != 2 || !scores.is_cuda()) {
    return absl::InvalidArgumentError("TopKIndices: scores must be a CUDA tensor [G, L]");
  }
  if (k < 0) return absl::InvalidArgumentError(absl::StrCat("TopKIndices: k must be >= 0, got ", k));
  const int64_t rows = scores.size(0), n = scores.size(1);
  if (n > 0x7fffffff) return absl::InvalidArgumentError("TopKIndices: rows longer than 2^31 - 1");
  const int64_t kk = std::min(k, n);
  try {
    c10::cuda::CUDAGuard guard(scores.device());
    const at::TensorOptions longs = scores.options().dtype(at::kLong);
    if (rows == 0 || kk == 0) return at::empty({rows, kk}, longs);
    if (kk == n) return at::arange(n, longs).unsqueeze(0).repeat({rows, 1});
    at::Tensor s = scores.to(at::kFloat).contiguous();
    at::Tensor keys = at::empty({rows, n}, longs);
    absl::Status st = CudaStatus(LaunchTopKKeys(s.data_ptr<float>(), rows, n, keys.data_ptr<int64_t>(), CurrentStream()),
                                 "TopKIndices (keys)");
    if (!st.ok()) return st;
    // The keys are unique, so any exact top-k of them is the one set TopKIndices keeps.
    at::Tensor top = std::get<0>(at::topk(keys, kk, /*dim=*/1, /*largest=*/true, /*sorted=*/false)).contiguous();
    at::Tensor idx = at::empty({rows, kk}, longs);
    st = CudaStatus(LaunchTopKKeyIndices(top.data_ptr<int64_t>(), rows * kk, idx.data_ptr<int64_t>(), CurrentStream()),
                    "TopKIndices (indices)");
    if (!st.ok()) return st;
    return std::get<0>(at::sort(idx, /*dim=*/1));
  } catch (const c10::Error& e) {
    return TorchStatus(e, "TopKIndices");
  }
}

absl::StatusOr<CompactLayer> GatherKv(const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                                      const at::Tensor& indices, int64_t capacity) {
  if (!k.defined() || !v.defined() || k.dim() != 3 || !k.sizes().equals(v.sizes()) || !k.strides().equals(v.strides())) {
    return absl::InvalidArgumentError("GatherKv: k and v must be [G, L, d] tensors of one shape and strides");
  }
  if (!k.is_cuda() || v.device() != k.device() || k.scalar_type() != v.scalar_type()) {
    return absl::InvalidArgumentError("GatherKv: k and v must be CUDA tensors of one dtype and device");
  }
  const int64_t elem = k.element_size();
  if (elem != 2 && elem != 4) return absl::InvalidArgumentError("GatherKv: k and v must have 2- or 4-byte elements");
  if (k.stride(2) != 1) return absl::InvalidArgumentError("GatherKv: k and v must have contiguous rows (stride(2) == 1)");
  const int64_t g = k.size(0), num = k.size(1), d = k.size(2);
  if (!positions.defined() || positions.dim() != 2 || positions.size(0) != g || positions.size(1) != num) {
    return absl::InvalidArgumentError(absl::StrCat("GatherKv: positions must be [G, L] = [", g, ", ", num, "]"));
  }
  if (!indices.defined() || indices.dim() != 2 || indices.size(0) != g) {
    return absl::InvalidArgumentError(absl::StrCat("GatherKv: indices must be [G, n] with G = ", g));
  }
  const int64_t n = indices.size(1);
  if (capacity < n) {
    return absl::InvalidArgumentError(absl::StrCat("GatherKv: capacity ", capacity, " < n = ", n));
  }
  if (g > 65535) return absl::InvalidArgumentError("GatherKv: at most 65535 groups");
  try {
    c10::cuda::CUDAGuard guard(k.device());
    const at::Device device = k.device();
    if (indices.device().is_cpu() && indices.numel() > 0) {
      at::Tensor ic = indices.to(at::kLong);
      const int64_t lo = ic.min().item<int64_t>(), hi = ic.max().item<int64_t>();
      if (lo < 0 || hi >= num) {
        return absl::InvalidArgumentError(
            absl::StrCat("GatherKv: indices hold values in [", lo, ", ", hi, "], outside [0, ", num, ")"));
      }
    }
    at::Tensor idx = LongOn(indices, device);
    at::Tensor pos = LongOn(positions, device);
    CompactLayer out;
    out.k = at::empty({g, capacity, d}, k.options());
    out.v = at::empty({g, capacity, d}, k.options());
    out.positions = at::empty({g, n}, idx.options());
    GatherParams p;
    p.groups = g;
    p.n = n;
    p.src_n = num;
    p.head_dim = d;
    p.elem_bytes = elem;
    p.src_k = k.data_ptr();
    p.src_v = v.data_ptr();
    p.src_group_stride = k.stride(0);
    p.src_row_stride = k.stride(1);
    p.dst_k = out.k.data_ptr();
    p.dst_v = out.v.data_ptr();
    p.dst_group_stride = capacity * d;
    p.dst_row_stride = d;
    p.indices = idx.data_ptr<int64_t>();
    p.src_positions = pos.data_ptr<int64_t>();
    p.dst_positions = out.positions.data_ptr<int64_t>();
    const absl::Status st = CudaStatus(LaunchGather(p, CurrentStream()), "GatherKv");
    if (!st.ok()) return st;
    return out;
  } catch (const c10::Error& e) {
    return TorchStatus(e, "GatherKv");
  }
}

absl::StatusOr<at::Tensor> RopeAtPositions(const at::Tensor& x, const at::Tensor& positions,
                                           int64_t rows_per_position, const at::Tensor& inv_freq) {
  if (!x.defined() || x.dim() < 1 || !x.is_cuda()) return absl::InvalidArgumentError("RopeAtPositions: x must be a CUDA tensor [..., d]");
  DType dtype;
  if (!KernelDType(x.scalar_type(), &dtype)) {
    return absl::InvalidArgumentError("RopeAtPositions: x must be float32, bfloat16 or float16");
  }
  const int64_t d = x.size(-1);
  if (d < 2 || d % 2 != 0) return absl::InvalidArgumentError(absl::StrCat("RopeAtPositions: head dim ", d, " must be even"));
  if (!inv_freq.defined() || inv_freq.numel() != d / 2) {
    return absl::InvalidArgumentError(absl::StrCat("RopeAtPositions: inv_freq must hold d/2 = ", d / 2, " values"));
  }
  if (!positions.defined() || positions.dim() != 1 || positions.numel() < 1) {
    return absl::InvalidArgumentError("RopeAtPositions: positions must be a non-empty [P] tensor");
  }
  if (rows_per_position < 1) return absl::InvalidArgumentError("RopeAtPositions: rows_per_position must be >= 1");
  try {
    c10::cuda::CUDAGuard guard(x.device());
    const at::Device device = x.device();
    at::Tensor in = x.contiguous();
    at::Tensor out = at::empty_like(in);
    at::Tensor pos = LongOn(positions, device);
    at::Tensor freq = inv_freq.to(device, at::kFloat).contiguous();
    RopeParams p;
    p.dtype = dtype;
    p.rows = in.numel() / d;
    p.head_dim = d;
    p.row_stride = d;
    p.in = in.data_ptr();
    p.out = out.data_ptr();
    p.positions = pos.data_ptr<int64_t>();
    p.num_positions = pos.numel();
    p.rows_per_position = rows_per_position;
    p.inv_freq = freq.data_ptr<float>();
    const absl::Status st = CudaStatus(LaunchRope(p, CurrentStream()), "RopeAtPositions");
    if (!st.ok()) return st;
    return out;
  } catch (const c10::Error& e) {
    return TorchStatus(e, "RopeAtPositions");
  }
}

namespace {

bool ScoresHook(const at::Tensor& queries, const at::Tensor& keys, const ScoreOptions& options, at::Tensor* out) {
  DType dtype;
  if (!KernelDType(keys.scalar_type(), &dtype) || keys.dim() != 3 || keys.size(2) > 256) return false;
  absl::StatusOr<at::Tensor> r = ::echokv::kernels::cuda::AttentionScores(queries, keys, options);
  TORCH_CHECK(r.ok(), r.status().ToString());
  *out = *std::move(r);
  return true;
}

bool TopKHook(const at::Tensor& scores, int64_t k, at::Tensor* out) {
  if (scores.dim() != 2 || scores.size(1) > 0x7fffffff) return false;
  absl::StatusOr<at::Tensor> r = ::echokv::kernels::cuda::TopKIndices(scores, k);
  TORCH_CHECK(r.ok(), r.status().ToString());
  *out = *std::move(r);
  return true;
}

}  // namespace

void RegisterScoreKernels() {
  static const DeviceScoreKernels kernels = [] {
    DeviceScoreKernels k;
    k.attention_scores = &ScoresHook;
    k.top_k_indices = &TopKHook;
    return k;
  }();
  RegisterDeviceScoreKernels(&kernels);
}

}  // namespace echokv::kernels::cuda
