// The Llama-family transformer (Llama, Mistral, Qwen2) on LibTorch: HF rotate_half
// RoPE with float32 angles, RMSNorm, SwiGLU, grouped-query attention over a KvCache
// whose groups may each hold their own entries.
//
//   DeviceOptions dev;                                   // cpu / float32 by default
//   ECHOKV_ASSIGN_OR_RETURN(auto model, Transformer::Load("/models/stories260K", dev));  // or a .gguf
//   KvCache cache = model->NewCache();
//   ForwardOptions fo; fo.return_anchor_queries = true; fo.keep_last_queries = 32;
//   ECHOKV_ASSIGN_OR_RETURN(ForwardResult pre, model->Forward(prompt, &cache, fo));
//   ECHOKV_ASSIGN_OR_RETURN(DecodeResult step, model->Decode(token, &cache));
#ifndef ECHOKV_MODEL_TRANSFORMER_H_
#define ECHOKV_MODEL_TRANSFORMER_H_

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace echokv::model {

struct DeviceOptions {
  std::string device = "cpu";     // "cpu", "cuda", "cuda:N"
  std::string dtype = "float32";  // "float32", "bfloat16", "float16"
  // Compute threads (0 = echokv::DefaultThreadCount()): OpenBLAS gets them in batched
  // products, LibTorch's OpenMP team in the decode loops; one pool is busy at a time.
  int num_threads = 0;
  // "float32" (the exact reference, the default): every weight decoded to float32 at
  // load. "native" (CPU float32 only): matrices a GGUF file stores as Q4_0 / Q4_1 / Q8_0
  // / Q4_K / Q6_K blocks or F16 / BF16 rows stay in that form and decode computes on
  // them (kernels/block_matmul.h: inputs quantized to int8 per 32 values, float32 for
  // F16 / BF16); prefill decodes them a matrix at a time into a float32 scratch for its
  // products. Other tensors (norms, other types such as Q5_0 / Q5_K, a fused matrix
  // whose parts differ in type, safetensors) stay float32.
  std::string weights = "float32";
  absl::Status Validate() const;
};

// Where a Forward's wall time went, per operation, summed over layers and chunks
// (ForwardOptions::profile). On CPU every op is synchronous, so the laps are exact; on
// other devices they only time the launches.
struct PrefillProfile {
  double embed = 0;      // token embedding lookup
  double norms = 0;      // RMSNorm before attention and MLP (+ the final one)
  double qkv = 0;        // fused QKV projection (GEMM)
  double rope = 0;       // RoPE tables of the chunk, rotation of queries and keys
  double cache = 0;      // appending keys/values to the KV cache (+ kept queries)
  double attention = 0;  // causal attention over the cache
  double out_proj = 0;   // attention output projection (GEMM) + residual
  double mlp = 0;        // gate/up GEMM, SiLU * up, down GEMM + residual
  double lm_head = 0;    // logits of the last position only
  double Total() const { return embed + norms + qkv + rope + cache + attention + out_proj + mlp + lm_head; }
};

struct ForwardOptions {
  // Tokens per prefill chunk: activation memory is O(chunk_size * context), never
  // O(context^2).
  int chunk_size = 256;
  // Return the pre-RoPE query vectors of the last token (per layer [H, d]).
  bool return_anchor_queries = false;
  // Return the post-RoPE queries of the last N tokens (per layer [H, N, d]); -1 = all.
  int keep_last_queries = 0;
  // Called after each chunk with (tokens done, tokens total).
  std::function<void(int64_t, int64_t)> progress;
  // When set and true, Forward stops between chunks with CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
  // When set, per-op wall times are added to it.
  PrefillProfile* profile = nullptr;
};

struct ForwardResult {
  at::Tensor logits;                         // [V] float32 CPU: logits after the last token
  std::vector<at::Tensor> anchor_queries;    // per layer [H, d] float32 CPU, pre-RoPE
  std::vector<at::Tensor> queries;           // per layer [H, N, d] float32, post-RoPE (model device)
  std::vector<int64_t> query_positions;      // the N positions of `queries`
};

struct DecodeResult {
  at::Tensor logits;                         // [V] float32 CPU
  std::vector<at::Tensor> queries;           // per layer [H, d] float32 post-RoPE (if asked)
};

// One row of a batched decode step: `token` at cache->next_position().
struct DecodeRow {
  int token = 0;
  KvCache* cache = nullptr;     // gets the token's keys/values appended; one row per cache
  bool return_queries = false;  // fill DecodeResult::queries (lookahead rows need them)
};

// The thread counts the compute libraries reported while a model call ran: what the
// pool-mode regression test checks (a decode between two prefill chunks must not leave
// the next chunk's products on one OpenBLAS thread).
struct PoolUse {
  int openmp = 0;    // at::get_num_threads()
  int openblas = 0;  // openblas_get_num_threads(); 0 when the BLAS is not OpenBLAS
  bool operator==(const PoolUse& o) const { return openmp == o.openmp && openblas == o.openblas; }
};
struct PoolTrace {
  int64_t prefill_chunks = 0;   // Forward chunks run so far
  PoolUse prefill_chunk;        // seen by the last chunk's products
  int64_t decodes = 0;          // single-row CPU decode steps (our own loops)
  PoolUse decode;               // seen by the last one's loops
  int64_t decode_batches = 0;   // DecodeBatch calls with more than one row on the CPU path
  PoolUse decode_batch;         // seen by the last one's batched products
  int threads = 0;              // the threads the model was built with
};

// Applies `scaling` to RoPE inverse frequencies `inv_freq` ([d/2] float32 CPU) in
// float32 tensor arithmetic written line for line as transformers writes it, so the
// float32 roundings are PyTorch's (only exactly rounded elementwise ops: the result
// does not depend on the CPU's vector width):
//   none: unchanged
//   linear: inv_freq / factor
//   llama3 (_compute_llama3_parameters): wavelen = 2 pi / inv_freq; wavelen <
//     original / high_freq_factor: unchanged; wavelen > original / low_freq_factor:
//     inv_freq / factor; between: (1 - s) inv_freq / factor + s inv_freq with
//     s = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor).
// `scaling` must be valid (RopeScaling::Validate).
at::Tensor ApplyRopeScaling(const at::Tensor& inv_freq, const RopeScaling& scaling);

// RoPE inverse frequencies [d/2] float32 CPU for `config`: theta^(-2i/d) by HF's
// float32 recipe (kernels::RopeInvFreq), then ApplyRopeScaling(config.rope_scaling).
at::Tensor ComputeRopeInvFreq(const ModelConfig& config);

class Transformer {
 public:
  // Loads a model: a Hugging Face directory (config.json + generation_config.json and
  // the safetensors weights) or one .gguf file (model/gguf_model.h; quantized weights
  // are decoded to the device's dtype).
  static absl::StatusOr<std::unique_ptr<Transformer>> Load(const std::string& path,
                                                           const DeviceOptions& device);
  // Builds from an already parsed config and its weights (validated against it).
  static absl::StatusOr<std::unique_ptr<Transformer>> Create(const ModelConfig& config,
                                                             const WeightSource& weights,
                                                             const DeviceOptions& device);
  static absl::StatusOr<std::unique_ptr<Transformer>> Create(const ModelConfig& config,
                                                             const Checkpoint& checkpoint,
                                                             const DeviceOptions& device);
  ~Transformer();

  const ModelConfig& config() const;
  const DeviceOptions& device_options() const;
  // An empty cache with this model's layer/group/head-dim shape, dtype and device.
  KvCache NewCache() const;
  // RoPE inverse frequencies [d/2] float32 CPU, with rope_scaling applied
  // (ComputeRopeInvFreq). Every rotation of this model uses them: Forward, Decode and
  // the compression policies that re-rotate queries (EchoKV's proposals).
  at::Tensor RopeInvFreq() const;

  // Runs `tokens` at positions cache->next_position() + 0, 1, ..., appending their
  // keys/values to every layer and group of `cache` and advancing next_position.
  // Each token attends to the entries its layer/group holds with position <= its own
  // (and inside the sliding window when the model has one), then to earlier new tokens.
  absl::StatusOr<ForwardResult> Forward(absl::Span<const int> tokens, KvCache* cache,
                                        const ForwardOptions& options = {}) const;

  // One token at cache->next_position() (the decode fast path). With
  // return_queries, fills DecodeResult::queries (per layer, post-RoPE, all heads).
  absl::StatusOr<DecodeResult> Decode(int token, KvCache* cache, bool return_queries = false) const;
  // The same step through the batched (device-generic) Forward path; Decode uses
  // this off CPU float32. Public so tests can compare the two paths.
  absl::StatusOr<DecodeResult> DecodeWithForward(int token, KvCache* cache, bool return_queries = false) const;

  // One decode step for every row (result i belongs to row i), each row at its own
  // cache's next position. On CPU float32 the dense work (norms, QKV, output
  // projection, MLP, LM head) runs as one matrix product over all rows, so the weights
  // are read once per step instead of once per row; attention runs per row over that
  // row's own (possibly ragged, per-group) entries. One row is Decode itself (the
  // single-stream fast path); other devices and dtypes run the rows one by one. Any bad
  // row fails the whole call before a cache is touched.
  absl::StatusOr<std::vector<DecodeResult>> DecodeBatch(absl::Span<const DecodeRow> rows) const;

  // Which thread counts the last prefill chunk, decode and batched decode ran with.
  PoolTrace pool_trace() const;

  // Bytes of the matrices one decode step reads (projections and LM head, as held: float32
  // or native blocks), for bandwidth bounds.
  int64_t DecodeWeightBytes() const;

 private:
  struct Impl;
  explicit Transformer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;  // weights and config; torch stays out of this header's users
};

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_TRANSFORMER_H_
