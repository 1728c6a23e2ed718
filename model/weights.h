// The tensors a Llama-family checkpoint must hold for a given config, and the check
// of a checkpoint against them (torch-free).
//
//   for (const ExpectedTensor& t : ExpectedTensors(cfg)) { ... t.name, t.shape ... }
//   ECHOKV_RETURN_IF_ERROR(ValidateCheckpoint(*ckpt, cfg));
#ifndef ECHOKV_MODEL_WEIGHTS_H_
#define ECHOKV_MODEL_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace echokv::model {

struct ExpectedTensor {
  std::string name;             // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
};

// Every tensor the transformer reads, in a fixed order. lm_head.weight is listed
// only when tie_word_embeddings is false.
std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config);

// Missing, unexpected or wrongly shaped tensors -> InvalidArgument naming the tensor
// (with expected vs actual shape). Tied checkpoints may still carry lm_head.weight
// (accepted when its shape matches). Rotary inv_freq buffers are ignored.
absl::Status ValidateCheckpoint(const Checkpoint& checkpoint, const ModelConfig& config);

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_WEIGHTS_H_
