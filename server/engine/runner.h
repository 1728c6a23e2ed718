// The engine's model runner: executes the decode rows of a step (every ready stream's
// pending token and every lookahead row of a compression job) as one batched model
// call. Model calls only; no scheduling, no sessions.
//
//   Runner runner(model.get());
//   std::vector<Runner::Row> rows = {{token, &stream_cache, false}, {x, view, true}};
//   std::vector<absl::StatusOr<compression::LookaheadDecoder::Step>> out = runner.Decode(rows);
#ifndef ECHOKV_SERVER_ENGINE_RUNNER_H_
#define ECHOKV_SERVER_ENGINE_RUNNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "compression/policy.h"
#include "model/kv_cache.h"
#include "model/transformer.h"

namespace echokv::server {

class Runner {
 public:
  explicit Runner(const model::Transformer* model) : model_(model) {}

  struct Row {
    int token = 0;                    // decoded at cache->next_position()
    model::KvCache* cache = nullptr;  // gets the token's KV appended
    bool want_queries = false;        // lookahead rows need the step's queries
  };
  // One decode step for every row; result i belongs to row i (logits [V] float32 CPU,
  // queries per layer [H, d] when asked). A failed batched call fails every row.
  std::vector<absl::StatusOr<compression::LookaheadDecoder::Step>> Decode(absl::Span<const Row> rows);

  // Decode rows run so far (for stats and tests).
  int64_t rows_decoded() const { return rows_decoded_; }
  int64_t batches() const { return batches_; }

 private:
  const model::Transformer* model_;  // not owned
  int64_t rows_decoded_ = 0;
  int64_t batches_ = 0;
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_ENGINE_RUNNER_H_
