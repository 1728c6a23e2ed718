// SentencePiece tokenizer over the isolated module libechokv_spm_shim.so.
//
// Behaviour (matching sentencepiece / HF LlamaTokenizer):
// - Encode: plain SentencePiece encoding; BOS is prepended when tokenizer_config.json's
//   add_bos_token (default true) and EncodeOptions::add_special_tokens are both true,
//   EOS appended likewise for add_eos_token (default false).
// - SentencePiece never parses special-token text: "<s>" or "[INST]" in the input are
//   encoded as ordinary pieces, so EncodeOptions::parse_special has no effect here.
//   Callers that need control ids in a prompt insert them themselves.
// - Decode: control ids (BOS, EOS, ...) decode to "" as sentencepiece does; with
//   skip_special_tokens they are dropped before decoding (same text, but they no
//   longer affect the dummy-prefix space rule).
// - IsSpecial(id) == the piece is a control token.
#include "model/sentencepiece_tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace echokv::model {
namespace {

constexpr char kShimFileName[] = "libechokv_spm_shim.so";
constexpr int kShimAbiVersion = 1;

struct EchokvSpm;  // opaque, defined in the module

// The C API of model/sentencepiece_shim.cc, resolved with dlsym.
struct SpmApi {
  int (*abi_version)();
  void (*free_fn)(void*);
  EchokvSpm* (*load)(const char*, char**);
  void (*destroy)(EchokvSpm*);
  int (*piece_size)(const EchokvSpm*);
  int (*bos_id)(const EchokvSpm*);
  int (*eos_id)(const EchokvSpm*);
  int (*unk_id)(const EchokvSpm*);
  int (*piece_to_id)(const EchokvSpm*, const char*, size_t);
  const char* (*id_to_piece)(const EchokvSpm*, int, size_t*);
  int (*is_control)(const EchokvSpm*, int);
  int (*is_unknown)(const EchokvSpm*, int);
  int (*is_byte)(const EchokvSpm*, int);
  char* (*encode)(const EchokvSpm*, const char*, size_t, int**, size_t*);
  char* (*decode)(const EchokvSpm*, const int*, size_t, char**, size_t*);
  char* (*train)(const char*);
};

bool FileExists(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

// Candidate paths of the module, in search order.
std::vector<std::string> ShimCandidates() {
  std::vector<std::string> paths;
  if (std::optional<std::string> env = GetEnv("ECHOKV_SPM_SHIM")) {
    paths.push_back(*env);
  }
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    std::string exe_path(exe, static_cast<size_t>(n));
    size_t slash = exe_path.rfind('/');
    if (slash != std::string::npos) {
      std::string dir = exe_path.substr(0, slash);
      paths.push_back(dir + "/" + kShimFileName);
      paths.push_back(dir + "/../lib/" + kShimFileName);
    }
  }
#ifdef ECHOKV_SPM_SHIM_BUILD_PATH
  paths.push_back(ECHOKV_SPM_SHIM_BUILD_PATH);
#endif
  return paths;
}

// ASan and UBSan builds (scripts/test.sh --sanitize, tests/fuzz): the sanitizer runtimes
// refuse RTLD_DEEPBIND and abort the process (google/sanitizers#611). There the module
// goes into a link namespace of its own instead (dlmopen LM_ID_NEWLM): SentencePiece and
// its private protobuf still see nothing of the process's libprotobuf, which is the
// isolation DEEPBIND gives. The module is built without sanitizers for this (a new
// namespace has no sanitizer runtime), and it frees what it allocates (free_fn).
#if defined(__SANITIZE_ADDRESS__)
#define ECHOKV_SPM_NEW_NAMESPACE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define ECHOKV_SPM_NEW_NAMESPACE 1
#endif
#endif

void* OpenModule(const std::string& path) {
#ifdef ECHOKV_SPM_NEW_NAMESPACE
  return dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
#else
  return dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
#endif
}

template <typename Fn>
absl::Status Resolve(void* handle, const std::string& path, const char* name, Fn* out) {
  void* sym = dlsym(handle, name);
  if (sym == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("SentencePiece module ", path, " lacks symbol ", name));
  }
  *out = reinterpret_cast<Fn>(sym);
  return absl::OkStatus();
}

absl::StatusOr<SpmApi> LoadApi() {
  std::vector<std::string> candidates = ShimCandidates();
  std::vector<std::string> tried;
  const bool env_set = GetEnv("ECHOKV_SPM_SHIM").has_value();
  for (size_t i = 0; i < candidates.size(); ++i) {
    const std::string& path = candidates[i];
    const bool from_env = env_set && i == 0;
    if (!FileExists(path)) {
      tried.push_back(path + " (not found)");
      if (from_env) {
        return absl::NotFoundError(
            absl::StrCat("$ECHOKV_SPM_SHIM names ", path, ", which does not exist"));
      }
      continue;
    }
    void* handle = OpenModule(path);
    if (handle == nullptr) {
      const char* why = dlerror();
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot load the SentencePiece module ", path, ": ", why ? why : "unknown error"));
    }
    // The handle is kept for the life of the process (the API below points into it).
    SpmApi api{};
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_abi_version", &api.abi_version));
    if (api.abi_version() != kShimAbiVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat("SentencePiece module ", path, " has ABI version ", api.abi_version(),
                       ", expected ", kShimAbiVersion, " (stale build?)"));
    }
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_free", &api.free_fn));
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_load", &api.load));
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_destroy", &api.destroy));
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_piece_size", &api.piece_size));
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_bos_id", &api.bos_id));
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_eos_id", &api.eos_id));
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_unk_id", &api.unk_id));
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_piece_to_id", &api.piece_to_id));
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_id_to_piece", &api.id_to_piece));
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_is_control", &api.is_control));
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_is_unknown", &api.is_unknown));
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_is_byte", &api.is_byte));
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_encode", &api.encode));
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_decode", &api.decode));
    ECHOKV_RETURN_IF_ERROR(Resolve(handle, path, "echokv_spm_train", &api.train));
    return api;
  }
  return absl::NotFoundError(absl::StrCat(
      "cannot find the SentencePiece module ", kShimFileName,
      " (set $ECHOKV_SPM_SHIM to its path); tried: ", absl::StrJoin(tried, ", ")));
}

// The module, loaded once per process (thread-safe static initialisation).
absl::StatusOr<const SpmApi*> GetApi() {
  static const absl::StatusOr<SpmApi>* const api = new absl::StatusOr<SpmApi>(LoadApi());
  if (!api->ok()) return api->status();
  return &**api;
}

// Takes ownership of an error string from the module.
absl::Status ModuleError(const SpmApi& api, char* error, absl::StatusCode code,
                         absl::string_view context) {
  std::string message = error != nullptr ? std::string(error) : "unknown error";
  api.free_fn(error);
  return absl::Status(code, absl::StrCat(context, ": ", message));
}

struct TokenizerConfig {
  bool add_bos = true;
  bool add_eos = false;
  std::vector<std::string> eos_pieces;  // eos_token content, when given
  std::string bos_piece;                // bos_token content, when given
};

// A special-token entry of tokenizer_config.json: a string or {"content": ...}.
std::string TokenContent(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object()) {
    auto it = value.find("content");
    if (it != value.end() && it->is_string()) return it->get<std::string>();
  }
  return "";
}

absl::StatusOr<TokenizerConfig> ReadTokenizerConfig(const std::string& dir) {
  TokenizerConfig config;
  const std::string path = dir + "/tokenizer_config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return config;  // absent: defaults
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json json = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  for (const auto& [key, field] : {std::pair<const char*, bool*>{"add_bos_token", &config.add_bos},
                                   std::pair<const char*, bool*>{"add_eos_token", &config.add_eos}}) {
    auto it = json.find(key);
    if (it == json.end() || it->is_null()) continue;
    if (!it->is_boolean()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": field ", key, " must be a boolean"));
    }
    *field = it->get<bool>();
  }
  if (auto it = json.find("eos_token"); it != json.end()) {
    std::string piece = TokenContent(*it);
    if (!piece.empty()) config.eos_pieces.push_back(piece);
  }
  if (auto it = json.find("bos_token"); it != json.end()) {
    config.bos_piece = TokenContent(*it);
  }
  return config;
}

// The few fields of tokenizer.model (a serialized sentencepiece.ModelProto) that
// decide whether a text may be encoded in pieces (EncodeAtMost). Read with a minimal
// wire-format reader: the module's protobuf types are not visible here.
struct SpmSpecs {
  bool valid = false;               // the file parsed
  std::string normalizer;           // normalizer_spec.name
  bool has_charsmap = false;        // normalizer_spec.precompiled_charsmap non-empty
  bool add_dummy_prefix = true;     // normalizer_spec 3
  bool remove_extra_whitespaces = true;  // normalizer_spec 4
  bool escape_whitespaces = true;   // normalizer_spec 5
  bool split_by_whitespace = true;  // trainer_spec 22
  bool treat_whitespace_as_suffix = false;  // trainer_spec 24
  bool byte_fallback = false;       // trainer_spec 35
};

// Reads a varint at *p (< end); false when truncated.
bool ReadVarint(const unsigned char** p, const unsigned char* end, uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    const unsigned char b = *(*p)++;
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      *out = v;
      return true;
    }
  }
  return false;
}

// Calls field(number, wire_type, varint, bytes) for each field of one message.
template <typename Fn>
bool ForEachField(absl::string_view msg, Fn&& field) {
  const auto* p = reinterpret_cast<const unsigned char*>(msg.data());
  const auto* end = p + msg.size();
  while (p < end) {
    uint64_t tag = 0, v = 0;
    if (!ReadVarint(&p, end, &tag)) return false;
    const int number = static_cast<int>(tag >> 3);
    switch (tag & 7) {
      case 0:
        if (!ReadVarint(&p, end, &v)) return false;
        field(number, 0, v, absl::string_view());
        break;
      case 1:
        if (end - p < 8) return false;
        p += 8;
        break;
      case 2: {
        if (!ReadVarint(&p, end, &v) || v > static_cast<uint64_t>(end - p)) return false;
        field(number, 2, 0, absl::string_view(reinterpret_cast<const char*>(p), v));
        p += v;
        break;
      }
      case 5:
        if (end - p < 4) return false;
        p += 4;
        break;
      default:
        return false;  // groups do not occur in ModelProto
    }
  }
  return true;
}

SpmSpecs ReadSpmSpecs(const std::string& path) {
  SpmSpecs specs;
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string model = buffer.str();
  bool ok = true;  // every nested message parsed
  const bool top = ForEachField(model, [&](int n, int type, uint64_t, absl::string_view bytes) {
    if (type != 2) return;
    if (n == 2) {  // trainer_spec
      ok = ok && ForEachField(bytes, [&](int f, int t, uint64_t v, absl::string_view) {
             if (t != 0) return;
             if (f == 22) specs.split_by_whitespace = v != 0;
             if (f == 24) specs.treat_whitespace_as_suffix = v != 0;
             if (f == 35) specs.byte_fallback = v != 0;
           });
    } else if (n == 3) {  // normalizer_spec
      ok = ok && ForEachField(bytes, [&](int f, int t, uint64_t v, absl::string_view b) {
             if (f == 1 && t == 2) specs.normalizer = std::string(b);
             if (f == 2 && t == 2) specs.has_charsmap = !b.empty();
             if (t != 0) return;
             if (f == 3) specs.add_dummy_prefix = v != 0;
             if (f == 4) specs.remove_extra_whitespaces = v != 0;
             if (f == 5) specs.escape_whitespaces = v != 0;
           });
    }
  });
  specs.valid = top && ok && !model.empty();
  return specs;
}

constexpr char kSpaceSymbol[] = "\xe2\x96\x81";  // U+2581, SentencePiece's escaped space

class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(const SpmApi* api, EchokvSpm* spm, TokenizerConfig config, SpmSpecs specs,
                         size_t chunk_bytes)
      : api_(api), spm_(spm), config_(std::move(config)), specs_(std::move(specs)), chunk_bytes_(chunk_bytes) {
    vocab_size_ = api_->piece_size(spm_);
    const int unk = api_->unk_id(spm_);
    int bos = api_->bos_id(spm_);
    if (bos < 0 && !config_.bos_piece.empty()) {
      int id = PieceToId(config_.bos_piece);
      if (id != unk) bos = id;
    }
    if (bos >= 0 && bos < vocab_size_) bos_id_ = bos;
    const int eos = api_->eos_id(spm_);
    if (eos >= 0 && eos < vocab_size_) eos_ids_.push_back(eos);
    for (const std::string& piece : config_.eos_pieces) {
      int id = PieceToId(piece);
      if (id >= 0 && id < vocab_size_ && id != unk &&
          std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end()) {
        eos_ids_.push_back(id);
      }
    }
    // Pieces may be encoded chunk by chunk, cut at a single space between two words,
    // exactly when no word-crossing can happen (docs/SECURITY.md "Bounded
    // tokenization"): no character mapping (identity, no charsmap), spaces escaped to
    // U+2581 and split on (a word starts at the first U+2581 after a non-U+2581), no
    // vocabulary piece holds U+2581 after another character (so no piece spans a word
    // boundary, for BPE merges and unigram lattices alike), U+2581 itself is a piece
    // (unknowns never merge across), and a cut space can be re-created by the dummy
    // prefix or is kept verbatim.
    chunkable_ = specs_.valid && specs_.normalizer == "identity" && !specs_.has_charsmap &&
                 specs_.escape_whitespaces && specs_.split_by_whitespace && !specs_.treat_whitespace_as_suffix &&
                 (specs_.add_dummy_prefix || !specs_.remove_extra_whitespaces) && PieceToId(kSpaceSymbol) != unk;
    for (int id = 0; id < vocab_size_ && chunkable_; ++id) {
      const std::string piece = IdToPiece(id);
      max_piece_bytes_ = std::max<int64_t>(max_piece_bytes_, static_cast<int64_t>(piece.size()));
      // U+2581 is allowed only in a leading run ("▁▁a"), never after another character.
      size_t lead = 0;
      while (piece.compare(lead, 3, kSpaceSymbol) == 0) lead += 3;
      if (piece.find(kSpaceSymbol, lead) != std::string::npos) chunkable_ = false;
    }
    // <0xNN> byte pieces are 6 characters but cover one byte; the longest piece bounds
    // the bytes one id covers either way.
  }
  ~SentencePieceTokenizer() override { api_->destroy(spm_); }
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  absl::StatusOr<std::vector<int>> Encode(absl::string_view text,
                                          const EncodeOptions& options) const override {
    int* raw = nullptr;
    size_t n = 0;
    if (char* error = api_->encode(spm_, text.data(), text.size(), &raw, &n)) {
      return ModuleError(*api_, error, absl::StatusCode::kInvalidArgument, "Encode");
    }
    std::vector<int> ids;
    ids.reserve(n + 2);
    const bool add_bos = options.add_special_tokens && config_.add_bos && bos_id_.has_value();
    if (add_bos) ids.push_back(*bos_id_);
    if (raw != nullptr) ids.insert(ids.end(), raw, raw + n);
    api_->free_fn(raw);
    if (options.add_special_tokens && config_.add_eos && !eos_ids_.empty()) {
      ids.push_back(eos_ids_.front());
    }
    return ids;
  }

  absl::StatusOr<BoundedEncoding> EncodeAtMost(absl::string_view text, const EncodeOptions& options,
                                               int64_t max_tokens) const override {
    if (!chunkable_) return Tokenizer::EncodeAtMost(text, options, max_tokens);
    const bool add_bos = options.add_special_tokens && config_.add_bos && bos_id_.has_value();
    const bool add_eos = options.add_special_tokens && config_.add_eos && !eos_ids_.empty();
    const int64_t specials = (add_bos ? 1 : 0) + (add_eos ? 1 : 0);
    BoundedEncoding out;
    auto exceeded = [&](int64_t at_least) {
      out.ids.clear();
      out.exceeded = true;
      out.at_least = at_least;
      return out;
    };
    // With byte fallback every byte of the (identity-)normalized text is covered by a
    // piece of at most max_piece_bytes_ bytes, and normalization never drops a
    // non-space byte: a lower bound without encoding anything.
    if (specs_.byte_fallback) {
      const int64_t non_space = static_cast<int64_t>(text.size() - std::count(text.begin(), text.end(), ' '));
      const int64_t at_least = non_space / std::max<int64_t>(max_piece_bytes_, 1) + specials;
      if (at_least > max_tokens) return exceeded(at_least);
    }
    if (add_bos) out.ids.push_back(*bos_id_);
    const size_t n = text.size();
    size_t pos = 0;
    while (pos < n) {
      size_t end = NextCut(text, pos + chunk_bytes_);
      absl::string_view chunk = text.substr(pos, end - pos);
      // A later chunk starts with the space of its first word, re-created by the dummy
      // prefix.
      if (pos > 0 && specs_.add_dummy_prefix) chunk.remove_prefix(1);
      ECHOKV_RETURN_IF_ERROR(AppendRaw(chunk, &out.ids));
      if (static_cast<int64_t>(out.ids.size()) + (add_eos ? 1 : 0) > max_tokens) {
        return exceeded(static_cast<int64_t>(out.ids.size()) + (add_eos ? 1 : 0));
      }
      pos = end;
    }
    if (add_eos) out.ids.push_back(eos_ids_.front());
    if (static_cast<int64_t>(out.ids.size()) > max_tokens) return exceeded(static_cast<int64_t>(out.ids.size()));
    return out;
  }

  absl::StatusOr<std::string> Decode(absl::Span<const int> ids,
                                     const DecodeOptions& options) const override {
    std::vector<int> kept;
    kept.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const int id = ids[i];
      if (id < 0 || id >= vocab_size_) {
        return absl::InvalidArgumentError(absl::StrCat("Decode: id ", id, " at index ", i,
                                                       " is outside [0, ", vocab_size_, ")"));
      }
      if (options.skip_special_tokens && api_->is_control(spm_, id)) continue;
      kept.push_back(id);
    }
    char* text = nullptr;
    size_t len = 0;
    if (char* error = api_->decode(spm_, kept.data(), kept.size(), &text, &len)) {
      return ModuleError(*api_, error, absl::StatusCode::kInternal, "Decode");
    }
    std::string out(text != nullptr ? text : "", len);
    api_->free_fn(text);
    return out;
  }

  std::string IdToPiece(int id) const override {
    size_t len = 0;
    const char* piece = api_->id_to_piece(spm_, id, &len);
    return piece == nullptr ? std::string() : std::string(piece, len);
  }
  int vocab_size() const override { return vocab_size_; }
  std::optional<int> bos_id() const override { return bos_id_; }
  std::vector<int> eos_ids() const override { return eos_ids_; }
  bool IsSpecial(int id) const override { return api_->is_control(spm_, id) != 0; }
  absl::string_view kind() const override { return "sentencepiece"; }

 private:
  int PieceToId(const std::string& piece) const {
    return api_->piece_to_id(spm_, piece.data(), piece.size());
  }

  // The first cut at or after `from`: a single space between two characters that are
  // neither a space nor U+2581 (which SentencePiece treats like a space);
  // text.size() when there is none. Cutting there splits the normalized text exactly
  // at a word boundary, and the space is re-created by the dummy prefix (or kept).
  static size_t NextCut(absl::string_view text, size_t from) {
    const size_t n = text.size();
    auto spacelike_ends_at = [&](size_t i) {  // text[..i) ends with ' ' or U+2581
      return text[i - 1] == ' ' || (i >= 3 && text.compare(i - 3, 3, kSpaceSymbol) == 0);
    };
    auto spacelike_starts_at = [&](size_t i) {
      return text[i] == ' ' || text.compare(i, 3, kSpaceSymbol) == 0;
    };
    for (size_t i = std::max<size_t>(from, 1); i + 1 < n; ++i) {
      if (text[i] == ' ' && !spacelike_ends_at(i) && !spacelike_starts_at(i + 1)) return i;
    }
    return n;
  }

  // Appends the plain SentencePiece encoding of `text` (no BOS/EOS).
  absl::Status AppendRaw(absl::string_view text, std::vector<int>* ids) const {
    int* raw = nullptr;
    size_t n = 0;
    if (char* error = api_->encode(spm_, text.data(), text.size(), &raw, &n)) {
      return ModuleError(*api_, error, absl::StatusCode::kInvalidArgument, "Encode");
    }
    if (raw != nullptr) ids->insert(ids->end(), raw, raw + n);
    api_->free_fn(raw);
    return absl::OkStatus();
  }

  const SpmApi* api_;           // process-wide module API
  EchokvSpm* spm_;              // owned; released with api_->destroy
  TokenizerConfig config_;      // from tokenizer_config.json (defaults when absent)
  SpmSpecs specs_;              // normalizer / trainer flags of tokenizer.model
  size_t chunk_bytes_;          // EncodeAtMost: bytes per chunk (at least)
  bool chunkable_ = false;      // EncodeAtMost may cut the text (see the constructor)
  int64_t max_piece_bytes_ = 1; // longest piece string (bytes one id covers at most)
  int vocab_size_ = 0;          // number of pieces
  std::optional<int> bos_id_;   // model's BOS (or bos_token's piece), if any
  std::vector<int> eos_ids_;    // model's EOS, then eos_token's piece when different
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& dir) {
  return LoadSentencePieceTokenizer(dir, SentencePieceOptions{});
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& dir,
                                                                      const SentencePieceOptions& options) {
  const std::string path = dir + "/tokenizer.model";
  if (!FileExists(path)) {
    return absl::NotFoundError(absl::StrCat("no SentencePiece model: ", path, " not found"));
  }
  ECHOKV_ASSIGN_OR_RETURN(TokenizerConfig config, ReadTokenizerConfig(dir));
  ECHOKV_ASSIGN_OR_RETURN(const SpmApi* api, GetApi());
  char* error = nullptr;
  EchokvSpm* spm = api->load(path.c_str(), &error);
  if (spm == nullptr) {
    return ModuleError(*api, error, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("cannot load ", path));
  }
  return std::unique_ptr<Tokenizer>(new SentencePieceTokenizer(api, spm, std::move(config), ReadSpmSpecs(path),
                                                               std::max<size_t>(options.encode_chunk_bytes, 1)));
}

absl::Status TrainSentencePiece(const std::string& args) {
  ECHOKV_ASSIGN_OR_RETURN(const SpmApi* api, GetApi());
  if (char* error = api->train(args.c_str())) {
    return ModuleError(*api, error, absl::StatusCode::kInvalidArgument, "TrainSentencePiece");
  }
  return absl::OkStatus();
}

}  // namespace echokv::model
