#include "model/tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/bpe_tokenizer.h"
#include "model/gguf.h"
#include "model/gguf_tokenizer.h"
#include "model/sentencepiece_tokenizer.h"

namespace echokv::model {
namespace {

// "\xEF\xBF\xBD": U+FFFD, what decoders produce for an incomplete byte-token run.
constexpr absl::string_view kReplacement = "\xEF\xBF\xBD";

// True when `text` ends inside a UTF-8 sequence (a lead byte whose continuation bytes
// have not all arrived yet).
bool EndsWithIncompleteUtf8(absl::string_view text) {
  // Walk back over at most 3 continuation bytes to the lead byte.
  size_t continuation = 0;
  size_t i = text.size();
  while (i > 0 && continuation < 4) {
    const unsigned char c = static_cast<unsigned char>(text[i - 1]);
    if ((c & 0xC0) != 0x80) break;
    ++continuation;
    --i;
  }
  if (i == 0) return false;  // only continuation bytes: nothing can complete them
  const unsigned char lead = static_cast<unsigned char>(text[i - 1]);
  size_t need = 0;
  if ((lead & 0x80) == 0) {
    need = 0;
  } else if ((lead & 0xE0) == 0xC0) {
    need = 1;
  } else if ((lead & 0xF0) == 0xE0) {
    need = 2;
  } else if ((lead & 0xF8) == 0xF0) {
    need = 3;
  } else {
    return false;  // invalid lead byte: nothing more will complete it
  }
  return continuation < need;
}

bool EndsWith(absl::string_view text, absl::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

bool StartsWith(absl::string_view text, absl::string_view prefix) {
  return text.size() >= prefix.size() && text.substr(0, prefix.size()) == prefix;
}

}  // namespace

absl::StatusOr<BoundedEncoding> Tokenizer::EncodeAtMost(absl::string_view text, const EncodeOptions& options,
                                                        int64_t max_tokens) const {
  absl::StatusOr<std::vector<int>> ids = Encode(text, options);
  if (!ids.ok()) return ids.status();
  BoundedEncoding out;
  out.exceeded = static_cast<int64_t>(ids->size()) > max_tokens;
  out.at_least = static_cast<int64_t>(ids->size());
  out.ids = std::move(*ids);
  return out;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& dir) {
  if (IsGgufFile(dir)) {
    ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(dir));
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadGgufTokenizer(*gguf);
    if (!tok.ok()) return absl::Status(tok.status().code(), absl::StrCat(dir, ": ", tok.status().message()));
    return tok;
  }
  if (IsByteLevelBpeDir(dir)) return LoadBpeTokenizer(dir);
  const std::string spm_path = dir + "/tokenizer.model";
  if (access(spm_path.c_str(), F_OK) == 0) return LoadSentencePieceTokenizer(dir);
  return absl::NotFoundError(absl::StrCat("no tokenizer in ", dir,
                                          ": neither tokenizer.json (byte-level BPE) nor "
                                          "tokenizer.model (SentencePiece) found"));
}

IncrementalDecoder::IncrementalDecoder(const Tokenizer* tokenizer, DecodeOptions options)
    : tokenizer_(tokenizer), options_(options) {}

IncrementalDecoder::IncrementalDecoder(const Tokenizer* tokenizer, absl::Span<const int> context,
                                       DecodeOptions options)
    : tokenizer_(tokenizer), options_(options) {
  // vLLM keeps 5 ids of context; one more covers a 4-byte character in byte tokens
  // right before the last word. A window that starts inside a character decodes its
  // stray bytes the same way in both decodes of Add, so they cancel out.
  constexpr size_t kContextIds = 6;
  const size_t keep = std::min(context.size(), kContextIds);
  ids_.assign(context.end() - keep, context.end());
  context_end_ = ids_.size();
  read_offset_ = ids_.size();
  // A context that ends inside a character (its decode ends in U+FFFD or a partial
  // sequence): what was emitted of it is the text before that character, so the
  // character is emitted whole once the added ids complete it.
  absl::StatusOr<std::string> text = tokenizer_->Decode(ids_, options_);
  context_broken_ = text.ok() && (EndsWith(*text, kReplacement) || EndsWithIncompleteUtf8(*text));
}

// The scheme of Hugging Face text-generation-inference: decode a small window twice,
// once up to what was already emitted and once up to the end, and emit the difference.
// Re-decoding from prefix_offset_ keeps the context SentencePiece needs (its dropped
// leading space, byte-fallback runs split over several tokens).
absl::StatusOr<std::string> IncrementalDecoder::PrefixText() const {
  absl::Span<const int> all(ids_);
  ECHOKV_ASSIGN_OR_RETURN(
      std::string prefix_text,
      tokenizer_->Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), options_));
  if (context_broken_ && read_offset_ == context_end_) {
    // Nothing emitted since the context: its broken last character counts as not emitted.
    while (EndsWith(prefix_text, kReplacement)) prefix_text.resize(prefix_text.size() - kReplacement.size());
    while (EndsWithIncompleteUtf8(prefix_text)) prefix_text.pop_back();
  }
  return prefix_text;
}

absl::StatusOr<std::string> IncrementalDecoder::Add(int id) {
  ids_.push_back(id);
  absl::Span<const int> all(ids_);
  ECHOKV_ASSIGN_OR_RETURN(std::string prefix_text, PrefixText());
  ECHOKV_ASSIGN_OR_RETURN(std::string new_text,
                          tokenizer_->Decode(all.subspan(prefix_offset_), options_));
  if (new_text.size() <= prefix_text.size() || !StartsWith(new_text, prefix_text) ||
      EndsWith(new_text, kReplacement) || EndsWithIncompleteUtf8(new_text)) {
    return std::string();  // nothing new yet, or a character still incomplete: wait
  }
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return new_text.substr(prefix_text.size());
}

absl::StatusOr<std::string> IncrementalDecoder::Finish() {
  if (ids_.size() == context_end_) return std::string();  // nothing added: nothing to flush
  absl::Span<const int> all(ids_);
  ECHOKV_ASSIGN_OR_RETURN(std::string prefix_text, PrefixText());
  ECHOKV_ASSIGN_OR_RETURN(std::string new_text,
                          tokenizer_->Decode(all.subspan(prefix_offset_), options_));
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  if (StartsWith(new_text, prefix_text)) return new_text.substr(prefix_text.size());
  // The window no longer extends what was emitted (should not happen with the
  // tokenizers here): emit what lies beyond the emitted length.
  return new_text.size() > prefix_text.size() ? new_text.substr(prefix_text.size())
                                              : std::string();
}

absl::StatusOr<std::string> DecodeContinuation(const Tokenizer& tokenizer, absl::Span<const int> context,
                                               absl::Span<const int> ids, const DecodeOptions& options) {
  IncrementalDecoder stream(&tokenizer, context, options);
  std::string out;
  for (int id : ids) {
    ECHOKV_ASSIGN_OR_RETURN(std::string piece, stream.Add(id));
    out += piece;
  }
  ECHOKV_ASSIGN_OR_RETURN(std::string rest, stream.Finish());
  return out + rest;
}

}  // namespace echokv::model
