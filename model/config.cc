#include "model/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace echokv::model {
namespace {

using Json = nlohmann::json;

// config.json files are a few KB; anything far larger is not a config.
constexpr int64_t kMaxConfigBytes = 16 << 20;

// Qwen2Config's default max_window_layers (transformers).
constexpr int kQwen2DefaultMaxWindowLayers = 28;

// JSON type name for error messages.
std::string TypeName(const Json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number_float()) return "a floating-point number";
  if (v.is_array() || v.is_object()) return std::string("an ") + v.type_name();
  return std::string("a ") + v.type_name();
}

// Reads one JSON object (`file` names it in errors), with parse errors reported.
absl::StatusOr<Json> ParseObject(absl::string_view text, absl::string_view file) {
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": invalid JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": expected a JSON object at the top level, got ", TypeName(j)));
  }
  return j;
}

// Field access over one parsed file; every error names the file and the field.
class Fields {
 public:
  Fields(const Json& obj, absl::string_view file) : obj_(obj), file_(file) {}

  // The value of `key`, or nullptr when absent or null.
  const Json* Get(absl::string_view key) const {
    auto it = obj_.find(std::string(key));
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::Status Error(absl::string_view key, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": field '", key, "' ", what));
  }

  // An integer field in int range; nullopt when absent/null.
  absl::StatusOr<std::optional<int64_t>> OptionalInt(absl::string_view key) const {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<int64_t>();
    return ToInt(key, *v);
  }

  absl::StatusOr<int64_t> ToInt(absl::string_view key, const Json& v) const {
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
        return Error(key, absl::StrCat("is too large: ", u));
      }
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) {
      int64_t i = v.get<int64_t>();
      if (i < std::numeric_limits<int>::min() || i > std::numeric_limits<int>::max()) {
        return Error(key, absl::StrCat("is out of range: ", i));
      }
      return i;
    }
    return Error(key, absl::StrCat("must be an integer, got ", TypeName(v)));
  }

  absl::StatusOr<int> RequiredPositiveInt(absl::string_view key) const {
    ECHOKV_ASSIGN_OR_RETURN(std::optional<int64_t> v, OptionalInt(key));
    if (!v.has_value()) return Error(key, "is missing (required)");
    if (*v <= 0) return Error(key, absl::StrCat("must be positive, got ", *v));
    return static_cast<int>(*v);
  }

  // A positive integer when present; `fallback` when absent or null.
  absl::StatusOr<int> OptionalPositiveInt(absl::string_view key, int fallback) const {
    ECHOKV_ASSIGN_OR_RETURN(std::optional<int64_t> v, OptionalInt(key));
    if (!v.has_value()) return fallback;
    if (*v <= 0) return Error(key, absl::StrCat("must be positive, got ", *v));
    return static_cast<int>(*v);
  }

  absl::StatusOr<std::optional<double>> OptionalNumber(absl::string_view key) const {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<double>();
    if (!v->is_number()) return Error(key, absl::StrCat("must be a number, got ", TypeName(*v)));
    double d = v->get<double>();
    if (!std::isfinite(d)) return Error(key, "must be finite");
    return std::optional<double>(d);
  }

  absl::StatusOr<bool> OptionalBool(absl::string_view key, bool fallback) const {
    const Json* v = Get(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) {
      return Error(key, absl::StrCat("must be true or false, got ", TypeName(*v)));
    }
    return v->get<bool>();
  }

  absl::StatusOr<std::optional<std::string>> OptionalString(absl::string_view key) const {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) return Error(key, absl::StrCat("must be a string, got ", TypeName(*v)));
    return std::optional<std::string>(v->get<std::string>());
  }

  // A token id field: int, list of ints, or null. Appends to `out` (order kept).
  absl::Status TokenIds(absl::string_view key, std::vector<int>* out) const {
    const Json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    auto add = [&](const Json& item) -> absl::Status {
      ECHOKV_ASSIGN_OR_RETURN(int64_t id, ToInt(key, item));
      if (id < 0) return Error(key, absl::StrCat("holds a negative token id ", id));
      out->push_back(static_cast<int>(id));
      return absl::OkStatus();
    };
    if (v->is_array()) {
      for (const Json& item : *v) ECHOKV_RETURN_IF_ERROR(add(item));
      return absl::OkStatus();
    }
    if (!v->is_number()) {
      return Error(key, absl::StrCat("must be an integer, a list of integers or null, got ",
                                     TypeName(*v)));
    }
    return add(*v);
  }

 private:
  const Json& obj_;       // the parsed object (outlives this)
  std::string file_;      // file name for messages
};

void AppendUnique(const std::vector<int>& ids, std::vector<int>* out) {
  for (int id : ids) {
    if (std::find(out->begin(), out->end(), id) == out->end()) out->push_back(id);
  }
}

// bos: a single id; a list is accepted only when it names one id.
absl::Status SingleBos(const Fields& f, int* bos) {
  std::vector<int> ids;
  ECHOKV_RETURN_IF_ERROR(f.TokenIds("bos_token_id", &ids));
  std::vector<int> unique;
  AppendUnique(ids, &unique);
  if (unique.size() > 1) {
    return f.Error("bos_token_id", "lists several different ids; expected one");
  }
  if (!unique.empty()) *bos = unique[0];
  return absl::OkStatus();
}

// A number inside the rope_scaling object; errors name it "rope_scaling.<key>".
absl::StatusOr<double> RopeNumber(const Json& rs, absl::string_view key, absl::string_view type,
                                  absl::string_view field) {
  auto it = rs.find(std::string(key));
  if (it == rs.end() || it->is_null()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: field '", field, ".", key,
                                                   "' is missing (required for rope_type '", type,
                                                   "')"));
  }
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: field '", field, ".", key,
                                                   "' must be a number, got ", TypeName(*it)));
  }
  const double d = it->get<double>();
  if (!std::isfinite(d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: field '", field, ".", key, "' must be finite"));
  }
  return d;
}

// rope_scaling: null, or an object with "rope_type" (or the older "type", which
// transformers still accepts) and the parameters of that type.
// `field` is "rope_scaling" (config.json up to transformers 4.x) or "rope_parameters"
// (transformers 5, which also moves rope_theta inside it).
absl::Status ParseRopeScaling(const Fields& f, const std::string& field, RopeScaling* out) {
  *out = RopeScaling();
  const Json* rs = f.Get(field);
  if (rs == nullptr) return absl::OkStatus();
  if (!rs->is_object()) {
    return f.Error(field, absl::StrCat("must be an object or null, got ", TypeName(*rs)));
  }
  const Json* type = nullptr;
  std::string type_key;
  for (const char* key : {"rope_type", "type"}) {
    auto it = rs->find(key);
    if (it == rs->end() || it->is_null()) continue;
    if (!it->is_string()) {
      return f.Error(absl::StrCat(field, ".", key),
                     absl::StrCat("must be a string, got ", TypeName(*it)));
    }
    if (type == nullptr) {
      type = &*it;
      type_key = key;
    } else if (*type != *it) {
      // transformers' rope utilities read rope_type first while LlamaConfig copies
      // "type" over "rope_type": the two disagree, so we refuse rather than guess.
      return f.Error(field, absl::StrCat("has rope_type '", type->get<std::string>(),
                                                  "' and type '", it->get<std::string>(),
                                                  "', which disagree"));
    }
  }
  if (type == nullptr) {
    return f.Error(field, "has no 'rope_type' or 'type'");
  }
  const std::string name = type->get<std::string>();
  if (name == "default") return absl::OkStatus();  // transformers' name for plain RoPE
  if (name == "linear") {
    out->type = RopeScalingType::kLinear;
    ECHOKV_ASSIGN_OR_RETURN(out->factor, RopeNumber(*rs, "factor", name, field));
  } else if (name == "llama3") {
    out->type = RopeScalingType::kLlama3;
    ECHOKV_ASSIGN_OR_RETURN(out->factor, RopeNumber(*rs, "factor", name, field));
    ECHOKV_ASSIGN_OR_RETURN(out->low_freq_factor, RopeNumber(*rs, "low_freq_factor", name, field));
    ECHOKV_ASSIGN_OR_RETURN(out->high_freq_factor, RopeNumber(*rs, "high_freq_factor", name, field));
    const char* kOriginal = "original_max_position_embeddings";
    auto it = rs->find(kOriginal);
    if (it == rs->end() || it->is_null()) {
      return f.Error(absl::StrCat(field, ".", kOriginal), "is missing (required for rope_type 'llama3')");
    }
    ECHOKV_ASSIGN_OR_RETURN(int64_t original, f.ToInt(absl::StrCat(field, ".", kOriginal), *it));
    out->original_max_position_embeddings = static_cast<int>(original);
  } else if (name == "dynamic") {
    return absl::UnimplementedError(absl::StrCat(
        "config.json: ", field, " type 'dynamic' (dynamic NTK, field '", field, ".", type_key,
        "') is not supported: it recomputes the RoPE base "
        "from the current sequence length, while echokv stores keys post-RoPE at their "
        "original positions and never re-rotates them (compressed, appended and forked "
        "caches), so keys written at one length would not match queries at another"));
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "config.json: ", field, " type '", name, "' (field '", field, ".", type_key,
        "') is not supported (supported: null, 'default', 'linear', 'llama3')"));
  }
  absl::Status valid = out->Validate();
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat("config.json: ", valid.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot read ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  if (st.st_size > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is ", st.st_size,
                                                   " bytes, larger than the ", kMaxConfigBytes,
                                                   "-byte limit for a config file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return ss.str();
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

absl::string_view ModelTypeName(ModelType type) {
  switch (type) {
    case ModelType::kLlama:
      return "llama";
    case ModelType::kMistral:
      return "mistral";
    case ModelType::kQwen2:
      return "qwen2";
  }
  return "unknown";
}

absl::string_view RopeScalingTypeName(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::kNone:
      return "none";
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kLlama3:
      return "llama3";
  }
  return "unknown";
}

absl::Status RopeScaling::Validate() const {
  auto bad = [](absl::string_view field, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("field 'rope_scaling.", field, "' ", what));
  };
  switch (type) {
    case RopeScalingType::kNone:
      return absl::OkStatus();
    case RopeScalingType::kLinear:
    case RopeScalingType::kLlama3:
      // transformers documents factor as a float >= 1 (it only warns); below 1 the
      // "extension" would shrink the context, which no checkpoint does.
      if (!std::isfinite(factor) || factor < 1.0) {
        return bad("factor", absl::StrCat("must be a finite number >= 1, got ", factor));
      }
      break;
  }
  if (type != RopeScalingType::kLlama3) return absl::OkStatus();
  if (!std::isfinite(low_freq_factor) || !(low_freq_factor > 0)) {
    return bad("low_freq_factor", absl::StrCat("must be positive and finite, got ", low_freq_factor));
  }
  // The smoothing band divides by high - low.
  if (!std::isfinite(high_freq_factor) || !(high_freq_factor > low_freq_factor)) {
    return bad("high_freq_factor", absl::StrCat("must be finite and greater than low_freq_factor (",
                                                low_freq_factor, "), got ", high_freq_factor));
  }
  if (original_max_position_embeddings <= 0) {
    return bad("original_max_position_embeddings",
               absl::StrCat("must be positive, got ", original_max_position_embeddings));
  }
  return absl::OkStatus();
}

absl::Status ModelConfig::Validate() const {
  auto bad = [](absl::string_view field, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("model config: ", field, " ", what));
  };
  const std::pair<const char*, int> positive[] = {
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_layers},
      {"num_attention_heads", num_heads},
      {"num_key_value_heads", num_kv_heads},
      {"head_dim", head_dim},
      {"vocab_size", vocab_size},
      {"max_position_embeddings", max_position_embeddings},
  };
  for (const auto& [name, value] : positive) {
    if (value <= 0) return bad(name, absl::StrCat("must be positive, got ", value));
  }
  if (num_heads % num_kv_heads != 0) {
    return bad("num_key_value_heads",
               absl::StrCat("(", num_kv_heads, ") must divide num_attention_heads (", num_heads,
                            ")"));
  }
  if (head_dim % 2 != 0) {
    return bad("head_dim", absl::StrCat("must be even for rotary embeddings, got ", head_dim));
  }
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps)) {
    return bad("rms_norm_eps", absl::StrCat("must be positive and finite, got ", rms_norm_eps));
  }
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) {
    return bad("rope_theta", absl::StrCat("must be positive and finite, got ", rope_theta));
  }
  if (absl::Status s = rope_scaling.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model config: ", s.message()));
  }
  if (!rope_freq_factors.empty()) {
    if (rope_freq_factors.size() != static_cast<size_t>(head_dim / 2)) {
      return bad("rope_freq_factors", absl::StrCat("must hold head_dim / 2 = ", head_dim / 2, " values, got ",
                                                   rope_freq_factors.size()));
    }
    for (float f : rope_freq_factors) {
      if (!(f > 0) || !std::isfinite(f)) {
        return bad("rope_freq_factors", absl::StrCat("must be positive and finite, got ", f));
      }
    }
  }
  if (sliding_window < 0) {
    return bad("sliding_window", absl::StrCat("must be >= 0, got ", sliding_window));
  }
  if (sliding_window_first_layer < 0 || sliding_window_first_layer > num_layers) {
    return bad("max_window_layers (sliding_window_first_layer)",
               absl::StrCat("must be in [0, ", num_layers, "], got ", sliding_window_first_layer));
  }
  if (bos_token_id < -1 || bos_token_id >= vocab_size) {
    return bad("bos_token_id",
               absl::StrCat("(", bos_token_id, ") must be -1 or in [0, vocab_size=", vocab_size,
                            ")"));
  }
  for (int id : eos_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return bad("eos_token_id",
                 absl::StrCat("(", id, ") must be in [0, vocab_size=", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view config_json,
                                             absl::string_view generation_config_json) {
  ECHOKV_ASSIGN_OR_RETURN(Json j, ParseObject(config_json, "config.json"));
  const Fields f(j, "config.json");
  ModelConfig cfg;

  ECHOKV_ASSIGN_OR_RETURN(std::optional<std::string> model_type, f.OptionalString("model_type"));
  if (!model_type.has_value()) return f.Error("model_type", "is missing (required)");
  if (*model_type == "llama") {
    cfg.type = ModelType::kLlama;
  } else if (*model_type == "mistral") {
    cfg.type = ModelType::kMistral;
  } else if (*model_type == "qwen2") {
    cfg.type = ModelType::kQwen2;
  } else {
    return f.Error("model_type", absl::StrCat("'", *model_type,
                                              "' is not supported (expected llama, mistral "
                                              "or qwen2)"));
  }

  ECHOKV_ASSIGN_OR_RETURN(cfg.hidden_size, f.RequiredPositiveInt("hidden_size"));
  ECHOKV_ASSIGN_OR_RETURN(cfg.intermediate_size, f.RequiredPositiveInt("intermediate_size"));
  ECHOKV_ASSIGN_OR_RETURN(cfg.num_layers, f.RequiredPositiveInt("num_hidden_layers"));
  ECHOKV_ASSIGN_OR_RETURN(cfg.num_heads, f.RequiredPositiveInt("num_attention_heads"));
  ECHOKV_ASSIGN_OR_RETURN(cfg.num_kv_heads,
                          f.OptionalPositiveInt("num_key_value_heads", cfg.num_heads));
  ECHOKV_ASSIGN_OR_RETURN(cfg.vocab_size, f.RequiredPositiveInt("vocab_size"));
  ECHOKV_ASSIGN_OR_RETURN(cfg.max_position_embeddings,
                          f.RequiredPositiveInt("max_position_embeddings"));

  if (cfg.num_heads % cfg.num_kv_heads != 0) {
    return f.Error("num_key_value_heads",
                   absl::StrCat("(", cfg.num_kv_heads, ") must divide num_attention_heads (",
                                cfg.num_heads, ")"));
  }
  ECHOKV_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, f.OptionalInt("head_dim"));
  if (head_dim.has_value()) {
    if (*head_dim <= 0) return f.Error("head_dim", absl::StrCat("must be positive, got ", *head_dim));
    cfg.head_dim = static_cast<int>(*head_dim);
  } else {
    if (cfg.hidden_size % cfg.num_heads != 0) {
      return f.Error("hidden_size",
                     absl::StrCat("(", cfg.hidden_size, ") is not a multiple of "
                                  "num_attention_heads (", cfg.num_heads,
                                  ") and head_dim is not given"));
    }
    cfg.head_dim = cfg.hidden_size / cfg.num_heads;
  }
  if (cfg.head_dim % 2 != 0) {
    return f.Error("head_dim",
                   absl::StrCat("must be even for rotary embeddings, got ", cfg.head_dim));
  }

  ECHOKV_ASSIGN_OR_RETURN(std::optional<double> eps, f.OptionalNumber("rms_norm_eps"));
  if (!eps.has_value()) return f.Error("rms_norm_eps", "is missing (required)");
  if (!(*eps > 0)) return f.Error("rms_norm_eps", absl::StrCat("must be positive, got ", *eps));
  cfg.rms_norm_eps = *eps;
  ECHOKV_ASSIGN_OR_RETURN(std::optional<double> theta, f.OptionalNumber("rope_theta"));
  if (theta.has_value()) {
    if (!(*theta > 0)) return f.Error("rope_theta", absl::StrCat("must be positive, got ", *theta));
    cfg.rope_theta = *theta;
  }
  if (f.Get("rope_parameters") != nullptr) {
    // transformers 5: {"rope_theta": ..., "rope_type": ..., <the type's parameters>}.
    const Json& rp = *f.Get("rope_parameters");
    if (f.Get("rope_scaling") != nullptr) {
      return f.Error("rope_parameters", "and 'rope_scaling' are both set; a config has one or the other");
    }
    if (rp.is_object() && rp.contains("rope_theta") && !rp["rope_theta"].is_null()) {
      if (!rp["rope_theta"].is_number() || !(rp["rope_theta"].get<double>() > 0) ||
          !std::isfinite(rp["rope_theta"].get<double>())) {
        return f.Error("rope_parameters.rope_theta", "must be a positive finite number");
      }
      const double inner = rp["rope_theta"].get<double>();
      if (theta.has_value() && *theta != inner) {
        return f.Error("rope_theta", absl::StrCat("(", *theta, ") disagrees with rope_parameters.rope_theta (",
                                                  inner, ")"));
      }
      cfg.rope_theta = inner;
    }
    ECHOKV_RETURN_IF_ERROR(ParseRopeScaling(f, "rope_parameters", &cfg.rope_scaling));
  } else {
    ECHOKV_RETURN_IF_ERROR(ParseRopeScaling(f, "rope_scaling", &cfg.rope_scaling));
  }

  ECHOKV_ASSIGN_OR_RETURN(cfg.tie_word_embeddings, f.OptionalBool("tie_word_embeddings", false));

  ECHOKV_ASSIGN_OR_RETURN(std::optional<std::string> act, f.OptionalString("hidden_act"));
  if (act.has_value() && *act != "silu") {
    return absl::UnimplementedError(absl::StrCat(
        "config.json: field 'hidden_act' is '", *act, "'; only 'silu' is supported"));
  }

  switch (cfg.type) {
    case ModelType::kLlama:
    case ModelType::kMistral: {
      ECHOKV_ASSIGN_OR_RETURN(bool attention_bias, f.OptionalBool("attention_bias", false));
      cfg.qkv_bias = attention_bias;
      cfg.o_bias = attention_bias;
      ECHOKV_ASSIGN_OR_RETURN(bool mlp_bias, f.OptionalBool("mlp_bias", false));
      if (mlp_bias) {
        return absl::UnimplementedError(
            "config.json: field 'mlp_bias' is true; MLP biases are not supported");
      }
      break;
    }
    case ModelType::kQwen2:
      // Qwen2's attention always has q/k/v biases and no o_proj bias.
      cfg.qkv_bias = true;
      cfg.o_bias = false;
      break;
  }

  switch (cfg.type) {
    case ModelType::kLlama:
      break;
    case ModelType::kMistral: {
      ECHOKV_ASSIGN_OR_RETURN(std::optional<int64_t> window, f.OptionalInt("sliding_window"));
      if (window.has_value()) {
        if (*window <= 0) {
          return f.Error("sliding_window", absl::StrCat("must be positive or null, got ", *window));
        }
        cfg.sliding_window = static_cast<int>(*window);
        cfg.sliding_window_first_layer = 0;
      }
      break;
    }
    case ModelType::kQwen2: {
      ECHOKV_ASSIGN_OR_RETURN(bool use_window, f.OptionalBool("use_sliding_window", false));
      if (use_window) {
        ECHOKV_ASSIGN_OR_RETURN(std::optional<int64_t> window, f.OptionalInt("sliding_window"));
        if (!window.has_value()) {
          return f.Error("sliding_window", "is missing while use_sliding_window is true");
        }
        if (*window <= 0) {
          return f.Error("sliding_window", absl::StrCat("must be positive, got ", *window));
        }
        ECHOKV_ASSIGN_OR_RETURN(std::optional<int64_t> max_window_layers,
                                f.OptionalInt("max_window_layers"));
        int64_t first = max_window_layers.value_or(kQwen2DefaultMaxWindowLayers);
        if (first < 0) {
          return f.Error("max_window_layers", absl::StrCat("must be >= 0, got ", first));
        }
        // HF: layers with index >= max_window_layers use the window.
        if (first < cfg.num_layers) {
          cfg.sliding_window = static_cast<int>(*window);
          cfg.sliding_window_first_layer = static_cast<int>(first);
        }
      }
      break;
    }
  }

  ECHOKV_ASSIGN_OR_RETURN(std::optional<std::string> dtype, f.OptionalString("torch_dtype"));
  if (!dtype.has_value()) {
    const Json* d = f.Get("dtype");  // newer transformers write "dtype"
    if (d != nullptr && d->is_string()) dtype = d->get<std::string>();
  }
  cfg.torch_dtype = dtype.value_or("");

  ECHOKV_RETURN_IF_ERROR(SingleBos(f, &cfg.bos_token_id));
  std::vector<int> eos;
  ECHOKV_RETURN_IF_ERROR(f.TokenIds("eos_token_id", &eos));
  AppendUnique(eos, &cfg.eos_token_ids);

  if (!generation_config_json.empty()) {
    ECHOKV_ASSIGN_OR_RETURN(Json g, ParseObject(generation_config_json, "generation_config.json"));
    const Fields gf(g, "generation_config.json");
    // generation_config.json's bos is what generation uses; it wins when present.
    ECHOKV_RETURN_IF_ERROR(SingleBos(gf, &cfg.bos_token_id));
    std::vector<int> gen_eos;
    ECHOKV_RETURN_IF_ERROR(gf.TokenIds("eos_token_id", &gen_eos));
    AppendUnique(gen_eos, &cfg.eos_token_ids);
  }

  ECHOKV_RETURN_IF_ERROR(cfg.Validate());
  return cfg;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  if (!FileExists(config_path)) {
    return absl::NotFoundError(absl::StrCat("model config not found: ", config_path));
  }
  ECHOKV_ASSIGN_OR_RETURN(std::string config_text, ReadSmallFile(config_path));
  std::string generation_text;
  const std::string generation_path = dir + "/generation_config.json";
  if (FileExists(generation_path)) {
    ECHOKV_ASSIGN_OR_RETURN(generation_text, ReadSmallFile(generation_path));
  }
  absl::StatusOr<ModelConfig> cfg = ParseModelConfig(config_text, generation_text);
  if (!cfg.ok()) {
    return absl::Status(cfg.status().code(),
                        absl::StrCat(dir, ": ", cfg.status().message()));
  }
  return cfg;
}

}  // namespace echokv::model
