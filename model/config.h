// Model configuration: Hugging Face config.json (+ generation_config.json) for the
// Llama family (model_type llama, mistral, qwen2), validated field by field.
//
//   ECHOKV_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig("/models/stories260K"));
//   int group = head / cfg.queries_per_kv();
//   bool window = cfg.UsesSlidingWindow(layer);   // Mistral sliding_window etc.
#ifndef ECHOKV_MODEL_CONFIG_H_
#define ECHOKV_MODEL_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace echokv::model {

enum class ModelType { kLlama, kMistral, kQwen2 };

// "llama", "mistral", "qwen2".
absl::string_view ModelTypeName(ModelType type);

// config.json "rope_scaling" (its "rope_type", or the older "type"). Each supported
// type only changes RoPE's inverse frequencies, once, at load; ComputeRopeInvFreq
// (model/transformer.h) applies it. "dynamic" (dynamic NTK) is refused: it recomputes
// the frequencies from the current sequence length, and echokv stores keys post-RoPE
// at their original positions and never re-rotates them (see ParseModelConfig).
enum class RopeScalingType {
  kNone,    // rope_scaling null or "default": plain RoPE
  kLinear,  // inv_freq / factor (positions divided by factor)
  kLlama3,  // Llama 3.1's three-band rescaling (transformers' _compute_llama3_parameters)
};

// "none", "linear", "llama3".
absl::string_view RopeScalingTypeName(RopeScalingType type);

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;                       // linear, llama3: >= 1
  double low_freq_factor = 1.0;              // llama3: > 0
  double high_freq_factor = 4.0;             // llama3: > low_freq_factor
  int original_max_position_embeddings = 0;  // llama3: > 0 (the pre-extension context)
  // Ranges for the fields `type` uses; the error names the rope_scaling field.
  absl::Status Validate() const;
};

struct ModelConfig {
  ModelType type = ModelType::kLlama;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;               // num_hidden_layers
  int num_heads = 0;                // num_attention_heads (H)
  int num_kv_heads = 0;             // num_key_value_heads (G); defaults to H when absent
  int head_dim = 0;                 // head_dim, else hidden_size / num_heads (d)
  int vocab_size = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;         // rope_scaling (kNone when null)
  // Per-frequency RoPE divisors ([head_dim / 2], all > 0) that a GGUF's
  // `rope_freqs.weight` carries (llama.cpp's form of Llama 3.1's scaling): inv_freq[i]
  // is divided by factor[i] after rope_scaling. Empty = none (Hugging Face configs).
  std::vector<float> rope_freq_factors;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;            // q/k/v projections carry a bias (Qwen2; Llama attention_bias)
  bool o_bias = false;              // o_proj carries a bias (Llama attention_bias)
  // Sliding-window attention: a query at position p sees keys at positions in
  // (p - sliding_window, p]. 0 = full causal attention.
  int sliding_window = 0;
  // Layers >= this index use the sliding window (Qwen2's max_window_layers); 0 = all layers.
  int sliding_window_first_layer = 0;
  int bos_token_id = -1;            // -1 = none
  std::vector<int> eos_token_ids;   // union of config.json and generation_config.json
  std::string torch_dtype;          // informational ("float32", "bfloat16", ...)

  int queries_per_kv() const { return num_heads / num_kv_heads; }
  bool UsesSlidingWindow(int layer) const {
    return sliding_window > 0 && layer >= sliding_window_first_layer;
  }
  // Checks every field's range and consistency; the error names the field.
  absl::Status Validate() const;
};

// Parses config.json text, then merges generation_config.json text (may be empty)
// for bos/eos ids. Missing or invalid fields -> InvalidArgument naming the field;
// a rope_scaling type other than default/linear/llama3 -> Unimplemented naming it.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view config_json,
                                             absl::string_view generation_config_json);

// Reads `dir`/config.json and, when present, `dir`/generation_config.json.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_CONFIG_H_
