#include "model/gguf_tokenizer.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "model/bpe_tokenizer.h"
#include "model/sentencepiece_tokenizer.h"
#include "model/spm_model_proto.h"
#include "nlohmann/json.hpp"

namespace echokv::model {
namespace {

using Json = nlohmann::ordered_json;

// GGUF token types (llama.cpp's llama_token_type).
constexpr int64_t kControl = 3;
constexpr int64_t kUserDefined = 4;

// llama.cpp's pre-tokenizer regexes (src/llama-vocab.cpp, llama_vocab::impl::load),
// as Split steps applied in order before ByteLevel. Names that use GPT-2's own regex
// alone map to an empty list (ByteLevel with its regex).
constexpr char kGpt2[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr char kLlama3[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kQwen2[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreTokenizer {
  const char* name;
  std::vector<const char*> splits;  // empty: ByteLevel's own GPT-2 regex
};

const std::vector<PreTokenizer>& PreTokenizers() {
  static const auto* kTable = new std::vector<PreTokenizer>{
      {"default", {}},      {"gpt-2", {}},           {"gpt2", {}},          {"mpt", {}},
      {"olmo", {}},         {"smollm", {R"(\p{N})", kGpt2}},               {"starcoder", {R"(\p{N})", kGpt2}},
      {"refact", {R"(\p{N})", kGpt2}},              {"command-r", {R"(\p{N})", kGpt2}},
      {"llama-bpe", {kLlama3}},                     {"llama3", {kLlama3}},
      {"llama-v3", {kLlama3}},                      {"smaug-bpe", {kLlama3}},
      {"qwen2", {kQwen2}},                          {"deepseek-r1-qwen", {kQwen2}},
  };
  return *kTable;
}

// The 256 code points GPT-2's byte-level alphabet spells bytes with.
const std::set<uint32_t>& ByteLevelAlphabet() {
  static const auto* kSet = [] {
    auto* s = new std::set<uint32_t>();
    int n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      s->insert(printable ? b : 256 + n++);
    }
    return s;
  }();
  return *kSet;
}

std::string ByteLevelSpelling(const std::string& bytes) {
  static const auto* kMap = [] {
    auto* m = new std::vector<uint32_t>(256);
    int n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      (*m)[b] = printable ? b : 256 + n++;
    }
    return m;
  }();
  std::string out;
  for (unsigned char c : bytes) {
    const uint32_t cp = (*kMap)[c];
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {  // every alphabet code point is below U+0800: two UTF-8 bytes
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

// True when every code point of `s` (valid UTF-8) is in the byte-level alphabet.
bool SpelledInByteLevel(const std::string& s) {
  const std::set<uint32_t>& alphabet = ByteLevelAlphabet();
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    int len;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
      len = 2;
    } else {
      return false;  // three- and four-byte code points are never in the alphabet
    }
    if (alphabet.count(cp) == 0) return false;
    i += len;
  }
  return true;
}

std::string Clip(const std::string& s) { return s.size() <= 64 ? s : s.substr(0, 64) + "..."; }

absl::Status WriteSmall(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

static absl::StatusOr<GgufTokenizerFiles> SentencePieceFiles(const GgufFile& f);

absl::StatusOr<GgufTokenizerFiles> GgufTokenizerJson(const GgufFile& f) {
  ECHOKV_ASSIGN_OR_RETURN(std::string model, f.GetString("tokenizer.ggml.model"));
  if (model == "llama") return SentencePieceFiles(f);
  if (model != "gpt2") {
    return absl::UnimplementedError(absl::StrCat("metadata 'tokenizer.ggml.model' is '", Clip(model),
                                                 "': only byte-level BPE (gpt2) and SentencePiece (llama) GGUF "
                                                 "tokenizers are supported"));
  }
  ECHOKV_ASSIGN_OR_RETURN(const GgufValue* tokens, f.GetArray("tokenizer.ggml.tokens", GgufValueType::kString));
  if (tokens->count == 0) return absl::InvalidArgumentError("metadata 'tokenizer.ggml.tokens' is empty");
  ECHOKV_ASSIGN_OR_RETURN(const GgufValue* merges, f.GetArray("tokenizer.ggml.merges", GgufValueType::kString));
  const GgufValue* types = nullptr;
  if (f.Find("tokenizer.ggml.token_type") != nullptr) {
    ECHOKV_ASSIGN_OR_RETURN(types, f.GetArray("tokenizer.ggml.token_type", GgufValueType::kInt64));
    if (types->count != tokens->count) {
      return absl::InvalidArgumentError(absl::StrCat("metadata 'tokenizer.ggml.token_type' has ", types->count,
                                                     " entries for ", tokens->count, " tokens"));
    }
  }
  std::string pre = "default";
  if (f.Find("tokenizer.ggml.pre") != nullptr) {
    ECHOKV_ASSIGN_OR_RETURN(pre, f.GetString("tokenizer.ggml.pre"));
  }
  const PreTokenizer* pt = nullptr;
  std::vector<std::string> known;
  for (const PreTokenizer& p : PreTokenizers()) {
    known.push_back(p.name);
    if (pre == p.name) pt = &p;
  }
  if (pt == nullptr) {
    return absl::UnimplementedError(absl::StrCat("metadata 'tokenizer.ggml.pre' is '", Clip(pre),
                                                 "', a pre-tokenizer echokv does not know (known: ",
                                                 absl::StrJoin(known, ", "), ")"));
  }
  const int64_t vocab_size = static_cast<int64_t>(tokens->count);
  auto token_id = [&](const char* key) -> absl::StatusOr<int64_t> {
    if (f.Find(key) == nullptr) return -1;
    ECHOKV_ASSIGN_OR_RETURN(uint64_t id, f.GetUint(key));
    if (id >= static_cast<uint64_t>(vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata '", key, "' is ", id, ", outside the vocabulary [0, ", vocab_size, ")"));
    }
    return static_cast<int64_t>(id);
  };
  ECHOKV_ASSIGN_OR_RETURN(int64_t bos, token_id("tokenizer.ggml.bos_token_id"));
  ECHOKV_ASSIGN_OR_RETURN(int64_t eos, token_id("tokenizer.ggml.eos_token_id"));
  ECHOKV_ASSIGN_OR_RETURN(int64_t unk, token_id("tokenizer.ggml.unknown_token_id"));
  ECHOKV_ASSIGN_OR_RETURN(int64_t pad, token_id("tokenizer.ggml.padding_token_id"));
  bool add_bos = false, add_eos = false;
  if (f.Find("tokenizer.ggml.add_bos_token") != nullptr) {
    ECHOKV_ASSIGN_OR_RETURN(add_bos, f.GetBool("tokenizer.ggml.add_bos_token"));
  }
  if (f.Find("tokenizer.ggml.add_eos_token") != nullptr) {
    ECHOKV_ASSIGN_OR_RETURN(add_eos, f.GetBool("tokenizer.ggml.add_eos_token"));
  }

  std::vector<std::string> spelled(tokens->strings.size());
  Json vocab = Json::object();
  for (size_t i = 0; i < spelled.size(); ++i) {
    const std::string& t = tokens->strings[i];
    spelled[i] = SpelledInByteLevel(t) ? t : ByteLevelSpelling(t);
    vocab[spelled[i]] = i;  // a repeated token keeps its last id, as a Python dict does
  }
  Json added = Json::array();
  std::set<int64_t> specials = {bos, eos, unk, pad};
  for (int64_t i = 0; i < vocab_size; ++i) {
    const int64_t type = types != nullptr ? types->IntAt(static_cast<uint64_t>(i)) : 1;
    const std::string& t = tokens->strings[static_cast<size_t>(i)];
    const bool control = (type == kControl || specials.count(i) != 0) && SpelledInByteLevel(t);
    const bool user = type == kUserDefined;
    if (!control && !user) continue;
    added.push_back({{"id", i},
                     {"content", control ? t : spelled[static_cast<size_t>(i)]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", control}});
  }
  Json pre_tokenizer;
  if (pt->splits.empty()) {
    pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  } else {
    Json steps = Json::array();
    for (const char* regex : pt->splits) {
      steps.push_back({{"type", "Split"},
                       {"pattern", {{"Regex", regex}}},
                       {"behavior", "Isolated"},
                       {"invert", false}});
    }
    steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}});
    pre_tokenizer = {{"type", "Sequence"}, {"pretokenizers", steps}};
  }
  Json merge_list = Json::array();
  for (const std::string& m : merges->strings) merge_list.push_back(m);
  Json tokenizer = {{"version", "1.0"},
                    {"added_tokens", added},
                    {"normalizer", nullptr},
                    {"pre_tokenizer", pre_tokenizer},
                    {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
                    {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
                    {"model",
                     {{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", nullptr},
                      {"continuing_subword_prefix", nullptr},
                      {"end_of_word_suffix", nullptr},
                      {"fuse_unk", false},
                      {"byte_fallback", false},
                      {"ignore_merges", false},
                      {"vocab", vocab},
                      {"merges", merge_list}}}};
  Json config = {{"add_bos_token", add_bos}, {"add_eos_token", add_eos}};
  auto token_text = [&](int64_t id) -> Json { return id < 0 ? Json(nullptr) : Json(tokens->strings[id]); };
  config["bos_token"] = token_text(bos);
  config["eos_token"] = token_text(eos);
  config["unk_token"] = token_text(unk);
  config["pad_token"] = token_text(pad);
  if (f.Find("tokenizer.chat_template") != nullptr) {
    ECHOKV_ASSIGN_OR_RETURN(std::string tmpl, f.GetString("tokenizer.chat_template"));
    config["chat_template"] = tmpl;
  }
  GgufTokenizerFiles out;
  // Token text from the file may be invalid UTF-8: replace rather than throw.
  out.tokenizer_json = tokenizer.dump(-1, ' ', false, Json::error_handler_t::replace);
  out.tokenizer_config_json = config.dump(-1, ' ', false, Json::error_handler_t::replace);
  return out;
}

static absl::StatusOr<GgufTokenizerFiles> SentencePieceFiles(const GgufFile& f) {
  ECHOKV_ASSIGN_OR_RETURN(const GgufValue* tokens, f.GetArray("tokenizer.ggml.tokens", GgufValueType::kString));
  if (tokens->count == 0) return absl::InvalidArgumentError("metadata 'tokenizer.ggml.tokens' is empty");
  const GgufValue* scores = nullptr;
  if (f.Find("tokenizer.ggml.scores") != nullptr) {
    ECHOKV_ASSIGN_OR_RETURN(scores, f.GetArray("tokenizer.ggml.scores", GgufValueType::kFloat32));
    if (scores->count != tokens->count) {
      return absl::InvalidArgumentError(absl::StrCat("metadata 'tokenizer.ggml.scores' has ", scores->count,
                                                     " entries for ", tokens->count, " tokens"));
    }
  }
  const GgufValue* types = nullptr;
  if (f.Find("tokenizer.ggml.token_type") != nullptr) {
    ECHOKV_ASSIGN_OR_RETURN(types, f.GetArray("tokenizer.ggml.token_type", GgufValueType::kInt64));
    if (types->count != tokens->count) {
      return absl::InvalidArgumentError(absl::StrCat("metadata 'tokenizer.ggml.token_type' has ", types->count,
                                                     " entries for ", tokens->count, " tokens"));
    }
  }
  const int64_t vocab = static_cast<int64_t>(tokens->count);
  auto id_or = [&](const char* key, int64_t fallback) -> absl::StatusOr<int64_t> {
    if (f.Find(key) == nullptr) return fallback;
    ECHOKV_ASSIGN_OR_RETURN(uint64_t id, f.GetUint(key));
    if (id >= static_cast<uint64_t>(vocab)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata '", key, "' is ", id, ", outside the vocabulary [0, ", vocab, ")"));
    }
    return static_cast<int64_t>(id);
  };
  SpmModelSpec spec;
  // llama.cpp's defaults for a SentencePiece vocabulary: unk 0, bos 1, eos 2, no padding.
  ECHOKV_ASSIGN_OR_RETURN(int64_t unk, id_or("tokenizer.ggml.unknown_token_id", 0));
  ECHOKV_ASSIGN_OR_RETURN(int64_t bos, id_or("tokenizer.ggml.bos_token_id", 1));
  ECHOKV_ASSIGN_OR_RETURN(int64_t eos, id_or("tokenizer.ggml.eos_token_id", 2));
  ECHOKV_ASSIGN_OR_RETURN(int64_t pad, id_or("tokenizer.ggml.padding_token_id", -1));
  spec.unk_id = static_cast<int>(unk);
  spec.bos_id = static_cast<int>(bos);
  spec.eos_id = static_cast<int>(eos);
  spec.pad_id = static_cast<int>(pad);
  spec.model_type = 2;  // BPE over the scores (llama.cpp's SPM tokenizer merges by score)
  if (f.Find("tokenizer.ggml.add_space_prefix") != nullptr) {
    ECHOKV_ASSIGN_OR_RETURN(spec.add_dummy_prefix, f.GetBool("tokenizer.ggml.add_space_prefix"));
  }
  int unknowns = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    SpmPiece p;
    p.piece = tokens->strings[static_cast<size_t>(i)];
    p.score = scores != nullptr ? static_cast<float>(scores->FloatAt(static_cast<uint64_t>(i))) : 0.0f;
    int64_t t = types != nullptr ? types->IntAt(static_cast<uint64_t>(i)) : 1;
    if (i == unk) t = 2;
    if (i == bos || i == eos || i == pad) t = t == 2 ? 2 : 3;
    if (t < 1 || t > 6) {
      return absl::InvalidArgumentError(absl::StrCat("metadata 'tokenizer.ggml.token_type' of token ", i, " is ", t,
                                                     " (1..6 are token types)"));
    }
    if (t == 6) spec.byte_fallback = true;
    if (t == 2) ++unknowns;
    p.type = static_cast<int>(t);
    spec.pieces.push_back(std::move(p));
  }
  if (unknowns != 1) {
    return absl::InvalidArgumentError(absl::StrCat("the SentencePiece vocabulary needs exactly one unknown token, has ",
                                                   unknowns, " (tokenizer.ggml.token_type / unknown_token_id)"));
  }
  bool add_bos = true;  // llama.cpp adds BOS to a SentencePiece vocabulary unless told otherwise
  if (f.Find("tokenizer.ggml.add_bos_token") != nullptr) {
    ECHOKV_ASSIGN_OR_RETURN(add_bos, f.GetBool("tokenizer.ggml.add_bos_token"));
  }
  Json config = {{"add_bos_token", add_bos}};
  config["bos_token"] = tokens->strings[static_cast<size_t>(bos)];
  config["eos_token"] = tokens->strings[static_cast<size_t>(eos)];
  config["unk_token"] = tokens->strings[static_cast<size_t>(unk)];
  if (f.Find("tokenizer.chat_template") != nullptr) {
    ECHOKV_ASSIGN_OR_RETURN(std::string tmpl, f.GetString("tokenizer.chat_template"));
    config["chat_template"] = tmpl;
  }
  GgufTokenizerFiles out;
  out.tokenizer_model = SerializeSpmModel(spec);
  out.tokenizer_config_json = config.dump(-1, ' ', false, Json::error_handler_t::replace);
  return out;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(const GgufFile& f) {
  ECHOKV_ASSIGN_OR_RETURN(GgufTokenizerFiles files, GgufTokenizerJson(f));
  if (!files.tokenizer_model.empty()) {
    // libsentencepiece loads from a path: a private scratch directory for the two files.
    char tmpl[] = "/tmp/echokv-gguf-spm-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed for the GGUF SentencePiece model");
    const std::string dir = tmpl;
    absl::Status written = WriteSmall(dir + "/tokenizer.model", files.tokenizer_model);
    if (written.ok()) written = WriteSmall(dir + "/tokenizer_config.json", files.tokenizer_config_json);
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
        written.ok() ? LoadSentencePieceTokenizer(dir) : absl::StatusOr<std::unique_ptr<Tokenizer>>(written);
    unlink((dir + "/tokenizer.model").c_str());
    unlink((dir + "/tokenizer_config.json").c_str());
    rmdir(dir.c_str());
    if (!tok.ok()) {
      return absl::Status(tok.status().code(), absl::StrCat("the GGUF tokenizer: ", tok.status().message()));
    }
    return tok;
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadBpeTokenizerFromJson(files.tokenizer_json,
                                                                            files.tokenizer_config_json);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(), absl::StrCat("the GGUF tokenizer: ", tok.status().message()));
  }
  return tok;
}

absl::StatusOr<ChatTemplate> LoadGgufChatTemplate(const GgufFile& f, const std::optional<std::string>& override_path) {
  ECHOKV_ASSIGN_OR_RETURN(GgufTokenizerFiles files, GgufTokenizerJson(f));
  ECHOKV_ASSIGN_OR_RETURN(ChatTemplateTokens tokens, ParseChatTemplateTokens(files.tokenizer_config_json));
  if (override_path) return LoadChatTemplateOverride(*override_path, std::move(tokens));
  if (f.Find("tokenizer.chat_template") == nullptr) {
    return absl::UnimplementedError(
        "the GGUF file has no tokenizer.chat_template; chat input needs one: start with --chat-template FILE");
  }
  ECHOKV_ASSIGN_OR_RETURN(std::string source, f.GetString("tokenizer.chat_template"));
  return ChatTemplate::Create(source, std::move(tokens), "tokenizer.chat_template");
}

}  // namespace echokv::model
