// SentencePiece tokenizer (tokenizer.model) through Debian's libsentencepiece, loaded
// in an isolated module (see model/CMakeLists.txt for why).
// (Declaration fixed by the skeleton; the implementation fills in the rest.)
//
//   ECHOKV_ASSIGN_OR_RETURN(auto tok, LoadSentencePieceTokenizer("/models/mistral"));
#ifndef ECHOKV_MODEL_SENTENCEPIECE_TOKENIZER_H_
#define ECHOKV_MODEL_SENTENCEPIECE_TOKENIZER_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/tokenizer.h"

namespace echokv::model {

// Loads `dir`/tokenizer.model; add_bos_token and special tokens come from
// `dir`/tokenizer_config.json when present (default: add BOS).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& dir);

struct SentencePieceOptions {
  // EncodeAtMost encodes the text in chunks of at least this many bytes (cut at a
  // single space between words), stopping once the ids exceed the limit. Tests lower it
  // to cut often.
  size_t encode_chunk_bytes = 16384;
};
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& dir,
                                                                      const SentencePieceOptions& options);

// Trains a SentencePiece model (test-model tool): `args` in spm_train flag syntax.
absl::Status TrainSentencePiece(const std::string& args);

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_SENTENCEPIECE_TOKENIZER_H_
