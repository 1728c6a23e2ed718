// Tensor-free bookkeeping of which original positions each layer and KV group
// holds (the idea of llama.cpp's llama-kv-cells.h). The KV tensors live in KvCache;
// entry i of group g in layer l is the token at position positions(l, g)[i].
// Invariant: within a layer every group holds the same number of entries, and each
// group's positions are strictly increasing.
//
//   KvCells cells(/*num_layers=*/5, /*num_kv_heads=*/4);
//   cells.AppendAll(/*layer=*/0, {0, 1, 2});                // same positions, every group
//   cells.Select(0, {{0, 2}, {1, 2}, {0, 1}, {0, 2}});      // per-group kept entry indices
//   int64_t n = cells.size(0);                              // 2
#ifndef ECHOKV_MODEL_KV_CELLS_H_
#define ECHOKV_MODEL_KV_CELLS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace echokv::model {

class KvCells {
 public:
  KvCells() = default;
  KvCells(int num_layers, int num_kv_heads);

  int num_layers() const { return static_cast<int>(layers_.size()); }
  int num_kv_heads() const { return num_kv_heads_; }
  // Entries per group in `layer`.
  int64_t size(int layer) const;
  // Total entries over all layers and groups.
  int64_t TotalEntries() const;
  const std::vector<int64_t>& positions(int layer, int group) const {
    return layers_[layer][group];
  }

  // Appends the same positions to every group of `layer`; each must exceed the
  // group's last position.
  absl::Status AppendAll(int layer, absl::Span<const int64_t> positions);
  // Keeps, per group, the entries at the given indices (ascending, unique, in range,
  // the same count for every group). indices.size() must equal num_kv_heads().
  absl::Status Select(int layer, const std::vector<std::vector<int64_t>>& indices);
  // Replaces `layer`'s entries with the given per-group positions (one vector per group,
  // equal lengths, strictly increasing) — restoring a saved compact cache.
  absl::Status SetLayer(int layer, std::vector<std::vector<int64_t>> positions);
  // Keeps the first n entries of every group of `layer` (n <= size(layer)).
  absl::Status Truncate(int layer, int64_t n);

  bool operator==(const KvCells& other) const {
    return num_kv_heads_ == other.num_kv_heads_ && layers_ == other.layers_;
  }

 private:
  int num_kv_heads_ = 0;                                  // G
  std::vector<std::vector<std::vector<int64_t>>> layers_;  // [layer][group] -> positions
};

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_KV_CELLS_H_
