// Hugging Face tokenizer.json byte-level BPE tokenizer (Qwen2/2.5, Llama-3, GPT-2).
//
// Supported tokenizer.json subset (anything else is an InvalidArgument naming the
// component, never a silent fallback):
//   normalizer     null | NFC | Sequence of those
//   pre_tokenizer  ByteLevel(add_prefix_space, use_regex: GPT-2's built-in regex)
//                  | Sequence of Split(pattern {Regex|String}, behavior Isolated,
//                    invert false) and ByteLevel; a ByteLevel step is required
//   model          BPE (vocab, merges as "a b" strings or ["a","b"] pairs,
//                  ignore_merges; no dropout / byte_fallback / subword affixes)
//   decoder        ByteLevel;  post_processor  null | ByteLevel | TemplateProcessing
//                  (special tokens around $A only) | Sequence of those
//   added_tokens   special and non-special, lstrip/rstrip; matched in the raw text
//                  before normalization, longest match first (off with
//                  EncodeOptions::parse_special = false)
// Regexes run on PCRE2 (UTF + UCP, JIT when available); NFC comes from utf8proc. BPE
// merges use a heap over a linked list of symbols (O(n log n) per pre-token), with a
// per-Encode-call word cache (no shared mutable state: Encode is thread-safe).
//
//   ECHOKV_ASSIGN_OR_RETURN(auto tok, LoadBpeTokenizer("/models/qwen2.5"));
//   ECHOKV_ASSIGN_OR_RETURN(std::vector<int> ids, tok->Encode("Hello world"));
//   ECHOKV_ASSIGN_OR_RETURN(std::string text, tok->Decode(ids));   // "Hello world"
#ifndef ECHOKV_MODEL_BPE_TOKENIZER_H_
#define ECHOKV_MODEL_BPE_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/tokenizer.h"

namespace echokv::model {

class BpeTokenizer;

// True when `dir`/tokenizer.json exists and holds a BPE model with a ByteLevel
// pre-tokenizer or decoder (the kind this class implements).
bool IsByteLevelBpeDir(const std::string& dir);

// Loads `dir`/tokenizer.json (+ tokenizer_config.json and generation_config.json when
// present: add_bos_token / add_eos_token, bos_token, eos_token, eos_token_id).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizer(const std::string& dir);

// Same from file contents (tests, embedded tokenizers). Empty config texts mean "no
// such file". Errors name the file ("tokenizer.json: ...") and the bad field.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizerFromJson(
    absl::string_view tokenizer_json, absl::string_view tokenizer_config_json = "",
    absl::string_view generation_config_json = "");

// Unicode NFC of valid UTF-8 text (utf8proc); InvalidArgument naming the byte offset
// for invalid UTF-8. The normalizer the NFC step of tokenizer.json applies.
absl::StatusOr<std::string> NfcNormalize(absl::string_view text);

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_BPE_TOKENIZER_H_
