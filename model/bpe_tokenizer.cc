#include "model/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace echokv::model {
namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex=true).
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Files larger than this are rejected before reading (a tokenizer.json is < 100 MB).
constexpr std::uintmax_t kMaxFileBytes = 1ull << 30;
// Vocabulary ids must stay below this (bounds the id tables we allocate).
constexpr int64_t kMaxTokenId = 1 << 24;
// Words up to this many bytes go into the per-call BPE cache.
constexpr size_t kMaxCachedWordBytes = 64;
// The per-call cache stops growing at this many entries.
constexpr size_t kMaxCacheEntries = 1 << 16;

// ---------------------------------------------------------------------------------
// UTF-8 and the GPT-2 byte <-> unicode table.

// Length of the valid UTF-8 sequence at s[i], or 0 when the bytes there are not a
// valid sequence; *consumed is the maximal invalid subpart length in that case (>= 1).
size_t Utf8SeqLen(absl::string_view s, size_t i, size_t* consumed) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  *consumed = 1;
  if (c < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      *consumed = k;
      return 0;
    }
    const unsigned char d = b(i + k);
    const unsigned char l = (k == 1) ? lo : 0x80, h = (k == 1) ? hi : 0xBF;
    if (d < l || d > h) {
      *consumed = k;
      return 0;
    }
  }
  return need + 1;
}

// Offset of the first invalid byte, or npos when `s` is valid UTF-8.
size_t FindInvalidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t consumed;
    const size_t n = Utf8SeqLen(s, i, &consumed);
    if (n == 0) return i;
    i += n;
  }
  return absl::string_view::npos;
}

// Replaces each maximal invalid subpart by U+FFFD (Rust from_utf8_lossy / WHATWG).
std::string LossyUtf8(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t consumed;
    const size_t n = Utf8SeqLen(s, i, &consumed);
    if (n > 0) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += consumed;
    }
  }
  return out;
}

// Decodes the code point of the valid sequence at s[i] (length n).
uint32_t DecodeAt(absl::string_view s, size_t i, size_t n) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[k])); };
  switch (n) {
    case 1: return b(i);
    case 2: return ((b(i) & 0x1F) << 6) | (b(i + 1) & 0x3F);
    case 3: return ((b(i) & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
    default:
      return ((b(i) & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) |
             (b(i + 3) & 0x3F);
  }
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the other 68 to
// U+0100.. in byte order.
struct ByteTables {
  std::array<uint32_t, 256> byte_to_cp;
  std::array<int, 512> cp_to_byte;  // -1 where no byte maps to the code point
};

const ByteTables& GetByteTables() {
  static const ByteTables tables = [] {
    ByteTables t;
    t.cp_to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t.byte_to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      t.cp_to_byte[t.byte_to_cp[b]] = b;
    }
    return t;
  }();
  return tables;
}

// Raw bytes of a byte-level vocabulary string ("Ġworld" -> " world"); nullopt when a
// character is outside the byte table (then the string stands for its own UTF-8).
std::optional<std::string> ByteLevelToBytes(absl::string_view piece) {
  const ByteTables& t = GetByteTables();
  std::string out;
  out.reserve(piece.size());
  size_t i = 0;
  while (i < piece.size()) {
    size_t consumed;
    const size_t n = Utf8SeqLen(piece, i, &consumed);
    if (n == 0) return std::nullopt;
    const uint32_t cp = DecodeAt(piece, i, n);
    if (cp >= t.cp_to_byte.size() || t.cp_to_byte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.cp_to_byte[cp]));
    i += n;
  }
  return out;
}

std::string BytesToByteLevel(absl::string_view bytes) {
  const ByteTables& t = GetByteTables();
  std::string out;
  for (unsigned char c : bytes) AppendUtf8(t.byte_to_cp[c], &out);
  return out;
}

// True for code points that NFC leaves alone and that never compose with a
// neighbour in this set (so a string made only of them is already NFC).
bool IsNfcInert(uint32_t cp) {
  return cp < 0x300 || (cp >= 0x4E00 && cp < 0xA000) || (cp >= 0x3000 && cp < 0x302A) ||
         (cp >= 0x3041 && cp < 0x3097) || (cp >= 0x30A1 && cp < 0x30FB) ||
         (cp >= 0xFF01 && cp < 0xFFEF) || (cp >= 0x1F300 && cp < 0x1FB00);
}

// ---------------------------------------------------------------------------------
// PCRE2 regex.

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

}  // namespace

// ---------------------------------------------------------------------------------

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
    std::unique_ptr<Regex> regex;  // Split regex (or GPT-2's for ByteLevel use_regex)
    bool byte_level = false;       // ByteLevel step
    bool add_prefix_space = false; // ByteLevel: prepend ' ' to a piece not starting with one
  };
  // Mutable state of one Encode call.
  struct EncodeState {
    std::vector<MatchScratch> match;                           // one per PreStep
    std::unordered_map<std::string, std::vector<int>> cache;   // word bytes -> ids
    int64_t limit = -1;     // stop once the output holds more ids (-1 = never)
    bool stopped = false;   // the limit was passed: the output is incomplete
  };
  // Encode, stopping past `limit` ids (-1 = never); *stopped says whether it did.
  absl::StatusOr<std::vector<int>> EncodeImpl(absl::string_view text, const EncodeOptions& options,
                                              int64_t limit, bool* stopped) const;

  BpeTokenizer() = default;
  absl::Status LoadModel(const json& model);
  absl::Status LoadAddedTokens(const json& added);
  absl::Status LoadNormalizer(const json& n);
  absl::Status LoadPreTokenizer(const json& p);
  absl::Status LoadPostProcessor(const json& p);
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
  FlatPairMap<MergeInfo> merges_;                   // (left id, right id) -> merge
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
// Encode.

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

// ---------------------------------------------------------------------------------
// Free functions.

absl::StatusOr<std::string> NfcNormalize(absl::string_view text) {
  bool inert = true;
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t consumed;
    const size_t n = Utf8SeqLen(text, i, &consumed);
    if (n == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("text to normalize is not valid UTF-8 (byte offset ", i, ")"));
    }
    if (inert && !IsNfcInert(DecodeAt(text, i, n))) inert = false;
    i += n;
  }
  if (inert) return std::string(text);
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t len =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &result,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (len < 0) {
    return absl::InvalidArgumentError(absl::StrCat("NFC failed: ", utf8proc_errmsg(len)));
  }
  std::string out(reinterpret_cast<const char*>(result), static_cast<size_t>(len));
  std::free(result);
  return out;
}

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
