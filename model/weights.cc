#include "model/weights.h"

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/ggml_types.h"

namespace echokv::model {
namespace {

constexpr char kLmHead[] = "lm_head.weight";
constexpr absl::string_view kInvFreqSuffix = ".rotary_emb.inv_freq";
// How many unexpected names one error message lists.
constexpr size_t kMaxListed = 5;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

bool EndsWith(absl::string_view s, absl::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config) {
  const int64_t d_model = config.hidden_size;
  const int64_t inter = config.intermediate_size;
  const int64_t q_dim = static_cast<int64_t>(config.num_heads) * config.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(config.num_kv_heads) * config.head_dim;
  const int64_t vocab = config.vocab_size;

  std::vector<ExpectedTensor> out;
  out.push_back({"model.embed_tokens.weight", {vocab, d_model}});
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const std::string p = absl::StrCat("model.layers.", layer, ".");
    out.push_back({p + "input_layernorm.weight", {d_model}});
    out.push_back({p + "self_attn.q_proj.weight", {q_dim, d_model}});
    out.push_back({p + "self_attn.k_proj.weight", {kv_dim, d_model}});
    out.push_back({p + "self_attn.v_proj.weight", {kv_dim, d_model}});
    if (config.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {q_dim}});
      out.push_back({p + "self_attn.k_proj.bias", {kv_dim}});
      out.push_back({p + "self_attn.v_proj.bias", {kv_dim}});
    }
    out.push_back({p + "self_attn.o_proj.weight", {d_model, q_dim}});
    if (config.o_bias) out.push_back({p + "self_attn.o_proj.bias", {d_model}});
    out.push_back({p + "post_attention_layernorm.weight", {d_model}});
    out.push_back({p + "mlp.gate_proj.weight", {inter, d_model}});
    out.push_back({p + "mlp.up_proj.weight", {inter, d_model}});
    out.push_back({p + "mlp.down_proj.weight", {d_model, inter}});
  }
  out.push_back({"model.norm.weight", {d_model}});
  if (!config.tie_word_embeddings) out.push_back({kLmHead, {vocab, d_model}});
  return out;
}

const std::vector<int64_t>* CheckpointWeights::Shape(absl::string_view name) const {
  const TensorView* t = checkpoint_->Find(name);
  return t == nullptr ? nullptr : &t->shape;
}

std::string CheckpointWeights::StoredType(absl::string_view name) const {
  const TensorView* t = checkpoint_->Find(name);
  return t == nullptr ? "" : std::string(DTypeName(t->dtype));
}

absl::Status CheckpointWeights::ReadFloat32(absl::string_view name, float* out) const {
  const TensorView* t = checkpoint_->Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no tensor '", name, "'"));
  const size_t n = t->nbytes / DTypeSize(t->dtype);
  switch (t->dtype) {
    case DType::kF32:
      std::memcpy(out, t->data, t->nbytes);
      break;
    case DType::kF16:
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = static_cast<uint16_t>(t->data[2 * i] | (t->data[2 * i + 1] << 8));
        out[i] = t->dtype == DType::kF16 ? HalfToFloat(h) : BFloat16ToFloat(h);
      }
      break;
  }
  return absl::OkStatus();
}

absl::Status ValidateCheckpoint(const Checkpoint& checkpoint, const ModelConfig& config) {
  return ValidateWeights(CheckpointWeights(&checkpoint), config);
}

absl::Status ValidateWeights(const WeightSource& checkpoint, const ModelConfig& config) {
  const std::vector<ExpectedTensor> expected = ExpectedTensors(config);
  std::set<std::string> known;
  std::vector<const ExpectedTensor*> missing;
  for (const ExpectedTensor& e : expected) {
    known.insert(e.name);
    const std::vector<int64_t>* shape = checkpoint.Shape(e.name);
    if (shape == nullptr) {
      missing.push_back(&e);
      continue;
    }
    if (*shape != e.shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", e.name, "' has shape ",
                                                     ShapeString(*shape), ", expected ",
                                                     ShapeString(e.shape)));
    }
  }
  if (!missing.empty()) {
    std::string more;
    if (missing.size() > 1) more = absl::StrCat(" (and ", missing.size() - 1, " more missing)");
    return absl::InvalidArgumentError(absl::StrCat("missing tensor '", missing[0]->name,
                                                   "' (expected shape ",
                                                   ShapeString(missing[0]->shape), ")", more));
  }

  std::vector<std::string> unexpected;
  for (const std::string& name : checkpoint.Names()) {
    if (known.count(name) != 0 || EndsWith(name, kInvFreqSuffix)) continue;
    if (config.tie_word_embeddings && name == kLmHead) {
      // Tied checkpoints sometimes still store the (identical) output matrix.
      const std::vector<int64_t> want = {config.vocab_size, config.hidden_size};
      const std::vector<int64_t>* shape = checkpoint.Shape(name);
      if (*shape != want) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", kLmHead, "' has shape ",
                                                       ShapeString(*shape), ", expected ",
                                                       ShapeString(want)));
      }
      continue;
    }
    unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    std::vector<std::string> quoted;
    for (size_t i = 0; i < unexpected.size() && i < kMaxListed; ++i) {
      quoted.push_back(absl::StrCat("'", unexpected[i], "'"));
    }
    std::string more;
    if (unexpected.size() > kMaxListed) {
      more = absl::StrCat(" (and ", unexpected.size() - kMaxListed, " more)");
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected tensor", unexpected.size() > 1 ? "s " : " ",
                     absl::StrJoin(quoted, ", "), more, " in the checkpoint: not used by a ",
                     ModelTypeName(config.type), " model with this config"));
  }
  return absl::OkStatus();
}

}  // namespace echokv::model
