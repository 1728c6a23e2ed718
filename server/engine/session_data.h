// The tensors of one session (engine thread only; SessionStore holds them as an
// opaque handle). The hot tier is what decode attends to; in tiered mode the cold
// tier is the exact KV of every token the session has held (docs/SESSION_MEMORY.md §2)
// plus what re-selection needs besides K and V (§3).
//
//   auto data = std::make_shared<SessionData>();
//   data->hot = std::move(compact);            // B entries per layer and group
//   data->last_logits = logits;                // [V] float32: the next token's logits
#ifndef ECHOKV_SERVER_ENGINE_SESSION_DATA_H_
#define ECHOKV_SERVER_ENGINE_SESSION_DATA_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/kv_cache.h"

namespace echokv::server {

struct SessionData {
  model::KvCache hot;                 // compact cache; next_position = tokens_seen
  at::Tensor last_logits;             // [V] float32 CPU: logits for the next token
  std::vector<int> tokens;            // every token the session has held, in order

  // ---- tiered mode only ----
  // The exact history: every layer and group holds positions 0..cold_len-1. Shared
  // between the committed state and the turn in progress, which appends to it in
  // place (and truncates back on failure); readers use the first cold_len entries.
  std::shared_ptr<model::KvCache> cold;
  int64_t cold_len = 0;               // committed entries (= tokens_seen)
  // Post-RoPE queries of the last positions (SnapKV/PyramidKV window, LAQ's last 8):
  // per layer [H, w, d] float32, w <= max(snapkv_window, 8), and their positions.
  std::vector<at::Tensor> window_queries;
  std::vector<int64_t> window_positions;
  // H2O: per layer [G, cold_len] float32, each entry's accumulated causal attention
  // (group sum over heads) from every query so far (§3: exact, since a causal query's
  // weights over earlier keys never change). Empty for other policies.
  std::vector<at::Tensor> h2o_scores;
  // --state_dir: turns written since the last superseding (full) segment.
  int segments_since_full = 0;
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_ENGINE_SESSION_DATA_H_
