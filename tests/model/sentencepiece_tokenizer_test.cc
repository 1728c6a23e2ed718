// SentencePiece tokenizer against the goldens of real tokenizers (stories260K,
// Mistral 7B v0.2), the tokenizer_config.json options, and incremental decoding.
// LibTorch is loaded in this process on purpose: the SentencePiece module's bundled
// protobuf would clash with LibTorch's if it were not isolated.
#include "model/sentencepiece_tokenizer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/model/decode_continuation_check.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::model {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;
using ::testing::ElementsAre;

// A scratch directory removed when the test ends.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix)
      : path_(::echokv::testing::MakeTempDir(prefix)) {}
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;  // created by MakeTempDir
};

// Strict UTF-8 validity (no overlongs, no surrogates, <= U+10FFFF).
bool IsValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000)) return false;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

nlohmann::json ReadJson(const std::string& path) {
  return nlohmann::json::parse(::echokv::testing::ReadFileOrDie(path));
}

std::vector<int> Ids(const nlohmann::json& j) { return j.get<std::vector<int>>(); }

// Feeds `ids` one at a time; checks every chunk is valid UTF-8 and that the chunks
// plus Finish() equal Decode(ids).
void ExpectIncrementalMatches(const Tokenizer& tok, const std::vector<int>& ids,
                              const std::string& label) {
  SCOPED_TRACE(label);
  IncrementalDecoder stream(&tok);
  std::string streamed;
  for (int id : ids) {
    absl::StatusOr<std::string> chunk = stream.Add(id);
    ASSERT_THAT(chunk, IsOk());
    EXPECT_TRUE(IsValidUtf8(*chunk)) << "chunk after id " << id << " is not valid UTF-8";
    EXPECT_EQ(chunk->find("\xEF\xBF\xBD"), std::string::npos) << "chunk has U+FFFD";
    streamed += *chunk;
  }
  absl::StatusOr<std::string> rest = stream.Finish();
  ASSERT_THAT(rest, IsOk());
  streamed += *rest;
  absl::StatusOr<std::string> whole = tok.Decode(ids);
  ASSERT_THAT(whole, IsOk());
  EXPECT_EQ(streamed, *whole);
}

TEST(ValidUtf8Test, Checker) {
  EXPECT_TRUE(IsValidUtf8("abc \xC3\xA9 \xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xC3"));
  EXPECT_FALSE(IsValidUtf8("\xF0\x9F\x98"));
  EXPECT_FALSE(IsValidUtf8("\x80"));
}

TEST(SentencePieceTokenizerTest, LibTorchIsLoadedInThisProcess) {
  // Creating a tensor forces LibTorch (and its protobuf) to initialise before and
  // alongside the SentencePiece module; a clash would crash this binary.
  at::Tensor t = at::ones({2, 3});
  EXPECT_EQ(t.sum().item<float>(), 6.0f);
}

TEST(SentencePieceTokenizerTest, MissingModelIsNotFound) {
  ScratchDir scratch("spm_missing");
  const std::string& dir = scratch.path();
  EXPECT_THAT(LoadSentencePieceTokenizer(dir),
              StatusIs(absl::StatusCode::kNotFound, "tokenizer.model"));
  EXPECT_THAT(LoadTokenizer(dir), StatusIs(absl::StatusCode::kNotFound, "tokenizer.json"));
  EXPECT_THAT(LoadTokenizer(dir), StatusIs(absl::StatusCode::kNotFound, "tokenizer.model"));
}

TEST(SentencePieceTokenizerTest, CorruptModelIsAnError) {
  ScratchDir scratch("spm_corrupt");
  const std::string& dir = scratch.path();
  ::echokv::testing::WriteFileOrDie(dir + "/tokenizer.model", "this is not a protobuf");
  EXPECT_THAT(LoadSentencePieceTokenizer(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, "tokenizer.model"));
}

TEST(StoriesTokenizerTest, PromptIdsMatchGolden) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  const std::string dir = data + "/models/stories260K";
  ASSERT_OK_AND_ASSIGN(auto tok, LoadTokenizer(dir));
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_THAT(tok->eos_ids(), ElementsAre(2));
  EXPECT_TRUE(tok->IsSpecial(1));
  EXPECT_TRUE(tok->IsSpecial(2));
  EXPECT_FALSE(tok->IsSpecial(300));
  std::vector<std::string> goldens = ::echokv::testing::ListFiles(dir, "golden", ".json");
  ASSERT_FALSE(goldens.empty());
  int cases = 0;
  for (const std::string& path : goldens) {
    nlohmann::json golden = ReadJson(path);
    for (const nlohmann::json& c : golden["cases"]) {
      SCOPED_TRACE(path + " case " + c["name"].get<std::string>());
      ASSERT_OK_AND_ASSIGN(std::vector<int> ids, tok->Encode(c["prompt"].get<std::string>()));
      EXPECT_EQ(ids, Ids(c["prompt_ids"]));
      const std::vector<int> generated = Ids(c["generated_ids"]);
      if (c.contains("sentencepiece_decode_generated")) {
        ASSERT_OK_AND_ASSIGN(std::string text, tok->Decode(generated));
        EXPECT_EQ(text, c["sentencepiece_decode_generated"].get<std::string>());
      }
      std::vector<int> all = ids;
      all.insert(all.end(), generated.begin(), generated.end());
      ExpectIncrementalMatches(*tok, all, "prompt + generated");
      ExpectIncrementalMatches(*tok, generated, "generated");
      ++cases;
    }
  }
  EXPECT_GT(cases, 0);
}

TEST(MistralTokenizerTest, EveryGoldenCase) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  const std::string dir = data + "/tokenizers/mistral-7b-v0.2";
  ASSERT_OK_AND_ASSIGN(auto tok, LoadSentencePieceTokenizer(dir));
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_THAT(tok->eos_ids(), ElementsAre(2));
  std::vector<std::string> goldens = ::echokv::testing::ListFiles(dir, "golden", ".json");
  ASSERT_FALSE(goldens.empty());
  int cases = 0;
  for (const std::string& path : goldens) {
    nlohmann::json golden = ReadJson(path);
    for (const nlohmann::json& c : golden["cases"]) {
      SCOPED_TRACE(path + " case " + c["id"].get<std::string>());
      const std::string text = c["text"].get<std::string>();
      EncodeOptions plain;
      plain.add_special_tokens = false;
      ASSERT_OK_AND_ASSIGN(std::vector<int> ids, tok->Encode(text, plain));
      EXPECT_EQ(ids, Ids(c["ids"]));
      ASSERT_OK_AND_ASSIGN(std::vector<int> with_bos, tok->Encode(text));
      EXPECT_EQ(with_bos, Ids(c["ids_with_bos"]));
      // parse_special has no effect on SentencePiece (it never parses special text).
      EncodeOptions no_parse;
      no_parse.parse_special = false;
      ASSERT_OK_AND_ASSIGN(std::vector<int> unparsed, tok->Encode(text, no_parse));
      EXPECT_EQ(unparsed, Ids(c["ids_with_bos"]));
      std::vector<std::string> pieces;
      for (int id : Ids(c["ids"])) pieces.push_back(tok->IdToPiece(id));
      EXPECT_EQ(pieces, c["pieces"].get<std::vector<std::string>>());
      ASSERT_OK_AND_ASSIGN(std::string decoded, tok->Decode(Ids(c["ids"])));
      EXPECT_EQ(decoded, c["decoded"].get<std::string>());
      ASSERT_OK_AND_ASSIGN(std::string decoded_bos, tok->Decode(Ids(c["ids_with_bos"])));
      EXPECT_EQ(decoded_bos, c["decoded_with_bos"].get<std::string>());
      ExpectIncrementalMatches(*tok, Ids(c["ids"]), "ids");
      ExpectIncrementalMatches(*tok, Ids(c["ids_with_bos"]), "ids_with_bos");
      ++cases;
    }
    // Chat cases: segments encoded one by one, control ids inserted as ids.
    if (golden.contains("chat_cases")) {
      for (const nlohmann::json& c : golden["chat_cases"]) {
        SCOPED_TRACE(path + " chat case " + c["id"].get<std::string>());
        std::vector<int> ids;
        for (const nlohmann::json& seg : c["segments"]) {
          const std::string type = seg["type"].get<std::string>();
          if (type == "bos") {
            ids.push_back(*tok->bos_id());
          } else if (type == "eos") {
            ids.push_back(tok->eos_ids().front());
          } else {
            EncodeOptions plain;
            plain.add_special_tokens = false;
            ASSERT_OK_AND_ASSIGN(std::vector<int> seg_ids,
                                 tok->Encode(seg["text"].get<std::string>(), plain));
            ids.insert(ids.end(), seg_ids.begin(), seg_ids.end());
          }
        }
        EXPECT_EQ(ids, Ids(c["ids"]));
        ExpectIncrementalMatches(*tok, ids, "chat");
        ++cases;
      }
    }
  }
  EXPECT_GT(cases, 0);
}

TEST(MistralTokenizerTest, IncrementalDecodingOfByteFallbackText) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  ASSERT_OK_AND_ASSIGN(auto tok,
                       LoadSentencePieceTokenizer(data + "/tokenizers/mistral-7b-v0.2"));
  const std::vector<std::string> texts = {
      "caf\xC3\xA9 cr\xC3\xA8me br\xC3\xBBl\xC3\xA9" "e",                // é è û
      "smile \xF0\x9F\x98\x80 party \xF0\x9F\x8E\x89\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",
      "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C \xE9\xBE\x98\xE9\x9D\x90",
      "\xF0\x9F\x87\xBA\xF0\x9F\x87\xB8\xF0\x9F\x87\xAF\xF0\x9F\x87\xB5 mixed \xC3\xA9\xF0\x9F\x98\x80x",
  };
  int byte_tokens = 0;
  for (const std::string& text : texts) {
    ASSERT_OK_AND_ASSIGN(std::vector<int> ids, tok->Encode(text));
    for (int id : ids) byte_tokens += tok->IdToPiece(id).rfind("<0x", 0) == 0 ? 1 : 0;
    ASSERT_OK_AND_ASSIGN(std::string round, tok->Decode(ids));
    EXPECT_EQ(round, text);
    ExpectIncrementalMatches(*tok, ids, text);
  }
  // The emoji have no pieces of their own: they must have gone through byte fallback.
  EXPECT_GE(byte_tokens, 8);
}

TEST(MistralTokenizerTest, HeldBackUntilTheCharacterIsComplete) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  ASSERT_OK_AND_ASSIGN(auto tok,
                       LoadSentencePieceTokenizer(data + "/tokenizers/mistral-7b-v0.2"));
  // "😀" = F0 9F 98 80 -> four byte tokens <0xF0> <0x9F> <0x98> <0x80>; byte b is id b+3.
  const std::vector<int> ids = {0xF0 + 3, 0x9F + 3, 0x98 + 3, 0x80 + 3};
  for (int id : ids) ASSERT_EQ(tok->IdToPiece(id).rfind("<0x", 0), 0u) << id;
  IncrementalDecoder stream(tok.get());
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(std::string chunk, stream.Add(ids[i]));
    EXPECT_EQ(chunk, "") << "emitted part of a character after byte " << i;
  }
  ASSERT_OK_AND_ASSIGN(std::string chunk, stream.Add(ids[3]));
  EXPECT_EQ(chunk, "\xF0\x9F\x98\x80");
  ASSERT_OK_AND_ASSIGN(std::string rest, stream.Finish());
  EXPECT_EQ(rest, "");

  // A truncated character is flushed by Finish() as U+FFFD, like Decode does.
  IncrementalDecoder broken(tok.get());
  ASSERT_OK_AND_ASSIGN(std::string first, broken.Add(ids[0]));
  ASSERT_OK_AND_ASSIGN(std::string second, broken.Add(ids[1]));
  EXPECT_EQ(first + second, "");
  ASSERT_OK_AND_ASSIGN(std::string flushed, broken.Finish());
  ASSERT_OK_AND_ASSIGN(std::string decoded, tok->Decode({ids[0], ids[1]}));
  EXPECT_EQ(flushed, decoded);
  EXPECT_NE(flushed.find("\xEF\xBF\xBD"), std::string::npos);
}

// Issue 25 defect 1: a continuation keeps its first token's leading space. Decoded
// from the start, SentencePiece drops the dummy prefix's space of the first piece, so
// a stream over "▁upon" alone gave "upon" after the prompt "Once".
TEST(StoriesTokenizerTest, ContinuationKeepsTheLeadingSpace) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  ASSERT_OK_AND_ASSIGN(auto tok, LoadSentencePieceTokenizer(data + "/models/stories260K"));
  ASSERT_OK_AND_ASSIGN(std::vector<int> prompt, tok->Encode("Once"));
  ASSERT_OK_AND_ASSIGN(std::vector<int> all, tok->Encode("Once upon a time"));
  ASSERT_GT(all.size(), prompt.size());
  ASSERT_TRUE(std::equal(prompt.begin(), prompt.end(), all.begin()));
  const std::vector<int> rest(all.begin() + static_cast<std::ptrdiff_t>(prompt.size()), all.end());
  ASSERT_OK_AND_ASSIGN(std::string alone, tok->Decode(rest));
  EXPECT_EQ(alone, "upon a time");  // the space a decode from the start drops
  ASSERT_OK_AND_ASSIGN(std::string text, DecodeContinuation(*tok, prompt, rest));
  EXPECT_EQ(text, " upon a time");
  IncrementalDecoder stream(tok.get(), prompt);
  ASSERT_OK_AND_ASSIGN(std::string first, stream.Add(rest[0]));
  EXPECT_EQ(first, " upon");
  // Without a context the stream is Decode(ids), as before.
  EXPECT_EQ(DecodeContinuation(*tok, {}, rest).value(), alone);
}

TEST(StoriesTokenizerTest, ContinuationsAtEverySplitEqualTheDecodeDifference) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  ASSERT_OK_AND_ASSIGN(auto tok, LoadSentencePieceTokenizer(data + "/models/stories260K"));
  for (const char* text : {"Once upon a time, there was a little girl named Lily.\nShe liked to play.",
                           "  two  spaces and a tab\t, caf\xC3\xA9 \xE2\x80\x9Cquoted\xE2\x80\x9D"}) {
    SCOPED_TRACE(text);
    ASSERT_OK_AND_ASSIGN(std::vector<int> ids, tok->Encode(text));
    EXPECT_GT(CheckContinuationsAtEverySplit(*tok, ids), 0);
  }
}

// Byte fallback: the emoji and CJK characters are several byte tokens, so splits fall
// inside characters as well as between them.
TEST(MistralTokenizerTest, ContinuationsAtEverySplitEqualTheDecodeDifference) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  ASSERT_OK_AND_ASSIGN(auto tok, LoadSentencePieceTokenizer(data + "/tokenizers/mistral-7b-v0.2"));
  ASSERT_OK_AND_ASSIGN(std::vector<int> ids,
                       tok->Encode("Hi \xF0\x9F\x98\x80 party \xF0\x9F\x8E\x89\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD "
                                   "\xE9\xBE\x98\xE9\x9D\x90 caf\xC3\xA9\n\nOnce upon"));
  int byte_tokens = 0;
  for (int id : ids) byte_tokens += tok->IdToPiece(id).rfind("<0x", 0) == 0;
  ASSERT_GE(byte_tokens, 8);
  const int exact = CheckContinuationsAtEverySplit(*tok, ids);
  EXPECT_GT(exact, 0);
  EXPECT_LT(exact, static_cast<int>(ids.size()) + 1);  // some splits fell inside a character
}

TEST(MistralTokenizerTest, DecodeOptionsAndErrors) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  ASSERT_OK_AND_ASSIGN(auto tok,
                       LoadSentencePieceTokenizer(data + "/tokenizers/mistral-7b-v0.2"));
  ASSERT_OK_AND_ASSIGN(std::vector<int> ids, tok->Encode("Hello world"));
  std::vector<int> with_eos = ids;
  with_eos.push_back(2);
  with_eos.push_back(22557);  // "▁Hello" after EOS
  DecodeOptions skip;
  skip.skip_special_tokens = true;
  ASSERT_OK_AND_ASSIGN(std::string kept, tok->Decode(with_eos));
  ASSERT_OK_AND_ASSIGN(std::string skipped, tok->Decode(with_eos, skip));
  // Control pieces decode to "" either way (as sentencepiece does).
  EXPECT_EQ(kept, "Hello world Hello");
  EXPECT_EQ(skipped, "Hello world Hello");
  ExpectIncrementalMatches(*tok, with_eos, "with eos");

  EXPECT_THAT(tok->Decode(std::vector<int>{5, 32000}),
              StatusIs(absl::StatusCode::kInvalidArgument, "32000"));
  EXPECT_THAT(tok->Decode(std::vector<int>{-1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "-1"));
  EXPECT_EQ(tok->IdToPiece(32000), "");
  EXPECT_EQ(tok->IdToPiece(-5), "");
  EXPECT_EQ(tok->IdToPiece(1), "<s>");
  EXPECT_FALSE(tok->IsSpecial(32000));
  ASSERT_OK_AND_ASSIGN(std::string empty, tok->Decode(std::vector<int>{}));
  EXPECT_EQ(empty, "");
  ASSERT_OK_AND_ASSIGN(std::vector<int> empty_ids, tok->Encode(""));
  EXPECT_THAT(empty_ids, ElementsAre(1));
}

// A copy of the Mistral tokenizer.model with a tokenizer_config.json of our own.
std::unique_ptr<ScratchDir> MistralDirWithConfig(const std::string& data,
                                                 const std::string& config_json) {
  auto dir = std::make_unique<ScratchDir>("spm_config");
  std::filesystem::copy_file(data + "/tokenizers/mistral-7b-v0.2/tokenizer.model",
                             dir->path() + "/tokenizer.model");
  ::echokv::testing::WriteFileOrDie(dir->path() + "/tokenizer_config.json", config_json);
  return dir;
}

TEST(MistralTokenizerTest, TokenizerConfigAddBosAndEos) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  {
    auto dir = MistralDirWithConfig(data, R"({"add_bos_token": false})");
    ASSERT_OK_AND_ASSIGN(auto tok, LoadSentencePieceTokenizer(dir->path()));
    ASSERT_OK_AND_ASSIGN(std::vector<int> ids, tok->Encode("Hello world"));
    EXPECT_THAT(ids, ElementsAre(22557, 1526));
  }
  {
    auto dir = MistralDirWithConfig(
        data, R"({"add_bos_token": true, "add_eos_token": true,
                  "eos_token": {"content": "</s>", "special": true}})");
    ASSERT_OK_AND_ASSIGN(auto tok, LoadSentencePieceTokenizer(dir->path()));
    ASSERT_OK_AND_ASSIGN(std::vector<int> ids, tok->Encode("Hello world"));
    EXPECT_THAT(ids, ElementsAre(1, 22557, 1526, 2));
    EncodeOptions plain;
    plain.add_special_tokens = false;
    ASSERT_OK_AND_ASSIGN(std::vector<int> plain_ids, tok->Encode("Hello world", plain));
    EXPECT_THAT(plain_ids, ElementsAre(22557, 1526));
    EXPECT_THAT(tok->eos_ids(), ElementsAre(2));
  }
  {
    // eos_token naming another piece adds it to eos_ids.
    auto dir = MistralDirWithConfig(data, R"({"eos_token": "<0x0A>"})");
    ASSERT_OK_AND_ASSIGN(auto tok, LoadSentencePieceTokenizer(dir->path()));
    EXPECT_THAT(tok->eos_ids(), ElementsAre(2, 13));
  }
  {
    auto dir = MistralDirWithConfig(data, R"({"add_bos_token": "yes"})");
    EXPECT_THAT(LoadSentencePieceTokenizer(dir->path()),
                StatusIs(absl::StatusCode::kInvalidArgument, "add_bos_token"));
  }
  {
    auto dir = MistralDirWithConfig(data, R"({"add_bos_token": tru)");
    EXPECT_THAT(LoadSentencePieceTokenizer(dir->path()),
                StatusIs(absl::StatusCode::kInvalidArgument, "tokenizer_config.json"));
  }
}

}  // namespace
}  // namespace echokv::model

namespace echokv::model {
namespace {

// Random text that exercises the chunk cuts: runs of 1-3 spaces, leading and trailing
// spaces, newlines and tabs, digits, multi-byte characters and characters outside a
// small vocabulary (byte fallback).
std::string RandomSpmText(std::mt19937* rng, size_t words) {
  static const std::vector<std::string> kParts = {"Once", "upon", "a", "time", "the", "little", "dog", "ran",
                                                  "42",   "2024", "é",  "東京", "🙂", "ß", "\n", "\t", ".", ",",
                                                  "don't", "zzqx", "ÅÅ", "\xe2\x96\x81"};
  std::string out;
  if ((*rng)() % 3 == 0) out.append((*rng)() % 3 + 1, ' ');
  for (size_t i = 0; i < words; ++i) {
    out += kParts[(*rng)() % kParts.size()];
    if ((*rng)() % 5 != 0) out.append((*rng)() % 6 == 0 ? (*rng)() % 3 + 2 : 1, ' ');
  }
  return out;
}

// EncodeAtMost with cuts every few bytes equals Encode whenever the result fits, and
// reports "exceeded" (with a bound above the limit) exactly when it does not.
void CheckBoundedEncodeEqualsFull(const std::string& dir) {
  SentencePieceOptions small;
  small.encode_chunk_bytes = 8;  // cut at nearly every word
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tok, LoadSentencePieceTokenizer(dir, small));
  std::mt19937 rng(7);
  int cut_texts = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string text = RandomSpmText(&rng, 1 + rng() % 40);
    for (bool special : {true, false}) {
      EncodeOptions eo;
      eo.add_special_tokens = special;
      ASSERT_OK_AND_ASSIGN(std::vector<int> full, tok->Encode(text, eo));
      const int64_t n = static_cast<int64_t>(full.size());
      for (int64_t limit : {n, n + 3}) {
        ASSERT_OK_AND_ASSIGN(BoundedEncoding b, tok->EncodeAtMost(text, eo, limit));
        ASSERT_FALSE(b.exceeded) << "'" << text << "'";
        ASSERT_EQ(b.ids, full) << "'" << text << "' limit " << limit;
      }
      if (n > 0) {
        ASSERT_OK_AND_ASSIGN(BoundedEncoding b, tok->EncodeAtMost(text, eo, n - 1));
        EXPECT_TRUE(b.exceeded) << "'" << text << "'";
        EXPECT_GT(b.at_least, n - 1);
        EXPECT_LE(b.at_least, n);  // a lower bound of the true length
      }
    }
    if (text.find(' ', 9) != std::string::npos) ++cut_texts;
  }
  EXPECT_GT(cut_texts, 100);
  // Only the specials (an empty text): still measured against the limit.
  ASSERT_OK_AND_ASSIGN(BoundedEncoding empty, tok->EncodeAtMost("", EncodeOptions{}, 0));
  EXPECT_TRUE(empty.exceeded);
  EXPECT_EQ(empty.at_least, 1);
  // A huge text without spaces is refused from its size alone (byte fallback).
  ASSERT_OK_AND_ASSIGN(BoundedEncoding huge, tok->EncodeAtMost(std::string(4 << 20, 'a'), EncodeOptions{}, 512));
  EXPECT_TRUE(huge.exceeded);
  EXPECT_GT(huge.at_least, 512);
  // A long text of words just over the limit: the size bound cannot decide, so the
  // chunks are encoded until the limit is passed, and no further.
  std::string words;
  while (words.size() < (256 << 10)) words += "the little dog ran ";
  ASSERT_OK_AND_ASSIGN(std::vector<int> all, tok->Encode(words, EncodeOptions{}));
  const int64_t limit = static_cast<int64_t>(all.size()) - 100;
  ASSERT_OK_AND_ASSIGN(BoundedEncoding many, tok->EncodeAtMost(words, EncodeOptions{}, limit));
  EXPECT_TRUE(many.exceeded);
  EXPECT_GT(many.at_least, limit);
  EXPECT_LE(many.at_least, limit + 16);  // stopped within one 8-byte chunk of the limit
}

TEST(BoundedEncodeTest, StoriesChunkedEqualsFull) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  CheckBoundedEncodeEqualsFull(data + "/models/stories260K");
}

TEST(BoundedEncodeTest, MistralChunkedEqualsFull) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  CheckBoundedEncodeEqualsFull(data + "/tokenizers/mistral-7b-v0.2");
}

}  // namespace
}  // namespace echokv::model
