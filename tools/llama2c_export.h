// Hugging Face Llama checkpoint -> llama2.c's legacy `.bin` files (torch-free), so that
// peers that read llama2.c checkpoints (llama.cpp's llama-convert-llama2c-to-ggml, run.c)
// can be benchmarked on exactly echokv's weights (bench/llamacpp_compare.sh,
// echokv-bench-model --llama2c-bin). Our code: it writes the format, it contains none of
// llama2.c's.
//
//   ECHOKV_RETURN_IF_ERROR(WriteLlama2cCheckpoint("/models/stories260K", "/tmp/model.bin"));
//   ECHOKV_RETURN_IF_ERROR(WriteLlama2cTokenizer("/models/stories260K/tokenizer.model", "/tmp/tok.bin"));
//
// Checkpoint layout (llama2.c export.py `legacy_export`, read by run.c):
//   int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
//     (vocab_size < 0: the classifier is NOT shared with the embedding and comes last)
//   float32 token_embedding[V, D]; attention_norm[L][D]; wq[L]; wk[L]; wv[L]; wo[L];
//   ffn_norm[L][D]; w1 (gate)[L]; w2 (down)[L]; w3 (up)[L]; final norm[D];
//   freqs_cos[seq_len, head_dim / 2]; freqs_sin[seq_len, head_dim / 2]; [wcls[V, D]]
// Every matrix is row-major [out, in], as nn.Linear and safetensors store it. HF's
// conversion script permutes the rows of q_proj and k_proj per head (the two rotary
// halves instead of llama2.c's interleaved pairs); that permutation is undone here.
#ifndef ECHOKV_TOOLS_LLAMA2C_EXPORT_H_
#define ECHOKV_TOOLS_LLAMA2C_EXPORT_H_

#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "absl/status/status.h"

namespace echokv::tools {

// Writes `out_path` from the F32 checkpoint in `model_dir` (config.json +
// model.safetensors). Refuses what the legacy format cannot hold (a head_dim other
// than hidden_size / num_heads, biases, sliding windows, rope scaling, non-F32 tensors),
// naming the field. The RoPE tables are cos/sin of float32 angles rounded once from
// double precision (PyTorch's own tables differ from these by at most 1 ulp; run.c
// and llama.cpp never read them). `seq_len` > 0 writes that context length (run.c's
// cap on its steps and the size of its caches) instead of max_position_embeddings.
absl::Status WriteLlama2cCheckpoint(const std::string& model_dir, const std::string& out_path,
                                    int64_t seq_len = 0);

// Writes llama2.c's tokenizer `.bin` (tokenizer.py `export`) from a SentencePiece
// tokenizer.model: uint32 max_token_length, then per id: float32 score, uint32 length,
// the piece's bytes with U+2581 replaced by a space, BOS/EOS as "\n<s>\n"/"\n</s>\n".
absl::Status WriteLlama2cTokenizer(const std::string& tokenizer_model_path, const std::string& out_path);

// Undoes HF's rotary permutation of a [n_heads * head_dim, cols] q/k projection:
// HF row h*d + j*(d/2) + i holds llama2.c row h*d + 2*i + j (i < d/2, j in {0, 1}).
void UnpermuteRotaryRows(absl::Span<const float> hf, int n_heads, int head_dim, int cols, absl::Span<float> out);

}  // namespace echokv::tools

#endif  // ECHOKV_TOOLS_LLAMA2C_EXPORT_H_
