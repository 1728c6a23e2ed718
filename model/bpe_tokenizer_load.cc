// Loading the byte-level BPE tokenizer (model/bpe_tokenizer.h): tokenizer.json's
// model (vocab, merges), added and special tokens, normalizer, pre-tokenizer and
// post-processor, then tokenizer_config.json and generation_config.json (BOS/EOS).
// Every unsupported component is an InvalidArgument naming it.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "model/bpe_text.h"
#include "model/bpe_tokenizer_internal.h"

namespace echokv::model {

using bpe_internal::ByteLevelToBytes;
using bpe_internal::BytesToByteLevel;
using bpe_internal::FindInvalidUtf8;
using bpe_internal::json;
using bpe_internal::kMaxTokenId;
using bpe_internal::Regex;

namespace {

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex=true).
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Files larger than this are rejected before reading (a tokenizer.json is < 100 MB).
constexpr std::uintmax_t kMaxFileBytes = 1ull << 30;

// ---------------------------------------------------------------------------------
// JSON helpers.

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", ec.message()));
  if (size > kMaxFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": file too large (", size, " bytes)"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string data(static_cast<size_t>(size), '\0');
  in.read(data.data(), static_cast<std::streamsize>(size));
  if (!in) return absl::DataLossError(absl::StrCat("short read from ", path));
  return data;
}

absl::StatusOr<json> ParseJson(absl::string_view text, absl::string_view file) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Re-parse with exceptions only to get the position for the message.
    try {
      json discarded = json::parse(text.begin(), text.end());
      (void)discarded;
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": invalid JSON: ", e.what()));
    }
    return absl::InvalidArgumentError(absl::StrCat(file, ": invalid JSON"));
  }
  return j;
}

bool GetBool(const json& obj, const char* key, bool dflt) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_boolean()) return dflt;
  return it->get<bool>();
}

std::string TypeOf(const json& obj) {
  auto it = obj.find("type");
  if (it == obj.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

// A special-token field of tokenizer_config.json: "text", {"content": "text"} or null.
std::optional<std::string> TokenText(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Create(
    absl::string_view tokenizer_json, absl::string_view config_json,
    absl::string_view generation_json) {
  ECHOKV_ASSIGN_OR_RETURN(json root, ParseJson(tokenizer_json, "tokenizer.json"));
  if (!root.is_object()) {
    return absl::InvalidArgumentError("tokenizer.json: top level is not an object");
  }
  auto tok = std::unique_ptr<BpeTokenizer>(new BpeTokenizer());
  auto model = root.find("model");
  if (model == root.end() || !model->is_object()) {
    return absl::InvalidArgumentError("tokenizer.json: missing 'model' object");
  }
  ECHOKV_RETURN_IF_ERROR(tok->LoadModel(*model));
  if (auto it = root.find("added_tokens"); it != root.end() && !it->is_null()) {
    ECHOKV_RETURN_IF_ERROR(tok->LoadAddedTokens(*it));
  }
  ECHOKV_RETURN_IF_ERROR(tok->LoadNormalizer(root.value("normalizer", json())));
  ECHOKV_RETURN_IF_ERROR(tok->LoadPreTokenizer(root.value("pre_tokenizer", json())));
  if (std::none_of(tok->pre_steps_.begin(), tok->pre_steps_.end(),
                   [](const PreStep& s) { return s.byte_level; })) {
    return absl::InvalidArgumentError(
        "tokenizer.json: pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)");
  }
  const json decoder = root.value("decoder", json());
  if (TypeOf(decoder) != "ByteLevel") {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.json: unsupported decoder type '",
        decoder.is_null() ? std::string("null") : TypeOf(decoder), "' (only ByteLevel)"));
  }
  ECHOKV_RETURN_IF_ERROR(tok->LoadPostProcessor(root.value("post_processor", json())));
  ECHOKV_RETURN_IF_ERROR(tok->LoadConfigs(config_json, generation_json));
  for (const std::string& b : tok->id_to_bytes_) {
    tok->max_token_bytes_ = std::max<int64_t>(tok->max_token_bytes_, static_cast<int64_t>(b.size()));
  }
  return tok;
}

absl::Status BpeTokenizer::LoadModel(const json& model) {
  const std::string type = TypeOf(model);
  if (type != "BPE" && !(type.empty() && model.contains("merges"))) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: unsupported model type '", type, "' (only BPE)"));
  }
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null() &&
                                       !(it->is_number() && it->get<double>() == 0.0)) {
    return absl::InvalidArgumentError("tokenizer.json: unsupported model.dropout (must be null)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it != model.end() && !it->is_null() &&
        !(it->is_string() && it->get<std::string>().empty())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: unsupported model.", key, " (must be empty)"));
    }
  }
  if (GetBool(model, "byte_fallback", false)) {
    return absl::InvalidArgumentError("tokenizer.json: unsupported model.byte_fallback=true");
  }
  ignore_merges_ = GetBool(model, "ignore_merges", false);

  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    return absl::InvalidArgumentError("tokenizer.json: model.vocab is missing or not an object");
  }
  const int64_t limit = std::min<int64_t>(kMaxTokenId, 2 * static_cast<int64_t>(vocab->size()) + 4096);
  piece_to_id_.reserve(vocab->size());
  int64_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: model.vocab['", it.key(), "'] is not an integer"));
    }
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= limit) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: model.vocab['", it.key(),
                                                     "'] = ", id, " is out of range"));
    }
    piece_to_id_.emplace(it.key(), static_cast<int>(id));
    max_id = std::max(max_id, id);
  }
  id_to_piece_.assign(max_id + 1, "");
  id_to_bytes_.assign(max_id + 1, "");
  flags_.assign(max_id + 1, 0);
  byte_id_.fill(-1);
  for (const auto& [piece, id] : piece_to_id_) {
    if (flags_[id] & kHasToken) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: model.vocab id ", id,
                                                     " is used by two tokens ('", id_to_piece_[id],
                                                     "' and '", piece, "')"));
    }
    flags_[id] |= kHasToken;
    id_to_piece_[id] = piece;
    std::optional<std::string> bytes = ByteLevelToBytes(piece);
    id_to_bytes_[id] = bytes ? *bytes : piece;
    if (bytes && bytes->size() == 1) byte_id_[static_cast<unsigned char>((*bytes)[0])] = id;
    if (ignore_merges_ && bytes) bytes_to_id_.emplace(*bytes, id);
  }
  if (auto it = model.find("unk_token"); it != model.end() && it->is_string()) {
    auto u = piece_to_id_.find(it->get<std::string>());
    if (u == piece_to_id_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: model.unk_token '",
                                                     it->get<std::string>(), "' is not in the vocab"));
    }
    unk_id_ = u->second;
  }

  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    return absl::InvalidArgumentError("tokenizer.json: model.merges is missing or not an array");
  }
  merges_.Reserve(merges->size());
  int rank = 0;
  for (const json& m : *merges) {
    std::string a, b;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tokenizer.json: model.merges[", rank, "] = '", s, "' is not two tokens 'a b'"));
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.json: model.merges[", rank, "] is neither \"a b\" nor [\"a\", \"b\"]"));
    }
    auto ia = piece_to_id_.find(a), ib = piece_to_id_.find(b);
    auto im = piece_to_id_.find(a + b);
    for (const auto& [it, name] : {std::pair{ia, &a}, std::pair{ib, &b}}) {
      if (it == piece_to_id_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: model.merges[", rank,
                                                       "] names unknown token '", *name, "'"));
      }
    }
    if (im == piece_to_id_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: model.merges[", rank,
                                                     "]: merged token '", a + b,
                                                     "' is not in the vocab"));
    }
    // The first occurrence of a pair wins (as in HF).
    merges_.Insert(PairKey(ia->second, ib->second), MergeInfo{rank, im->second});
    ++rank;
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizer::LoadAddedTokens(const json& added) {
  if (!added.is_array()) {
    return absl::InvalidArgumentError("tokenizer.json: added_tokens is not an array");
  }
  for (size_t i = 0; i < added.size(); ++i) {
    const json& t = added[i];
    const std::string where = absl::StrCat("tokenizer.json: added_tokens[", i, "]");
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        !t.contains("content") || !t["content"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " needs integer 'id' and string 'content'"));
    }
    const int64_t id = t["id"].get<int64_t>();
    const std::string content = t["content"].get<std::string>();
    if (id < 0 || id >= kMaxTokenId || id > static_cast<int64_t>(id_to_piece_.size()) + 1000000) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": id ", id, " is out of range"));
    }
    if (content.empty() || FindInvalidUtf8(content) != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": content is empty or not UTF-8"));
    }
    if (GetBool(t, "single_word", false)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " ('", content, "'): unsupported single_word=true"));
    }
    if (static_cast<size_t>(id) >= id_to_piece_.size()) {
      id_to_piece_.resize(id + 1);
      id_to_bytes_.resize(id + 1);
      flags_.resize(id + 1, 0);
    }
    id_to_piece_[id] = content;
    id_to_bytes_[id] = content;
    flags_[id] |= kHasToken | kAdded;
    if (GetBool(t, "special", false)) flags_[id] |= kSpecial;
    added_.push_back(AddedToken{content, static_cast<int>(id), GetBool(t, "lstrip", false),
                                GetBool(t, "rstrip", false)});
  }
  std::stable_sort(added_.begin(), added_.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
  for (size_t i = 0; i < added_.size(); ++i) {
    added_by_byte_[static_cast<unsigned char>(added_[i].content[0])].push_back(static_cast<int>(i));
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizer::LoadNormalizer(const json& n) {
  if (n.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(n);
  if (type == "NFC") {
    nfc_ = true;
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    auto it = n.find("normalizers");
    if (it == n.end() || !it->is_array()) {
      return absl::InvalidArgumentError("tokenizer.json: normalizer Sequence without 'normalizers'");
    }
    for (const json& sub : *it) ECHOKV_RETURN_IF_ERROR(LoadNormalizer(sub));
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json: unsupported normalizer type '", type, "'"));
}

absl::Status BpeTokenizer::LoadPreTokenizer(const json& p) {
  if (p.is_null()) {
    return absl::InvalidArgumentError(
        "tokenizer.json: unsupported pre_tokenizer null (byte-level BPE needs ByteLevel)");
  }
  const std::string type = TypeOf(p);
  if (type == "Sequence") {
    auto it = p.find("pretokenizers");
    if (it == p.end() || !it->is_array()) {
      return absl::InvalidArgumentError(
          "tokenizer.json: pre_tokenizer Sequence without 'pretokenizers'");
    }
    for (const json& sub : *it) {
      if (TypeOf(sub) == "Sequence") {
        return absl::InvalidArgumentError("tokenizer.json: unsupported nested pre_tokenizer Sequence");
      }
      ECHOKV_RETURN_IF_ERROR(LoadPreTokenizer(sub));
    }
  } else if (type == "Split") {
    const std::string behavior = p.value("behavior", std::string());
    if (behavior != "Isolated") {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.json: unsupported pre_tokenizer Split behavior '", behavior, "' (only Isolated)"));
    }
    if (GetBool(p, "invert", false)) {
      return absl::InvalidArgumentError("tokenizer.json: unsupported pre_tokenizer Split invert=true");
    }
    auto pat = p.find("pattern");
    std::string pattern;
    bool literal = false;
    if (pat != p.end() && pat->is_object() && pat->contains("Regex") && (*pat)["Regex"].is_string()) {
      pattern = (*pat)["Regex"].get<std::string>();
    } else if (pat != p.end() && pat->is_object() && pat->contains("String") &&
               (*pat)["String"].is_string()) {
      pattern = (*pat)["String"].get<std::string>();
      literal = true;
    } else {
      return absl::InvalidArgumentError(
          "tokenizer.json: pre_tokenizer Split needs pattern {\"Regex\": ...} or {\"String\": ...}");
    }
    if (pattern.empty()) {
      return absl::InvalidArgumentError("tokenizer.json: pre_tokenizer Split pattern is empty");
    }
    PreStep step;
    ECHOKV_ASSIGN_OR_RETURN(step.regex,
                            Regex::Compile(pattern, literal, "tokenizer.json: pre_tokenizer Split"));
    pre_steps_.push_back(std::move(step));
  } else if (type == "ByteLevel") {
    PreStep step;
    step.byte_level = true;
    step.add_prefix_space = GetBool(p, "add_prefix_space", true);
    if (GetBool(p, "use_regex", true)) {
      ECHOKV_ASSIGN_OR_RETURN(step.regex,
                              Regex::Compile(kGpt2Pattern, false, "tokenizer.json: ByteLevel"));
    }
    pre_steps_.push_back(std::move(step));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: unsupported pre_tokenizer type '", type, "'"));
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizer::LoadPostProcessor(const json& p) {
  if (p.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(p);
  if (type == "ByteLevel") return absl::OkStatus();
  if (type == "Sequence") {
    auto it = p.find("processors");
    if (it == p.end() || !it->is_array()) {
      return absl::InvalidArgumentError("tokenizer.json: post_processor Sequence without 'processors'");
    }
    for (const json& sub : *it) ECHOKV_RETURN_IF_ERROR(LoadPostProcessor(sub));
    return absl::OkStatus();
  }
  if (type == "TemplateProcessing") {
    auto single = p.find("single");
    if (single == p.end() || !single->is_array()) {
      return absl::InvalidArgumentError("tokenizer.json: TemplateProcessing without 'single'");
    }
    const json specials = p.value("special_tokens", json::object());
    bool seen_a = false;
    for (const json& item : *single) {
      if (item.contains("Sequence")) {
        if (seen_a || item["Sequence"].value("id", std::string()) != "A") {
          return absl::InvalidArgumentError(
              "tokenizer.json: unsupported TemplateProcessing 'single' (only specials around $A)");
        }
        seen_a = true;
      } else if (item.contains("SpecialToken")) {
        const std::string name = item["SpecialToken"].value("id", std::string());
        auto st = specials.find(name);
        if (st == specials.end() || !st->contains("ids") || !(*st)["ids"].is_array()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tokenizer.json: TemplateProcessing special token '", name, "' has no ids"));
        }
        for (const json& idj : (*st)["ids"]) {
          if (!idj.is_number_integer() || idj.get<int64_t>() < 0 ||
              idj.get<int64_t>() >= static_cast<int64_t>(id_to_piece_.size())) {
            return absl::InvalidArgumentError(absl::StrCat(
                "tokenizer.json: TemplateProcessing special token '", name, "' has a bad id"));
          }
          (seen_a ? template_suffix_ : template_prefix_).push_back(idj.get<int>());
        }
      } else {
        return absl::InvalidArgumentError("tokenizer.json: unsupported TemplateProcessing item");
      }
    }
    has_template_ = true;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json: unsupported post_processor type '", type, "'"));
}

std::optional<int> BpeTokenizer::LookupToken(const std::string& text) const {
  for (const AddedToken& t : added_) {
    if (t.content == text) return t.id;
  }
  auto it = piece_to_id_.find(text);
  if (it != piece_to_id_.end()) return it->second;
  it = piece_to_id_.find(BytesToByteLevel(text));
  if (it != piece_to_id_.end()) return it->second;
  return std::nullopt;
}

absl::Status BpeTokenizer::LoadConfigs(absl::string_view config_json,
                                       absl::string_view generation_json) {
  if (!config_json.empty()) {
    ECHOKV_ASSIGN_OR_RETURN(json cfg, ParseJson(config_json, "tokenizer_config.json"));
    if (!cfg.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json: top level is not an object");
    }
    std::optional<int> eos;
    if (auto text = TokenText(cfg, "bos_token")) {
      bos_id_ = LookupToken(*text);
      if (!bos_id_) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer_config.json: bos_token '", *text, "' is not a token"));
      }
    }
    if (auto text = TokenText(cfg, "eos_token")) {
      eos = LookupToken(*text);
      if (!eos) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer_config.json: eos_token '", *text, "' is not a token"));
      }
      eos_ids_.push_back(*eos);
    }
    if (GetBool(cfg, "add_bos_token", false) && bos_id_) bos_prefix_.push_back(*bos_id_);
    if (GetBool(cfg, "add_eos_token", false) && eos) eos_suffix_.push_back(*eos);
  }
  if (!generation_json.empty()) {
    ECHOKV_ASSIGN_OR_RETURN(json gen, ParseJson(generation_json, "generation_config.json"));
    if (gen.is_object()) {
      const json e = gen.value("eos_token_id", json());
      std::vector<json> items;
      if (e.is_array()) items.assign(e.begin(), e.end());
      if (e.is_number_integer()) items.push_back(e);
      for (const json& v : items) {
        if (!v.is_number_integer()) continue;
        const int64_t id = v.get<int64_t>();
        if (id < 0 || id >= vocab_size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("generation_config.json: eos_token_id ", id, " is out of range"));
        }
        if (std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end()) {
          eos_ids_.push_back(static_cast<int>(id));
        }
      }
    }
  }
  if (!bos_id_ && !template_prefix_.empty()) bos_id_ = template_prefix_.front();
  if (bos_id_) flags_[*bos_id_] |= kSpecial;
  for (int id : eos_ids_) flags_[id] |= kSpecial;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------
// Free functions.

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizerFromJson(
    absl::string_view tokenizer_json, absl::string_view tokenizer_config_json,
    absl::string_view generation_config_json) {
  ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<BpeTokenizer> tok,
                          BpeTokenizer::Create(tokenizer_json, tokenizer_config_json,
                                               generation_config_json));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizer(const std::string& dir) {
  ECHOKV_ASSIGN_OR_RETURN(std::string tok_json, ReadFile(dir + "/tokenizer.json"));
  std::string config, generation;
  std::error_code ec;
  if (std::filesystem::exists(dir + "/tokenizer_config.json", ec)) {
    ECHOKV_ASSIGN_OR_RETURN(config, ReadFile(dir + "/tokenizer_config.json"));
  }
  if (std::filesystem::exists(dir + "/generation_config.json", ec)) {
    ECHOKV_ASSIGN_OR_RETURN(generation, ReadFile(dir + "/generation_config.json"));
  }
  auto tok = LoadBpeTokenizerFromJson(tok_json, config, generation);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(), absl::StrCat(dir, ": ", tok.status().message()));
  }
  return tok;
}

bool IsByteLevelBpeDir(const std::string& dir) {
  auto text = ReadFile(dir + "/tokenizer.json");
  if (!text.ok()) return false;
  // Skip the big vocab/merges while parsing: only the component types matter here.
  const json::parser_callback_t skip_tables = [](int depth, json::parse_event_t event,
                                                 json& parsed) {
    if (event == json::parse_event_t::key && depth == 2 && parsed.is_string()) {
      const auto& k = parsed.get_ref<const std::string&>();
      return k != "vocab" && k != "merges";
    }
    return true;
  };
  json root = json::parse(text->begin(), text->end(), skip_tables, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return false;
  const json model = root.value("model", json());
  if (!model.is_object() || (TypeOf(model) != "BPE" && !TypeOf(model).empty())) return false;
  const auto mentions_byte_level = [](const json& j) {
    return j.is_object() && j.dump().find("\"ByteLevel\"") != std::string::npos;
  };
  return mentions_byte_level(root.value("pre_tokenizer", json())) ||
         mentions_byte_level(root.value("decoder", json()));
}

}  // namespace echokv::model
