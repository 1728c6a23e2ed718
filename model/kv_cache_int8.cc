#include "model/kv_cache_int8.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/kv_quant.h"

namespace echokv::model {

KvCacheInt8::KvCacheInt8(int num_layers, int num_kv_heads, int head_dim)
    : num_kv_heads_(num_kv_heads), head_dim_(head_dim), layers_(num_layers), cells_(num_layers, num_kv_heads) {}

void KvCacheInt8::EnsureCapacity(int layer, int64_t held, int64_t needed) {
  Layer& l = layers_[layer];
  if (l.capacity >= needed) return;
  const int64_t cap = std::max<int64_t>({needed, 2 * l.capacity, 16});
  const int64_t G = num_kv_heads_, d = head_dim_, n = held;
  Layer grown;
  grown.capacity = cap;
  grown.k.resize(G * cap * d);
  grown.v.resize(G * cap * d);
  grown.ks.resize(G * cap);
  grown.vs.resize(G * cap);
  for (int64_t g = 0; g < G; ++g) {
    std::copy_n(l.k.data() + g * l.capacity * d, n * d, grown.k.data() + g * cap * d);
    std::copy_n(l.v.data() + g * l.capacity * d, n * d, grown.v.data() + g * cap * d);
    std::copy_n(l.ks.data() + g * l.capacity, n, grown.ks.data() + g * cap);
    std::copy_n(l.vs.data() + g * l.capacity, n, grown.vs.data() + g * cap);
  }
  l = std::move(grown);
}

absl::Status KvCacheInt8::Append(int layer, const float* k, const float* v, int64_t m,
                                 absl::Span<const int64_t> positions) {
  if (layer < 0 || layer >= num_layers()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " out of range [0, ", num_layers(), ")"));
  }
  if (static_cast<int64_t>(positions.size()) != m) {
    return absl::InvalidArgumentError(absl::StrCat("appending ", m, " entries with ", positions.size(), " positions"));
  }
  // The positions first: KvCells checks them and changes nothing when they are wrong.
  const int64_t n = size(layer);
  if (absl::Status s = cells_.AppendAll(layer, positions); !s.ok()) return s;
  EnsureCapacity(layer, n, n + m);  // (the cells already count the new rows)
  Layer& l = layers_[layer];
  const int64_t d = head_dim_;
  for (int64_t g = 0; g < num_kv_heads_; ++g) {
    kernels::QuantizeRowsInt8(k + g * m * d, m, d, l.k.data() + (g * l.capacity + n) * d,
                              l.ks.data() + g * l.capacity + n);
    kernels::QuantizeRowsInt8(v + g * m * d, m, d, l.v.data() + (g * l.capacity + n) * d,
                              l.vs.data() + g * l.capacity + n);
  }
  return absl::OkStatus();
}

absl::Status KvCacheInt8::Select(int layer, const std::vector<std::vector<int64_t>>& indices) {
  if (absl::Status s = cells_.Select(layer, indices); !s.ok()) return s;
  Layer& l = layers_[layer];
  const int64_t d = head_dim_;
  for (int64_t g = 0; g < num_kv_heads_; ++g) {
    // Indices ascend, so row i moves to slot i <= indices[g][i]: in place, front to back.
    for (size_t i = 0; i < indices[g].size(); ++i) {
      const int64_t from = g * l.capacity + indices[g][i], to = g * l.capacity + static_cast<int64_t>(i);
      if (from == to) continue;
      std::copy_n(l.k.data() + from * d, d, l.k.data() + to * d);
      std::copy_n(l.v.data() + from * d, d, l.v.data() + to * d);
      l.ks[to] = l.ks[from];
      l.vs[to] = l.vs[from];
    }
  }
  return absl::OkStatus();
}

absl::Status KvCacheInt8::Truncate(int layer, int64_t n) { return cells_.Truncate(layer, n); }

kernels::DecodeAttentionInt8Args KvCacheInt8::AttentionArgs(int layer, std::vector<const int64_t*>* positions) const {
  positions->resize(num_kv_heads_);
  for (int g = 0; g < num_kv_heads_; ++g) (*positions)[g] = cells_.positions(layer, g).data();
  kernels::DecodeAttentionInt8Args a;
  a.num_kv_heads = num_kv_heads_;
  a.head_dim = head_dim_;
  a.key_scaling = kernels::Int8KeyScaling::kPerToken;
  a.k = KeyData(layer);
  a.v = ValueData(layer);
  a.k_scales = KeyScales(layer);
  a.v_scales = ValueScales(layer);
  a.kv_group_stride = GroupStride(layer);
  a.k_scale_group_stride = ScaleGroupStride(layer);
  a.v_scale_group_stride = ScaleGroupStride(layer);
  a.n = size(layer);
  a.key_positions = positions->data();
  return a;
}

void KvCacheInt8::Dequantize(int layer, std::vector<float>* k, std::vector<float>* v) const {
  const Layer& l = layers_[layer];
  const int64_t G = num_kv_heads_, d = head_dim_, n = size(layer);
  k->resize(G * n * d);
  v->resize(G * n * d);
  for (int64_t g = 0; g < G; ++g) {
    kernels::DequantizeRowsInt8(l.k.data() + g * l.capacity * d, l.ks.data() + g * l.capacity, n, d,
                                k->data() + g * n * d);
    kernels::DequantizeRowsInt8(l.v.data() + g * l.capacity * d, l.vs.data() + g * l.capacity, n, d,
                                v->data() + g * n * d);
  }
}

int64_t KvCacheInt8::KvBytes() const {
  int64_t total = 0;
  for (int l = 0; l < num_layers(); ++l) total += size(l) * num_kv_heads_;
  return total * kernels::KvEntryBytes(kernels::KvDtype::kInt8, head_dim_);
}

}  // namespace echokv::model
