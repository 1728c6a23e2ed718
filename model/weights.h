// Where a model's weights come from (WeightSource: a safetensors checkpoint, a GGUF
// file), the tensors a Llama-family model must hold for a given config, and the check
// of a source against them (torch-free).
//
//   for (const ExpectedTensor& t : ExpectedTensors(cfg)) { ... t.name, t.shape ... }
//   ECHOKV_RETURN_IF_ERROR(ValidateWeights(*ckpt, cfg));
//   std::vector<float> w(numel);
//   ECHOKV_RETURN_IF_ERROR(ckpt->ReadFloat32("model.norm.weight", w.data()));
#ifndef ECHOKV_MODEL_WEIGHTS_H_
#define ECHOKV_MODEL_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace echokv::model {

// A model's tensors by Hugging Face name ("model.layers.0.self_attn.q_proj.weight"),
// in Hugging Face's layout (row-major, [out, in] for projections).
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual std::vector<std::string> Names() const = 0;  // sorted
  // The tensor's shape; nullptr when there is no such tensor.
  virtual const std::vector<int64_t>* Shape(absl::string_view name) const = 0;
  // The stored bytes when they are plain F32 / F16 / BF16 in exactly that layout (a
  // view valid while the source lives); nullptr when they must be decoded (quantized
  // blocks, GGUF's permuted q/k rows): read those with ReadFloat32.
  virtual const TensorView* View(absl::string_view name) const = 0;
  // Writes the tensor's prod(shape) values as float32 to `out`.
  virtual absl::Status ReadFloat32(absl::string_view name, float* out) const = 0;
  // How the tensor is stored ("F32", "BF16", "Q4_1", ...), for logs; "" when absent.
  virtual std::string StoredType(absl::string_view name) const = 0;
  // The ggml type id of a tensor stored as GGUF blocks (model/ggml_types.h), or -1 when
  // the source keeps no such form (safetensors) or there is no such tensor.
  virtual int StoredGgmlType(absl::string_view name) const { return -1; }
  // Copies a 2-D tensor's stored bytes as they are (no decoding: one row after another,
  // each rows' cols / block_size blocks) with the rows in Hugging Face order (GGUF's q/k
  // row permutation undone), to `out` (the tensor's stored size). For the native-weight
  // path (DeviceOptions::weights); Unimplemented where StoredGgmlType is -1.
  virtual absl::Status ReadStoredRows(absl::string_view name, uint8_t* out) const {
    return absl::UnimplementedError("this weight source keeps no stored blocks");
  }
};

// WeightSource over a safetensors checkpoint (every tensor is a View; ReadFloat32
// converts F16 / BF16 exactly).
class CheckpointWeights : public WeightSource {
 public:
  explicit CheckpointWeights(const Checkpoint* checkpoint) : checkpoint_(checkpoint) {}
  std::vector<std::string> Names() const override { return checkpoint_->Names(); }
  const std::vector<int64_t>* Shape(absl::string_view name) const override;
  const TensorView* View(absl::string_view name) const override { return checkpoint_->Find(name); }
  absl::Status ReadFloat32(absl::string_view name, float* out) const override;
  std::string StoredType(absl::string_view name) const override;

 private:
  const Checkpoint* checkpoint_;  // not owned
};

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
absl::Status ValidateWeights(const WeightSource& weights, const ModelConfig& config);
absl::Status ValidateCheckpoint(const Checkpoint& checkpoint, const ModelConfig& config);

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_WEIGHTS_H_
