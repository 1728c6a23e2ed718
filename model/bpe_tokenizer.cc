// Encode and Decode of the byte-level BPE tokenizer (model/bpe_tokenizer.h): added
// tokens matched in the raw text, NFC, the pre-tokenizer pipeline, the byte-level
// mapping, the merge loop (a heap over a linked list of symbols, O(n log n) per
// pre-token, with a per-call word cache); loading is in bpe_tokenizer_load.cc.
#include "model/bpe_tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "model/bpe_text.h"
#include "model/bpe_tokenizer_internal.h"

namespace echokv::model {

using bpe_internal::FindInvalidUtf8;
using bpe_internal::kMaxCachedWordBytes;
using bpe_internal::kMaxCacheEntries;
using bpe_internal::LossyUtf8;
using bpe_internal::SplitIsolated;

absl::StatusOr<std::vector<int>> BpeTokenizer::Encode(absl::string_view text,
                                                      const EncodeOptions& options) const {
  bool stopped = false;
  return EncodeImpl(text, options, -1, &stopped);
}

absl::StatusOr<BoundedEncoding> BpeTokenizer::EncodeAtMost(absl::string_view text, const EncodeOptions& options,
                                                           int64_t max_tokens) const {
  BoundedEncoding out;
  // Every id covers at most max_token_bytes_ bytes of the normalized text, and NFC
  // shrinks text at most 3-fold (three 3-byte Hangul jamo compose into one syllable).
  // Added tokens with lstrip/rstrip may swallow any amount of whitespace, so the bound
  // holds only when they are not matched.
  if (!options.parse_special || added_.empty()) {
    const int64_t at_least = static_cast<int64_t>(text.size()) / (nfc_ ? 3 : 1) / max_token_bytes_;
    if (at_least > max_tokens) {
      out.exceeded = true;
      out.at_least = at_least;
      return out;
    }
  }
  bool stopped = false;
  ECHOKV_ASSIGN_OR_RETURN(out.ids, EncodeImpl(text, options, std::max<int64_t>(max_tokens, 0), &stopped));
  if (stopped || static_cast<int64_t>(out.ids.size()) > max_tokens) {
    out.exceeded = true;
    out.at_least = std::max<int64_t>(static_cast<int64_t>(out.ids.size()), max_tokens + 1);
    out.ids.clear();
  }
  return out;
}

absl::StatusOr<std::vector<int>> BpeTokenizer::EncodeImpl(absl::string_view text, const EncodeOptions& options,
                                                          int64_t limit, bool* stopped) const {
  if (const size_t bad = FindInvalidUtf8(text); bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("text to encode is not valid UTF-8 (byte offset ", bad, ")"));
  }
  std::vector<int> out;
  const size_t guess = text.size() / 3 + 4;
  out.reserve(limit >= 0 ? std::min<size_t>(guess, static_cast<size_t>(limit) + 4) : guess);
  if (options.add_special_tokens) {
    const std::vector<int>& pre = has_template_ ? template_prefix_ : bos_prefix_;
    out.insert(out.end(), pre.begin(), pre.end());
  }
  EncodeState state;
  state.match.resize(pre_steps_.size());
  state.limit = limit;
  // The limit counts every id, the specials around the text included.
  const int64_t suffix = options.add_special_tokens
                             ? static_cast<int64_t>((has_template_ ? template_suffix_ : eos_suffix_).size())
                             : 0;
  if (limit >= 0) state.limit = std::max<int64_t>(limit - suffix, 0);
  const absl::Status encoded = [&]() -> absl::Status {
    if (!options.parse_special || added_.empty()) {
      ECHOKV_RETURN_IF_ERROR(EncodeSegment(text, &state, &out));
    } else {
      size_t seg_start = 0, i = 0;
      const size_t n = text.size();
      while (i < n) {
        const auto& candidates = added_by_byte_[static_cast<unsigned char>(text[i])];
        const AddedToken* hit = nullptr;
        for (int c : candidates) {
          const AddedToken& t = added_[c];
          if (text.compare(i, t.content.size(), t.content) == 0) {
            hit = &t;  // longest first
            break;
          }
        }
        if (hit == nullptr) {
          ++i;
          continue;
        }
        size_t start = i, end = i + hit->content.size();
        const auto is_space = [](char c) {
          return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
        };
        if (hit->lstrip) {
          while (start > seg_start && is_space(text[start - 1])) --start;
        }
        if (hit->rstrip) {
          while (end < n && is_space(text[end])) ++end;
        }
        if (start > seg_start) {
          ECHOKV_RETURN_IF_ERROR(EncodeSegment(text.substr(seg_start, start - seg_start), &state, &out));
        }
        out.push_back(hit->id);
        if (state.limit >= 0 && static_cast<int64_t>(out.size()) > state.limit) {
          state.stopped = true;
          return absl::OkStatus();
        }
        seg_start = i = end;
      }
      if (seg_start < n) ECHOKV_RETURN_IF_ERROR(EncodeSegment(text.substr(seg_start), &state, &out));
    }
    return absl::OkStatus();
  }();
  *stopped = state.stopped;
  if (state.stopped) return out;  // incomplete: the caller only learns it is too long
  if (!encoded.ok()) return encoded;
  if (options.add_special_tokens) {
    const std::vector<int>& post = has_template_ ? template_suffix_ : eos_suffix_;
    out.insert(out.end(), post.begin(), post.end());
  }
  return out;
}

absl::Status BpeTokenizer::EncodeSegment(absl::string_view segment, EncodeState* state,
                                         std::vector<int>* out) const {
  if (state->stopped) return absl::OkStatus();
  if (!nfc_) return PreTokenize(0, segment, state, out);
  ECHOKV_ASSIGN_OR_RETURN(std::string normalized, NfcNormalize(segment));
  return PreTokenize(0, normalized, state, out);
}

absl::Status BpeTokenizer::PreTokenize(size_t step, absl::string_view piece, EncodeState* state,
                                       std::vector<int>* out) const {
  if (piece.empty() || state->stopped) return absl::OkStatus();
  if (step == pre_steps_.size()) {
    ECHOKV_RETURN_IF_ERROR(EncodeWord(piece, state, out));
    if (state->limit >= 0 && static_cast<int64_t>(out->size()) > state->limit) state->stopped = true;
    return absl::OkStatus();
  }
  const PreStep& s = pre_steps_[step];
  std::string with_space;
  if (s.byte_level && s.add_prefix_space && piece.front() != ' ') {
    with_space = absl::StrCat(" ", piece);
    piece = with_space;
  }
  if (s.regex == nullptr) return PreTokenize(step + 1, piece, state, out);
  absl::Status status;
  ECHOKV_RETURN_IF_ERROR(SplitIsolated(*s.regex, piece, &state->match[step],
                                       [&](absl::string_view sub) {
                                         if (status.ok()) status = PreTokenize(step + 1, sub, state, out);
                                         return status.ok() && !state->stopped;  // false: stop scanning
                                       }));
  return status;
}

absl::Status BpeTokenizer::EncodeWord(absl::string_view word, EncodeState* state,
                                      std::vector<int>* out) const {
  if (word.size() == 1) {
    const int id = byte_id_[static_cast<unsigned char>(word[0])];
    if (id >= 0) {
      out->push_back(id);
      return absl::OkStatus();
    }
  }
  if (ignore_merges_) {
    auto it = bytes_to_id_.find(std::string(word));
    if (it != bytes_to_id_.end()) {
      out->push_back(it->second);
      return absl::OkStatus();
    }
  }
  if (word.size() > kMaxCachedWordBytes) return MergeWord(word, out);
  std::string key(word);
  auto it = state->cache.find(key);
  if (it != state->cache.end()) {
    out->insert(out->end(), it->second.begin(), it->second.end());
    return absl::OkStatus();
  }
  const size_t before = out->size();
  ECHOKV_RETURN_IF_ERROR(MergeWord(word, out));
  if (state->cache.size() < kMaxCacheEntries) {
    state->cache.emplace(std::move(key), std::vector<int>(out->begin() + before, out->end()));
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizer::MergeWord(absl::string_view word, std::vector<int>* out) const {
  // Symbols form a doubly linked list over the word's bytes; a min-heap holds candidate
  // merges (rank, left position). Stale heap entries are detected and skipped, so the
  // whole word costs O(n log n) whatever its length.
  struct Symbol {
    int id;
    int prev, next;  // neighbours (-1 at the ends)
    bool alive;      // false once merged into its left neighbour
  };
  struct Candidate {
    int rank, pos;         // merge rank; position of the left symbol
    int right;             // position of the right symbol when pushed
    int left_id, right_id; // the pair when pushed (stale once either symbol changed)
    int new_id;            // merged token
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const int n = static_cast<int>(word.size());
  std::vector<Symbol> sym(n);
  for (int i = 0; i < n; ++i) {
    int id = byte_id_[static_cast<unsigned char>(word[i])];
    if (id < 0) {
      if (!unk_id_) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "byte 0x%02x has no token in the vocabulary and model.unk_token is null",
            static_cast<unsigned char>(word[i])));
      }
      id = *unk_id_;
    }
    sym[i] = Symbol{id, i - 1, i + 1 < n ? i + 1 : -1, true};
  }
  std::vector<Candidate> storage;
  storage.reserve(n);
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap(
      std::greater<Candidate>(), std::move(storage));
  const auto push_pair = [&](int left) {
    const int right = sym[left].next;
    if (right < 0) return;
    const MergeInfo* m = merges_.Find(PairKey(sym[left].id, sym[right].id));
    if (m != nullptr) heap.push(Candidate{m->rank, left, right, sym[left].id, sym[right].id, m->new_id});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    Symbol& left = sym[top.pos];
    // Stale when the left symbol was absorbed, got a new right neighbour, or either
    // symbol changed id since the candidate was pushed.
    if (!left.alive || left.next != top.right || left.id != top.left_id ||
        sym[top.right].id != top.right_id) {
      continue;
    }
    Symbol& right = sym[top.right];
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int i = 0; i >= 0; i = sym[i].next) out->push_back(sym[i].id);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------
// Decode.

absl::StatusOr<std::string> BpeTokenizer::Decode(absl::Span<const int> ids,
                                                 const DecodeOptions& options) const {
  std::string bytes;
  for (int id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside [0, ", vocab_size(), ")"));
    }
    if (!(flags_[id] & kHasToken)) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " has no token"));
    }
    if (options.skip_special_tokens && (flags_[id] & kSpecial)) continue;
    bytes += id_to_bytes_[id];
  }
  return LossyUtf8(bytes);
}

}  // namespace echokv::model
