// The bridge between sessions and the durable state store (server/state/): what one
// turn writes, how a session is rebuilt from what is on disk (no model pass: the hot
// tier is a gather of the cold tier at the saved positions), and the model fingerprint.
// Engine thread only (it reads session tensors).
//
// Blobs of a segment (docs/ARCHITECTURE.md "Durable session state"):
//   tiered, every turn:  cold.k.<l>, cold.v.<l>  [G, m, d] model dtype  the turn's m new tokens
//                        hot.pos.<l>             [G, n_l] int64        positions kept hot
//                        win.q.<l>  [H, w, d] f32, win.pos [w] i64      window queries (§3)
//                        h2o.<l>    [G, L] f32                          H2O scores (h2o only)
//                        logits     [V] f32                             the next token's logits
//   evict, every turn (supersedes the earlier ones):
//                        hot.k.<l>, hot.v.<l> [G, n_l, d], hot.pos.<l>, logits
// A tiered segment written by Export from memory holds the whole cold tier at once and
// supersedes: the loader concatenates every segment's cold blobs in token order.
//
//   ECHOKV_ASSIGN_OR_RETURN(TurnRecord rec, EncodeTurn(meta, *data, tokens_before, false));
//   ECHOKV_RETURN_IF_ERROR(state_store->WriteTurn(rec.meta, rec.segment));
//   ECHOKV_ASSIGN_OR_RETURN(auto data, LoadSessionData(*reader, *model));
#ifndef ECHOKV_SERVER_ENGINE_PERSISTENCE_H_
#define ECHOKV_SERVER_ENGINE_PERSISTENCE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/transformer.h"
#include "server/engine/session_data.h"
#include "server/engine/session_store.h"
#include "server/state/store.h"
#include "server/state/types.h"

namespace echokv::server {

// 128-bit fingerprint of a model directory: config.json and every tensor (name, dtype,
// shape, bytes) of its checkpoint.
absl::StatusOr<state::ModelFingerprint> FingerprintModelDir(const std::string& dir);

// One turn ready to write. The segment's blob views point into `keep_alive`.
struct TurnRecord {
  state::SavedSession meta;
  state::NewSegment segment;
  std::vector<at::Tensor> keep_alive;  // contiguous CPU tensors the views read
};

// The record of a turn that produced `data`: tiered sessions write the cold KV of the
// tokens after `tokens_before` (all of it when `full`, superseding the earlier
// segments), evict sessions write their whole compact cache (always superseding).
absl::StatusOr<TurnRecord> EncodeTurn(const SessionInfo& meta, const SessionData& data, int64_t tokens_before,
                                      bool full);

// The engine's metadata as saved (config, report and chat messages in the opaque JSON).
state::SavedSession ToStateMeta(const SessionInfo& meta, const SessionData& data);

// Metadata of a saved session without reading payloads: hot bytes and entries from the
// blob shapes; cold_in_memory = false (the tensors load on first use).
absl::StatusOr<SessionInfo> MetaFromManifest(const state::SessionManifest& manifest, const model::Transformer& model);

// Rebuilds the session's tensors from disk (reads every blob it needs once).
absl::StatusOr<std::shared_ptr<SessionData>> LoadSessionData(const state::SessionReader& reader,
                                                             const model::Transformer& model);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_ENGINE_PERSISTENCE_H_
