// Transformer construction: DeviceOptions, RoPE frequencies, Load (a model directory
// or a .gguf file) and Create (weights from a WeightSource onto the device).
#include "model/transformer_impl.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/blas_env.h"
#include "common/env.h"
#include "common/huge_pages.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/attention.h"
#include "kernels/block_matmul.h"
#include "kernels/rope.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/weights.h"

namespace echokv::model {
namespace {

absl::StatusOr<at::ScalarType> ParseDType(const std::string& dtype) {
  if (dtype == "float32") return at::kFloat;
  if (dtype == "bfloat16") return at::kBFloat16;
  if (dtype == "float16") return at::kHalf;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype must be one of float32, bfloat16, float16; got '", dtype, "'"));
}

at::ScalarType ToScalarType(DType d) {
  switch (d) {
    case DType::kF32:
      return at::kFloat;
    case DType::kF16:
      return at::kHalf;
    case DType::kBF16:
      return at::kBFloat16;
  }
  return at::kFloat;
}

// A copy of CPU tensor `t` in huge-page memory (common/huge_pages.h) when it holds
// 1 MiB or more and the mapping succeeds (else `t` itself); adds the bytes the kernel
// accepted the advice for to *advised_bytes.
at::Tensor OnHugePages(const at::Tensor& t, int64_t* advised_bytes) {
  if (!t.device().is_cpu() || !t.is_contiguous() || t.nbytes() < (size_t{1} << 20)) return t;
  HugePageBuffer buffer = HugePageBuffer::Allocate(t.nbytes());
  if (!buffer.ok()) return t;
  std::memcpy(buffer.data(), t.data_ptr(), t.nbytes());
  const size_t size = buffer.size();
  if (buffer.advised()) *advised_bytes += static_cast<int64_t>(size);
  return at::from_blob(
      buffer.Release(), t.sizes(), [size](void* data) { HugePageBuffer::Free(data, size); }, t.options());
}

}  // namespace

absl::Status DeviceOptions::Validate() const {
  ECHOKV_ASSIGN_OR_RETURN(at::ScalarType st, ParseDType(dtype));
  try {
    c10::Device dev(device);
    if (dev.is_cuda() && !at::hasCUDA()) {
      return absl::FailedPreconditionError(
          absl::StrCat("device '", device, "' requested but this LibTorch build has no CUDA support"));
    }
    if (!dev.is_cpu() && !dev.is_cuda()) {
      return absl::InvalidArgumentError(absl::StrCat("device must be cpu or cuda[:N], got '", device, "'"));
    }
    if (dev.is_cpu() && st == at::kHalf) {
      return absl::InvalidArgumentError(
          "dtype float16 needs device cuda: LibTorch's CPU kernels have no float16 matrix products "
          "(use float32 or bfloat16 on cpu)");
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("device must be cpu or cuda[:N], got '", device, "'"));
  }
  if (weights != "float32" && weights != "native") {
    return absl::InvalidArgumentError(absl::StrCat("weights must be float32 or native, got '", weights, "'"));
  }
  if (weights == "native" && (device != "cpu" || st != at::kFloat)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights native needs device cpu and dtype float32 (got ", device, " ", dtype, ")"));
  }
  if (num_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_threads must be >= 0, got ", num_threads));
  }
  return absl::OkStatus();
}

at::Tensor ComputeRopeInvFreq(const ModelConfig& config) {
  at::Tensor inv = ApplyRopeScaling(kernels::RopeInvFreq(config.head_dim, config.rope_theta), config.rope_scaling);
  if (!config.rope_freq_factors.empty()) {
    // ggml's rope divides each angle by its frequency factor (float32).
    std::vector<float> factors = config.rope_freq_factors;
    inv = inv / at::from_blob(factors.data(), {static_cast<int64_t>(factors.size())}, at::kFloat).clone();
  }
  return inv;
}

at::Tensor ApplyRopeScaling(const at::Tensor& inv_freq, const RopeScaling& rs) {
  const at::Tensor inv = inv_freq.to(at::kFloat);  // [d/2]
  switch (rs.type) {
    case RopeScalingType::kNone:
      return inv;
    case RopeScalingType::kLinear:
      // HF: inv_freq /= factor (float32 division by the float32-rounded factor).
      return inv / rs.factor;
    case RopeScalingType::kLlama3: {
      // Each line mirrors one line of transformers' _compute_llama3_parameters; Python
      // scalars become float32 inside the tensor op, and `scalar / t` is
      // t.reciprocal() * scalar (torch's Tensor.__rtruediv__), as here.
      const double original = rs.original_max_position_embeddings;
      const double low_freq_wavelen = original / rs.low_freq_factor;    // Python float
      const double high_freq_wavelen = original / rs.high_freq_factor;  // Python float
      at::Tensor wavelen = inv.reciprocal() * (2.0 * M_PI);            // 2 * math.pi / inv_freq
      at::Tensor inv_llama = at::where(wavelen > low_freq_wavelen, inv / rs.factor, inv);
      at::Tensor smooth = (wavelen.reciprocal() * original - rs.low_freq_factor) /
                          (rs.high_freq_factor - rs.low_freq_factor);
      at::Tensor smoothed = at::rsub(smooth, 1.0) * inv_llama / rs.factor + smooth * inv_llama;
      at::Tensor medium = (wavelen < high_freq_wavelen).logical_not() & (wavelen > low_freq_wavelen).logical_not();
      return at::where(medium, smoothed, inv_llama);
    }
  }
  return inv;
}

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Load(const std::string& path, const DeviceOptions& device) {
  if (IsGgufFile(path)) {
    ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<GgufModel> gguf, GgufModel::Open(path));
    return Create(gguf->config(), *gguf, device);
  }
  ECHOKV_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(path));
  ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(path));
  return Create(config, *checkpoint, device);
}

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Create(const ModelConfig& config,
                                                                 const Checkpoint& checkpoint,
                                                                 const DeviceOptions& device) {
  return Create(config, CheckpointWeights(&checkpoint), device);
}

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Create(const ModelConfig& config,
                                                                 const WeightSource& weights,
                                                                 const DeviceOptions& device) {
  ECHOKV_RETURN_IF_ERROR(config.Validate());
  ECHOKV_RETURN_IF_ERROR(device.Validate());
  ECHOKV_RETURN_IF_ERROR(ValidateWeights(weights, config));
  ECHOKV_ASSIGN_OR_RETURN(at::ScalarType dtype, ParseDType(device.dtype));
  // Parameters (embedding, attention, MLP, LM head) for the small-model thread default.
  const int64_t D = config.hidden_size, Hd = int64_t{config.num_heads} * config.head_dim,
                Gd = int64_t{config.num_kv_heads} * config.head_dim;
  const int64_t parameters =
      int64_t{config.vocab_size} * D * (config.tie_word_embeddings ? 1 : 2) +
      int64_t{config.num_layers} * (D * Hd + 2 * D * Gd + Hd * D + 3 * D * int64_t{config.intermediate_size});
  const ThreadChoice chosen = CapForModelSize(ChooseThreadCount(), parameters);
  const int threads = device.num_threads > 0 ? device.num_threads : chosen.threads;
  const std::string threads_why = device.num_threads > 0 ? std::string("--threads") : chosen.reason;

  auto impl = std::make_unique<Impl>();
  impl->pools = std::make_unique<ThreadPools>(threads);
  const char* blas_env = std::getenv("ECHOKV_DECODE_BATCH_BLAS");
  impl->decode_batch_blas = blas_env != nullptr && std::string(blas_env) == "1";
  // ECHOKV_DECODE_SPLIT=rows or =ops (read at load) overrides the choice by size.
  const char* split_env = std::getenv("ECHOKV_DECODE_SPLIT");
  const std::string split = split_env != nullptr ? split_env : "";
  if (!split.empty() && split != "rows" && split != "ops") {
    return absl::InvalidArgumentError(
        absl::StrCat("ECHOKV_DECODE_SPLIT is '", split, "'; expected 'rows', 'ops' or unset (by model size)"));
  }
  impl->small_model = split.empty() ? parameters < kSmallModelParameters : split == "rows";
  impl->pools->ForBatched();
  impl->config = config;
  impl->device_options = device;
  int64_t huge_page_bytes = 0;
  // Tensors are read one at a time, each straight into its place (quantized ones decoded
  // into a float32 tensor first), so loading needs the model's memory plus about one
  // tensor. Progress is logged every few seconds on long loads.
  const auto load_start = std::chrono::steady_clock::now();
  auto last_report = load_start;
  const int64_t total_tensors = static_cast<int64_t>(ExpectedTensors(config).size());
  int64_t loaded_tensors = 0;
  absl::Status read_error;
  int64_t native_bytes = 0, native_matrices = 0, float_matrices = 0;  // weights "native"
  std::set<std::string> native_types;
  std::shared_ptr<void> arena;  // the native blocks' memory (each WeightMatrix shares it)
  int64_t arena_size = 0, arena_used = 0;
  try {
    impl->options = at::TensorOptions().dtype(dtype).device(c10::Device(device.device));
    auto load = [&](const std::string& name) -> at::Tensor {
      ++loaded_tensors;
      const auto now = std::chrono::steady_clock::now();
      if (now - last_report > std::chrono::seconds(3)) {
        last_report = now;
        ECHOKV_LOG(INFO) << "loading weights: " << loaded_tensors << "/" << total_tensors << " tensors ("
                         << 100 * loaded_tensors / std::max<int64_t>(total_tensors, 1) << " %), "
                         << std::chrono::duration<double>(now - load_start).count() << " s";
      }
      if (const TensorView* t = weights.View(name); t != nullptr) {
        at::Tensor raw = at::from_blob(const_cast<uint8_t*>(t->data), t->shape,
                                       at::TensorOptions().dtype(ToScalarType(t->dtype)));
        return raw.to(impl->options, /*non_blocking=*/false, /*copy=*/true).contiguous();
      }
      at::Tensor decoded = at::empty(*weights.Shape(name), at::kFloat);  // present: ValidateWeights passed
      if (absl::Status s = weights.ReadFloat32(name, decoded.data_ptr<float>()); !s.ok()) {
        if (read_error.ok()) read_error = s;
        return decoded;
      }
      if (impl->options.device().is_cpu() && impl->options.dtype() == at::kFloat) return decoded;
      return decoded.to(impl->options, /*non_blocking=*/false, /*copy=*/true).contiguous();
    };
    // Matrices of 1 MiB and more go to huge-page memory (common/huge_pages.h): decode
    // streams them once per token.
    auto big = [&](const at::Tensor& t) { return OnHugePages(t, &huge_page_bytes); };
    // A product's matrix from one or more tensors stacked by rows (fused q/k/v, gate/up):
    // with weights "native", the stored blocks when every part is a type the kernels read
    // with whole blocks per row (parts of different types, as llama-quantize's Q4_K_M
    // mixes them in q/k/v, stay separate BlockMatrix parts); otherwise float32 (the
    // dtype's) as always.
    auto matrix = [&](const std::vector<std::string>& names) -> WeightMatrix {
      WeightMatrix m;
      kernels::BlockType type{};
      bool blocks = device.weights == "native", mixed = false;
      int64_t rows = 0, cols = -1;
      std::vector<kernels::BlockMatrix> block_parts;
      for (const std::string& name : names) {
        kernels::BlockType t{};
        const int id = weights.StoredGgmlType(name);
        const std::vector<int64_t>* shape = weights.Shape(name);
        blocks = blocks && id >= 0 && kernels::BlockTypeFromGgml(static_cast<uint32_t>(id), &t) &&
                 shape->size() == 2 && (cols < 0 || (*shape)[1] == cols) &&
                 (*shape)[1] % kernels::BlockValuesOf(t) == 0;
        if (!blocks) break;
        mixed = mixed || (name != names[0] && t != type);
        if (name == names[0]) type = t;
        block_parts.push_back(kernels::BlockMatrix{t, nullptr, (*shape)[0], (*shape)[1]});
        rows += (*shape)[0];
        cols = (*shape)[1];
      }
      if (blocks && mixed) {
        // One arena slice per part (as the arena was sized: per tensor, 64-byte aligned).
        m.storage = arena;
        for (size_t k = 0; k < block_parts.size(); ++k) {
          const int64_t bytes = block_parts[k].Bytes();
          if (arena_used + bytes > arena_size) {
            read_error = absl::InternalError("native weights: the block arena is too small (a bug)");
            return WeightMatrix();
          }
          uint8_t* data = static_cast<uint8_t*>(arena.get()) + arena_used;
          arena_used += (bytes + 63) / 64 * 64;
          block_parts[k].data = data;
          loaded_tensors++;
          if (absl::Status s = weights.ReadStoredRows(names[k], data); !s.ok()) {
            if (read_error.ok()) read_error = s;
          }
          native_bytes += bytes;
          native_types.insert(kernels::BlockTypeName(block_parts[k].type));
        }
        m.blocks = block_parts[0];
        m.parts = std::move(block_parts);
        ++native_matrices;
        return m;
      }
      if (blocks) {
        m.blocks = kernels::BlockMatrix{type, nullptr, rows, cols};
        const int64_t bytes = m.blocks.Bytes();
        if (arena_used + bytes > arena_size) {
          read_error = absl::InternalError("native weights: the block arena is too small (a bug)");
          return m;
        }
        uint8_t* data = static_cast<uint8_t*>(arena.get()) + arena_used;
        arena_used += (bytes + 63) / 64 * 64;
        m.storage = arena;
        m.blocks.data = data;
        int64_t row = 0;
        for (const std::string& name : names) {
          loaded_tensors++;
          if (absl::Status s = weights.ReadStoredRows(name, data + row * m.blocks.RowBytes()); !s.ok()) {
            if (read_error.ok()) read_error = s;
          }
          row += (*weights.Shape(name))[0];
        }
        native_bytes += bytes;
        ++native_matrices;
        native_types.insert(kernels::BlockTypeName(type));
        return m;
      }
      if (device.weights == "native") ++float_matrices;
      std::vector<at::Tensor> parts;
      for (const std::string& name : names) parts.push_back(load(name));
      m.tensor = big(parts.size() == 1 ? parts[0] : at::cat(parts, 0));
      return m;
    };
    // Native blocks share one arena (2-MiB pages are per mapping: a 200 KB matrix alone
    // would hold a whole one), sized by every block tensor the source holds.
    if (device.weights == "native") {
      for (const ExpectedTensor& t : ExpectedTensors(config)) {
        kernels::BlockType bt{};
        const int id = weights.StoredGgmlType(t.name);
        if (id < 0 || !kernels::BlockTypeFromGgml(static_cast<uint32_t>(id), &bt) || t.shape.size() != 2 ||
            t.shape[1] % kernels::BlockValuesOf(bt) != 0) {
          continue;
        }
        arena_size += (kernels::BlockMatrix{bt, nullptr, t.shape[0], t.shape[1]}.Bytes() + 63) / 64 * 64;
      }
      if (arena_size > 0) {
        HugePageBuffer buffer = HugePageBuffer::Allocate(static_cast<size_t>(arena_size));
        if (!buffer.ok()) return absl::ResourceExhaustedError("native weights: could not map the block arena");
        if (buffer.advised()) huge_page_bytes += static_cast<int64_t>(buffer.size());
        const size_t size = buffer.size();
        arena = std::shared_ptr<void>(buffer.Release(), [size](void* p) { HugePageBuffer::Free(p, size); });
      }
    }
    const std::string p = "model.layers.";
    impl->embed = matrix({"model.embed_tokens.weight"});
    for (int l = 0; l < config.num_layers; ++l) {
      const std::string b = absl::StrCat(p, l, ".");
      Impl::Layer layer;
      layer.input_norm = load(b + "input_layernorm.weight");
      layer.post_norm = load(b + "post_attention_layernorm.weight");
      layer.wqkv =
          matrix({b + "self_attn.q_proj.weight", b + "self_attn.k_proj.weight", b + "self_attn.v_proj.weight"});
      if (config.qkv_bias) {
        layer.bqkv = at::cat({load(b + "self_attn.q_proj.bias"), load(b + "self_attn.k_proj.bias"),
                              load(b + "self_attn.v_proj.bias")},
                             0);
      }
      layer.wo = matrix({b + "self_attn.o_proj.weight"});
      if (config.o_bias) layer.bo = load(b + "self_attn.o_proj.bias");
      layer.w_gate_up = matrix({b + "mlp.gate_proj.weight", b + "mlp.up_proj.weight"});
      layer.w_down = matrix({b + "mlp.down_proj.weight"});
      impl->layers.push_back(std::move(layer));
    }
    impl->final_norm = load("model.norm.weight");
    impl->lm_head = config.tie_word_embeddings ? impl->embed : matrix({"lm_head.weight"});
    impl->inv_freq = ComputeRopeInvFreq(config).contiguous();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("loading weights failed: ", ErrorText(e)));
  }
  if (!read_error.ok()) return read_error;
  ECHOKV_LOG(INFO) << "loaded " << ModelTypeName(config.type) << " model: " << config.num_layers << " layers, "
                   << config.num_heads << "/" << config.num_kv_heads << " heads, d=" << config.head_dim
                   << ", rope_scaling " << RopeScalingTypeName(config.rope_scaling.type) << ", vocab " << config.vocab_size << " on " << device.device << " " << device.dtype << ", "
                   << threads << " threads [" << threads_why << "] (" << impl->pools->Describe() << "; decode "
                   << (impl->small_model ? "loops on one thread, batches split by rows" : "loops split")
                   << (split.empty() ? "" : " [ECHOKV_DECODE_SPLIT]") << "); "
                   << DescribeBlasSetup() << "; attention kernel " << kernels::AttentionIsa() << "; "
                   << (huge_page_bytes >> 20) << " MiB of weights on huge pages; weights " << device.weights
                   << (device.weights == "native"
                           ? absl::StrCat(" (", native_matrices, " matrices as ", absl::StrJoin(native_types, "/"),
                                          " blocks, ", native_bytes >> 20, " MiB; ", float_matrices,
                                          " float32; block kernels ", kernels::BlockMatMulIsa(), ")")
                           : std::string())
                   << "; loaded in "
                   << std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count() << " s";
  return std::unique_ptr<Transformer>(new Transformer(std::move(impl)));
}

}  // namespace echokv::model
