// The rule of IncrementalDecoder with a context (model/tokenizer.h), checked at every
// split of a text's ids: the ids after the split stream exactly Decode(all) minus
// Decode(context); a split inside a character (Decode(context) ends in U+FFFD) streams
// that character whole. Shared by the SentencePiece and byte-level BPE tests.
#ifndef ECHOKV_TESTS_MODEL_DECODE_CONTINUATION_CHECK_H_
#define ECHOKV_TESTS_MODEL_DECODE_CONTINUATION_CHECK_H_

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/tokenizer.h"
#include "tests/testing/status_matchers.h"

namespace echokv::model {

inline bool OnlyReplacementChars(const std::string& s) {
  for (size_t i = 0; i < s.size(); i += 3) {
    if (s.compare(i, 3, "\xEF\xBF\xBD") != 0) return false;
  }
  return true;
}

// Returns how many splits were checked exactly (not inside a character).
inline int CheckContinuationsAtEverySplit(const Tokenizer& tok, const std::vector<int>& ids) {
  int exact = 0;
  absl::StatusOr<std::string> full = tok.Decode(ids);
  EXPECT_TRUE(full.ok());
  if (!full.ok()) return 0;
  for (size_t k = 0; k <= ids.size(); ++k) {
    SCOPED_TRACE("split after " + std::to_string(k) + " of " + std::to_string(ids.size()) + " ids");
    const std::vector<int> context(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k));
    const std::vector<int> rest(ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end());
    absl::StatusOr<std::string> pre = tok.Decode(context);
    EXPECT_TRUE(pre.ok());
    if (!pre.ok()) return exact;
    IncrementalDecoder stream(&tok, context);
    std::string streamed;
    for (int id : rest) {
      absl::StatusOr<std::string> piece = stream.Add(id);
      EXPECT_TRUE(piece.ok());
      if (!piece.ok()) return exact;
      streamed += *piece;
    }
    absl::StatusOr<std::string> tail = stream.Finish();
    EXPECT_TRUE(tail.ok());
    if (!tail.ok()) return exact;
    streamed += *tail;
    absl::StatusOr<std::string> once = DecodeContinuation(tok, context, rest);
    EXPECT_TRUE(once.ok());
    if (once.ok()) {
      EXPECT_EQ(*once, streamed);
    }
    if (full->compare(0, pre->size(), *pre) == 0) {
      EXPECT_EQ(streamed, full->substr(pre->size()));
      ++exact;
    } else {
      // Inside a character: what is before it, then U+FFFD for its first bytes.
      EXPECT_GE(full->size(), streamed.size());
      const std::string before = full->substr(0, full->size() - streamed.size());
      EXPECT_EQ(full->substr(full->size() - streamed.size()), streamed);
      EXPECT_EQ(pre->compare(0, before.size(), before), 0) << *pre;
      EXPECT_TRUE(OnlyReplacementChars(pre->substr(std::min(before.size(), pre->size())))) << *pre;
    }
  }
  return exact;
}

}  // namespace echokv::model

#endif  // ECHOKV_TESTS_MODEL_DECODE_CONTINUATION_CHECK_H_
