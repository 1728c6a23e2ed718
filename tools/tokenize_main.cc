// echokv-tokenize: encode text to ids and pieces, or decode ids, with a model folder's
// tokenizer (tokenizer.json byte-level BPE or tokenizer.model SentencePiece).
//
//   echokv-tokenize --tokenizer /models/qwen2.5 --text "Hello world"
//   echokv-tokenize --tokenizer /models/qwen2.5 --text "<|im_end|>" --no-special --json
//   echokv-tokenize --tokenizer /models/qwen2.5 --decode 9707,1879 [--skip-special]
//   echokv-tokenize --tokenizer /models/qwen2.5 --decode-file ids.txt   # one JSON line per line
//
// Flag names accept '-' or '_' (--no-special == --no_special). Errors go to stderr
// with a non-zero exit status.
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/flag_names.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, tokenizer, "", "Model folder holding tokenizer.json or tokenizer.model");
ABSL_FLAG(std::string, text, "", "Text to encode");
ABSL_FLAG(std::string, text_file, "", "Encode this file's bytes exactly (instead of --text)");
ABSL_FLAG(bool, no_special, false,
          "Encode added/special-token strings (e.g. <|im_end|>) as plain text");
ABSL_FLAG(bool, no_bos, false, "Do not add the tokenizer's default BOS/EOS");
ABSL_FLAG(std::string, decode, "", "Comma-separated ids to decode instead of encoding");
ABSL_FLAG(std::string, decode_file, "",
          "Decode every line of this file (comma-separated ids; empty = no ids): one JSON object "
          "{\"text\": ...} per line on stdout (one process for many decodes, e.g. a test's oracle)");
ABSL_FLAG(bool, skip_special, false, "With --decode / --decode-file: drop special tokens");
ABSL_FLAG(bool, json, false, "Print JSON instead of text");

namespace {

int Fail(const std::string& message) {
  std::cerr << "echokv-tokenize: " << message << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "echokv-tokenize --tokenizer DIR ((--text T | --text-file F) [--no-special] [--no-bos] | --decode 1,2,3 "
      "[--skip-special]) [--json]");
  echokv::DashedFlagArgs dashed(argc, argv);
  absl::ParseCommandLine(dashed.argc(), dashed.argv());

  const std::string dir = absl::GetFlag(FLAGS_tokenizer);
  if (dir.empty()) return Fail("--tokenizer DIR is required");
  auto tok_or = echokv::model::LoadTokenizer(dir);
  if (!tok_or.ok()) return Fail(std::string(tok_or.status().ToString()));
  const echokv::model::Tokenizer& tok = **tok_or;
  const bool as_json = absl::GetFlag(FLAGS_json);

  echokv::model::DecodeOptions decode_opts;
  decode_opts.skip_special_tokens = absl::GetFlag(FLAGS_skip_special);
  auto parse_ids = [](absl::string_view list, std::vector<int>* ids) -> bool {
    for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
      int id;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &id)) {
        Fail("--decode: '" + std::string(part) + "' is not an integer id");
        return false;
      }
      ids->push_back(id);
    }
    return true;
  };
  if (const std::string path = absl::GetFlag(FLAGS_decode_file); !path.empty()) {
    std::ifstream in(path);
    if (!in) return Fail("--decode-file: cannot read '" + path + "'");
    std::string line;
    while (std::getline(in, line)) {
      std::vector<int> ids;
      if (!parse_ids(line, &ids)) return 1;
      auto text = tok.Decode(ids, decode_opts);
      if (!text.ok()) return Fail(std::string(text.status().ToString()));
      std::cout << nlohmann::json({{"text", *text}}).dump() << "\n";
    }
    return 0;
  }
  const std::string decode = absl::GetFlag(FLAGS_decode);
  if (!decode.empty()) {
    std::vector<int> ids;
    if (!parse_ids(decode, &ids)) return 1;
    const echokv::model::DecodeOptions& opts = decode_opts;
    auto text = tok.Decode(ids, opts);
    if (!text.ok()) return Fail(std::string(text.status().ToString()));
    if (as_json) {
      std::cout << nlohmann::json({{"text", *text}}).dump() << "\n";
    } else {
      std::cout << *text << "\n";
    }
    return 0;
  }

  echokv::model::EncodeOptions opts;
  opts.parse_special = !absl::GetFlag(FLAGS_no_special);
  opts.add_special_tokens = !absl::GetFlag(FLAGS_no_bos);
  std::string text = absl::GetFlag(FLAGS_text);
  if (const std::string path = absl::GetFlag(FLAGS_text_file); !path.empty()) {
    if (!text.empty()) return Fail("give --text or --text-file, not both");
    std::ifstream in(path, std::ios::binary);
    if (!in) return Fail("--text-file: cannot read '" + path + "'");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto ids = tok.Encode(text, opts);
  if (!ids.ok()) return Fail(std::string(ids.status().ToString()));
  std::vector<std::string> pieces;
  for (int id : *ids) pieces.push_back(tok.IdToPiece(id));
  if (as_json) {
    std::cout << nlohmann::json({{"ids", *ids}, {"tokens", pieces}}).dump() << "\n";
  } else {
    std::cout << "ids: " << absl::StrJoin(*ids, ",") << "\n";
    for (size_t i = 0; i < ids->size(); ++i) {
      std::cout << (*ids)[i] << "\t" << pieces[i] << (tok.IsSpecial((*ids)[i]) ? "\t(special)" : "")
                << "\n";
    }
  }
  return 0;
}
