// Writes a Hugging Face Llama-family checkpoint as one GGUF file in the layout
// llama.cpp's converter (convert_hf_to_gguf.py) gives: its tensor names, the q/k rows
// of llama/mistral models permuted for ggml's interleaved RoPE (LlamaModel.permute),
// the config as `<arch>.*` metadata, Llama 3.1 rope scaling as a `rope_freqs.weight`
// tensor of per-frequency factors, and the byte-level BPE tokenizer (tokenizer.json
// vocabulary, merges and added tokens, tokenizer_config.json's chat template) as
// `tokenizer.*` metadata when the directory has one. Weights are written as F32, F16
// or Q8_0 (quantized with ggml's reference rounding, as the gguf package does), BF16, Q4_K
// or Q6_K (our own plain rounding). Torch-free.
//
// For tests and benchmarks of the GGUF path: a model made by echokv-make-test-model
// and its GGUF twin must give the same logits (tests/model/gguf_model_test.cc).
//
//   GgufExportOptions o;
//   o.type = "f32";
//   ECHOKV_RETURN_IF_ERROR(ExportGguf("/tmp/tiny-llama", "/tmp/tiny-llama.gguf", o));
#ifndef ECHOKV_TOOLS_GGUF_EXPORT_H_
#define ECHOKV_TOOLS_GGUF_EXPORT_H_

#include <string>

#include "absl/status/status.h"

namespace echokv::tools {

struct GgufExportOptions {
  // Matrices' storage: "f32", "f16", "bf16", "q8_0", "q4_k" or "q6_k" (norms, biases and
  // rope_freqs stay f32; K-quant matrices whose rows are not whole 256-value super-blocks
  // are written as q8_0). q4_k / q6_k use plain min / max scales, not llama-quantize's
  // searched ones: for tests of the K-quant readers.
  std::string type = "f32";
  // Embedding matrix storage when it differs from `type` ("" = same).
  std::string embedding_type;
  // attn_v storage when it differs from `type` ("" = same): a fused q/k/v of mixed types,
  // as llama-quantize's Q4_K_M writes some layers.
  std::string v_type;
};

absl::Status ExportGguf(const std::string& model_dir, const std::string& out_path, const GgufExportOptions& options);

}  // namespace echokv::tools

#endif  // ECHOKV_TOOLS_GGUF_EXPORT_H_
