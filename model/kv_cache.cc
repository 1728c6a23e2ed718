#include "model/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/errors.h"
#include "common/status_macros.h"
#include "kernels/gather.h"
#include "kernels/kv_quant.h"

namespace echokv::model {
namespace {

std::string ShapeString(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) absl::StrAppend(&s, i ? ", " : "", t.size(i));
  return s + "]";
}

// int8 rows [G, cap, d] and float32 scales [G, cap], zeroed scales (an unwritten slot
// dequantizes to 0, never to garbage).
void AllocInt8(int64_t G, int64_t cap, int64_t d, at::Tensor* k, at::Tensor* v, at::Tensor* ks, at::Tensor* vs) {
  *k = at::empty({G, cap, d}, at::kChar);
  *v = at::empty({G, cap, d}, at::kChar);
  *ks = at::zeros({G, cap}, at::kFloat);
  *vs = at::zeros({G, cap}, at::kFloat);
}

}  // namespace

absl::StatusOr<KvCache> KvCache::WithStorage(int num_layers, int num_kv_heads, int head_dim,
                                             at::TensorOptions options, kernels::KvDtype storage) {
  KvCache out(num_layers, num_kv_heads, head_dim, options);
  switch (storage) {
    case kernels::KvDtype::kFloat32:
      return out;
    case kernels::KvDtype::kInt8:
      if (options.dtype() != at::kFloat || !options.device().is_cpu()) {
        return MakeError(ErrorKind::kInvalidArgument, "cache_dtype",
                         "cache_dtype int8 needs the CPU float32 model (this server computes in another dtype "
                         "or on another device)");
      }
      out.storage_ = storage;
      return out;
    case kernels::KvDtype::kBFloat16:
      break;
  }
  return MakeError(ErrorKind::kInvalidArgument, "cache_dtype",
                   absl::StrCat("cache_dtype ", kernels::KvDtypeName(storage), " is not a cache storage here (float32, int8)"));
}

at::Tensor KvCache::Dequantized(const at::Tensor& rows, const at::Tensor& scales, int64_t n) const {
  const int64_t G = num_kv_heads_, d = head_dim_;
  at::Tensor out = at::empty({G, n, d}, at::kFloat);
  if (n == 0) return out;
  const int64_t cap = rows.size(1);
  for (int64_t g = 0; g < G; ++g) {
    kernels::DequantizeRowsInt8(rows.data_ptr<int8_t>() + g * cap * d, scales.data_ptr<float>() + g * cap, n, d,
                                out.data_ptr<float>() + g * n * d);
  }
  return out;
}

void KvCache::QuantizeInto(int layer, int64_t n, const float* k, const float* v, int64_t m) {
  Layer& l = layers_[layer];
  const int64_t cap = l.k.size(1), d = head_dim_;
  int8_t* kd = l.k.data_ptr<int8_t>();
  int8_t* vd = l.v.data_ptr<int8_t>();
  float* ks = l.ks.data_ptr<float>();
  float* vs = l.vs.data_ptr<float>();
  for (int64_t g = 0; g < num_kv_heads_; ++g) {
    kernels::QuantizeRowsInt8(k + g * m * d, m, d, kd + (g * cap + n) * d, ks + g * cap + n);
    kernels::QuantizeRowsInt8(v + g * m * d, m, d, vd + (g * cap + n) * d, vs + g * cap + n);
  }
}

KvCache::KvCache(int num_layers, int num_kv_heads, int head_dim, at::TensorOptions options)
    : num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      options_(options),
      layers_(num_layers),
      cells_(num_layers, num_kv_heads) {}

at::Tensor KvCache::keys(int layer) const {
  const Layer& l = layers_.at(layer);
  if (!l.k.defined()) return at::empty({num_kv_heads_, 0, head_dim_}, options_);
  if (is_int8()) return Dequantized(l.k, l.ks, size(layer));
  return l.k.narrow(1, 0, size(layer));
}

at::Tensor KvCache::values(int layer) const {
  const Layer& l = layers_.at(layer);
  if (!l.v.defined()) return at::empty({num_kv_heads_, 0, head_dim_}, options_);
  if (is_int8()) return Dequantized(l.v, l.vs, size(layer));
  return l.v.narrow(1, 0, size(layer));
}

at::Tensor KvCache::Int8Keys(int layer) const {
  const Layer& l = layers_.at(layer);
  if (!l.k.defined()) return at::empty({num_kv_heads_, 0, head_dim_}, at::kChar);
  return l.k.narrow(1, 0, size(layer));
}

at::Tensor KvCache::Int8Values(int layer) const {
  const Layer& l = layers_.at(layer);
  if (!l.v.defined()) return at::empty({num_kv_heads_, 0, head_dim_}, at::kChar);
  return l.v.narrow(1, 0, size(layer));
}

at::Tensor KvCache::KeyScales(int layer) const {
  const Layer& l = layers_.at(layer);
  if (!l.ks.defined()) return at::empty({num_kv_heads_, 0}, at::kFloat);
  return l.ks.narrow(1, 0, size(layer));
}

at::Tensor KvCache::ValueScales(int layer) const {
  const Layer& l = layers_.at(layer);
  if (!l.vs.defined()) return at::empty({num_kv_heads_, 0}, at::kFloat);
  return l.vs.narrow(1, 0, size(layer));
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
  const int64_t n = size(layer);
  if (is_int8()) {
    Layer grown;
    AllocInt8(num_kv_heads_, new_cap, head_dim_, &grown.k, &grown.v, &grown.ks, &grown.vs);
    if (n > 0) {
      grown.k.narrow(1, 0, n).copy_(l.k.narrow(1, 0, n));
      grown.v.narrow(1, 0, n).copy_(l.v.narrow(1, 0, n));
      grown.ks.narrow(1, 0, n).copy_(l.ks.narrow(1, 0, n));
      grown.vs.narrow(1, 0, n).copy_(l.vs.narrow(1, 0, n));
    }
    l = std::move(grown);
    return;
  }
  at::Tensor k = at::empty({num_kv_heads_, new_cap, head_dim_}, options_);
  at::Tensor v = at::empty({num_kv_heads_, new_cap, head_dim_}, options_);
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
    if (is_int8()) {
      const at::Tensor kf = k.to(at::kCPU, at::kFloat).contiguous(), vf = v.to(at::kCPU, at::kFloat).contiguous();
      QuantizeInto(layer, n, kf.data_ptr<float>(), vf.data_ptr<float>(), m);
    } else {
      layers_[layer].k.narrow(1, n, m).copy_(k);
      layers_[layer].v.narrow(1, n, m).copy_(v);
    }
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
    if (is_int8() && src.is_int8()) {
      // Rows move with their scales (no re-quantization); the cells grow only when the
      // positions are valid, as in Append.
      const int64_t held = size(l);
      EnsureCapacity(l, held + count);
      ECHOKV_RETURN_IF_ERROR(cells_.AppendAll(l, positions));
      Layer& dst = layers_[l];
      const Layer& from = src.layers_[l];
      dst.k.narrow(1, held, count).copy_(from.k.narrow(1, n - count, count));
      dst.v.narrow(1, held, count).copy_(from.v.narrow(1, n - count, count));
      dst.ks.narrow(1, held, count).copy_(from.ks.narrow(1, n - count, count));
      dst.vs.narrow(1, held, count).copy_(from.vs.narrow(1, n - count, count));
      continue;
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
  if (is_int8()) {
    // k, v are [G, 1, d] group-major: one row per group.
    QuantizeInto(layer, n, k, v, 1);
    const int64_t pos[1] = {position};
    return cells_.AppendAll(layer, pos);
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
  return l.k.defined() && !is_int8() ? l.k.data_ptr<float>() : nullptr;
}

const float* KvCache::ValueData(int layer) const {
  const Layer& l = layers_.at(layer);
  return l.v.defined() && !is_int8() ? l.v.data_ptr<float>() : nullptr;
}

int64_t KvCache::GroupStride(int layer) const {
  const Layer& l = layers_.at(layer);
  return l.k.defined() ? l.k.size(1) * head_dim_ : 0;
}

kernels::DecodeAttentionInt8Args KvCache::Int8AttentionArgs(int layer, std::vector<const int64_t*>* positions) const {
  positions->resize(num_kv_heads_);
  for (int g = 0; g < num_kv_heads_; ++g) (*positions)[g] = cells_.positions(layer, g).data();
  const Layer& l = layers_.at(layer);
  kernels::DecodeAttentionInt8Args a;
  a.num_kv_heads = num_kv_heads_;
  a.head_dim = head_dim_;
  a.key_scaling = kernels::Int8KeyScaling::kPerToken;
  a.n = size(layer);
  a.key_positions = positions->data();
  if (!is_int8() || !l.k.defined()) return a;
  const int64_t cap = l.k.size(1);
  a.k = l.k.data_ptr<int8_t>();
  a.v = l.v.data_ptr<int8_t>();
  a.k_scales = l.ks.data_ptr<float>();
  a.v_scales = l.vs.data_ptr<float>();
  a.kv_group_stride = cap * head_dim_;
  a.k_scale_group_stride = cap;
  a.v_scale_group_stride = cap;
  return a;
}

absl::StatusOr<KvCache> KvCache::ToStorage(kernels::KvDtype storage) const {
  if (storage == storage_) return *this;
  ECHOKV_ASSIGN_OR_RETURN(KvCache out,
                          WithStorage(num_layers(), num_kv_heads_, head_dim_, options_, storage));
  out.cells_ = cells_;
  out.next_position_ = next_position_;
  try {
    for (int l = 0; l < num_layers(); ++l) {
      const int64_t n = size(l);
      if (n == 0) continue;
      Layer& dst = out.layers_[l];
      if (out.is_int8()) {
        AllocInt8(num_kv_heads_, n, head_dim_, &dst.k, &dst.v, &dst.ks, &dst.vs);
        const at::Tensor k = keys(l).to(at::kFloat).contiguous(), v = values(l).to(at::kFloat).contiguous();
        out.QuantizeInto(l, 0, k.data_ptr<float>(), v.data_ptr<float>(), n);
      } else {
        dst.k = keys(l).to(options_).contiguous();  // dequantized copies
        dst.v = values(l).to(options_).contiguous();
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("KV conversion failed: ", e.what_without_backtrace()));
  }
  return out;
}

absl::StatusOr<KvCache> KvCache::Gather(const KvCache& src, const std::vector<at::Tensor>& indices) {
  if (static_cast<int>(indices.size()) != src.num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gather needs indices for ", src.num_layers(), " layers, got ", indices.size()));
  }
  KvCache out(src.num_layers(), src.num_kv_heads_, src.head_dim_, src.options_);
  out.storage_ = src.storage_;
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
      if (idx.size(1) > 0 && src.is_int8()) {
        // Rows with their scales, as they are (no re-quantization).
        Layer& dst = out.layers_[l];
        dst.k = kernels::GatherEntries(src.Int8Keys(l), idx);
        dst.v = kernels::GatherEntries(src.Int8Values(l), idx);
        dst.ks = kernels::GatherEntries(src.KeyScales(l).unsqueeze(-1), idx).squeeze(-1).contiguous();
        dst.vs = kernels::GatherEntries(src.ValueScales(l).unsqueeze(-1), idx).squeeze(-1).contiguous();
      } else if (idx.size(1) > 0) {
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
  out.storage_ = storage_;
  out.next_position_ = next_position_;
  out.cells_ = cells_;
  for (int l = 0; l < num_layers(); ++l) out.layers_[l] = PrefixCopy(l, size(l));
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
    if (is_int8()) {
      Layer& l = layers_[layer];
      AllocInt8(num_kv_heads_, n, head_dim_, &l.k, &l.v, &l.ks, &l.vs);
      const at::Tensor kf = k.to(at::kCPU, at::kFloat).contiguous(), vf = v.to(at::kCPU, at::kFloat).contiguous();
      if (n > 0) QuantizeInto(layer, 0, kf.data_ptr<float>(), vf.data_ptr<float>(), n);
    } else {
      layers_[layer].k = k.to(options_).contiguous().clone();
      layers_[layer].v = v.to(options_).contiguous().clone();
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("KV restore failed: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::Status KvCache::SetLayerInt8(int layer, const at::Tensor& k, const at::Tensor& ks, const at::Tensor& v,
                                   const at::Tensor& vs, std::vector<std::vector<int64_t>> positions) {
  if (!is_int8()) return absl::FailedPreconditionError("SetLayerInt8 needs an int8 cache");
  if (layer < 0 || layer >= num_layers()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " out of range [0, ", num_layers(), ")"));
  }
  const int64_t n = positions.empty() ? 0 : static_cast<int64_t>(positions[0].size());
  for (const at::Tensor* t : {&k, &v}) {
    if (t->scalar_type() != at::kChar || t->dim() != 3 || t->size(0) != num_kv_heads_ || t->size(1) != n ||
        t->size(2) != head_dim_) {
      return absl::InvalidArgumentError(absl::StrCat("int8 KV of layer ", layer, " has shape ", ShapeString(*t),
                                                     ", expected int8 [", num_kv_heads_, ", ", n, ", ", head_dim_, "]"));
    }
  }
  for (const at::Tensor* t : {&ks, &vs}) {
    if (t->scalar_type() != at::kFloat || t->dim() != 2 || t->size(0) != num_kv_heads_ || t->size(1) != n) {
      return absl::InvalidArgumentError(absl::StrCat("KV scales of layer ", layer, " have shape ", ShapeString(*t),
                                                     ", expected float32 [", num_kv_heads_, ", ", n, "]"));
    }
  }
  ECHOKV_RETURN_IF_ERROR(cells_.SetLayer(layer, std::move(positions)));
  Layer& l = layers_[layer];
  l.k = k.to(at::kCPU).contiguous().clone();
  l.v = v.to(at::kCPU).contiguous().clone();
  l.ks = ks.to(at::kCPU).contiguous().clone();
  l.vs = vs.to(at::kCPU).contiguous().clone();
  return absl::OkStatus();
}

KvCache::Layer KvCache::PrefixCopy(int layer, int64_t n) const {
  Layer out;
  if (n == 0) return out;
  const Layer& l = layers_[layer];
  out.k = l.k.narrow(1, 0, n).clone();
  out.v = l.v.narrow(1, 0, n).clone();
  if (is_int8()) {
    out.ks = l.ks.narrow(1, 0, n).clone();
    out.vs = l.vs.narrow(1, 0, n).clone();
  }
  return out;
}

absl::StatusOr<KvCache> KvCache::ClonePrefix(int64_t n) const {
  KvCache out(num_layers(), num_kv_heads_, head_dim_, options_);
  out.storage_ = storage_;
  out.cells_ = cells_;
  for (int l = 0; l < num_layers(); ++l) {
    if (n < 0 || n > size(l)) {
      return absl::OutOfRangeError(absl::StrCat("ClonePrefix(", n, "): layer ", l, " holds ", size(l)));
    }
    ECHOKV_RETURN_IF_ERROR(out.cells_.Truncate(l, n));
    out.layers_[l] = PrefixCopy(l, n);
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
  if (is_int8()) {
    int64_t entries = 0;
    for (int l = 0; l < num_layers(); ++l) entries += size(l);
    return entries * num_kv_heads_ * kernels::KvEntryBytes(kernels::KvDtype::kInt8, head_dim_);
  }
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
