// A Llama-family model stored as one GGUF file: its ModelConfig from the metadata, its
// weights under Hugging Face names and layout (a WeightSource), and its tokenizer and
// chat template. Torch-free.
//
// Architectures (`general.architecture`): `llama` (Llama 1-3.x, SmolLM2, TinyLlama,
// Mistral 7B as llama.cpp converts it), `mistral` (same layout), `qwen2`. Tensor names
// map as llama.cpp's converter wrote them (`blk.N.attn_q.weight` <->
// `model.layers.N.self_attn.q_proj.weight`, ...). llama.cpp's converter permutes the q
// and k projection rows of `llama`/`mistral` models so that each head's RoPE pairs
// are adjacent (ggml's "normal" rope); ReadFloat32 undoes it, giving the rows Hugging
// Face's rotate_half layout expects (transformers' GGUF loader does the same: the
// golden logits of tests/model/gguf_model_test.cc are its output). `qwen2` files are
// not permuted (llama.cpp's NeoX rope is rotate_half). A `rope_freqs.weight` tensor
// (Llama 3.1+: one divisor per frequency) becomes ModelConfig::rope_freq_factors.
//
//   ECHOKV_ASSIGN_OR_RETURN(auto m, GgufModel::Open("/models/SmolLM2-135M-Instruct.Q4_1.gguf"));
//   const ModelConfig& cfg = m->config();
//   std::vector<float> w(576 * 576);
//   ECHOKV_RETURN_IF_ERROR(m->ReadFloat32("model.layers.0.self_attn.q_proj.weight", w.data()));
#ifndef ECHOKV_MODEL_GGUF_MODEL_H_
#define ECHOKV_MODEL_GGUF_MODEL_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/weights.h"

namespace echokv::model {

class GgufModel : public WeightSource {
 public:
  static absl::StatusOr<std::unique_ptr<GgufModel>> Open(const std::string& path);
  // Over an already parsed file (tests); `file` must outlive the result.
  static absl::StatusOr<std::unique_ptr<GgufModel>> FromFile(std::shared_ptr<const GgufFile> file);

  const GgufFile& file() const { return *file_; }
  const ModelConfig& config() const { return config_; }

  std::vector<std::string> Names() const override;
  const std::vector<int64_t>* Shape(absl::string_view name) const override;
  const TensorView* View(absl::string_view name) const override;
  absl::Status ReadFloat32(absl::string_view name, float* out) const override;
  std::string StoredType(absl::string_view name) const override;
  int StoredGgmlType(absl::string_view name) const override;
  absl::Status ReadStoredRows(absl::string_view name, uint8_t* out) const override;
  // The GGUF tensor behind a Hugging Face name; nullptr when absent.
  const GgufTensor* Tensor(absl::string_view name) const;

 private:
  struct Entry {
    const GgufTensor* tensor = nullptr;
    std::vector<int64_t> shape;  // Hugging Face shape
    int permute_heads = 0;       // > 0: undo llama.cpp's q/k row permutation over this many heads
    bool has_view = false;
    TensorView view;             // F32/F16/BF16 stored in HF layout
  };
  GgufModel() = default;
  absl::Status Build();

  std::shared_ptr<const GgufFile> file_;
  ModelConfig config_;
  std::map<std::string, Entry, std::less<>> entries_;  // by Hugging Face name
};

// ModelConfig from a GGUF file's metadata (and its tensor table: vocabulary size, tied
// embeddings, biases, rope_freqs). Errors name the metadata key.
absl::StatusOr<ModelConfig> GgufModelConfig(const GgufFile& file);

// The Hugging Face name of a GGUF tensor name ("blk.3.ffn_up.weight" ->
// "model.layers.3.mlp.up_proj.weight"); "" for names that have none.
std::string GgufToHfName(absl::string_view gguf_name);

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_GGUF_MODEL_H_
