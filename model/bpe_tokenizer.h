// Hugging Face tokenizer.json byte-level BPE tokenizer (Qwen2/2.5, Llama-3, GPT-2).
// (Declaration fixed by the skeleton; the implementation fills in the rest.)
//
//   ECHOKV_ASSIGN_OR_RETURN(auto tok, BpeTokenizer::Load("/models/qwen2.5"));
//   ECHOKV_ASSIGN_OR_RETURN(std::vector<int> ids, tok->Encode("Hello world"));
#ifndef ECHOKV_MODEL_BPE_TOKENIZER_H_
#define ECHOKV_MODEL_BPE_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/tokenizer.h"

namespace echokv::model {

class BpeTokenizer;

// True when `dir`/tokenizer.json exists and holds a BPE model with a ByteLevel
// pre-tokenizer or decoder (the kind this class implements).
bool IsByteLevelBpeDir(const std::string& dir);

// Loads `dir`/tokenizer.json (+ tokenizer_config.json when present).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizer(const std::string& dir);

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_BPE_TOKENIZER_H_
