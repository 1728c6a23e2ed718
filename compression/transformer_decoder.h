// Adapts model::Transformer to the LookaheadDecoder interface of the lookahead
// policies (LAQ, EchoKV): one DecodeStep = one Transformer::Decode with the queries
// returned. Counts the steps it ran (docs/ALGORITHM.md §3's "exactly T forward passes").
//
//   TransformerDecoder decoder(model.get());
//   CompressionInput in; in.decoder = &decoder; ...
//   ECHOKV_ASSIGN_OR_RETURN(CompressionResult r, Compress(cfg, in));
//   int passes = decoder.calls();                 // == cfg.lookahead when evicting
#ifndef ECHOKV_COMPRESSION_TRANSFORMER_DECODER_H_
#define ECHOKV_COMPRESSION_TRANSFORMER_DECODER_H_

#include "absl/status/statusor.h"
#include "compression/policy.h"
#include "model/kv_cache.h"
#include "model/transformer.h"

namespace echokv::compression {

class TransformerDecoder : public LookaheadDecoder {
 public:
  // `model` is not owned and must outlive the decoder.
  explicit TransformerDecoder(const model::Transformer* model) : model_(model) {}

  // model->Decode(token, view, /*return_queries=*/true): logits [V] float32 CPU and
  // per layer [H, d] float32 post-RoPE queries; appends the token's KV to `view`.
  absl::StatusOr<Step> DecodeStep(int token, model::KvCache* view) override;

  // Decode steps run so far (failed ones included).
  int calls() const { return calls_; }

 private:
  const model::Transformer* model_;  // not owned
  int calls_ = 0;                    // DecodeStep invocations
};

}  // namespace echokv::compression

#endif  // ECHOKV_COMPRESSION_TRANSFORMER_DECODER_H_
