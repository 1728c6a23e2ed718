// libFuzzer target: tokenizers on untrusted text, and tokenizer.json itself.
//   selector % 8 in 0..3: text encoded by a real tokenizer (0 stories260K SentencePiece,
//     1 mistral-7b-v0.2 SentencePiece, 2 gpt2 byte-level BPE, 3 qwen2.5 BPE with NFC);
//     bit 3 / bit 4 of the selector: add_special_tokens / parse_special. Checks that
//     EncodeAtMost agrees with Encode (its contract), decodes the ids back, streams them
//     through IncrementalDecoder, and decodes the input's bytes read as ids.
//   selector % 8 == 4: tokenizer.json, NUL, tokenizer_config.json (LoadBpeTokenizerFromJson),
//     then encodes and decodes a fixed text with what loaded.
//   selector % 8 == 5: NfcNormalize of the text.
//   else: as 0..3 with selector % 4.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model/bpe_tokenizer.h"
#include "model/sentencepiece_tokenizer.h"
#include "model/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using echokv::model::Tokenizer;

std::unique_ptr<Tokenizer> MustLoad(const std::string& dir) {
  auto t = echokv::model::LoadTokenizer(dir);
  if (!t.ok()) {
    std::fprintf(stderr, "fuzz_tokenizer: cannot load %s: %s\n", dir.c_str(), t.status().ToString().c_str());
    std::abort();
  }
  return std::move(*t);
}

const std::vector<std::unique_ptr<Tokenizer>>& Tokenizers() {
  static const auto* all = [] {
    const std::string data = echokv::fuzz::TestData();
    auto* v = new std::vector<std::unique_ptr<Tokenizer>>();
    v->push_back(MustLoad(data + "/models/stories260K"));
    v->push_back(MustLoad(data + "/tokenizers/mistral-7b-v0.2"));
    v->push_back(MustLoad(data + "/tokenizers/gpt2"));
    v->push_back(MustLoad(data + "/tokenizers/qwen2.5"));
    return v;
  }();
  return *all;
}

void EncodeAndCheck(const Tokenizer& tok, absl::string_view text, uint8_t selector) {
  echokv::model::EncodeOptions options;
  options.add_special_tokens = (selector & 0x08) != 0;
  options.parse_special = (selector & 0x10) != 0;
  auto ids = tok.Encode(text, options);
  if (!ids.ok()) return;
  for (int id : *ids) {
    if (id < 0 || id >= tok.vocab_size()) echokv::fuzz::Violation("Encode produced an id outside the vocabulary");
  }
  const int64_t n = static_cast<int64_t>(ids->size());
  // EncodeAtMost's contract: when the encoding fits, exactly Encode's ids.
  for (int64_t max_tokens : {n, n + 3, std::max<int64_t>(0, n - 1), int64_t{0}}) {
    auto bounded = tok.EncodeAtMost(text, options, max_tokens);
    if (!bounded.ok()) echokv::fuzz::Violation("EncodeAtMost failed where Encode succeeded");
    if (n <= max_tokens) {
      if (bounded->exceeded || bounded->ids != *ids) echokv::fuzz::Violation("EncodeAtMost differs from Encode");
    } else if (!bounded->exceeded || bounded->at_least <= max_tokens) {
      echokv::fuzz::Violation("EncodeAtMost missed that the encoding exceeds max_tokens");
    }
  }
  auto text_back = tok.Decode(*ids);
  if (!text_back.ok()) echokv::fuzz::Violation("Decode refused ids Encode produced");
  echokv::model::IncrementalDecoder stream(&tok);
  for (int id : *ids) {
    if (!stream.Add(id).ok()) echokv::fuzz::Violation("IncrementalDecoder refused an id Encode produced");
  }
  (void)stream.Finish();
  for (int id : *ids) (void)tok.IdToPiece(id);
}

// The input's bytes read as ids (anything, including out of range: must be refused, not read).
void DecodeRaw(const Tokenizer& tok, absl::string_view bytes, uint8_t selector) {
  std::vector<int> ids(bytes.size() / sizeof(int32_t));
  if (!ids.empty()) std::memcpy(ids.data(), bytes.data(), ids.size() * sizeof(int32_t));
  // Mostly in range (folded into [-2, vocab + 2)) so decoding gets exercised, sometimes raw.
  if ((selector & 0x20) == 0) {
    const int64_t span = static_cast<int64_t>(tok.vocab_size()) + 4;
    for (int& id : ids) id = static_cast<int>(((static_cast<int64_t>(id) % span) + span) % span - 2);
  }
  echokv::model::DecodeOptions options;
  options.skip_special_tokens = (selector & 0x40) != 0;
  (void)tok.Decode(ids, options);
  echokv::model::IncrementalDecoder stream(&tok, options);
  for (int id : ids) (void)stream.Add(id);
  (void)stream.Finish();
  for (int id : ids) (void)tok.IdToPiece(id);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Tokenizers();  // load once, before the first input (not timed against it)
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const echokv::fuzz::Selected in = echokv::fuzz::Select(data, size);
  const int mode = in.selector % 8;
  if (mode == 4) {
    auto [json, config] = echokv::fuzz::SplitAtNul(in.rest);
    auto tok = echokv::model::LoadBpeTokenizerFromJson(json, config);
    if (tok.ok()) {
      EncodeAndCheck(**tok, "Hello world! <|im_end|> 123 \xc3\xa9\xe2\x80\x99 \n\n  x", in.selector);
      DecodeRaw(**tok, absl::string_view("\x01\x00\x00\x00\x05\x00\x00\x00\xff\xff\xff\xff", 12), in.selector);
    }
    return 0;
  }
  if (mode == 5) {
    (void)echokv::model::NfcNormalize(in.rest);
    return 0;
  }
  const Tokenizer& tok = *Tokenizers()[static_cast<size_t>(mode % 4)];
  if ((in.selector & 0x80) != 0) {
    DecodeRaw(tok, in.rest, in.selector);
  } else {
    EncodeAndCheck(tok, in.rest, in.selector);
  }
  return 0;
}
