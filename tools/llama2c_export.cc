#include "tools/llama2c_export.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace echokv::tools {
namespace {

// Buffered binary writer that remembers the first failure (the file is large: the
// 40M model's is 160 MB, so it is streamed, never held in memory).
class BinWriter {
 public:
  explicit BinWriter(const std::string& path) : path_(path), out_(path, std::ios::binary | std::ios::trunc) {}
  bool opened() const { return static_cast<bool>(out_); }
  void Int32(int32_t v) { Raw(&v, 4); }
  void Float(float v) { Raw(&v, 4); }
  void Floats(const float* p, size_t n) { Raw(p, n * 4); }
  void Raw(const void* p, size_t n) { out_.write(static_cast<const char*>(p), static_cast<std::streamsize>(n)); }
  absl::Status Close() {
    out_.close();
    if (!out_) return absl::DataLossError(absl::StrCat("writing ", path_, " failed"));
    return absl::OkStatus();
  }

 private:
  std::string path_;
  std::ofstream out_;
};

// The F32 tensor `name` with exactly `numel` elements.
absl::StatusOr<const float*> F32Tensor(const model::Checkpoint& ckpt, const std::string& name, int64_t numel) {
  const model::TensorView* t = ckpt.Find(name);
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " is missing"));
  if (t->dtype != model::DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " is ", model::DTypeName(t->dtype),
                                                   "; llama2.c checkpoints hold F32 only"));
  }
  if (t->nbytes != static_cast<size_t>(numel) * 4) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has ", t->nbytes / 4, " elements, expected ", numel));
  }
  // Only ever read through memcpy/ostream::write: safetensors offsets need not be aligned.
  return reinterpret_cast<const float*>(t->data);
}

// Fields of the config the legacy format has no room for.
absl::Status CheckRepresentable(const model::ModelConfig& c) {
  if (c.type != model::ModelType::kLlama) return absl::InvalidArgumentError("model_type: llama2.c holds Llama models only");
  if (c.head_dim * c.num_heads != c.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim: ", c.head_dim, " * num_attention_heads ", c.num_heads,
                                                   " != hidden_size ", c.hidden_size, " (llama2.c assumes equality)"));
  }
  if (c.qkv_bias || c.o_bias) return absl::InvalidArgumentError("attention_bias: llama2.c has no biases");
  if (c.sliding_window > 0) return absl::InvalidArgumentError("sliding_window: llama2.c attends to every position");
  if (c.rope_scaling.type != model::RopeScalingType::kNone) {
    return absl::InvalidArgumentError("rope_scaling: llama2.c has plain RoPE only");
  }
  if (c.head_dim % 2 != 0) return absl::InvalidArgumentError("head_dim: must be even for RoPE");
  return absl::OkStatus();
}

// Reads a protobuf varint at *p (< end); false when truncated.
bool ReadVarint(const uint8_t** p, const uint8_t* end, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    const uint8_t b = *(*p)++;
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// Skips one field of wire type `wire`; false when malformed.
bool SkipField(const uint8_t** p, const uint8_t* end, uint64_t wire) {
  uint64_t n = 0;
  switch (wire) {
    case 0: return ReadVarint(p, end, &n);
    case 1: n = 8; break;
    case 2: if (!ReadVarint(p, end, &n)) return false; break;
    case 5: n = 4; break;
    default: return false;
  }
  if (n > static_cast<uint64_t>(end - *p)) return false;
  *p += n;
  return true;
}

struct Piece {
  std::string text;
  float score = 0;
};

// The pieces of a SentencePiece ModelProto: field 1 (repeated SentencePiece: piece = 1,
// score = 2). Parsed by hand: two fields of a stable format do not justify linking
// libsentencepiece (and its private protobuf) into a tool.
absl::StatusOr<std::vector<Piece>> ParseSentencePieceModel(const std::string& bytes) {
  std::vector<Piece> pieces;
  const uint8_t* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint8_t* end = p + bytes.size();
  while (p < end) {
    uint64_t key = 0;
    if (!ReadVarint(&p, end, &key)) return absl::InvalidArgumentError("tokenizer.model: truncated field key");
    if (key >> 3 != 1 || (key & 7) != 2) {
      if (!SkipField(&p, end, key & 7)) return absl::InvalidArgumentError("tokenizer.model: malformed field");
      continue;
    }
    uint64_t len = 0;
    if (!ReadVarint(&p, end, &len) || len > static_cast<uint64_t>(end - p)) {
      return absl::InvalidArgumentError("tokenizer.model: truncated piece");
    }
    const uint8_t* q = p;
    const uint8_t* qend = p + len;
    p = qend;
    Piece piece;
    while (q < qend) {
      uint64_t k = 0;
      if (!ReadVarint(&q, qend, &k)) return absl::InvalidArgumentError("tokenizer.model: truncated piece field");
      if (k == ((1 << 3) | 2)) {
        uint64_t n = 0;
        if (!ReadVarint(&q, qend, &n) || n > static_cast<uint64_t>(qend - q)) {
          return absl::InvalidArgumentError("tokenizer.model: truncated piece text");
        }
        piece.text.assign(reinterpret_cast<const char*>(q), n);
        q += n;
      } else if (k == ((2 << 3) | 5)) {
        if (qend - q < 4) return absl::InvalidArgumentError("tokenizer.model: truncated piece score");
        std::memcpy(&piece.score, q, 4);
        q += 4;
      } else if (!SkipField(&q, qend, k & 7)) {
        return absl::InvalidArgumentError("tokenizer.model: malformed piece field");
      }
    }
    pieces.push_back(std::move(piece));
  }
  if (pieces.empty()) return absl::InvalidArgumentError("tokenizer.model: no pieces");
  return pieces;
}

}  // namespace

void UnpermuteRotaryRows(absl::Span<const float> hf, int n_heads, int head_dim, int cols, absl::Span<float> out) {
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    for (int i = 0; i < half; ++i) {
      for (int j = 0; j < 2; ++j) {
        const size_t from = static_cast<size_t>(h * head_dim + j * half + i) * cols;
        const size_t to = static_cast<size_t>(h * head_dim + 2 * i + j) * cols;
        std::memcpy(&out[to], &hf[from], static_cast<size_t>(cols) * sizeof(float));
      }
    }
  }
}

absl::Status WriteLlama2cCheckpoint(const std::string& model_dir, const std::string& out_path, int64_t seq_len) {
  absl::StatusOr<model::ModelConfig> cfg = model::LoadModelConfig(model_dir);
  if (!cfg.ok()) return cfg.status();
  if (absl::Status s = CheckRepresentable(*cfg); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<model::Checkpoint>> ckpt = model::Checkpoint::Open(model_dir);
  if (!ckpt.ok()) return ckpt.status();
  if (absl::Status s = model::ValidateCheckpoint(**ckpt, *cfg); !s.ok()) return s;
  const model::ModelConfig& c = *cfg;
  const int64_t d = c.hidden_size, f = c.intermediate_size, v = c.vocab_size, hd = c.head_dim;
  const int64_t kv = static_cast<int64_t>(c.num_kv_heads) * hd;
  if (seq_len < 0 || seq_len > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len must be in [0, 2^30], got ", seq_len));
  }
  const int64_t positions = seq_len > 0 ? seq_len : c.max_position_embeddings;
  // A tied checkpoint may still carry lm_head.weight (ValidateCheckpoint accepts it);
  // llama2.c's export compares the two tensors, so an identical copy counts as shared.
  const float* embed = nullptr;
  const float* cls = nullptr;
  {
    absl::StatusOr<const float*> e = F32Tensor(**ckpt, "model.embed_tokens.weight", v * d);
    if (!e.ok()) return e.status();
    embed = *e;
    if (!c.tie_word_embeddings) {
      absl::StatusOr<const float*> l = F32Tensor(**ckpt, "lm_head.weight", v * d);
      if (!l.ok()) return l.status();
      if (std::memcmp(*l, embed, static_cast<size_t>(v * d) * 4) != 0) cls = *l;
    }
  }
  BinWriter out(out_path);
  if (!out.opened()) return absl::InvalidArgumentError(absl::StrCat("out: cannot create ", out_path));
  out.Int32(static_cast<int32_t>(d));
  out.Int32(static_cast<int32_t>(f));
  out.Int32(c.num_layers);
  out.Int32(c.num_heads);
  out.Int32(c.num_kv_heads);
  out.Int32(static_cast<int32_t>(cls == nullptr ? v : -v));
  out.Int32(static_cast<int32_t>(positions));
  out.Floats(embed, static_cast<size_t>(v * d));
  // One block per kind of tensor, every layer in a row, as run.c maps them.
  auto layer_block = [&](const std::string& suffix, int64_t rows, int64_t cols, int rotary_heads) -> absl::Status {
    std::vector<float> unpermuted(rotary_heads > 0 ? rows * cols : 0);
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string name = absl::StrCat("model.layers.", l, ".", suffix);
      absl::StatusOr<const float*> t = F32Tensor(**ckpt, name, rows * cols);
      if (!t.ok()) return t.status();
      if (rotary_heads > 0) {
        UnpermuteRotaryRows(absl::MakeConstSpan(*t, rows * cols), rotary_heads, c.head_dim, static_cast<int>(cols),
                            absl::MakeSpan(unpermuted));
        out.Floats(unpermuted.data(), unpermuted.size());
      } else {
        out.Floats(*t, static_cast<size_t>(rows * cols));
      }
    }
    return absl::OkStatus();
  };
  const int64_t q = static_cast<int64_t>(c.num_heads) * hd;
  for (absl::Status s : {layer_block("input_layernorm.weight", 1, d, 0),
                         layer_block("self_attn.q_proj.weight", q, d, c.num_heads),
                         layer_block("self_attn.k_proj.weight", kv, d, c.num_kv_heads),
                         layer_block("self_attn.v_proj.weight", kv, d, 0),
                         layer_block("self_attn.o_proj.weight", d, q, 0),
                         layer_block("post_attention_layernorm.weight", 1, d, 0),
                         layer_block("mlp.gate_proj.weight", f, d, 0),
                         layer_block("mlp.down_proj.weight", d, f, 0),
                         layer_block("mlp.up_proj.weight", f, d, 0)}) {
    if (!s.ok()) return s;
  }
  {
    absl::StatusOr<const float*> norm = F32Tensor(**ckpt, "model.norm.weight", d);
    if (!norm.ok()) return norm.status();
    out.Floats(*norm, static_cast<size_t>(d));
  }
  // llama2.c model.py precompute_freqs_cis in float32: inv_freq = 1 / theta^(2i/d),
  // angle = t * inv_freq, both float32 as torch computes them; cos/sin correctly rounded.
  const int half = c.head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(c.rope_theta), e);
  }
  for (int table = 0; table < 2; ++table) {
    for (int64_t t = 0; t < positions; ++t) {
      for (int i = 0; i < half; ++i) {
        const double angle = static_cast<float>(t) * inv_freq[i];
        out.Float(static_cast<float>(table == 0 ? std::cos(angle) : std::sin(angle)));
      }
    }
  }
  if (cls != nullptr) out.Floats(cls, static_cast<size_t>(v * d));
  return out.Close();
}

absl::Status WriteLlama2cTokenizer(const std::string& tokenizer_model_path, const std::string& out_path) {
  std::ifstream in(tokenizer_model_path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("tokenizer_model: cannot read ", tokenizer_model_path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<std::vector<Piece>> pieces = ParseSentencePieceModel(ss.str());
  if (!pieces.ok()) return pieces.status();
  // tokenizer.py uses sp's bos_id/eos_id; echokv's SentencePiece models (like
  // Llama's) keep them at 1 and 2, which the pieces confirm.
  if (pieces->size() < 3 || (*pieces)[1].text != "<s>" || (*pieces)[2].text != "</s>") {
    return absl::InvalidArgumentError("tokenizer_model: ids 1 and 2 are not <s> and </s>");
  }
  std::vector<std::string> texts;
  uint32_t max_len = 0;
  for (size_t id = 0; id < pieces->size(); ++id) {
    std::string t = id == 1 ? "\n<s>\n" : id == 2 ? "\n</s>\n" : (*pieces)[id].text;
    std::string replaced;
    for (size_t k = 0; k < t.size(); ++k) {
      if (t.compare(k, 3, "\xe2\x96\x81") == 0) {  // U+2581 LOWER ONE EIGHTH BLOCK
        replaced += ' ';
        k += 2;
      } else {
        replaced += t[k];
      }
    }
    max_len = std::max<uint32_t>(max_len, static_cast<uint32_t>(replaced.size()));
    texts.push_back(std::move(replaced));
  }
  BinWriter out(out_path);
  if (!out.opened()) return absl::InvalidArgumentError(absl::StrCat("tokenizer_out: cannot create ", out_path));
  out.Raw(&max_len, 4);
  for (size_t id = 0; id < texts.size(); ++id) {
    const uint32_t len = static_cast<uint32_t>(texts[id].size());
    out.Float((*pieces)[id].score);
    out.Raw(&len, 4);
    out.Raw(texts[id].data(), len);
  }
  return out.Close();
}

}  // namespace echokv::tools
