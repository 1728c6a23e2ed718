// SentencePiece's ModelProto (sentencepiece_model.proto), written and read by hand:
// what a GGUF's `tokenizer.ggml.model = llama` metadata (tokens, scores, token types,
// add_space_prefix, special ids) becomes so that Debian's libsentencepiece can load it
// (model/gguf_tokenizer.h), and what tools/gguf_export reads out of a tokenizer.model.
// Only the fields those two need; torch-free, no protobuf library.
//
//   SpmModelSpec spec;                    // pieces, ids, normalizer flags
//   std::string bytes = SerializeSpmModel(spec);   // a loadable tokenizer.model
//   ECHOKV_ASSIGN_OR_RETURN(SpmModelSpec back, ParseSpmModel(bytes));
#ifndef ECHOKV_MODEL_SPM_MODEL_PROTO_H_
#define ECHOKV_MODEL_SPM_MODEL_PROTO_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace echokv::model {

struct SpmPiece {
  std::string piece;
  float score = 0;
  int type = 1;  // SentencePiece::Type: 1 NORMAL, 2 UNKNOWN, 3 CONTROL, 4 USER_DEFINED, 5 UNUSED, 6 BYTE
};

struct SpmModelSpec {
  std::vector<SpmPiece> pieces;
  int model_type = 2;  // TrainerSpec.model_type: 1 UNIGRAM, 2 BPE
  bool byte_fallback = false;
  int unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;
  // NormalizerSpec (name "identity": no character mapping).
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = false;
  bool escape_whitespaces = true;
};

std::string SerializeSpmModel(const SpmModelSpec& spec);

// The pieces, trainer ids/type/byte_fallback and normalizer flags of a ModelProto;
// InvalidArgument for bytes that are not one.
absl::StatusOr<SpmModelSpec> ParseSpmModel(absl::string_view bytes);

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_SPM_MODEL_PROTO_H_
