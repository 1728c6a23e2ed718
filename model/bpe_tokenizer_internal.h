// The byte-level BPE tokenizer's class (model/bpe_tokenizer.h), shared by the files
// that implement it: bpe_tokenizer_load.cc (tokenizer.json, the configs, added and
// special tokens) and bpe_tokenizer.cc (Encode: added tokens, normalization,
// pre-tokenization, the merge loop; Decode). Internal to model/.
#ifndef ECHOKV_MODEL_BPE_TOKENIZER_INTERNAL_H_
#define ECHOKV_MODEL_BPE_TOKENIZER_INTERNAL_H_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/bpe_regex.h"
#include "model/bpe_tokenizer.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace echokv::model {
namespace bpe_internal {

using json = nlohmann::json;

// Vocabulary ids must stay below this (bounds the id tables we allocate).
constexpr int64_t kMaxTokenId = 1 << 24;
// Words up to this many bytes go into the per-call BPE cache.
constexpr size_t kMaxCachedWordBytes = 64;
// The per-call cache stops growing at this many entries.
constexpr size_t kMaxCacheEntries = 1 << 16;

// Open-addressing hash map (pair key -> merge) for the hot lookups of the merge loop:
// one probe sequence in a flat array instead of std::unordered_map's node chase.
template <typename Value>
class FlatPairMap {
 public:
  void Reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots_.assign(cap, Slot{kEmpty, Value{}});
    mask_ = cap - 1;
    size_ = 0;
  }
  // Inserts unless present; returns false when `key` was already there.
  bool Insert(uint64_t key, const Value& value) {
    if (2 * (size_ + 1) > slots_.size()) Grow();
    for (size_t i = Hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return false;
      if (slots_[i].key == kEmpty) {
        slots_[i] = Slot{key, value};
        ++size_;
        return true;
      }
    }
  }
  const Value* Find(uint64_t key) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = Hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;  // never a key: ids are < 2^24
  struct Slot {
    uint64_t key;
    Value value;
  };
  static size_t Hash(uint64_t key) { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20); }
  void Grow() {
    std::vector<Slot> old = std::move(slots_);
    Reserve(std::max<size_t>(old.size(), 8));
    for (const Slot& s : old) {
      if (s.key != kEmpty) Insert(s.key, s.value);
    }
  }
  std::vector<Slot> slots_;  // kEmpty keys are free
  size_t mask_ = 0;          // slots_.size() - 1 (a power of two)
  size_t size_ = 0;          // occupied slots
};

}  // namespace bpe_internal

class BpeTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Create(absl::string_view tokenizer_json,
                                                              absl::string_view config_json,
                                                              absl::string_view generation_json);

  absl::StatusOr<std::vector<int>> Encode(absl::string_view text,
                                          const EncodeOptions& options) const override;
  absl::StatusOr<BoundedEncoding> EncodeAtMost(absl::string_view text, const EncodeOptions& options,
                                               int64_t max_tokens) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int> ids,
                                     const DecodeOptions& options) const override;
  std::string IdToPiece(int id) const override {
    if (id < 0 || id >= vocab_size()) return "";
    return id_to_piece_[id];
  }
  int vocab_size() const override { return static_cast<int>(id_to_piece_.size()); }
  std::optional<int> bos_id() const override { return bos_id_; }
  std::vector<int> eos_ids() const override { return eos_ids_; }
  bool IsSpecial(int id) const override {
    return id >= 0 && id < vocab_size() && (flags_[id] & kSpecial) != 0;
  }
  absl::string_view kind() const override { return "bpe"; }

 private:
  enum Flag : uint8_t { kHasToken = 1, kAdded = 2, kSpecial = 4 };
  struct AddedToken {
    std::string content;  // matched verbatim in the raw text
    int id;
    bool lstrip, rstrip;  // also swallow whitespace to the left / right
  };
  struct MergeInfo {
    int rank;    // position in merges (lower merges first)
    int new_id;  // id of the merged token
  };
  // One pre-tokenizer step (applied to every piece of the previous step).
  struct PreStep {
    std::unique_ptr<bpe_internal::Regex> regex;  // Split regex (or GPT-2's for ByteLevel use_regex)
    bool byte_level = false;                     // ByteLevel step
    bool add_prefix_space = false;               // ByteLevel: prepend ' ' to a piece not starting with one
  };
  // Mutable state of one Encode call.
  struct EncodeState {
    std::vector<bpe_internal::MatchScratch> match;            // one per PreStep
    std::unordered_map<std::string, std::vector<int>> cache;  // word bytes -> ids
    int64_t limit = -1;    // stop once the output holds more ids (-1 = never)
    bool stopped = false;  // the limit was passed: the output is incomplete
  };
  // Encode, stopping past `limit` ids (-1 = never); *stopped says whether it did.
  absl::StatusOr<std::vector<int>> EncodeImpl(absl::string_view text, const EncodeOptions& options,
                                              int64_t limit, bool* stopped) const;

  BpeTokenizer() = default;
  absl::Status LoadModel(const bpe_internal::json& model);
  absl::Status LoadAddedTokens(const bpe_internal::json& added);
  absl::Status LoadNormalizer(const bpe_internal::json& n);
  absl::Status LoadPreTokenizer(const bpe_internal::json& p);
  absl::Status LoadPostProcessor(const bpe_internal::json& p);
  absl::Status LoadConfigs(absl::string_view config_json, absl::string_view generation_json);
  std::optional<int> LookupToken(const std::string& text) const;

  absl::Status EncodeSegment(absl::string_view segment, EncodeState* state,
                             std::vector<int>* out) const;
  absl::Status PreTokenize(size_t step, absl::string_view piece, EncodeState* state,
                           std::vector<int>* out) const;
  absl::Status EncodeWord(absl::string_view word, EncodeState* state, std::vector<int>* out) const;
  absl::Status MergeWord(absl::string_view word, std::vector<int>* out) const;

  static uint64_t PairKey(int a, int b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::vector<std::string> id_to_piece_;            // vocab string ("Ġworld") or added content
  std::vector<std::string> id_to_bytes_;            // what Decode emits for the id
  std::vector<uint8_t> flags_;                      // Flag bits per id
  std::unordered_map<std::string, int> piece_to_id_;  // byte-level vocab strings
  std::unordered_map<std::string, int> bytes_to_id_;  // raw bytes -> id (ignore_merges only)
  bpe_internal::FlatPairMap<MergeInfo> merges_;     // (left id, right id) -> merge
  std::array<int, 256> byte_id_;                    // id of each single byte, -1 if none
  std::optional<int> unk_id_;                       // model.unk_token, used for missing bytes
  bool ignore_merges_ = false;                      // whole-word vocab hit skips merging
  bool nfc_ = false;                                // normalizer applies NFC
  std::vector<PreStep> pre_steps_;                  // pre-tokenizer pipeline
  std::vector<AddedToken> added_;                   // sorted longest first
  std::array<std::vector<int>, 256> added_by_byte_; // first byte -> indices into added_
  std::vector<int> template_prefix_, template_suffix_;  // TemplateProcessing specials
  bool has_template_ = false;                       // post_processor defines specials
  std::vector<int> bos_prefix_, eos_suffix_;        // from tokenizer_config add_*_token
  std::optional<int> bos_id_;                       // tokenizer_config bos_token
  std::vector<int> eos_ids_;                        // eos_token + generation_config
  int64_t max_token_bytes_ = 1;                     // most raw bytes one id covers (>= 1)
};

}  // namespace echokv::model

#endif  // ECHOKV_MODEL_BPE_TOKENIZER_INTERNAL_H_
