// The tokenizer and chat template a GGUF file carries in its metadata (torch-free).
//
// `tokenizer.ggml.model` "gpt2" (byte-level BPE: tokens, merges, token types) becomes
// the tokenizer.json + tokenizer_config.json that describe the same tokenizer, loaded
// by our byte-level BPE (model/bpe_tokenizer.h):
//   - vocabulary: the tokens in id order (a token not spelled in the byte-level
//     alphabet is respelled from its UTF-8 bytes, as transformers does);
//   - added tokens: CONTROL tokens (type 3) and the bos/eos/unk/padding tokens as
//     special, USER_DEFINED (type 4) as plain added tokens, matched whole in the text;
//   - pre-tokenizer: the regex splits llama.cpp applies for `tokenizer.ggml.pre`
//     (llama-vocab.cpp), as a Sequence of Split(Isolated) steps and ByteLevel without
//     its own regex. "smollm" (and starcoder, refact, command-r) split every digit
//     on its own before GPT-2's regex, like the original SmolLM2 tokenizer.json
//     (Digits(individual_digits) + ByteLevel); transformers' GGUF tokenizer (5.x)
//     knows no "smollm" and falls back to GPT-2's regex, so the two differ on runs of
//     digits only (tests/model/smollm2_golden_test.cc pins both facts);
//   - add_bos_token / add_eos_token from `tokenizer.ggml.add_bos_token` /
//     `add_eos_token` (default false for gpt2 files).
// `tokenizer.chat_template` is the model's Jinja template, rendered by jinja/.
// `tokenizer.ggml.model` "llama" (SentencePiece: tokens, scores, token types) becomes a
// SentencePiece ModelProto (model/spm_model_proto.h) loaded by Debian's
// libsentencepiece, as llama.cpp's SPM vocabulary reads it: BPE over the scores, byte
// fallback when the vocabulary has byte tokens, `tokenizer.ggml.add_space_prefix`
// (default true) as the dummy prefix, no other normalization, add_bos_token default
// true. Other tokenizer models (t5, bert, rwkv, ...) are refused by name.
//
//   ECHOKV_ASSIGN_OR_RETURN(auto gguf, GgufFile::Open(path));
//   ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, LoadGgufTokenizer(*gguf));
//   ECHOKV_ASSIGN_OR_RETURN(ChatTemplate chat, LoadGgufChatTemplate(*gguf, std::nullopt));
#ifndef ECHOKV_MODEL_GGUF_TOKENIZER_H_
#define ECHOKV_MODEL_GGUF_TOKENIZER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace echokv::model {

struct GgufTokenizerFiles {
  std::string tokenizer_json;         // byte-level BPE: Hugging Face tokenizer.json
  std::string tokenizer_model;        // SentencePiece: the tokenizer.model bytes
  std::string tokenizer_config_json;  // tokenizer_config.json (special tokens, add_bos, chat_template)
};

// The Hugging Face files equivalent to the file's tokenizer metadata (tokenizer.json
// or tokenizer.model, and tokenizer_config.json). Errors name the metadata key.
absl::StatusOr<GgufTokenizerFiles> GgufTokenizerJson(const GgufFile& file);

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(const GgufFile& file);

// The file's `tokenizer.chat_template` with its special tokens, or the operator's
// override (a Jinja file or "builtin:NAME"); UNIMPLEMENTED when there is neither.
absl::StatusOr<ChatTemplate> LoadGgufChatTemplate(const GgufFile& file,
                                                  const std::optional<std::string>& override_path);

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_GGUF_TOKENIZER_H_
