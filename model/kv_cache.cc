#include "model/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/gather.h"

namespace echokv::model {
namespace {

std::string ShapeString(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) absl::StrAppend(&s, i ? ", " : "", t.size(i));
  return s + "]";
}

}  // namespace

KvCache::KvCache(int num_layers, int num_kv_heads, int head_dim, at::TensorOptions options)
    : num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      options_(options),
      layers_(num_layers),
      cells_(num_layers, num_kv_heads) {}

at::Tensor KvCache::keys(int layer) const {
  const Layer& l = layers_.at(layer);
  if (!l.k.defined()) return at::empty({num_kv_heads_, 0, head_dim_}, options_);
  return l.k.narrow(1, 0, size(layer));
}

at::Tensor KvCache::values(int layer) const {
  const Layer& l = layers_.at(layer);
  if (!l.v.defined()) return at::empty({num_kv_heads_, 0, head_dim_}, options_);
  return l.v.narrow(1, 0, size(layer));
}

at::Tensor KvCache::positions(int layer) const {
  const int64_t n = size(layer);
  at::Tensor out = at::empty({num_kv_heads_, n}, at::kLong);
  int64_t* p = out.data_ptr<int64_t>();
  for (int g = 0; g < num_kv_heads_; ++g) {
    const auto& pos = cells_.positions(layer, g);
    std::copy(pos.begin(), pos.end(), p + g * n);
  }
  return out;
}

void KvCache::EnsureCapacity(int layer, int64_t needed) {
  Layer& l = layers_[layer];
  const int64_t cap = l.k.defined() ? l.k.size(1) : 0;
  if (cap >= needed) return;
  const int64_t new_cap = std::max<int64_t>({needed, 2 * cap, 16});
  at::Tensor k = at::empty({num_kv_heads_, new_cap, head_dim_}, options_);
  at::Tensor v = at::empty({num_kv_heads_, new_cap, head_dim_}, options_);
  const int64_t n = size(layer);
  if (n > 0) {
    k.narrow(1, 0, n).copy_(l.k.narrow(1, 0, n));
    v.narrow(1, 0, n).copy_(l.v.narrow(1, 0, n));
  }
  l.k = std::move(k);
  l.v = std::move(v);
}

absl::Status KvCache::Append(int layer, const at::Tensor& k, const at::Tensor& v,
                             absl::Span<const int64_t> positions) {
  if (layer < 0 || layer >= num_layers()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " out of range [0, ", num_layers(), ")"));
  }
  const int64_t m = static_cast<int64_t>(positions.size());
  for (const at::Tensor* t : {&k, &v}) {
    if (t->dim() != 3 || t->size(0) != num_kv_heads_ || t->size(1) != m || t->size(2) != head_dim_) {
      return absl::InvalidArgumentError(absl::StrCat("KV to append has shape ", ShapeString(*t), ", expected [",
                                                     num_kv_heads_, ", ", m, ", ", head_dim_, "]"));
    }
  }
  // The new entries go into the capacity slack past size(layer) first; the cells
  // only grow when the positions are valid, so a failed append changes nothing.
  const int64_t n = size(layer);
  try {
    EnsureCapacity(layer, n + m);
    layers_[layer].k.narrow(1, n, m).copy_(k);
    layers_[layer].v.narrow(1, n, m).copy_(v);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("KV append failed: ", e.what_without_backtrace()));
  }
  return cells_.AppendAll(layer, positions);
}

absl::Status KvCache::AppendTail(const KvCache& src, int64_t count) {
  if (src.num_layers() != num_layers() || src.num_kv_heads_ != num_kv_heads_ || src.head_dim_ != head_dim_) {
    return absl::InvalidArgumentError("AppendTail: source cache has a different shape");
  }
  for (int l = 0; l < num_layers(); ++l) {
    const int64_t n = src.size(l);
    if (count < 0 || count > n) {
      return absl::OutOfRangeError(absl::StrCat("AppendTail: ", count, " entries asked, layer ", l, " holds ", n));
    }
    const std::vector<int64_t>& first = src.cells_.positions(l, 0);
    std::vector<int64_t> positions(first.end() - count, first.end());
    for (int g = 1; g < num_kv_heads_; ++g) {
      const std::vector<int64_t>& other = src.cells_.positions(l, g);
      if (!std::equal(positions.begin(), positions.end(), other.end() - count)) {
        return absl::InvalidArgumentError(
            absl::StrCat("AppendTail: the last ", count, " entries of layer ", l, " differ between groups"));
      }
    }
    ECHOKV_RETURN_IF_ERROR(Append(l, src.keys(l).narrow(1, n - count, count), src.values(l).narrow(1, n - count, count),
                                  positions));
  }
  next_position_ = src.next_position_;
  return absl::OkStatus();
}

absl::Status KvCache::AppendRow(int layer, const float* k, const float* v, int64_t position) {
  if (layer < 0 || layer >= num_layers()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " out of range [0, ", num_layers(), ")"));
  }
  if (options_.dtype() != at::kFloat || options_.device().type() != at::kCPU) {
    return absl::FailedPreconditionError("AppendRow needs a CPU float32 cache");
  }
  const int64_t n = size(layer);
  try {
    EnsureCapacity(layer, n + 1);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("KV append failed: ", e.what_without_backtrace()));
  }
  float* kd = layers_[layer].k.data_ptr<float>();
  float* vd = layers_[layer].v.data_ptr<float>();
  const int64_t stride = layers_[layer].k.size(1) * head_dim_;
  for (int g = 0; g < num_kv_heads_; ++g) {
    std::copy(k + g * head_dim_, k + (g + 1) * head_dim_, kd + g * stride + n * head_dim_);
    std::copy(v + g * head_dim_, v + (g + 1) * head_dim_, vd + g * stride + n * head_dim_);
  }
  const int64_t pos[1] = {position};
  return cells_.AppendAll(layer, pos);
}

const float* KvCache::KeyData(int layer) const {
  const Layer& l = layers_.at(layer);
  return l.k.defined() ? l.k.data_ptr<float>() : nullptr;
}

const float* KvCache::ValueData(int layer) const {
  const Layer& l = layers_.at(layer);
  return l.v.defined() ? l.v.data_ptr<float>() : nullptr;
}

int64_t KvCache::GroupStride(int layer) const {
  const Layer& l = layers_.at(layer);
  return l.k.defined() ? l.k.size(1) * head_dim_ : 0;
}

absl::StatusOr<KvCache> KvCache::Gather(const KvCache& src, const std::vector<at::Tensor>& indices) {
  if (static_cast<int>(indices.size()) != src.num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gather needs indices for ", src.num_layers(), " layers, got ", indices.size()));
  }
  KvCache out(src.num_layers(), src.num_kv_heads_, src.head_dim_, src.options_);
  out.next_position_ = src.next_position_;
  out.cells_ = src.cells_;
  try {
    for (int l = 0; l < src.num_layers(); ++l) {
      at::Tensor idx = indices[l].to(at::kCPU).to(at::kLong).contiguous();
      if (idx.dim() != 2 || idx.size(0) != src.num_kv_heads_) {
        return absl::InvalidArgumentError(absl::StrCat("indices of layer ", l, " have shape ", ShapeString(idx),
                                                       ", expected [", src.num_kv_heads_, ", n]"));
      }
      std::vector<std::vector<int64_t>> per_group(src.num_kv_heads_);
      const int64_t* p = idx.data_ptr<int64_t>();
      for (int g = 0; g < src.num_kv_heads_; ++g) {
        per_group[g].assign(p + g * idx.size(1), p + (g + 1) * idx.size(1));
      }
      if (absl::Status s = out.cells_.Select(l, per_group); !s.ok()) return s;
      if (idx.size(1) > 0) {
        out.layers_[l].k = kernels::GatherEntries(src.keys(l), idx);
        out.layers_[l].v = kernels::GatherEntries(src.values(l), idx);
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("KV gather failed: ", e.what_without_backtrace()));
  }
  return out;
}

KvCache KvCache::Clone() const {
  KvCache out(num_layers(), num_kv_heads_, head_dim_, options_);
  out.next_position_ = next_position_;
  out.cells_ = cells_;
  for (int l = 0; l < num_layers(); ++l) {
    if (size(l) > 0) {
      out.layers_[l].k = keys(l).clone();
      out.layers_[l].v = values(l).clone();
    }
  }
  return out;
}

absl::Status KvCache::SetLayer(int layer, const at::Tensor& k, const at::Tensor& v,
                              std::vector<std::vector<int64_t>> positions) {
  if (layer < 0 || layer >= num_layers()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " out of range [0, ", num_layers(), ")"));
  }
  const int64_t n = positions.empty() ? 0 : static_cast<int64_t>(positions[0].size());
  for (const at::Tensor* t : {&k, &v}) {
    if (t->dim() != 3 || t->size(0) != num_kv_heads_ || t->size(1) != n || t->size(2) != head_dim_) {
      return absl::InvalidArgumentError(absl::StrCat("KV of layer ", layer, " has shape ", ShapeString(*t),
                                                     ", expected [", num_kv_heads_, ", ", n, ", ", head_dim_, "]"));
    }
  }
  ECHOKV_RETURN_IF_ERROR(cells_.SetLayer(layer, std::move(positions)));
  try {
    layers_[layer].k = k.to(options_).contiguous().clone();
    layers_[layer].v = v.to(options_).contiguous().clone();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("KV restore failed: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::StatusOr<KvCache> KvCache::ClonePrefix(int64_t n) const {
  KvCache out(num_layers(), num_kv_heads_, head_dim_, options_);
  out.cells_ = cells_;
  for (int l = 0; l < num_layers(); ++l) {
    if (n < 0 || n > size(l)) {
      return absl::OutOfRangeError(absl::StrCat("ClonePrefix(", n, "): layer ", l, " holds ", size(l)));
    }
    ECHOKV_RETURN_IF_ERROR(out.cells_.Truncate(l, n));
    if (n > 0) {
      out.layers_[l].k = keys(l).narrow(1, 0, n).clone();
      out.layers_[l].v = values(l).narrow(1, 0, n).clone();
    }
  }
  out.next_position_ = n > 0 && num_layers() > 0 ? cells_.positions(0, 0)[n - 1] + 1 : 0;
  return out;
}

absl::Status KvCache::TruncateTo(int64_t n, int64_t next_position) {
  for (int l = 0; l < num_layers(); ++l) {
    if (n < 0 || n > size(l)) {
      return absl::OutOfRangeError(absl::StrCat("TruncateTo(", n, "): layer ", l, " holds ", size(l)));
    }
  }
  for (int l = 0; l < num_layers(); ++l) ECHOKV_RETURN_IF_ERROR(cells_.Truncate(l, n));
  next_position_ = next_position;
  return absl::OkStatus();
}

int64_t KvCache::KvBytes() const {
  const int64_t elem = static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(options_.dtype())));
  int64_t entries = 0;
  for (int l = 0; l < num_layers(); ++l) entries += size(l);
  return 2 * entries * num_kv_heads_ * head_dim_ * elem;
}

int64_t KvCache::FullEquivalentKvBytes(int64_t tokens) const {
  const int64_t elem = static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(options_.dtype())));
  return 2 * tokens * num_layers() * num_kv_heads_ * head_dim_ * elem;
}

}  // namespace echokv::model
