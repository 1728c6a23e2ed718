#include "model/kv_cells.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace echokv::model {

KvCells::KvCells(int num_layers, int num_kv_heads)
    : num_kv_heads_(num_kv_heads),
      layers_(num_layers, std::vector<std::vector<int64_t>>(num_kv_heads)) {}

int64_t KvCells::size(int layer) const {
  if (layer < 0 || layer >= num_layers() || layers_[layer].empty()) return 0;
  return static_cast<int64_t>(layers_[layer][0].size());
}

int64_t KvCells::TotalEntries() const {
  int64_t total = 0;
  for (int l = 0; l < num_layers(); ++l) total += size(l) * num_kv_heads_;
  return total;
}

absl::Status KvCells::AppendAll(int layer, absl::Span<const int64_t> positions) {
  if (layer < 0 || layer >= num_layers()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " out of range [0, ", num_layers(), ")"));
  }
  for (size_t i = 0; i < positions.size(); ++i) {
    if (positions[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("position ", positions[i], " is negative"));
    }
    if (i > 0 && positions[i] <= positions[i - 1]) {
      return absl::InvalidArgumentError("positions to append must be strictly increasing");
    }
  }
  if (!positions.empty()) {
    for (int g = 0; g < num_kv_heads_; ++g) {
      const auto& held = layers_[layer][g];
      if (!held.empty() && positions.front() <= held.back()) {
        return absl::InvalidArgumentError(absl::StrCat("position ", positions.front(), " is not after position ",
                                                       held.back(), " already held by group ", g,
                                                       " of layer ", layer));
      }
    }
  }
  for (int g = 0; g < num_kv_heads_; ++g) {
    layers_[layer][g].insert(layers_[layer][g].end(), positions.begin(), positions.end());
  }
  return absl::OkStatus();
}

absl::Status KvCells::Select(int layer, const std::vector<std::vector<int64_t>>& indices) {
  if (layer < 0 || layer >= num_layers()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " out of range [0, ", num_layers(), ")"));
  }
  if (static_cast<int>(indices.size()) != num_kv_heads_) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected indices for ", num_kv_heads_, " groups, got ", indices.size()));
  }
  const int64_t n = size(layer);
  for (int g = 0; g < num_kv_heads_; ++g) {
    if (indices[g].size() != indices[0].size()) {
      return absl::InvalidArgumentError(absl::StrCat("group ", g, " keeps ", indices[g].size(),
                                                     " entries but group 0 keeps ", indices[0].size(),
                                                     " (every group of a layer keeps the same count)"));
    }
    for (size_t i = 0; i < indices[g].size(); ++i) {
      const int64_t idx = indices[g][i];
      if (idx < 0 || idx >= n) {
        return absl::OutOfRangeError(
            absl::StrCat("index ", idx, " of group ", g, " out of range [0, ", n, ") in layer ", layer));
      }
      if (i > 0 && idx <= indices[g][i - 1]) {
        return absl::InvalidArgumentError(
            absl::StrCat("indices of group ", g, " in layer ", layer, " must be strictly ascending"));
      }
    }
  }
  for (int g = 0; g < num_kv_heads_; ++g) {
    std::vector<int64_t> kept;
    kept.reserve(indices[g].size());
    for (int64_t idx : indices[g]) kept.push_back(layers_[layer][g][idx]);
    layers_[layer][g] = std::move(kept);
  }
  return absl::OkStatus();
}

absl::Status KvCells::SetLayer(int layer, std::vector<std::vector<int64_t>> positions) {
  if (layer < 0 || layer >= num_layers()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " out of range [0, ", num_layers(), ")"));
  }
  if (static_cast<int>(positions.size()) != num_kv_heads_) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected positions for ", num_kv_heads_, " groups, got ", positions.size()));
  }
  for (size_t g = 0; g < positions.size(); ++g) {
    if (positions[g].size() != positions[0].size()) {
      return absl::InvalidArgumentError(absl::StrCat("group ", g, " holds ", positions[g].size(),
                                                     " positions, group 0 holds ", positions[0].size()));
    }
    for (size_t i = 0; i < positions[g].size(); ++i) {
      if (positions[g][i] < 0 || (i > 0 && positions[g][i] <= positions[g][i - 1])) {
        return absl::InvalidArgumentError(
            absl::StrCat("group ", g, " positions must be non-negative and strictly increasing (index ", i, ")"));
      }
    }
  }
  layers_[layer] = std::move(positions);
  return absl::OkStatus();
}

absl::Status KvCells::Truncate(int layer, int64_t n) {
  if (layer < 0 || layer >= num_layers()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " out of range [0, ", num_layers(), ")"));
  }
  if (n < 0 || n > size(layer)) {
    return absl::OutOfRangeError(absl::StrCat("truncate to ", n, " entries; layer ", layer, " holds ", size(layer)));
  }
  for (auto& group : layers_[layer]) group.resize(static_cast<size_t>(n));
  return absl::OkStatus();
}

}  // namespace echokv::model
