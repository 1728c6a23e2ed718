// The pre-tokenizer's regexes for the byte-level BPE tokenizer (model/bpe_tokenizer.h):
// PCRE2 (UTF + UCP, JIT when available) compiled once at load, per-Encode-call match
// scratch, and the split of a text into matches and the gaps between them (HF Split
// behavior "Isolated"). Internal to model/ (bpe_tokenizer*.cc).
#ifndef ECHOKV_MODEL_BPE_REGEX_H_
#define ECHOKV_MODEL_BPE_REGEX_H_

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "model/bpe_text.h"

namespace echokv::model::bpe_internal {

class Regex {
 public:
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(const std::string& pattern, bool literal,
                                                        const std::string& where) {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    uint32_t flags = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
    if (literal) flags |= PCRE2_LITERAL;
    if (FindInvalidUtf8(pattern) != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": pattern is not valid UTF-8"));
    }
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     flags, &err, &err_offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof(buf));
      return absl::InvalidArgumentError(absl::StrFormat("%s: bad regex at offset %d: %s (pattern %s)",
                                                        where, err_offset,
                                                        reinterpret_cast<char*>(buf), pattern));
    }
    auto re = std::unique_ptr<Regex>(new Regex(code));
    re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    return re;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  pcre2_code* code() const { return code_; }

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;  // owned
  bool jit_ = false;  // JIT-compiled (pcre2_match then uses it automatically)
};

// Per-Encode-call state for one regex: match data and, when the default JIT stack is
// too small for a subject, a bigger one.
struct MatchScratch {
  ~MatchScratch() {
    if (match_data != nullptr) pcre2_match_data_free(match_data);
    if (context != nullptr) pcre2_match_context_free(context);
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
  }
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
};

// Calls emit(piece) for each match of `re` in `subject` and for each gap between
// matches (HF Split behavior "Isolated"), in order, until emit returns false.
// `subject` must be valid UTF-8.
template <typename Emit>
absl::Status SplitIsolated(const Regex& re, absl::string_view subject, MatchScratch* scratch,
                           Emit&& emit) {
  if (scratch->match_data == nullptr) {
    scratch->match_data = pcre2_match_data_create_from_pattern(re.code(), nullptr);
    if (scratch->match_data == nullptr) return absl::ResourceExhaustedError("pcre2: out of memory");
  }
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const size_t n = subject.size();
  size_t offset = 0, last_end = 0;
  while (offset <= n) {
    int rc = pcre2_match(re.code(), subj, n, offset, PCRE2_NO_UTF_CHECK, scratch->match_data,
                         scratch->context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && scratch->jit_stack == nullptr) {
      scratch->context = pcre2_match_context_create(nullptr);
      scratch->jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
      if (scratch->context == nullptr || scratch->jit_stack == nullptr) {
        return absl::ResourceExhaustedError("pcre2: cannot allocate a JIT stack");
      }
      pcre2_jit_stack_assign(scratch->context, nullptr, scratch->jit_stack);
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof(buf));
      return absl::InternalError(
          absl::StrCat("pre-tokenizer regex failed: ", reinterpret_cast<char*>(buf)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch->match_data);
    const size_t s = ov[0], e = ov[1];
    if (s > last_end && !emit(subject.substr(last_end, s - last_end))) return absl::OkStatus();
    if (e > s) {
      if (!emit(subject.substr(s, e - s))) return absl::OkStatus();
      offset = e;
    } else {
      if (s >= n) break;
      size_t consumed;
      const size_t len = Utf8SeqLen(subject, s, &consumed);
      offset = s + std::max<size_t>(len, 1);
    }
    last_end = std::max(last_end, e);
  }
  if (last_end < n) emit(subject.substr(last_end));
  return absl::OkStatus();
}

}  // namespace echokv::model::bpe_internal

#endif  // ECHOKV_MODEL_BPE_REGEX_H_
