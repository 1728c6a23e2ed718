#include "kernels/score.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/softmax.h"

namespace echokv::kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

// Per-chunk / per-block position bounds, kept on the host so that the loops below can
// skip key chunks no query of a block can see (half of the work of a causal pass)
// without a device round trip per chunk.
struct PositionBounds {
  // key_min[c] / key_max[c]: smallest / largest key position of chunk c over all groups.
  std::vector<int64_t> key_min;
  std::vector<int64_t> key_max;
  // query_min[b] / query_max[b]: smallest / largest query position of block b.
  std::vector<int64_t> query_min;
  std::vector<int64_t> query_max;
};

PositionBounds ComputeBounds(const at::Tensor& query_positions_cpu,
                             const at::Tensor& key_positions_cpu, int64_t chunk,
                             int64_t query_chunk) {
  PositionBounds b;
  const int64_t nq = query_positions_cpu.size(0);
  const int64_t num_keys = key_positions_cpu.size(1);
  for (int64_t ks = 0; ks < num_keys; ks += chunk) {
    const int64_t c = std::min(chunk, num_keys - ks);
    at::Tensor part = key_positions_cpu.narrow(1, ks, c);
    b.key_min.push_back(part.min().item<int64_t>());
    b.key_max.push_back(part.max().item<int64_t>());
  }
  for (int64_t qs = 0; qs < nq; qs += query_chunk) {
    const int64_t n = std::min(query_chunk, nq - qs);
    at::Tensor part = query_positions_cpu.narrow(0, qs, n);
    b.query_min.push_back(part.min().item<int64_t>());
    b.query_max.push_back(part.max().item<int64_t>());
  }
  return b;
}

// Scaled logits of one query block against one key chunk, with invisible keys at -inf.
//   qb: [G, r*nb, d] float32 (already multiplied by the softmax scale)
//   keys: [G, L, d] any float dtype; the chunk [ks, ks+c) is cast to float32 here.
//   visible: [G, nb, c] bool or undefined (every key visible).
// Returns [G, r*nb, c] float32, contiguous.
at::Tensor ChunkLogits(const at::Tensor& qb, const at::Tensor& keys, int64_t ks, int64_t c,
                       int64_t r, int64_t nb, const at::Tensor& visible) {
  at::Tensor kc = keys.narrow(1, ks, c).to(at::kFloat);       // [G, c, d]
  at::Tensor logits = at::bmm(qb, kc.transpose(1, 2));         // [G, r*nb, c]
  if (visible.defined()) {
    const int64_t g = logits.size(0);
    logits.view({g, r, nb, c}).masked_fill_(visible.logical_not().unsqueeze(1), kNegInf);
  }
  return logits;
}

void CheckInputs(const at::Tensor& queries, const at::Tensor& keys, const ScoreOptions& o) {
  TORCH_CHECK(queries.defined() && queries.dim() == 3,
              "AttentionScores: queries must be [H, nq, d], got ",
              queries.defined() ? queries.sizes() : at::IntArrayRef{});
  TORCH_CHECK(keys.defined() && keys.dim() == 3, "AttentionScores: keys must be [G, L, d], got ",
              keys.defined() ? keys.sizes() : at::IntArrayRef{});
  TORCH_CHECK(at::isFloatingType(queries.scalar_type()) && at::isFloatingType(keys.scalar_type()),
              "AttentionScores: queries and keys must be floating point");
  TORCH_CHECK(queries.device() == keys.device(),
              "AttentionScores: queries and keys must be on the same device");
  const int64_t h = queries.size(0);
  const int64_t g = keys.size(0);
  TORCH_CHECK(g >= 1 && h >= 1 && h % g == 0, "AttentionScores: query heads H=", h,
              " must be a positive multiple of key groups G=", g);
  TORCH_CHECK(queries.size(2) == keys.size(2), "AttentionScores: head dim of queries (",
              queries.size(2), ") != head dim of keys (", keys.size(2), ")");
  TORCH_CHECK(o.chunk >= 1, "ScoreOptions.chunk must be >= 1, got ", o.chunk);
  TORCH_CHECK(o.query_chunk >= 1, "ScoreOptions.query_chunk must be >= 1, got ", o.query_chunk);
  TORCH_CHECK(std::isfinite(o.scale), "ScoreOptions.scale must be finite");
  TORCH_CHECK(o.query_positions.defined() == o.key_positions.defined(),
              "ScoreOptions: query_positions and key_positions must be both set or both unset");
  if (o.query_positions.defined()) {
    TORCH_CHECK(o.query_positions.dim() == 1 && o.query_positions.size(0) == queries.size(1),
                "ScoreOptions.query_positions must be [nq] = [", queries.size(1), "], got ",
                o.query_positions.sizes());
    TORCH_CHECK(o.key_positions.dim() == 2 && o.key_positions.size(0) == g &&
                    o.key_positions.size(1) == keys.size(1),
                "ScoreOptions.key_positions must be [G, L] = [", g, ", ", keys.size(1), "], got ",
                o.key_positions.sizes());
    TORCH_CHECK(!at::isFloatingType(o.query_positions.scalar_type()) &&
                    !at::isFloatingType(o.key_positions.scalar_type()),
                "ScoreOptions: query_positions and key_positions must be integer tensors");
  }
}

}  // namespace

namespace {

// AttentionScores on CPU float32: per head and query one row of logits over the keys
// (O(L) floats per thread, reused), its softmax (kernels/softmax.h: vectorised dots and
// exp), and the probabilities added into the head's output row; heads in parallel (each
// writes only its own row). The ATen path below ran each [chunk] block through ~10 ops
// in two passes: 50-100 ms per EchoKV phase over an 8K-token cold tier of the 40M model,
// a third of a tiered turn.
at::Tensor AttentionScoresCpu(const at::Tensor& queries, const at::Tensor& keys, const ScoreOptions& options) {
  const int64_t h = queries.size(0), nq = queries.size(1), d = queries.size(2);
  const int64_t g = keys.size(0), num_keys = keys.size(1), r = h / g;
  const double scale64 = options.scale != 0.0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(d));
  const float scale = static_cast<float>(scale64);
  at::Tensor q = queries.contiguous();
  at::Tensor k = keys.contiguous();
  at::Tensor out = at::zeros({h, num_keys}, at::kFloat);
  if (nq == 0 || num_keys == 0) return out;
  const bool causal = options.query_positions.defined();
  at::Tensor qpos, kpos;
  if (causal) {
    qpos = options.query_positions.to(at::kCPU, at::kLong).contiguous();
    kpos = options.key_positions.to(at::kCPU, at::kLong).contiguous();
  }
  const float* qd = q.data_ptr<float>();
  const float* kd = k.data_ptr<float>();
  float* od = out.data_ptr<float>();
  at::parallel_for(0, h, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> row(num_keys);
    for (int64_t hh = begin; hh < end; ++hh) {
      const int64_t gg = hh / r;
      const float* keys_g = kd + gg * num_keys * d;
      const int64_t* kp = causal ? kpos.data_ptr<int64_t>() + gg * num_keys : nullptr;
      float* out_row = od + hh * num_keys;
      for (int64_t i = 0; i < nq; ++i) {
        ScaledDots(qd + (hh * nq + i) * d, keys_g, num_keys, d, scale, row.data());
        if (causal) {
          const int64_t p = qpos.data_ptr<int64_t>()[i];
          for (int64_t j = 0; j < num_keys; ++j) {
            if (kp[j] > p) row[j] = kNegInf;
          }
        }
        const float mx = MaxOf(row.data(), num_keys);
        if (mx == kNegInf) continue;  // sees no key: contributes nothing
        const float inv = 1.0f / ExpShiftSum(row.data(), num_keys, mx);
        for (int64_t j = 0; j < num_keys; ++j) out_row[j] += row[j] * inv;
      }
    }
  });
  return out;
}

std::atomic<const DeviceScoreKernels*> g_device_kernels{nullptr};

}  // namespace

void RegisterDeviceScoreKernels(const DeviceScoreKernels* kernels) { g_device_kernels.store(kernels); }

at::Tensor AttentionScores(const at::Tensor& queries, const at::Tensor& keys,
                           const ScoreOptions& options) {
  CheckInputs(queries, keys, options);
  if (keys.is_cuda()) {
    const DeviceScoreKernels* device = g_device_kernels.load();
    at::Tensor out;
    if (device != nullptr && device->attention_scores != nullptr && device->attention_scores(queries, keys, options, &out)) {
      return out;
    }
  }
  if (queries.device().is_cpu() && keys.device().is_cpu() && queries.scalar_type() == at::kFloat &&
      keys.scalar_type() == at::kFloat) {
    return AttentionScoresCpu(queries, keys, options);
  }
  const int64_t h = queries.size(0);
  const int64_t nq = queries.size(1);
  const int64_t d = queries.size(2);
  const int64_t g = keys.size(0);
  const int64_t num_keys = keys.size(1);
  const int64_t r = h / g;
  const at::Device device = queries.device();
  const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat).device(device);

  at::Tensor out = at::zeros({h, num_keys}, f32);
  if (nq == 0 || num_keys == 0) return out;
  at::Tensor out3 = out.view({g, r, num_keys});

  const double scale = options.scale != 0.0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(d));
  // [G, r, nq, d]: heads of a group are consecutive (HF repeat_kv order, docs/ALGORITHM.md §1).
  at::Tensor q = (queries.to(at::kFloat) * scale).view({g, r, nq, d});

  const bool causal = options.query_positions.defined();
  at::Tensor qpos, kpos;
  PositionBounds bounds;
  if (causal) {
    at::Tensor qpos_cpu = options.query_positions.to(at::kCPU, at::kLong).contiguous();
    at::Tensor kpos_cpu = options.key_positions.to(at::kCPU, at::kLong).contiguous();
    bounds = ComputeBounds(qpos_cpu, kpos_cpu, options.chunk, options.query_chunk);
    qpos = qpos_cpu.to(device);
    kpos = kpos_cpu.to(device);
  }

  // Peak memory per block: one [G, r*nb, chunk] logits tensor (plus its mask), i.e.
  // O(H * query_chunk * chunk), independent of nq and L.
  int64_t block = 0;
  for (int64_t qs = 0; qs < nq; qs += options.query_chunk, ++block) {
    const int64_t nb = std::min(options.query_chunk, nq - qs);
    at::Tensor qb = q.narrow(2, qs, nb).reshape({g, r * nb, d});  // [G, r*nb, d]

    // Which chunks this block can see at all, and whether they need a mask.
    auto chunk_mask = [&](int64_t chunk_index, int64_t ks, int64_t c, bool* skip) -> at::Tensor {
      *skip = false;
      if (!causal) return at::Tensor();
      if (bounds.key_min[chunk_index] > bounds.query_max[block]) {
        *skip = true;  // every key of the chunk is after every query of the block
        return at::Tensor();
      }
      if (bounds.key_max[chunk_index] <= bounds.query_min[block]) return at::Tensor();
      // [G, 1, c] <= [1, nb, 1] -> [G, nb, c]
      return kpos.narrow(1, ks, c).unsqueeze(1) <= qpos.narrow(0, qs, nb).view({1, nb, 1});
    };

    // Pass 1: per-query log-sum-exp with a running max (online softmax denominator).
    at::Tensor run_max = at::full({g, r * nb}, kNegInf, f32);
    at::Tensor run_sum = at::zeros({g, r * nb}, f32);
    int64_t chunk_index = 0;
    for (int64_t ks = 0; ks < num_keys; ks += options.chunk, ++chunk_index) {
      const int64_t c = std::min(options.chunk, num_keys - ks);
      bool skip = false;
      at::Tensor visible = chunk_mask(chunk_index, ks, c, &skip);
      if (skip) continue;
      at::Tensor logits = ChunkLogits(qb, keys, ks, c, r, nb, visible);
      at::Tensor new_max = at::maximum(run_max, logits.amax(-1));
      // A row with no visible key so far keeps max -inf; shift it by 0 instead so that
      // (-inf) - (-inf) never produces NaN (its terms are exp(-inf) = 0 either way).
      at::Tensor shift = new_max.masked_fill(at::isneginf(new_max), 0.0);
      run_sum.mul_(at::exp(run_max - shift));
      run_sum.add_(logits.sub_(shift.unsqueeze(-1)).exp_().sum(-1));
      run_max = new_max;
    }
    // A query that sees no key gets lse = +inf: all its probabilities become exp(-inf) = 0.
    at::Tensor lse = (run_max + at::log(run_sum)).masked_fill_(run_sum == 0, kPosInf);

    // Pass 2: probabilities exp(logit - lse), summed over the block's queries per head.
    chunk_index = 0;
    for (int64_t ks = 0; ks < num_keys; ks += options.chunk, ++chunk_index) {
      const int64_t c = std::min(options.chunk, num_keys - ks);
      bool skip = false;
      at::Tensor visible = chunk_mask(chunk_index, ks, c, &skip);
      if (skip) continue;
      at::Tensor probs = ChunkLogits(qb, keys, ks, c, r, nb, visible)
                             .sub_(lse.unsqueeze(-1))
                             .exp_();                                  // [G, r*nb, c]
      out3.narrow(2, ks, c).add_(probs.view({g, r, nb, c}).sum(2));  // [G, r, c]
    }
  }
  return out;
}

at::Tensor CausalColumnSums(const at::Tensor& queries, const at::Tensor& query_positions,
                            const at::Tensor& keys, const at::Tensor& key_positions) {
  TORCH_CHECK(query_positions.defined() && key_positions.defined(),
              "CausalColumnSums: query_positions and key_positions are required");
  ScoreOptions options;
  options.query_positions = query_positions;
  options.key_positions = key_positions;
  return AttentionScores(queries, keys, options);
}

at::Tensor SumHeadsPerGroup(const at::Tensor& head_scores, int64_t num_kv_heads) {
  TORCH_CHECK(head_scores.defined() && head_scores.dim() == 2,
              "SumHeadsPerGroup: head_scores must be [H, L]");
  const int64_t h = head_scores.size(0);
  TORCH_CHECK(num_kv_heads >= 1 && h % num_kv_heads == 0, "SumHeadsPerGroup: H=", h,
              " is not a multiple of num_kv_heads=", num_kv_heads);
  return head_scores.reshape({num_kv_heads, h / num_kv_heads, head_scores.size(1)}).sum(1);
}

at::Tensor MaxPool1d(const at::Tensor& x, int64_t kernel) {
  TORCH_CHECK(x.defined() && x.dim() == 2, "MaxPool1d: x must be [R, L]");
  TORCH_CHECK(kernel >= 1 && kernel % 2 == 1, "MaxPool1d: kernel must be odd and >= 1, got ",
              kernel);
  at::Tensor xf = x.to(at::kFloat);
  if (kernel == 1 || x.numel() == 0) return xf.clone();
  // Implicit padding of max_pool1d is -inf, so out-of-range positions are ignored.
  return at::max_pool1d(xf.unsqueeze(0), {kernel}, /*stride=*/{1}, /*padding=*/{kernel / 2})
      .squeeze(0);
}

at::Tensor TopKIndices(const at::Tensor& scores, int64_t k) {
  TORCH_CHECK(scores.defined() && scores.dim() == 2, "TopKIndices: scores must be [G, L]");
  TORCH_CHECK(k >= 0, "TopKIndices: k must be >= 0, got ", k);
  const int64_t rows = scores.size(0);
  const int64_t n = scores.size(1);
  const int64_t kk = std::min(k, n);
  if (scores.is_cuda()) {
    const DeviceScoreKernels* device = g_device_kernels.load();
    at::Tensor on_device;
    if (device != nullptr && device->top_k_indices != nullptr && device->top_k_indices(scores, k, &on_device)) {
      return on_device.to(at::kCPU);
    }
  }
  at::Tensor out = at::empty({rows, kk}, at::TensorOptions().dtype(at::kLong));
  if (rows == 0 || kk == 0) return out;
  if (kk == n) return at::arange(n, at::kLong).unsqueeze(0).repeat({rows, 1});

  // double holds every float/half/bf16 value exactly, so no new ties are created.
  at::Tensor s = scores.to(at::kCPU, at::kDouble).contiguous();
  const double* data = s.data_ptr<double>();
  int64_t* dst = out.data_ptr<int64_t>();
  std::vector<int64_t> order(n);
  std::vector<double> key(n);
  for (int64_t row = 0; row < rows; ++row) {
    const double* v = data + row * n;
    for (int64_t i = 0; i < n; ++i) {
      order[i] = i;
      key[i] = std::isnan(v[i]) ? -std::numeric_limits<double>::infinity() : v[i];
    }
    // Strict total order: larger score first, then lower index.
    auto better = [&key](int64_t a, int64_t b) {
      return key[a] > key[b] || (key[a] == key[b] && a < b);
    };
    std::nth_element(order.begin(), order.begin() + (kk - 1), order.end(), better);
    std::sort(order.begin(), order.begin() + kk);
    std::copy(order.begin(), order.begin() + kk, dst + row * kk);
  }
  return out;
}

}  // namespace echokv::kernels
