// The tokenizer interface of echokv, the loader that picks an implementation for a
// model directory, and the UTF-8-safe incremental decoder used for streaming.
//
//   ECHOKV_ASSIGN_OR_RETURN(auto tok, LoadTokenizer("/models/stories260K"));
//   ECHOKV_ASSIGN_OR_RETURN(std::vector<int> ids, tok->Encode("Once upon a time"));
//   IncrementalDecoder stream(tok.get(), prompt);   // the prompt: context only
//   for (int id : generated) std::cout << stream.Add(id);   // never half a character
//   std::cout << stream.Finish();
#ifndef ECHOKV_MODEL_TOKENIZER_H_
#define ECHOKV_MODEL_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace echokv::model {

struct EncodeOptions {
  // Prepend BOS when the tokenizer adds one by default (tokenizer_config.json's
  // add_bos_token; SentencePiece Llama/Mistral: true; byte-level BPE: usually false).
  // false never adds BOS.
  bool add_special_tokens = true;
  // Match added/special-token strings (e.g. "<|im_end|>") in the text. false encodes
  // such strings as plain text (for untrusted user content).
  bool parse_special = true;
};

// The result of Tokenizer::EncodeAtMost.
struct BoundedEncoding {
  // !exceeded: exactly Encode(text, options). exceeded: unspecified (work stopped).
  std::vector<int> ids;
  bool exceeded = false;  // the encoding has more than max_tokens ids
  int64_t at_least = 0;   // exceeded: a lower bound (> max_tokens) on its length
};

struct DecodeOptions {
  bool skip_special_tokens = false;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual absl::StatusOr<std::vector<int>> Encode(absl::string_view text,
                                                  const EncodeOptions& options = {}) const = 0;
  // Encode with bounded work for untrusted input: stops as soon as the result is known
  // to exceed `max_tokens` ids (a lower bound from the text's size, or the pieces
  // encoded so far), so a huge text costs about as much as max_tokens tokens. When the
  // encoding fits, the ids are exactly Encode's (tests prove it per implementation).
  // The default encodes in full and compares.
  virtual absl::StatusOr<BoundedEncoding> EncodeAtMost(absl::string_view text, const EncodeOptions& options,
                                                       int64_t max_tokens) const;
  // Ids outside [0, vocab_size) -> InvalidArgument naming the id. Invalid UTF-8 from
  // byte tokens decodes to U+FFFD, as the reference implementations do.
  virtual absl::StatusOr<std::string> Decode(absl::Span<const int> ids,
                                             const DecodeOptions& options = {}) const = 0;
  // The vocabulary entry of `id` ("▁Once", "Ġworld", "<0x0A>"); "" when out of range.
  virtual std::string IdToPiece(int id) const = 0;
  virtual int vocab_size() const = 0;
  virtual std::optional<int> bos_id() const = 0;
  virtual std::vector<int> eos_ids() const = 0;
  // True for control/special tokens (BOS, EOS, <|im_end|>, ...).
  virtual bool IsSpecial(int id) const = 0;
  // "sentencepiece" or "bpe".
  virtual absl::string_view kind() const = 0;
};

// Loads the tokenizer of a model directory: tokenizer.json when it holds a byte-level
// BPE model, otherwise tokenizer.model (SentencePiece). tokenizer_config.json, when
// present, supplies add_bos_token and the special tokens. `dir` may also be a .gguf
// file: the tokenizer in its metadata (model/gguf_tokenizer.h).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& dir);

// Streams text for a growing id sequence without ever emitting a partial UTF-8
// character: text is held back while the decoded tail ends in an incomplete sequence
// (or U+FFFD from an incomplete byte-token run); Finish() flushes the rest.
//
// With a `context` (the ids that precede the streamed ones: a prompt, a session's
// history) the text streamed for ids a1..an is exactly
// Decode(context + a) minus Decode(context), the way Hugging Face's TextStreamer and
// vLLM's detokenizer keep prefix and read offsets: a SentencePiece "▁upon" after "Once"
// streams " upon", not the "upon" a decode from the start gives (the dummy prefix's
// space is dropped only at the start of a text). Only the context's last few ids are
// kept. When the context itself ends inside a character (a generation that stopped
// mid-character), that character is streamed whole once the added ids complete it.
// Without a context the stream is Decode(a).
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer* tokenizer, DecodeOptions options = {});
  IncrementalDecoder(const Tokenizer* tokenizer, absl::Span<const int> context, DecodeOptions options = {});

  // Adds one id; returns the newly completed text (possibly empty).
  absl::StatusOr<std::string> Add(int id);
  // Returns whatever is still held back (may contain U+FFFD for broken bytes).
  absl::StatusOr<std::string> Finish();

 private:
  const Tokenizer* tokenizer_;   // not owned
  DecodeOptions options_;        // passed to every Decode
  std::vector<int> ids_;         // every id added so far
  size_t prefix_offset_ = 0;     // ids_[prefix_offset_..) are re-decoded for context
  size_t read_offset_ = 0;       // ids_[..read_offset_) have been emitted
  size_t context_end_ = 0;       // ids_[..context_end_) are the context's tail
  bool context_broken_ = false;  // the context's decode ends inside a character

  // Decode of ids_[prefix_offset_, read_offset_): the text already emitted of the window.
  absl::StatusOr<std::string> PrefixText() const;
};

// The text `ids` add after `context`: Decode(context + ids) minus Decode(context)
// (IncrementalDecoder's rule, everything flushed). Without a context, Decode(ids).
absl::StatusOr<std::string> DecodeContinuation(const Tokenizer& tokenizer, absl::Span<const int> context,
                                               absl::Span<const int> ids, const DecodeOptions& options = {});

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_TOKENIZER_H_
