// The KV cache of one sequence: per layer, keys and values [G, n, d] (post-RoPE keys
// at their original positions, never re-rotated) plus the tensor-free KvCells record
// of which position each entry holds. Different groups may hold different positions
// (after compression); within a layer every group holds the same count n, and n may
// differ between layers (PyramidKV). Storage grows by doubling, so appending a token
// is amortised O(1).
//
// Storage (issue 31): float32 / the options' dtype (the default), or int8 on the CPU
// (kernels/kv_quant.h's per-token format: each key and value row of d values as int8
// with one float32 scale per row and group). An int8 cache computes in float32: keys()
// and values() return dequantized copies, Append and AppendRow quantize exactly the new
// rows (a row's bits are what QuantizeRowsInt8 gives it alone, so re-quantizing a float32
// row always gives the same bits), and Gather / Clone / ClonePrefix move rows with their
// scales, never re-quantizing. The decode attention reads the int8 rows where they lie
// (Int8AttentionArgs, kernels/attention_int8.h).
//
//   KvCache cache = model->NewCache();
//   model->Forward(prompt_ids, &cache);                       // fills 0..L-1
//   KvCache compact = KvCache::Gather(cache, kept_indices);   // per layer [G, B] indices
//   model->Decode(next_token, &compact);                      // appends at position L
//   int64_t bytes = compact.KvBytes();
#ifndef ECHOKV_MODEL_KV_CACHE_H_
#define ECHOKV_MODEL_KV_CACHE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/attention_int8.h"
#include "kernels/kv_quant.h"
#include "model/kv_cells.h"

namespace echokv::model {

class KvCache {
 public:
  KvCache() = default;
  // An empty cache; `options` gives the dtype and device of keys and values (of what
  // keys() / values() return: float32 CPU for an int8 storage).
  KvCache(int num_layers, int num_kv_heads, int head_dim, at::TensorOptions options);
  // The same with a storage: kFloat32 = `options`' own dtype; kInt8 needs CPU float32
  // options; kBFloat16 is not a storage (use bfloat16 options). Checked, naming
  // "cache_dtype".
  static absl::StatusOr<KvCache> WithStorage(int num_layers, int num_kv_heads, int head_dim,
                                             at::TensorOptions options, kernels::KvDtype storage);

  int num_layers() const { return static_cast<int>(layers_.size()); }
  int num_kv_heads() const { return num_kv_heads_; }
  int head_dim() const { return head_dim_; }
  at::TensorOptions options() const { return options_; }
  kernels::KvDtype storage() const { return storage_; }
  bool is_int8() const { return storage_ == kernels::KvDtype::kInt8; }
  // Entries per group in `layer`.
  int64_t size(int layer) const { return cells_.size(layer); }
  // The position the next appended token takes (one past the last token ever held).
  int64_t next_position() const { return next_position_; }
  void set_next_position(int64_t p) { next_position_ = p; }

  // Views of the live entries: [G, n, d] (no copy; valid until the next append). An int8
  // cache returns dequantized float32 copies.
  at::Tensor keys(int layer) const;
  at::Tensor values(int layer) const;
  // [G, n] int64 CPU tensor of original positions (built from the cells).
  at::Tensor positions(int layer) const;
  const KvCells& cells() const { return cells_; }

  // Appends m entries to every group of `layer`: k, v [G, m, d] (any dtype/device;
  // converted), positions: m increasing values, each above every held position.
  absl::Status Append(int layer, const at::Tensor& k, const at::Tensor& v,
                      absl::Span<const int64_t> positions);

  // Appends, in every layer, the last `count` entries of `src` (same shape; those
  // entries must hold the same positions in every group, as tokens appended after a
  // compression do) and takes src's next_position. EchoKV's round 2 uses it to carry
  // round 1's lookahead KV onto the repaired workspace.
  absl::Status AppendTail(const KvCache& src, int64_t count);

  // Appends one entry to every group of `layer` from raw float32 rows (CPU float32
  // caches only; the decode fast path): k, v point at G * d floats, group-major.
  absl::Status AppendRow(int layer, const float* k, const float* v, int64_t position);
  // Raw float32 storage of `layer` (CPU float32 caches only): group g's entry i
  // starts at data + g * group_stride + i * d. Valid until the next append.
  const float* KeyData(int layer) const;
  const float* ValueData(int layer) const;
  int64_t GroupStride(int layer) const;
  // int8 caches: the decode attention's cache fields for `layer` (shapes, int8 rows and
  // scales where they lie, strides, key positions, which *positions holds); the caller
  // sets num_heads, q, q_head_stride, q_position, sliding_window, scale and out. Valid
  // until the next append.
  kernels::DecodeAttentionInt8Args Int8AttentionArgs(int layer, std::vector<const int64_t*>* positions) const;
  // int8 caches: the live rows [G, n, d] int8 and their scales [G, n] float32 (views).
  at::Tensor Int8Keys(int layer) const;
  at::Tensor Int8Values(int layer) const;
  at::Tensor KeyScales(int layer) const;
  at::Tensor ValueScales(int layer) const;

  // This cache in `storage`: a copy whose rows are quantized (float32 -> int8) or
  // dequantized (int8 -> float32); the same cache (shallow) when it already is.
  absl::StatusOr<KvCache> ToStorage(kernels::KvDtype storage) const;

  // A new cache holding, for each layer l, the entries indices[l] ([G, n_l] int64,
  // ascending per group) of `src`. next_position is copied.
  static absl::StatusOr<KvCache> Gather(const KvCache& src, const std::vector<at::Tensor>& indices);
  // A deep copy (for forking a session).
  KvCache Clone() const;
  // Replaces `layer` with entries k, v [G, n, d] (converted to this cache's dtype and
  // device) at per-group positions [G][n] (strictly increasing) — a saved compact cache.
  absl::Status SetLayer(int layer, const at::Tensor& k, const at::Tensor& v,
                        std::vector<std::vector<int64_t>> positions);
  // int8 caches: the same from saved int8 rows k, v [G, n, d] and scales ks, vs [G, n]
  // (kept bit for bit).
  absl::Status SetLayerInt8(int layer, const at::Tensor& k, const at::Tensor& ks, const at::Tensor& v,
                            const at::Tensor& vs, std::vector<std::vector<int64_t>> positions);
  // A deep copy of the first n entries of every layer and group (n <= size(l) for every
  // layer); next_position = one past the last kept position (of layer 0, group 0; 0
  // when n = 0). Meant for full caches, whose groups all hold positions 0..size-1.
  absl::StatusOr<KvCache> ClonePrefix(int64_t n) const;
  // Drops every entry after the first n of each layer and sets next_position; the
  // storage is kept (a turn that failed is rolled back without a copy).
  absl::Status TruncateTo(int64_t n, int64_t next_position);

  // Bytes of keys and values actually held: 2 * sum_l(G * n_l * d) * sizeof(dtype)
  // (docs/ALGORITHM.md §7; capacity slack is not counted); int8: sum_l G * n_l *
  // KvEntryBytes(kInt8, d), the scales included.
  int64_t KvBytes() const;
  // Bytes of the position bookkeeping (8 per entry per group).
  int64_t PositionBytes() const { return cells_.TotalEntries() * 8; }
  // Bytes of a full cache of `tokens` tokens with this cache's shape and options' dtype
  // (the uncompressed, unquantized reference: float32 for an int8 storage).
  int64_t FullEquivalentKvBytes(int64_t tokens) const;

 private:
  struct Layer {
    at::Tensor k;  // [G, capacity, d] (options' dtype, or int8)
    at::Tensor v;  // [G, capacity, d]
    at::Tensor ks;  // int8 only: [G, capacity] float32 row scales
    at::Tensor vs;
  };
  void EnsureCapacity(int layer, int64_t needed);
  // int8: quantizes m rows per group (k, v contiguous float32 [G, m, d]) into the slack
  // after the first `n` entries of `layer` (capacity already ensured).
  void QuantizeInto(int layer, int64_t n, const float* k, const float* v, int64_t m);
  at::Tensor Dequantized(const at::Tensor& rows, const at::Tensor& scales, int64_t n) const;
  // A deep copy of the first n entries of `layer`'s storage (rows and scales).
  Layer PrefixCopy(int layer, int64_t n) const;

  int num_kv_heads_ = 0;          // G
  int head_dim_ = 0;              // d
  at::TensorOptions options_;     // dtype/device of k and v (as keys() returns them)
  kernels::KvDtype storage_ = kernels::KvDtype::kFloat32;
  std::vector<Layer> layers_;     // one per transformer layer
  KvCells cells_;                 // positions held, per layer and group
  int64_t next_position_ = 0;     // position of the next appended token
};

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_KV_CACHE_H_
