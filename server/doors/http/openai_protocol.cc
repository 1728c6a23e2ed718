#include "server/doors/http/openai_protocol.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/echo.h"

namespace echokv::server::openai {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;  // responses keep OpenAI's field order

const char* TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::binary: return "binary";
    case json::value_t::discarded: return "invalid";
  }
  return "invalid";
}

// Typed access to the fields of one JSON object; the first error wins and names the
// field as `prefix + name`. A field that is absent or null counts as not given (OpenAI
// treats null as "use the default").
class Fields {
 public:
  Fields(const json& object, std::string prefix, HttpError* error)
      : object_(object), prefix_(std::move(prefix)), error_(error) {}

  bool ok() const { return ok_; }
  std::string Path(absl::string_view name) const { return absl::StrCat(prefix_, name); }

  const json* Get(absl::string_view name) const {
    auto it = object_.find(std::string(name));
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  bool Fail(absl::string_view name, const std::string& message, const std::string& code = "invalid_value") {
    if (ok_) *error_ = InvalidParam(Path(name), absl::StrCat(Path(name), ": ", message), code);
    ok_ = false;
    return false;
  }
  bool WrongType(absl::string_view name, const char* expected, const json& v) {
    return Fail(name, absl::StrCat("must be ", expected, ", not ", TypeName(v)), "invalid_type");
  }

  bool String(absl::string_view name, std::string* out) {
    const json* v = Get(name);
    if (v == nullptr) return false;
    if (!v->is_string()) return WrongType(name, "a string", *v);
    *out = v->get<std::string>();
    return true;
  }
  bool Bool(absl::string_view name, bool* out) {
    const json* v = Get(name);
    if (v == nullptr) return false;
    if (!v->is_boolean()) return WrongType(name, "a boolean", *v);
    *out = v->get<bool>();
    return true;
  }
  // Integers only (2.0 is refused, as OpenAI does); [lo, hi].
  bool Int(absl::string_view name, int64_t lo, int64_t hi, int64_t* out) {
    const json* v = Get(name);
    if (v == nullptr) return false;
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(hi) || (lo > 0 && u < static_cast<uint64_t>(lo))) {
        return Fail(name, absl::StrCat("must be in [", lo, ", ", hi, "], not ", u));
      }
      *out = static_cast<int64_t>(u);
      return true;
    }
    if (!v->is_number_integer()) return WrongType(name, "an integer", *v);
    const int64_t i = v->get<int64_t>();
    if (i < lo || i > hi) return Fail(name, absl::StrCat("must be in [", lo, ", ", hi, "], not ", i));
    *out = i;
    return true;
  }
  bool Int(absl::string_view name, int lo, int hi, int* out) {
    int64_t v = 0;
    if (!Int(name, int64_t{lo}, int64_t{hi}, &v)) return false;
    *out = static_cast<int>(v);
    return true;
  }
  // A finite number in [lo, hi] (lo_open: lo excluded).
  bool Number(absl::string_view name, double lo, double hi, bool lo_open, double* out) {
    const json* v = Get(name);
    if (v == nullptr) return false;
    if (!v->is_number()) return WrongType(name, "a number", *v);
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi || (lo_open && d == lo)) {
      return Fail(name, absl::StrCat("must be in ", lo_open ? "(" : "[", lo, ", ", hi, "], not ", d));
    }
    *out = d;
    return true;
  }
  bool Number(absl::string_view name, double lo, double hi, bool lo_open, float* out) {
    double d = 0;
    if (!Number(name, lo, hi, lo_open, &d)) return false;
    *out = static_cast<float>(d);
    return true;
  }
  const json* Object(absl::string_view name) {
    const json* v = Get(name);
    if (v == nullptr) return nullptr;
    if (!v->is_object()) {
      WrongType(name, "an object", *v);
      return nullptr;
    }
    return v;
  }
  const json* Array(absl::string_view name) {
    const json* v = Get(name);
    if (v == nullptr) return nullptr;
    if (!v->is_array()) {
      WrongType(name, "an array", *v);
      return nullptr;
    }
    return v;
  }

 private:
  const json& object_;
  std::string prefix_;
  HttpError* error_;
  bool ok_ = true;
};

bool ParseBody(absl::string_view body, json* out, HttpError* error) {
  try {
    *out = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    // parse_error for malformed text, and out_of_range for a number beyond a double
    // ("1e999": nlohmann throws error 406, not a parse_error): both a 400 naming the body,
    // never an exception into the HTTP library (a 500). Found by tests/fuzz/fuzz_edge.
    // nlohmann quotes the token it last read (a whole 1 MB string): at most a prefix of it.
    absl::string_view what = e.what();
    std::string message = absl::StrCat("the request body is not valid JSON: ", what);
    if (const size_t at = what.find("last read: "); at != absl::string_view::npos) {
      const size_t from = at + 11;
      const size_t to = what.find(';', from);
      const absl::string_view token = what.substr(from, to == absl::string_view::npos ? what.npos : to - from);
      message = absl::StrCat("the request body is not valid JSON: ", what.substr(0, from), EchoPrefix(token),
                             to == absl::string_view::npos ? "" : what.substr(to));
    }
    *error = InvalidParam("", message, "invalid_json");
    error->param.clear();
    return false;
  }
  if (!out->is_object()) {
    *error = InvalidParam("", absl::StrCat("the request body must be a JSON object, not ", TypeName(*out)),
                          "invalid_json");
    return false;
  }
  return true;
}

// OpenAI's `stop`: a string or an array of strings (empty strings refused).
bool ParseStop(Fields& f, std::vector<std::string>* out) {
  const json* v = f.Get("stop");
  if (v == nullptr) return true;
  if (v->is_string()) {
    if (v->get<std::string>().empty()) return f.Fail("stop", "must not be empty");
    out->push_back(v->get<std::string>());
    return true;
  }
  if (!v->is_array()) return f.WrongType("stop", "a string or an array of strings", *v);
  for (size_t i = 0; i < v->size(); ++i) {
    const json& s = (*v)[i];
    const std::string name = absl::StrCat("stop[", i, "]");
    if (!s.is_string()) return f.WrongType(name, "a string", s);
    if (s.get<std::string>().empty()) return f.Fail(name, "must not be empty");
    out->push_back(s.get<std::string>());
  }
  return true;
}

bool ParseEchokv(Fields& f, EchokvOptions* out, HttpError* error) {
  const json* v = f.Object("echokv");
  if (!f.ok()) return false;
  if (v == nullptr) return true;
  Fields e(*v, "echokv.", error);
  std::string s;
  if (e.String("policy", &s)) out->policy = s;
  int i = 0;
  if (e.Int("budget", 1, 1 << 30, &i)) out->budget = i;
  if (e.Int("lookahead", 0, 1 << 20, &i)) out->lookahead = i;
  if (e.Int("workspace", 0, 1 << 30, &i)) out->workspace = i;
  if (e.Int("window", 0, 1 << 30, &i)) out->window = i;
  if (e.String("memory", &s)) out->memory = s;
  if (e.String("cache_dtype", &s)) out->cache_dtype = s;
  double d = 0;
  if (e.Number("target_mass", 0, 1, /*lo_open=*/true, &d)) out->target_mass = d;
  int64_t ttl = 0;
  if (e.Int("ttl_seconds", int64_t{1}, int64_t{1} << 40, &ttl)) out->ttl_seconds = ttl;
  return e.ok();
}

// The fields both APIs share. `chat`: max_completion_tokens and logprobs as a boolean
// exist only there; completions take `logprobs: k`.
bool ParseCommon(const json& body, bool chat, int max_new_tokens, GenerationRequest* out, HttpError* error) {
  Fields f(body, "", error);
  const json* model = f.Get("model");
  if (model == nullptr) return f.Fail("model", "is required (GET /v1/models lists the served model)", "missing");
  if (!model->is_string()) return f.WrongType("model", "a string", *model);
  out->model = model->get<std::string>();

  f.Bool("stream", &out->stream);
  if (const json* so = f.Object("stream_options"); so != nullptr) {
    if (!out->stream) return f.Fail("stream_options", "is only allowed when stream is true");
    Fields s(*so, "stream_options.", error);
    s.Bool("include_usage", &out->include_usage);
    if (!s.ok()) return false;
  }
  int64_t n = 1;
  if (f.Int("n", int64_t{1}, int64_t{1} << 30, &n) && n != 1) {
    return f.Fail("n", absl::StrCat("only n = 1 is supported (one choice per request), not ", n), "unsupported_value");
  }
  int v = 0;
  if (f.Int("max_tokens", 1, max_new_tokens, &v)) {
    out->max_tokens = v;
    out->max_tokens_param = "max_tokens";
  }
  if (chat && f.Int("max_completion_tokens", 1, max_new_tokens, &v)) {
    out->max_tokens = v;
    out->max_tokens_param = "max_completion_tokens";
  }
  model::SamplingParams& sp = out->sampling;
  sp.temperature = 1.0f;  // OpenAI's default; 0 = greedy
  f.Number("temperature", 0, 2, false, &sp.temperature);
  f.Number("top_p", 0, 1, true, &sp.top_p);
  int top_k = 0;
  if (f.Int("top_k", -1, 1 << 30, &top_k)) sp.top_k = top_k < 0 ? 0 : top_k;  // -1 = off (vLLM)
  f.Number("min_p", 0, 1, false, &sp.min_p);
  f.Number("repetition_penalty", 0, 1e6, true, &sp.repetition_penalty);
  f.Number("presence_penalty", -2, 2, false, &sp.presence_penalty);
  f.Number("frequency_penalty", -2, 2, false, &sp.frequency_penalty);
  if (const json* seed = f.Get("seed"); seed != nullptr) {
    if (seed->is_number_unsigned()) {
      out->seed = seed->get<uint64_t>();
    } else if (seed->is_number_integer()) {
      out->seed = static_cast<uint64_t>(seed->get<int64_t>());
    } else {
      return f.WrongType("seed", "an integer", *seed);
    }
  }
  if (!ParseStop(f, &out->stop)) return false;
  if (const json* ids = f.Array("stop_token_ids"); ids != nullptr) {
    for (size_t i = 0; i < ids->size(); ++i) {
      if (!(*ids)[i].is_number_integer()) return f.WrongType(absl::StrCat("stop_token_ids[", i, "]"), "an integer", (*ids)[i]);
      out->stop_token_ids.push_back((*ids)[i].get<int>());
    }
  }
  f.Bool("ignore_eos", &out->ignore_eos);
  f.String("session_id", &out->session_id);
  if (const json* lb = f.Object("logit_bias"); lb != nullptr && !lb->empty()) {
    return f.Fail("logit_bias", "is not supported", "unsupported_parameter");
  }
  if (!f.ok()) return false;
  return ParseEchokv(f, &out->echokv, error);
}

// A message's content: a string, or an array of {type: "text", text} parts (joined
// with "\n", as vLLM does). null is allowed for assistant messages ("").
bool ParseContent(Fields& m, const std::string& role, std::string* out) {
  const json* c = m.Get("content");
  if (c == nullptr) {
    if (role == "assistant") return true;
    return m.Fail("content", "is required");
  }
  if (c->is_string()) {
    *out = c->get<std::string>();
    return true;
  }
  if (!c->is_array()) return m.WrongType("content", "a string or an array of content parts", *c);
  std::vector<std::string> texts;
  for (size_t j = 0; j < c->size(); ++j) {
    const json& part = (*c)[j];
    const std::string name = absl::StrCat("content[", j, "]");
    if (!part.is_object()) return m.WrongType(name, "an object", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) return m.Fail(absl::StrCat(name, ".type"), "must be a string");
    if (type->get<std::string>() != "text") {
      return m.Fail(absl::StrCat(name, ".type"),
                    absl::StrCat("only \"text\" content parts are supported, not ", EchoPrefix(type->get<std::string>())),
                    "unsupported_value");
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) return m.Fail(absl::StrCat(name, ".text"), "must be a string");
    texts.push_back(text->get<std::string>());
  }
  *out = absl::StrJoin(texts, "\n");
  return true;
}

bool ParseMessages(const json& body, std::vector<model::ChatMessage>* out, HttpError* error) {
  Fields f(body, "", error);
  const json* msgs = f.Get("messages");
  if (msgs == nullptr) return f.Fail("messages", "is required", "missing");
  if (!msgs->is_array()) return f.WrongType("messages", "an array", *msgs);
  if (msgs->empty()) return f.Fail("messages", "must not be empty");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& msg = (*msgs)[i];
    const std::string prefix = absl::StrCat("messages[", i, "].");
    if (!msg.is_object()) return f.WrongType(absl::StrCat("messages[", i, "]"), "an object", msg);
    Fields m(msg, prefix, error);
    std::string role;
    const json* r = m.Get("role");
    if (r == nullptr) return m.Fail("role", "is required", "missing");
    if (!r->is_string()) return m.WrongType("role", "a string", *r);
    role = r->get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (role == "tool" || role == "function") {
      return m.Fail("role", absl::StrCat(EchoPrefix(role), " messages are not supported (no tool calling yet)"),
                    "unsupported_value");
    }
    if (role != "system" && role != "user" && role != "assistant") {
      return m.Fail("role", absl::StrCat("must be one of system, developer, user, assistant; not ", EchoPrefix(role)));
    }
    if (const json* calls = m.Get("tool_calls"); calls != nullptr && !(calls->is_array() && calls->empty())) {
      return m.Fail("tool_calls", "is not supported (no tool calling yet)", "unsupported_parameter");
    }
    model::ChatMessage cm;
    cm.role = role;
    if (!ParseContent(m, role, &cm.content)) return false;
    out->push_back(std::move(cm));
  }
  return true;
}

std::string RandomHex(int digits) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string s;
  static const char* kHex = "0123456789abcdef";
  for (int i = 0; i < digits; ++i) s.push_back(kHex[rng() & 15]);
  return s;
}

// GPT-2's byte -> unicode map, inverted: code point -> byte (-1: not a byte char).
int ByteOfCodepoint(uint32_t cp) {
  static const std::vector<int> table = [] {
    std::vector<int> t(512, -1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      if (printable) {
        t[b] = b;
      } else {
        t[256 + n] = b;
        ++n;
      }
    }
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

// Decodes one UTF-8 code point at s[*i]; false on malformed input.
bool NextCodepoint(const std::string& s, size_t* i, uint32_t* cp) {
  const unsigned char c = static_cast<unsigned char>(s[*i]);
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || *i + len > s.size()) return false;
  uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < len; ++k) {
    const unsigned char cc = static_cast<unsigned char>(s[*i + k]);
    if ((cc >> 6) != 2) return false;
    v = (v << 6) | (cc & 0x3F);
  }
  *i += len;
  *cp = v;
  return true;
}

bool IsValidUtf8(const std::string& s) {
  size_t i = 0;
  uint32_t cp = 0;
  while (i < s.size()) {
    if (!NextCodepoint(s, &i, &cp)) return false;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
  }
  return true;
}

// Characters (code points; a stray byte counts as one) in s.
int64_t CharCount(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

bool ParseChatRequest(absl::string_view body, ChatRequest* out, HttpError* error, int max_new_tokens) {
  json j;
  if (!ParseBody(body, &j, error)) return false;
  if (!ParseCommon(j, /*chat=*/true, max_new_tokens, &out->gen, error)) return false;
  if (!ParseMessages(j, &out->messages, error)) return false;
  Fields f(j, "", error);
  bool logprobs = false;
  f.Bool("logprobs", &logprobs);
  int top = 0;
  const bool has_top = f.Int("top_logprobs", 0, 20, &top);
  if (!f.ok()) return false;
  if (has_top && !logprobs) return f.Fail("top_logprobs", "requires logprobs: true");
  out->gen.sampling.logprobs = logprobs;
  out->gen.sampling.top_logprobs = top;
  f.Bool("add_generation_prompt", &out->add_generation_prompt);
  if (const json* tools = f.Array("tools"); tools != nullptr && !tools->empty()) {
    return f.Fail("tools", "tool calling is not supported yet", "unsupported_parameter");
  }
  if (const json* tc = f.Get("tool_choice"); tc != nullptr && !(tc->is_string() && (*tc == "none" || *tc == "auto"))) {
    return f.Fail("tool_choice", "tool calling is not supported yet", "unsupported_parameter");
  }
  if (const json* rf = f.Object("response_format"); rf != nullptr) {
    auto type = rf->find("type");
    if (type == rf->end() || !type->is_string()) return f.Fail("response_format.type", "must be a string");
    if (*type != "text") {
      return f.Fail("response_format.type",
                    absl::StrCat("only \"text\" is supported, not ", EchoPrefix(type->get<std::string>())),
                    "unsupported_value");
    }
  }
  return f.ok();
}

bool ParseCompletionRequest(absl::string_view body, CompletionRequest* out, HttpError* error, int max_new_tokens) {
  json j;
  if (!ParseBody(body, &j, error)) return false;
  if (!ParseCommon(j, /*chat=*/false, max_new_tokens, &out->gen, error)) return false;
  Fields f(j, "", error);
  const json* p = f.Get("prompt");
  if (p == nullptr) return f.Fail("prompt", "is required", "missing");
  // A string or token ids [int...] (one prompt), or a list of them ([string...],
  // [[int...]...]: one choice per prompt, as OpenAI does).
  auto token_ids = [&f](const json& arr, const std::string& name, CompletionPrompt* out) {
    out->tokens = true;
    for (size_t i = 0; i < arr.size(); ++i) {
      const json& t = arr[i];
      const std::string at = absl::StrCat(name, "[", i, "]");
      if (!t.is_number_integer()) return f.WrongType(at, "an integer (token id)", t);
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id > INT32_MAX) return f.Fail(at, "is not a token id");
      out->ids.push_back(static_cast<int>(id));
    }
    return true;
  };
  if (p->is_string()) {
    out->prompts.push_back(CompletionPrompt{false, p->get<std::string>(), {}});
  } else if (!p->is_array()) {
    return f.WrongType("prompt", "a string, an array of token ids, or an array of these", *p);
  } else if (p->empty()) {
    return f.Fail("prompt", "must not be empty");
  } else if ((*p)[0].is_number()) {
    CompletionPrompt one;
    if (!token_ids(*p, "prompt", &one)) return false;
    out->prompts.push_back(std::move(one));
  } else {
    if (p->size() > static_cast<size_t>(kMaxPrompts)) {
      return f.Fail("prompt", absl::StrCat("at most ", kMaxPrompts, " prompts per request, not ", p->size()),
                    "too_many_prompts");
    }
    for (size_t i = 0; i < p->size(); ++i) {
      const json& e = (*p)[i];
      const std::string name = absl::StrCat("prompt[", i, "]");
      CompletionPrompt one;
      if (e.is_string()) {
        one.text = e.get<std::string>();
      } else if (e.is_array() && !e.empty()) {
        if (!token_ids(e, name, &one)) return false;
      } else if (e.is_array()) {
        return f.Fail(name, "must not be empty");
      } else {
        return f.WrongType(name, "a string or an array of token ids", e);
      }
      out->prompts.push_back(std::move(one));
    }
  }
  out->token_prompt = out->prompts[0].tokens;
  out->text = out->prompts[0].text;
  out->tokens = out->prompts[0].ids;
  int logprobs = 0;
  if (f.Int("logprobs", 0, 20, &logprobs)) {
    out->gen.sampling.logprobs = true;
    out->gen.sampling.top_logprobs = logprobs;
  }
  bool echo = false;
  if (f.Bool("echo", &echo) && echo) return f.Fail("echo", "true is not supported", "unsupported_value");
  std::string suffix;
  if (f.String("suffix", &suffix) && !suffix.empty()) return f.Fail("suffix", "is not supported", "unsupported_parameter");
  int64_t best_of = 1;
  if (f.Int("best_of", int64_t{1}, int64_t{1} << 30, &best_of) && best_of != 1) {
    return f.Fail("best_of", "only best_of = 1 is supported", "unsupported_value");
  }
  return f.ok();
}

bool ResolveSession(const std::string& body_id, const std::string& header_id, SessionRef* out, HttpError* error) {
  if (!body_id.empty() && !header_id.empty() && body_id != header_id) {
    *error = InvalidParam("session_id", absl::StrCat("session_id ", EchoPrefix(body_id), " and the x-echokv-session header ",
                                                     EchoPrefix(header_id), " differ; send one"));
    return false;
  }
  const std::string& id = body_id.empty() ? header_id : body_id;
  if (id.empty()) {
    out->mode = SessionRef::Mode::kStateless;
  } else if (absl::AsciiStrToLower(id) == "new") {
    out->mode = SessionRef::Mode::kNew;
  } else {
    out->mode = SessionRef::Mode::kContinue;
    out->id = id;
  }
  return true;
}

// ---- TokenTable ----

TokenTable::TokenTable(const model::Tokenizer& tokenizer) {
  const int v = tokenizer.vocab_size();
  std::vector<std::string> pieces(v);
  std::vector<bool> special(v);
  for (int id = 0; id < v; ++id) {
    pieces[id] = tokenizer.IdToPiece(id);
    special[id] = tokenizer.IsSpecial(id);
  }
  Build(pieces, special, tokenizer.kind());
}

TokenTable::TokenTable(const std::vector<std::string>& pieces, const std::vector<bool>& special,
                       absl::string_view kind) {
  Build(pieces, special, kind);
}

void TokenTable::Build(const std::vector<std::string>& pieces, const std::vector<bool>& special,
                       absl::string_view kind) {
  bytes_.resize(pieces.size());
  const bool bpe = kind == "bpe";
  for (size_t id = 0; id < pieces.size(); ++id) {
    const std::string& p = pieces[id];
    std::string& out = bytes_[id];
    if (special[id]) {
      out = p;
      continue;
    }
    if (!bpe) {
      unsigned int byte = 0;
      if (p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>' && std::sscanf(p.c_str() + 3, "%2x", &byte) == 1) {
        out.push_back(static_cast<char>(byte));
        continue;
      }
      static const std::string kSpace = "\xE2\x96\x81";  // U+2581
      for (size_t i = 0; i < p.size();) {
        if (p.compare(i, kSpace.size(), kSpace) == 0) {
          out.push_back(' ');
          i += kSpace.size();
        } else {
          out.push_back(p[i++]);
        }
      }
      continue;
    }
    // Byte-level BPE: every code point stands for one byte; a piece with any other
    // code point is an added token stored as plain text.
    std::string decoded;
    bool byte_level = true;
    for (size_t i = 0; i < p.size();) {
      uint32_t cp = 0;
      const int b = NextCodepoint(p, &i, &cp) ? ByteOfCodepoint(cp) : -1;
      if (b < 0) {
        byte_level = false;
        break;
      }
      decoded.push_back(static_cast<char>(b));
    }
    out = byte_level ? decoded : p;
  }
}

const std::string& TokenTable::Bytes(int id) const {
  static const std::string kEmpty;
  return id >= 0 && static_cast<size_t>(id) < bytes_.size() ? bytes_[id] : kEmpty;
}

std::string TokenTable::Display(int id) const {
  const std::string& b = Bytes(id);
  if (IsValidUtf8(b)) return b;
  std::string s = "bytes:";
  for (unsigned char c : b) absl::StrAppend(&s, "\\x", absl::Hex(c, absl::kZeroPad2));
  return s;
}

// ---- responses ----

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength: return "length";
    case FinishReason::kEos:
    case FinishReason::kStopToken:
    case FinishReason::kStopString: return "stop";
  }
  return "stop";
}

double WireLogprob(float logprob) {
  if (std::isnan(logprob) || std::isinf(logprob)) return -9999.0;
  return static_cast<double>(logprob);
}

std::string Dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string Dump(const ojson& value) { return value.dump(-1, ' ', false, ojson::error_handler_t::replace); }

std::string SseEvent(const std::string& json_text) { return absl::StrCat("data: ", json_text, "\n\n"); }

std::string NewResponseId(ApiKind kind) {
  return absl::StrCat(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-", RandomHex(24));
}

ResponseBuilder::ResponseBuilder(ApiKind kind, std::string id, int64_t created, std::string model,
                                 const TokenTable* tokens)
    : kind_(kind), id_(std::move(id)), created_(created), model_(std::move(model)), tokens_(tokens) {}

ojson ResponseBuilder::Envelope(const char* object) const {
  ojson j = ojson::object();
  j["id"] = id_;
  j["object"] = object;
  j["created"] = created_;
  j["model"] = model_;
  if (!session_id_.empty()) j["session_id"] = session_id_;
  return j;
}

ojson ResponseBuilder::Logprobs(const std::vector<model::SampledToken>& toks) {
  if (kind_ == ApiKind::kChat) {
    ojson content = ojson::array();
    auto entry = [this](int id, float lp) {
      const std::string& b = tokens_->Bytes(id);
      ojson bytes = ojson::array();
      for (unsigned char c : b) bytes.push_back(static_cast<int>(c));
      return ojson{{"token", tokens_->Display(id)}, {"logprob", WireLogprob(lp)}, {"bytes", std::move(bytes)}};
    };
    for (const model::SampledToken& t : toks) {
      ojson e = entry(t.token, t.logprob);
      ojson top = ojson::array();
      for (const model::TokenLogprob& alt : t.top_logprobs) top.push_back(entry(alt.token, alt.logprob));
      e["top_logprobs"] = std::move(top);
      content.push_back(std::move(e));
    }
    return ojson{{"content", std::move(content)}, {"refusal", nullptr}};
  }
  // Legacy completions shape: parallel arrays; top_logprobs as {token: logprob}.
  ojson tokens = ojson::array(), token_logprobs = ojson::array(), top = ojson::array(), offsets = ojson::array();
  for (const model::SampledToken& t : toks) {
    tokens.push_back(tokens_->Display(t.token));
    token_logprobs.push_back(WireLogprob(t.logprob));
    ojson alts = ojson::object();
    for (const model::TokenLogprob& alt : t.top_logprobs) alts[tokens_->Display(alt.token)] = WireLogprob(alt.logprob);
    top.push_back(std::move(alts));
    offsets.push_back(text_offset_);
    text_offset_ += CharCount(tokens_->Bytes(t.token));
  }
  return ojson{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top)},
              {"text_offset", std::move(offsets)}};
}

std::string ResponseBuilder::FirstChunk() const {
  if (kind_ != ApiKind::kChat) return "";
  ojson j = Envelope("chat.completion.chunk");
  j["choices"] = ojson::array(
      {ojson{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
  if (include_usage_) j["usage"] = nullptr;
  return Dump(j);
}

std::string ResponseBuilder::DeltaChunk(const GenerateDelta& delta) {
  const ojson lp = logprobs_ ? Logprobs(delta.logprobs) : ojson(nullptr);
  ojson j;
  if (kind_ == ApiKind::kChat) {
    j = Envelope("chat.completion.chunk");
    j["choices"] = ojson::array(
        {ojson{{"index", 0}, {"delta", {{"content", delta.text}}}, {"logprobs", lp}, {"finish_reason", nullptr}}});
  } else {
    j = Envelope("text_completion");
    j["choices"] = ojson::array({ojson{{"index", 0}, {"text", delta.text}, {"logprobs", lp}, {"finish_reason", nullptr}}});
  }
  if (include_usage_) j["usage"] = nullptr;
  return Dump(j);
}

std::string ResponseBuilder::FinishChunk(FinishReason reason) const {
  ojson j;
  if (kind_ == ApiKind::kChat) {
    j = Envelope("chat.completion.chunk");
    j["choices"] = ojson::array({ojson{{"index", 0},
                                     {"delta", ojson::object()},
                                     {"logprobs", nullptr},
                                     {"finish_reason", FinishReasonName(reason)}}});
  } else {
    j = Envelope("text_completion");
    j["choices"] = ojson::array(
        {ojson{{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", FinishReasonName(reason)}}});
  }
  if (include_usage_) j["usage"] = nullptr;
  return Dump(j);
}

namespace {
ojson UsageJson(const Usage& u) {
  return ojson{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}
}  // namespace

std::string ResponseBuilder::UsageChunk(const Usage& usage) const {
  ojson j = Envelope(kind_ == ApiKind::kChat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = ojson::array();
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string ResponseBuilder::Full(const std::string& text, const std::vector<model::SampledToken>& logprobs,
                                  FinishReason reason, const Usage& usage) {
  const ojson lp = logprobs_ ? Logprobs(logprobs) : ojson(nullptr);
  ojson j;
  if (kind_ == ApiKind::kChat) {
    j = Envelope("chat.completion");
    j["choices"] = ojson::array({ojson{{"index", 0},
                                     {"message", {{"role", "assistant"}, {"content", text}, {"refusal", nullptr}}},
                                     {"logprobs", lp},
                                     {"finish_reason", FinishReasonName(reason)}}});
  } else {
    j = Envelope("text_completion");
    j["choices"] =
        ojson::array({ojson{{"index", 0}, {"text", text}, {"logprobs", lp}, {"finish_reason", FinishReasonName(reason)}}});
  }
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

}  // namespace echokv::server::openai
