// libFuzzer target: a hostile GGUF file (model/gguf.h) and everything echokv builds from
// one before any weight reaches LibTorch: the metadata and tensor table, the decoded
// blocks of every tensor (model/ggml_types.h), the model config, the Hugging Face view
// of the weights with llama.cpp's q/k permutation undone (model/gguf_model.h), and the
// tokenizer and chat template the metadata describes (model/gguf_tokenizer.h), which
// then encodes and decodes a fixed text. The input is the file itself (no selector).
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "model/ggml_types.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/gguf_tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// Values decoded per input at most (the fuzzer's inputs are small; a header may claim
// a large tensor that the bounds check then refuses).
constexpr int64_t kMaxValues = int64_t{1} << 20;

void CheckTable(const echokv::model::GgufFile& f, size_t size) {
  for (const echokv::model::GgufTensor& t : f.tensors()) {
    if (f.data_offset() + t.offset + t.nbytes > size) echokv::fuzz::Violation("tensor past the end: " + t.name);
    if (f.TensorBytes(t).size() != t.nbytes) echokv::fuzz::Violation("TensorBytes size differs: " + t.name);
    if (t.offset % f.alignment() != 0) echokv::fuzz::Violation("misaligned tensor accepted: " + t.name);
    const echokv::model::GgmlTypeInfo* info = echokv::model::FindGgmlType(t.type);
    if (info == nullptr) echokv::fuzz::Violation("unknown type accepted: " + t.name);
    int64_t row = 0;
    if (!echokv::model::GgmlRowBytes(*info, t.dims[0], &row)) echokv::fuzz::Violation("bad row accepted");
  }
}

void DecodeAll(const echokv::model::GgufFile& f) {
  int64_t budget = kMaxValues;
  std::vector<float> out;
  for (const echokv::model::GgufTensor& t : f.tensors()) {
    if (t.elements > budget) continue;
    budget -= t.elements;
    out.resize(static_cast<size_t>(t.elements));
    absl::string_view bytes = f.TensorBytes(t);
    (void)echokv::model::DequantizeGgml(t.type, reinterpret_cast<const uint8_t*>(bytes.data()), t.elements,
                                        out.data());
  }
}

void ModelView(std::shared_ptr<const echokv::model::GgufFile> f) {
  absl::StatusOr<std::unique_ptr<echokv::model::GgufModel>> m = echokv::model::GgufModel::FromFile(f);
  if (!m.ok()) return;
  if (!(*m)->config().Validate().ok()) echokv::fuzz::Violation("GgufModel accepted an invalid config");
  int64_t budget = kMaxValues;
  std::vector<float> out;
  for (const std::string& name : (*m)->Names()) {
    const std::vector<int64_t>* shape = (*m)->Shape(name);
    if (shape == nullptr) echokv::fuzz::Violation("Names() lists " + name + " without a shape");
    int64_t n = 1;
    for (int64_t d : *shape) n *= d;
    if (n > budget) continue;
    budget -= n;
    out.assign(static_cast<size_t>(n), 0.0f);
    (void)(*m)->ReadFloat32(name, out.data());
  }
}

void TokenizerAndTemplate(const echokv::model::GgufFile& f) {
  absl::StatusOr<std::unique_ptr<echokv::model::Tokenizer>> tok = echokv::model::LoadGgufTokenizer(f);
  if (tok.ok()) {
    absl::StatusOr<std::vector<int>> ids = (*tok)->Encode("Hello 123 wörld <|im_end|>\n");
    if (ids.ok()) {
      for (int id : *ids) {
        if (id < 0 || id >= (*tok)->vocab_size()) echokv::fuzz::Violation("Encode gave an id out of range");
      }
      (void)(*tok)->Decode(*ids);
    }
  }
  absl::StatusOr<echokv::model::ChatTemplate> chat = echokv::model::LoadGgufChatTemplate(f, std::nullopt);
  if (chat.ok()) {
    std::vector<echokv::model::ChatMessage> msgs = {{"user", "hi"}};
    (void)chat->Render(msgs, /*add_generation_prompt=*/true);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The bytes outlive the parsed file: copy them into storage the shared_ptr keeps.
  auto bytes = std::make_shared<std::string>(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<echokv::model::GgufFile>> parsed = echokv::model::GgufFile::Parse(*bytes);
  if (!parsed.ok()) return 0;
  std::shared_ptr<const echokv::model::GgufFile> f(parsed->release(), [bytes](const echokv::model::GgufFile* p) {
    delete p;  // `bytes` is released after the file
  });
  CheckTable(*f, size);
  DecodeAll(*f);
  ModelView(f);
  TokenizerAndTemplate(*f);
  return 0;
}
