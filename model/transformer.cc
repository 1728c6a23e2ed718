#include "model/transformer_impl.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/attention.h"
#include "kernels/rope.h"

namespace echokv::model {
namespace {

// Upper bound on the float32 attention-score block of one prefill step
// ([H, query_block, context]); larger chunks are split along the queries.
constexpr int64_t kMaxScoreElements = int64_t{32} << 20;  // 128 MiB of float32

// Native weights in prefill: decoded into a float32 scratch of at most this many values
// (16 MiB) per product, panels of rows when a matrix is larger; the product of a panel
// goes through OpenBLAS like the float32 path's. No float32 copy of the model is kept.
constexpr int64_t kPanelValues = int64_t{4} << 20;

}  // namespace

at::Tensor Transformer::Impl::EmbedRows(const std::vector<int64_t>& ids) const {
  if (!embed.native()) {
    return embed.tensor.index_select(0, at::tensor(ids, at::kLong).to(options.device()));
  }
  const int64_t D = embed.cols();
  at::Tensor out = at::empty({static_cast<int64_t>(ids.size()), D}, at::kFloat);
  for (size_t i = 0; i < ids.size(); ++i) {
    kernels::DequantizeBlockRows(embed.blocks, ids[i], ids[i] + 1, out.data_ptr<float>() + i * D);
  }
  return out;
}

at::Tensor Transformer::Impl::Linear(const at::Tensor& x, const WeightMatrix& w, const at::Tensor& bias) const {
  if (!w.native()) return bias.defined() ? at::linear(x, w.tensor, bias) : at::linear(x, w.tensor);
  const at::Tensor in = x.contiguous();
  const int64_t m = in.size(0), rows = w.rows(), cols = w.cols();
  at::Tensor out = at::empty({m, rows}, at::kFloat);
  if (m <= 4) {
    NativeMatMul(w, in.data_ptr<float>(), m, bias.defined() ? bias.data_ptr<float>() : nullptr,
                 out.data_ptr<float>(), /*may_split=*/false);
    return out;
  }
  thread_local std::vector<float> scratch;
  const int64_t panel = std::max<int64_t>(1, std::min(rows, kPanelValues / cols));
  if (static_cast<int64_t>(scratch.size()) < panel * cols) scratch.resize(panel * cols);
  for (int64_t r0 = 0; r0 < rows; r0 += panel) {
    const int64_t r1 = std::min(rows, r0 + panel);
    DequantizeWeightRows(w, r0, r1, scratch.data());
    const at::Tensor wp = at::from_blob(scratch.data(), {r1 - r0, cols}, at::kFloat);
    if (r0 == 0 && r1 == rows) {
      if (bias.defined()) {
        at::addmm_out(out, bias, in, wp.t());
      } else {
        at::mm_out(out, in, wp.t());
      }
      return out;
    }
    at::Tensor part = at::mm(in, wp.t());
    if (bias.defined()) part.add_(bias.narrow(0, r0, r1 - r0));
    out.narrow(1, r0, r1 - r0).copy_(part);
  }
  return out;
}

at::Tensor Transformer::Impl::RmsNorm(const at::Tensor& x, const at::Tensor& weight) const {
  // HF LlamaRMSNorm: normalise in float32, cast back, then scale.
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor var = xf.pow(2).mean(-1, /*keepdim=*/true);
  at::Tensor normed = xf * at::rsqrt(var + config.rms_norm_eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor Transformer::Impl::Rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  at::Tensor xf = x.to(at::kFloat);
  const int64_t half = xf.size(-1) / 2;
  at::Tensor rotated = at::cat({-xf.narrow(-1, half, half), xf.narrow(-1, 0, half)}, -1);
  return (xf * cos + rotated * sin).to(x.scalar_type());
}

at::Tensor Transformer::Impl::Attention(int layer, const at::Tensor& q, const std::vector<int64_t>& qpos,
                                        const at::Tensor& k, const at::Tensor& v, const at::Tensor& kpos) const {
  const int64_t H = config.num_heads, G = config.num_kv_heads, r = H / G, d = config.head_dim;
  const int64_t m = q.size(1), n = k.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const bool window = config.UsesSlidingWindow(layer);
  at::Tensor kpos_dev = kpos.to(q.device());                       // [G, n]
  at::Tensor qpos_all = at::tensor(qpos, at::kLong).to(q.device());  // [m]
  at::Tensor out = at::empty({H, m, d}, q.options());
  const int64_t block = std::max<int64_t>(1, std::min<int64_t>(m, kMaxScoreElements / std::max<int64_t>(1, H * n)));
  at::Tensor kt = k.transpose(1, 2);  // [G, d, n]
  for (int64_t s = 0; s < m; s += block) {
    const int64_t b = std::min(block, m - s);
    at::Tensor qb = q.narrow(1, s, b).reshape({G, r * b, d});           // heads of a group together
    at::Tensor scores = at::bmm(qb, kt).to(at::kFloat).mul_(scale);   // [G, r*b, n]
    at::Tensor qp = qpos_all.narrow(0, s, b).view({1, b, 1});          // [1, b, 1]
    at::Tensor kp = kpos_dev.view({G, 1, n});                          // [G, 1, n]
    at::Tensor allowed = kp <= qp;                                     // [G, b, n]
    if (window) allowed = allowed & ((qp - kp) < config.sliding_window);
    allowed = allowed.unsqueeze(1).expand({G, r, b, n}).reshape({G, r * b, n});
    scores.masked_fill_(allowed.logical_not(), -std::numeric_limits<float>::infinity());
    at::Tensor probs = at::softmax(scores, -1).to(v.scalar_type());
    at::Tensor ob = at::bmm(probs, v);                                 // [G, r*b, d]
    out.narrow(1, s, b).copy_(ob.view({H, b, d}));
  }
  return out.transpose(0, 1).reshape({m, H * d});
}

at::Tensor Transformer::Impl::FusedAttention(int layer, const at::Tensor& q, const std::vector<int64_t>& qpos,
                                             const KvCache& cache) const {
  const int64_t H = config.num_heads, G = config.num_kv_heads, d = config.head_dim, m = q.size(1);
  at::Tensor qc = q.stride(2) == 1 ? q : q.contiguous();
  at::Tensor out = at::empty({m, H * d}, q.options());
  std::vector<const int64_t*> kpos(G);
  for (int64_t g = 0; g < G; ++g) kpos[g] = cache.cells().positions(layer, static_cast<int>(g)).data();
  kernels::CausalAttentionArgs a;
  a.num_heads = H;
  a.num_kv_heads = G;
  a.head_dim = d;
  a.q = qc.data_ptr<float>();
  a.q_row_stride = qc.stride(1);
  a.q_head_stride = qc.stride(0);
  a.m = m;
  a.q_positions = qpos.data();
  a.k = cache.KeyData(layer);
  a.v = cache.ValueData(layer);
  a.kv_group_stride = cache.GroupStride(layer);
  a.n = cache.size(layer);
  a.key_positions = kpos.data();
  a.sliding_window = config.UsesSlidingWindow(layer) ? config.sliding_window : 0;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  a.out = out.data_ptr<float>();
  a.out_row_stride = H * d;
  a.out_head_stride = d;
  pools->ForDecodeLoops();
  at::parallel_for(0, kernels::CausalAttentionWorkItems(a), 1,
                   [&](int64_t b, int64_t e) { kernels::CausalAttention(a, b, e); });
  pools->ForBatched();
  return out;
}

Transformer::Transformer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Transformer::~Transformer() = default;

const ModelConfig& Transformer::config() const { return impl_->config; }
const DeviceOptions& Transformer::device_options() const { return impl_->device_options; }
at::Tensor Transformer::RopeInvFreq() const { return impl_->inv_freq; }

KvCache Transformer::NewCache() const {
  return KvCache(impl_->config.num_layers, impl_->config.num_kv_heads, impl_->config.head_dim, impl_->options);
}



absl::StatusOr<ForwardResult> Transformer::Forward(absl::Span<const int> tokens, KvCache* cache,
                                                   const ForwardOptions& options) const {
  const ModelConfig& c = impl_->config;
  if (tokens.empty()) return absl::InvalidArgumentError("tokens: at least one token is required");
  if (cache == nullptr) return absl::InvalidArgumentError("cache must not be null");
  if (cache->num_layers() != c.num_layers || cache->num_kv_heads() != c.num_kv_heads ||
      cache->head_dim() != c.head_dim) {
    return absl::InvalidArgumentError("cache shape does not match the model (use Transformer::NewCache)");
  }
  if (options.chunk_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_size must be >= 1, got ", options.chunk_size));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", tokens[i], " at index ", i,
                                                     " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  const int64_t total = static_cast<int64_t>(tokens.size());
  const int64_t start = cache->next_position();
  const int64_t H = c.num_heads, G = c.num_kv_heads, d = c.head_dim;
  const int64_t keep = options.keep_last_queries < 0 ? total : std::min<int64_t>(options.keep_last_queries, total);
  const int64_t keep_from = total - keep;  // token index of the first kept query

  // CPU float32 (model and cache) attends with the fused kernel; other devices and
  // dtypes with the ATen composition (Impl::Attention).
  // An int8 cache (issue 31) attends over its dequantized rows by the composition.
  const bool fused = impl_->CanUseCpuKernels(*cache) && !cache->is_int8();
  impl_->pools->ForBatched();
  // Per-op laps for options.profile (nothing is timed without it).
  auto lap_start = std::chrono::steady_clock::now();
  auto lap = [&](double PrefillProfile::*field) {
    if (options.profile == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    if (field != nullptr) options.profile->*field += std::chrono::duration<double>(now - lap_start).count();
    lap_start = now;
  };
  ForwardResult result;
  std::vector<std::vector<at::Tensor>> kept_queries(c.num_layers);
  try {
    const at::Device dev = impl_->options.device();
    at::Tensor last_hidden;
    for (int64_t s = 0; s < total; s += options.chunk_size) {
      if (options.cancel != nullptr && options.cancel->load()) return absl::CancelledError("forward cancelled");
      const int64_t m = std::min<int64_t>(options.chunk_size, total - s);
      const bool last_chunk = s + m == total;
      // Per chunk, not once per call: whatever ran since the last chunk (a decode step
      // of the engine, say) may have handed the threads to the other pool.
      impl_->pools->ForBatched();
      impl_->RecordPools(&PoolTrace::prefill_chunks, &PoolTrace::prefill_chunk);
      std::vector<int64_t> pos(m);
      for (int64_t i = 0; i < m; ++i) pos[i] = start + s + i;
      at::Tensor cos, sin;
      kernels::RopeTables(pos, impl_->inv_freq, dev, &cos, &sin);  // [m, d]
      lap(&PrefillProfile::rope);
      std::vector<int64_t> ids(tokens.begin() + s, tokens.begin() + s + m);
      at::Tensor x = impl_->EmbedRows(ids);  // [m, D]
      lap(&PrefillProfile::embed);

      for (int l = 0; l < c.num_layers; ++l) {
        const Impl::Layer& w = impl_->layers[l];
        at::Tensor h = impl_->RmsNorm(x, w.input_norm);
        lap(&PrefillProfile::norms);
        at::Tensor qkv = impl_->Linear(h, w.wqkv, w.bqkv);
        lap(&PrefillProfile::qkv);
        at::Tensor q = qkv.narrow(1, 0, H * d).view({m, H, d}).transpose(0, 1);          // [H, m, d]
        at::Tensor k = qkv.narrow(1, H * d, G * d).view({m, G, d}).transpose(0, 1);      // [G, m, d]
        at::Tensor v = qkv.narrow(1, (H + G) * d, G * d).view({m, G, d}).transpose(0, 1);
        if (last_chunk && options.return_anchor_queries) {
          result.anchor_queries.push_back(q.select(1, m - 1).to(at::kFloat).to(at::kCPU).clone());  // [H, d]
        }
        q = Impl::Rope(q, cos, sin);
        k = Impl::Rope(k, cos, sin);
        lap(&PrefillProfile::rope);
        ECHOKV_RETURN_IF_ERROR(cache->Append(l, k, v, pos));
        if (s + m > keep_from) {
          const int64_t from = std::max<int64_t>(keep_from - s, 0);
          kept_queries[l].push_back(q.narrow(1, from, m - from).to(at::kFloat));
        }
        lap(&PrefillProfile::cache);
        at::Tensor attn = fused ? impl_->FusedAttention(l, q, pos, *cache)
                                : impl_->Attention(l, q, pos, cache->keys(l), cache->values(l), cache->positions(l));
        lap(&PrefillProfile::attention);
        at::Tensor o = impl_->Linear(attn, w.wo, w.bo);
        x = x + o;
        lap(&PrefillProfile::out_proj);
        at::Tensor h2 = impl_->RmsNorm(x, w.post_norm);
        lap(&PrefillProfile::norms);
        at::Tensor gu = impl_->Linear(h2, w.w_gate_up, at::Tensor());  // [m, 2I]
        const int64_t inter = c.intermediate_size;
        at::Tensor act = at::silu(gu.narrow(1, 0, inter)) * gu.narrow(1, inter, inter);
        x = x + impl_->Linear(act, w.w_down, at::Tensor());
        lap(&PrefillProfile::mlp);
      }
      cache->set_next_position(start + s + m);
      if (last_chunk) last_hidden = x.select(0, m - 1);
      if (options.progress) options.progress(s + m, total);
      lap(nullptr);  // the progress callback is the caller's time
    }
    at::Tensor normed = impl_->RmsNorm(last_hidden, impl_->final_norm);
    lap(&PrefillProfile::norms);
    result.logits = impl_->Linear(normed.unsqueeze(0), impl_->lm_head, at::Tensor()).squeeze(0).to(at::kFloat).to(at::kCPU).contiguous();
    lap(&PrefillProfile::lm_head);
    if (keep > 0) {
      for (int l = 0; l < c.num_layers; ++l) result.queries.push_back(at::cat(kept_queries[l], 1));
      for (int64_t i = keep_from; i < total; ++i) result.query_positions.push_back(start + i);
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("forward failed: ", ErrorText(e)));
  }
  return result;
}

absl::StatusOr<DecodeResult> Transformer::Decode(int token, KvCache* cache, bool return_queries) const {
  if (cache != nullptr && impl_->CanUseCpuKernels(*cache) && cache->num_layers() == impl_->config.num_layers &&
      cache->num_kv_heads() == impl_->config.num_kv_heads && cache->head_dim() == impl_->config.head_dim) {
    if (token < 0 || token >= impl_->config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", token, " at index 0 is outside the vocabulary [0, ",
                                                     impl_->config.vocab_size, ")"));
    }
    try {
      impl_->pools->ForDecodeLoops();
      impl_->RecordPools(&PoolTrace::decodes, &PoolTrace::decode);
      return impl_->DecodeCpu(token, cache, return_queries);
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("decode failed: ", ErrorText(e)));
    }
  }
  return DecodeWithForward(token, cache, return_queries);
}

absl::StatusOr<DecodeResult> Transformer::DecodeWithForward(int token, KvCache* cache, bool return_queries) const {
  ForwardOptions options;
  options.keep_last_queries = return_queries ? 1 : 0;
  const int tokens[1] = {token};
  ECHOKV_ASSIGN_OR_RETURN(ForwardResult r, Forward(absl::MakeConstSpan(tokens, 1), cache, options));
  DecodeResult out;
  out.logits = std::move(r.logits);
  if (return_queries) {
    for (at::Tensor& q : r.queries) out.queries.push_back(q.select(1, 0));  // [H, d]
  }
  return out;
}

absl::StatusOr<std::vector<DecodeResult>> Transformer::DecodeBatch(absl::Span<const DecodeRow> rows) const {
  const ModelConfig& c = impl_->config;
  bool fast = true;
  for (size_t i = 0; i < rows.size(); ++i) {
    const KvCache* cache = rows[i].cache;
    if (cache == nullptr) return absl::InvalidArgumentError(absl::StrCat("rows[", i, "].cache must not be null"));
    if (cache->num_layers() != c.num_layers || cache->num_kv_heads() != c.num_kv_heads ||
        cache->head_dim() != c.head_dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows[", i, "].cache shape does not match the model (use Transformer::NewCache)"));
    }
    if (rows[i].token < 0 || rows[i].token >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("rows[", i, "].token id ", rows[i].token,
                                                     " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
    for (size_t j = 0; j < i; ++j) {
      // Two rows appending to one cache would each attend without the other's entry.
      if (rows[j].cache == cache) {
        return absl::InvalidArgumentError(absl::StrCat("rows[", j, "] and rows[", i, "] share one cache"));
      }
    }
    fast = fast && impl_->CanUseCpuKernels(*cache);
  }
  std::vector<DecodeResult> out;
  if (rows.empty()) return out;
  if (rows.size() == 1 || !fast) {
    // The single-stream fast path unchanged; other devices/dtypes row by row.
    for (const DecodeRow& row : rows) {
      ECHOKV_ASSIGN_OR_RETURN(DecodeResult r, Decode(row.token, row.cache, row.return_queries));
      out.push_back(std::move(r));
    }
    return out;
  }
  try {
    return impl_->DecodeBatchCpu(rows);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("batched decode failed: ", ErrorText(e)));
  }
}

int64_t Transformer::DecodeWeightBytes() const {
  auto bytes = [](const WeightMatrix& m) -> int64_t {
    return m.native() ? m.NativeBytes() : static_cast<int64_t>(m.tensor.nbytes());
  };
  int64_t total = bytes(impl_->lm_head);
  for (const Impl::Layer& l : impl_->layers) total += bytes(l.wqkv) + bytes(l.wo) + bytes(l.w_gate_up) + bytes(l.w_down);
  return total;
}

PoolTrace Transformer::pool_trace() const {
  std::lock_guard<std::mutex> lock(impl_->trace_mu);
  PoolTrace t = impl_->trace;
  t.threads = impl_->pools->threads();
  return t;
}

}  // namespace echokv::model
