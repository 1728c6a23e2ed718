// The retained tier of a KV cache in int8 (issue 31), torch-free: per layer, keys and
// values [G, capacity, d] as int8 rows with one float32 scale per row (token x KV
// group; kernels/kv_quant.h's per-token format), plus the KvCells record of which
// position each entry holds, with KvCache's invariants (every group of a layer holds
// the same count; positions strictly increasing per group). Only new rows are
// quantized: Append quantizes the appended rows, Select gathers kept rows with their
// scales (no re-quantization, so a selection keeps every surviving row's bits), and
// Truncate drops rows. The decode attention reads it where it lies
// (kernels/attention_int8.h, AttentionArgs).
//
// Not yet used by KvCache, the decode path or the server: the first piece of issue 31's
// integration.
//
//   KvCacheInt8 c(/*num_layers=*/30, /*num_kv_heads=*/3, /*head_dim=*/64);
//   c.Append(0, k, v, /*m=*/L, positions);          // k, v: [G, L, d] float32
//   c.Select(0, {{0, 5, 9}, {1, 2, 9}, {3, 4, 5}});  // per-group kept entry indices
//   std::vector<const int64_t*> kpos;
//   kernels::DecodeAttentionInt8Args a = c.AttentionArgs(0, &kpos);  // + q, out, scale
#ifndef ECHOKV_MODEL_KV_CACHE_INT8_H_
#define ECHOKV_MODEL_KV_CACHE_INT8_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/attention_int8.h"
#include "model/kv_cells.h"

namespace echokv::model {

class KvCacheInt8 {
 public:
  KvCacheInt8() = default;
  KvCacheInt8(int num_layers, int num_kv_heads, int head_dim);

  int num_layers() const { return static_cast<int>(layers_.size()); }
  int num_kv_heads() const { return num_kv_heads_; }
  int head_dim() const { return head_dim_; }
  int64_t size(int layer) const { return cells_.size(layer); }
  const KvCells& cells() const { return cells_; }
  int64_t next_position() const { return next_position_; }
  void set_next_position(int64_t p) { next_position_ = p; }

  // Appends m entries to every group of `layer`: k, v point at G * m * d float32
  // values [G, m, d] (group-major), quantized per row; positions: m increasing values,
  // each above every held position (KvCells::AppendAll's checks, nothing changed on error).
  absl::Status Append(int layer, const float* k, const float* v, int64_t m, absl::Span<const int64_t> positions);
  // Keeps, per group, the entries at the given indices (KvCells::Select's rules):
  // rows and scales are moved, not re-quantized.
  absl::Status Select(int layer, const std::vector<std::vector<int64_t>>& indices);
  // Keeps the first n entries of every group of `layer`.
  absl::Status Truncate(int layer, int64_t n);

  // Raw storage of `layer`: group g's entry i at KeyData(layer) + g * GroupStride(layer)
  // + i * d, its scale at KeyScales(layer)[g * ScaleGroupStride(layer) + i] (same for
  // values). Valid until the next Append.
  const int8_t* KeyData(int layer) const { return layers_[layer].k.data(); }
  const int8_t* ValueData(int layer) const { return layers_[layer].v.data(); }
  const float* KeyScales(int layer) const { return layers_[layer].ks.data(); }
  const float* ValueScales(int layer) const { return layers_[layer].vs.data(); }
  int64_t GroupStride(int layer) const { return layers_[layer].capacity * head_dim_; }
  int64_t ScaleGroupStride(int layer) const { return layers_[layer].capacity; }

  // The cache fields of the decode attention's arguments for `layer` (shapes, int8
  // pointers, strides, key positions, which *positions holds); the caller sets
  // num_heads, q, q_head_stride, q_position, sliding_window, scale and out.
  kernels::DecodeAttentionInt8Args AttentionArgs(int layer, std::vector<const int64_t*>* positions) const;

  // The dequantized entries of `layer`, [G, n, d] float32 each (snapshots, tests).
  void Dequantize(int layer, std::vector<float>* k, std::vector<float>* v) const;

  // Bytes of keys, values and their scales actually held:
  // sum_l G * n_l * kernels::KvEntryBytes(kInt8, d) (capacity slack is not counted).
  int64_t KvBytes() const;

 private:
  struct Layer {
    int64_t capacity = 0;    // entries per group the storage holds
    std::vector<int8_t> k;   // [G, capacity, d]
    std::vector<int8_t> v;
    std::vector<float> ks;   // [G, capacity]
    std::vector<float> vs;
  };
  // Room for `needed` entries per group, keeping the first `held`.
  void EnsureCapacity(int layer, int64_t held, int64_t needed);

  int num_kv_heads_ = 0;
  int head_dim_ = 0;
  std::vector<Layer> layers_;
  KvCells cells_;
  int64_t next_position_ = 0;
};

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_KV_CACHE_INT8_H_
