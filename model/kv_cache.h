// The KV cache of one sequence: per layer, keys and values [G, n, d] (post-RoPE keys
// at their original positions, never re-rotated) plus the tensor-free KvCells record
// of which position each entry holds. Different groups may hold different positions
// (after compression); within a layer every group holds the same count n, and n may
// differ between layers (PyramidKV). Storage grows by doubling, so appending a token
// is amortised O(1).
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
#include "model/kv_cells.h"

namespace echokv::model {

class KvCache {
 public:
  KvCache() = default;
  // An empty cache; `options` gives the dtype and device of keys and values.
  KvCache(int num_layers, int num_kv_heads, int head_dim, at::TensorOptions options);

  int num_layers() const { return static_cast<int>(layers_.size()); }
  int num_kv_heads() const { return num_kv_heads_; }
  int head_dim() const { return head_dim_; }
  at::TensorOptions options() const { return options_; }
  // Entries per group in `layer`.
  int64_t size(int layer) const { return cells_.size(layer); }
  // The position the next appended token takes (one past the last token ever held).
  int64_t next_position() const { return next_position_; }
  void set_next_position(int64_t p) { next_position_ = p; }

  // Views of the live entries: [G, n, d] (no copy; valid until the next append).
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

  // A new cache holding, for each layer l, the entries indices[l] ([G, n_l] int64,
  // ascending per group) of `src`. next_position is copied.
  static absl::StatusOr<KvCache> Gather(const KvCache& src, const std::vector<at::Tensor>& indices);
  // A deep copy (for forking a session).
  KvCache Clone() const;
  // Replaces `layer` with entries k, v [G, n, d] (converted to this cache's dtype and
  // device) at per-group positions [G][n] (strictly increasing) — a saved compact cache.
  absl::Status SetLayer(int layer, const at::Tensor& k, const at::Tensor& v,
                        std::vector<std::vector<int64_t>> positions);
  // A deep copy of the first n entries of every layer and group (n <= size(l) for every
  // layer); next_position = one past the last kept position (of layer 0, group 0; 0
  // when n = 0). Meant for full caches, whose groups all hold positions 0..size-1.
  absl::StatusOr<KvCache> ClonePrefix(int64_t n) const;
  // Drops every entry after the first n of each layer and sets next_position; the
  // storage is kept (a turn that failed is rolled back without a copy).
  absl::Status TruncateTo(int64_t n, int64_t next_position);

  // Bytes of keys and values actually held: 2 * sum_l(G * n_l * d) * sizeof(dtype)
  // (docs/ALGORITHM.md §7; capacity slack is not counted).
  int64_t KvBytes() const;
  // Bytes of the position bookkeeping (8 per entry per group).
  int64_t PositionBytes() const { return cells_.TotalEntries() * 8; }
  // Bytes of a full cache of `tokens` tokens with this cache's shape and dtype.
  int64_t FullEquivalentKvBytes(int64_t tokens) const;

 private:
  struct Layer {
    at::Tensor k;  // [G, capacity, d]
    at::Tensor v;  // [G, capacity, d]
  };
  void EnsureCapacity(int layer, int64_t needed);

  int num_kv_heads_ = 0;          // G
  int head_dim_ = 0;              // d
  at::TensorOptions options_;     // dtype/device of k and v
  std::vector<Layer> layers_;     // one per transformer layer
  KvCells cells_;                 // positions held, per layer and group
  int64_t next_position_ = 0;     // position of the next appended token
};

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_KV_CACHE_H_
