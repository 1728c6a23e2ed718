#include "client/cli_util.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace echokv::client {
namespace {

using echokv::v1::CompressionConfig;
using echokv::v1::CompressionReport;
using echokv::v1::Session;

absl::StatusOr<int32_t> ToInt32(int64_t value, absl::string_view flag) {
  if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", value, " does not fit a 32-bit integer"));
  }
  return static_cast<int32_t>(value);
}

std::string Percent(double fraction) { return absl::StrFormat("%.1f%%", 100.0 * fraction); }

// "0.734" or "n/a" for the report's -1 sentinel.
std::string Overlap(double value) {
  return value < 0 ? std::string("n/a") : absl::StrFormat("%.3f", value);
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

std::string DescribeStatus(const absl::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string reason = std::strerror(err);
    if (err == EACCES) {
      return absl::PermissionDeniedError(absl::StrCat("cannot read ", path, ": ", reason));
    }
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", reason));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return buffer.str();
}

absl::StatusOr<std::vector<int32_t>> ParseIdList(absl::string_view text) {
  std::vector<int32_t> ids;
  int index = 0;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    piece = absl::StripAsciiWhitespace(piece);
    int64_t value = 0;
    if (piece.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--ids: entry ", index, " is empty"));
    }
    if (!absl::SimpleAtoi(piece, &value) || value < 0 ||
        value > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ids: entry ", index, " ('", piece, "') is not a token id (an integer in [0, 2^31))"));
    }
    ids.push_back(static_cast<int32_t>(value));
    ++index;
  }
  return ids;
}

absl::StatusOr<echokv::v1::ChatMessages> ParseChatJson(absl::string_view json,
                                                       absl::string_view source) {
  nlohmann::json doc = nlohmann::json::parse(json.begin(), json.end(), /*cb=*/nullptr,
                                             /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  }
  if (doc.is_object() && doc.contains("messages")) doc = doc["messages"];
  if (!doc.is_array() || doc.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": expected a non-empty array of {\"role\": ..., \"content\": ...} objects"));
  }
  echokv::v1::ChatMessages messages;
  for (size_t i = 0; i < doc.size(); ++i) {
    const nlohmann::json& entry = doc[i];
    if (!entry.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": entry ", i, " is not an object"));
    }
    for (const char* key : {"role", "content"}) {
      if (!entry.contains(key) || !entry[key].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": entry ", i, " lacks a string \"", key, "\""));
      }
    }
    echokv::v1::ChatMessage* message = messages.add_messages();
    message->set_role(entry["role"].get<std::string>());
    message->set_content(entry["content"].get<std::string>());
  }
  return messages;
}

absl::StatusOr<echokv::v1::Input> BuildInput(const InputSpec& spec) {
  const int sources = spec.text.has_value() + spec.file.has_value() +
                      spec.chat_file.has_value() + spec.ids.has_value();
  if (sources != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "give exactly one input: --text, --file, --chat or --ids (got ", sources, ")"));
  }
  echokv::v1::Input input;
  if (spec.text.has_value()) {
    input.set_text(*spec.text);
  } else if (spec.file.has_value()) {
    absl::StatusOr<std::string> text = ReadFileToString(*spec.file);
    if (!text.ok()) return text.status();
    input.set_text(*std::move(text));
  } else if (spec.chat_file.has_value()) {
    absl::StatusOr<std::string> json = ReadFileToString(*spec.chat_file);
    if (!json.ok()) return json.status();
    absl::StatusOr<echokv::v1::ChatMessages> chat =
        ParseChatJson(*json, absl::StrCat("--chat ", *spec.chat_file));
    if (!chat.ok()) return chat.status();
    *input.mutable_chat() = *std::move(chat);
  } else {
    absl::StatusOr<std::vector<int32_t>> ids = ParseIdList(*spec.ids);
    if (!ids.ok()) return ids.status();
    for (int32_t id : *ids) input.mutable_tokens()->add_ids(id);
  }
  if (spec.add_special_tokens.has_value()) {
    input.set_add_special_tokens(*spec.add_special_tokens);
  }
  return input;
}

absl::StatusOr<CompressionConfig> BuildCompression(const CompressionFlags& flags) {
  CompressionConfig config;
  if (flags.policy.has_value()) config.set_policy(*flags.policy);
  struct IntField {
    const std::optional<int64_t>& value;
    const char* flag;
    void (CompressionConfig::*set)(int32_t);
  };
  for (const IntField& field : {IntField{flags.budget, "budget", &CompressionConfig::set_budget},
                                IntField{flags.lookahead, "lookahead", &CompressionConfig::set_lookahead},
                                IntField{flags.workspace, "workspace", &CompressionConfig::set_workspace},
                                IntField{flags.window, "window", &CompressionConfig::set_window}}) {
    if (!field.value.has_value()) continue;
    absl::StatusOr<int32_t> v = ToInt32(*field.value, field.flag);
    if (!v.ok()) return v.status();
    (config.*field.set)(*v);
  }
  if (flags.bootstrap.has_value()) config.set_bootstrap(*flags.bootstrap);
  if (flags.repair.has_value()) config.set_repair(*flags.repair);
  if (flags.cache_dtype.has_value()) config.set_cache_dtype(*flags.cache_dtype);
  if (flags.target_mass.has_value()) config.set_target_mass(*flags.target_mass);
  return config;
}

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024 && bytes > -1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes);
  int unit = -1;
  while ((value >= 1024.0 || value <= -1024.0) && unit < 3) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", value, units[unit]);
}

std::string FormatCompression(const CompressionConfig& c) {
  std::vector<std::string> parts;
  if (c.has_policy()) parts.push_back(absl::StrCat("policy=", c.policy()));
  if (c.has_budget()) parts.push_back(absl::StrCat("budget=", c.budget()));
  if (c.has_lookahead()) parts.push_back(absl::StrCat("lookahead=", c.lookahead()));
  if (c.has_workspace()) parts.push_back(absl::StrCat("workspace=", c.workspace()));
  if (c.has_window()) parts.push_back(absl::StrCat("window=", c.window()));
  if (c.has_bootstrap()) parts.push_back(absl::StrCat("bootstrap=", c.bootstrap()));
  if (c.has_repair()) parts.push_back(absl::StrCat("repair=", c.repair() ? "true" : "false"));
  if (c.has_snapkv_window()) parts.push_back(absl::StrCat("snapkv_window=", c.snapkv_window()));
  if (c.has_snapkv_kernel()) parts.push_back(absl::StrCat("snapkv_kernel=", c.snapkv_kernel()));
  if (c.has_cache_dtype()) parts.push_back(absl::StrCat("cache_dtype=", c.cache_dtype()));
  if (c.has_target_mass()) parts.push_back(absl::StrCat("target_mass=", c.target_mass()));
  return parts.empty() ? std::string("(server defaults)") : absl::StrJoin(parts, " ");
}

std::string FormatServerInfo(const echokv::v1::ServerInfo& info) {
  const echokv::v1::ModelInfo& m = info.model();
  const echokv::v1::Limits& l = info.limits();
  std::string out;
  absl::StrAppend(&out, "echokv-server ", info.version(), " on ", info.device(), " (",
                  info.dtype(), ")\n");
  absl::StrAppend(&out, "model        ", m.path(), " (", m.model_type(), "): ", m.num_layers(),
                  " layers, ", m.num_heads(), " heads, ", m.num_kv_heads(), " KV heads, head dim ",
                  m.head_dim(), ", hidden ", m.hidden_size(), "\n");
  absl::StrAppend(&out, "vocab        ", m.vocab_size(), " (", m.tokenizer(), "), max context ",
                  m.max_context(), ", chat template ", m.chat_template() ? "yes" : "no", "\n");
  absl::StrAppend(&out, "KV per token ", FormatBytes(m.kv_bytes_per_token()), " (full cache)\n");
  absl::StrAppend(&out, "policies     ", absl::StrJoin(info.policies(), ", "), "\n");
  absl::StrAppend(&out, "defaults     ", FormatCompression(info.default_compression()), "\n");
  absl::StrAppend(&out, "limits       max_context_tokens=", l.max_context_tokens(),
                  " max_new_tokens=", l.max_new_tokens(), " max_sessions=", l.max_sessions(),
                  " max_kv_bytes=", l.max_kv_bytes(), " (", FormatBytes(l.max_kv_bytes()), ")\n");
  absl::StrAppend(&out, "             session_ttl=", l.session_ttl_seconds(),
                  "s max_session_ttl=", l.max_session_ttl_seconds(),
                  "s max_concurrent_streams=", l.max_concurrent_streams(),
                  " max_request_bytes=", l.max_request_bytes(), "\n");
  absl::StrAppend(&out, "sessions     ", info.live_sessions(), " live, ",
                  FormatBytes(info.live_retained_kv_bytes()), " retained\n");
  return out;
}

std::string FormatSession(const Session& s) {
  std::string out;
  absl::StrAppend(&out, "session      ", s.id(), s.busy() ? " (busy)" : "", "\n");
  absl::StrAppend(&out, "tokens seen  ", s.tokens_seen(), "\n");
  absl::StrAppend(&out, "retained     ", s.retained_entries(), " entries (all layers and groups)\n");
  absl::StrAppend(&out, "KV memory    ", FormatBytes(s.retained_kv_bytes()), " retained of ",
                  FormatBytes(s.full_kv_bytes()), " full-equivalent; saved ",
                  FormatBytes(s.bytes_saved()), " (ratio ",
                  absl::StrFormat("%.4f", s.compression_ratio()), ")\n");
  absl::StrAppend(&out, "compression  ", FormatCompression(s.compression()), "\n");
  absl::StrAppend(&out, "idle TTL     ", s.ttl_seconds(), " s\n");
  return out;
}

std::string FormatReport(const CompressionReport& r) {
  std::string out;
  absl::StrAppend(&out, "last compression: ", FormatCompression(r.config()), "\n");
  absl::StrAppend(&out, "  context ", r.context_tokens(), " tokens; kept ", r.retained_entries(),
                  " of ", r.total_entries(), " entries",
                  r.evicted() ? "" : " (nothing evicted: context within budget)", "\n");
  absl::StrAppend(&out, "  KV bytes ", FormatBytes(r.retained_kv_bytes()), " of ",
                  FormatBytes(r.full_kv_bytes()), "\n");
  std::vector<std::string> phases;
  for (const echokv::v1::PhaseTime& p : r.phases()) {
    phases.push_back(absl::StrFormat("%s %.1f ms", p.phase(), 1e3 * p.seconds()));
  }
  absl::StrAppend(&out, "  phases ", phases.empty() ? "-" : absl::StrJoin(phases, ", "),
                  absl::StrFormat("; total %.1f ms, lookahead %.1f ms\n", 1e3 * r.total_seconds(),
                                  1e3 * r.lookahead_seconds()));
  absl::StrAppend(&out, "  forward passes ", r.forward_passes(), ", scoring passes ",
                  r.scoring_passes(), "\n");
  absl::StrAppend(&out, "  overlap W1/W2 ", Overlap(r.overlap_w1_w2()), ", W1/final ",
                  Overlap(r.overlap_w1_final()), ", W2/final ", Overlap(r.overlap_w2_final()),
                  "\n");
  // The fidelity signal: the share of the probe queries' attention on the kept entries.
  absl::StrAppend(&out, "  attention mass kept ",
                  r.retained_mass_mean() < 0
                      ? std::string("- (not measured)")
                      : absl::StrFormat("mean %.3f, min %.3f over %d layer x group values", r.retained_mass_mean(),
                                        r.retained_mass_min(), r.retained_mass_size()),
                  "\n");
  return out;
}

std::string FormatInspect(const echokv::v1::InspectCacheResponse& response, bool positions) {
  std::string out = FormatSession(response.session());
  absl::StrAppend(&out, "\n", absl::StrFormat("%5s %5s %10s %12s\n", "layer", "group",
                                              "retained", "KV bytes"));
  for (const echokv::v1::LayerCache& layer : response.layers()) {
    for (const echokv::v1::KvGroupCache& group : layer.groups()) {
      absl::StrAppend(&out, absl::StrFormat("%5d %5d %10d %12s\n", layer.layer(), group.group(),
                                            group.retained(), FormatBytes(group.kv_bytes())));
      if (positions) {
        absl::StrAppend(&out, "            positions: ",
                        group.positions().empty() ? "(none)" : absl::StrJoin(group.positions(), " "),
                        "\n");
      }
    }
    if (layer.groups_size() > 1) {
      absl::StrAppend(&out, absl::StrFormat("%5d %5s %10s %12s\n", layer.layer(), "all",
                                            absl::StrCat(layer.retained(), "/group"),
                                            FormatBytes(layer.kv_bytes())));
    }
  }
  const int64_t full = response.full_equivalent_kv_bytes();
  absl::StrAppend(&out, absl::StrFormat("%11s %10d %12s\n", "total", response.total_retained_entries(),
                                        FormatBytes(response.total_kv_bytes())));
  absl::StrAppend(&out, "\nKV bytes retained ", FormatBytes(response.total_kv_bytes()), " of ",
                  FormatBytes(full), " full-equivalent",
                  full > 0 ? absl::StrCat(" (",
                                          Percent(static_cast<double>(response.total_kv_bytes()) /
                                                  static_cast<double>(full)),
                                          ")")
                           : std::string(),
                  "; position bookkeeping ", FormatBytes(response.position_bytes()), "\n\n");
  absl::StrAppend(&out, FormatReport(response.last_report()));
  return out;
}

std::string FormatSessionList(const echokv::v1::ListSessionsResponse& response) {
  if (response.sessions().empty()) return "no sessions\n";
  std::string out = absl::StrFormat("%-32s %8s %9s %12s %12s %7s %6s\n", "session", "tokens",
                                    "retained", "KV bytes", "full bytes", "ratio", "busy");
  for (const Session& s : response.sessions()) {
    absl::StrAppend(&out, absl::StrFormat("%-32s %8d %9d %12s %12s %7.4f %6s\n", s.id(),
                                          s.tokens_seen(), s.retained_entries(),
                                          FormatBytes(s.retained_kv_bytes()),
                                          FormatBytes(s.full_kv_bytes()), s.compression_ratio(),
                                          s.busy() ? "yes" : "no"));
  }
  return out;
}

ProgressBar::ProgressBar(FILE* out, bool interactive) : out_(out), interactive_(interactive) {}

void ProgressBar::Update(const echokv::v1::SessionProgress::Progress& p) {
  const bool new_phase = p.phase() != phase_;
  const double fraction =
      p.total() > 0 ? std::clamp(static_cast<double>(p.done()) / p.total(), 0.0, 1.0) : 0.0;
  if (interactive_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar(filled, '#');
    bar.resize(kWidth, '.');
    std::fprintf(out_, "\r%-10s [%s] %6lld/%-6lld %5.1fs", p.phase().c_str(), bar.c_str(),
                 static_cast<long long>(p.done()), static_cast<long long>(p.total()),
                 p.elapsed_seconds());
    line_open_ = true;
  } else {
    const int quarter = static_cast<int>(fraction * 4);
    // Short phases (lookahead rounds: a few steps) get one line; long ones one per 25 %.
    if (new_phase || (p.total() >= 16 && quarter > last_quarter_)) {
      std::fprintf(out_, "progress: %s %lld/%lld (%.0f%%) at %.2fs\n", p.phase().c_str(),
                   static_cast<long long>(p.done()), static_cast<long long>(p.total()),
                   100.0 * fraction, p.elapsed_seconds());
      last_quarter_ = quarter;
    }
  }
  if (new_phase) {
    phase_ = p.phase();
    if (!interactive_) last_quarter_ = static_cast<int>(fraction * 4);
  }
  std::fflush(out_);
}

void ProgressBar::Finish() {
  if (line_open_) std::fputc('\n', out_);
  line_open_ = false;
  std::fflush(out_);
}

absl::StatusOr<std::string> CheckHealth(const std::shared_ptr<grpc::ChannelInterface>& channel,
                                        const std::string& service, absl::Duration timeout) {
  std::unique_ptr<grpc::health::v1::Health::Stub> stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
}

absl::StatusOr<Credentials> LoadCredentials(const CredentialFlags& flags, const char* env_token) {
  Credentials c;
  if (flags.token.has_value() && flags.token_file.has_value()) {
    return absl::InvalidArgumentError("--token and --token_file: give one of them");
  }
  if (flags.token.has_value()) {
    c.bearer = *flags.token;
    if (c.bearer.empty()) return absl::InvalidArgumentError("--token: empty");
  } else if (flags.token_file.has_value()) {
    absl::StatusOr<std::string> text = ReadFileToString(*flags.token_file);
    if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("--token_file: ", text.status().message()));
    c.bearer = std::string(absl::StripAsciiWhitespace(*text));
    if (c.bearer.empty()) return absl::InvalidArgumentError(absl::StrCat("--token_file: ", *flags.token_file, " is empty"));
  } else if (env_token != nullptr) {
    c.bearer = env_token;
  }
  if (flags.tls_cert.has_value() != flags.tls_key.has_value()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together (mutual TLS)");
  }
  c.tls = flags.tls_ca.has_value() || flags.tls_cert.has_value();
  if (flags.tls_server_name.has_value()) {
    if (!c.tls) return absl::InvalidArgumentError("--tls_server_name needs TLS (--tls_ca or --tls_cert)");
    if (flags.tls_server_name->empty()) return absl::InvalidArgumentError("--tls_server_name: empty");
    c.server_name = *flags.tls_server_name;
  }
  const std::pair<const char*, const std::optional<std::string>*> files[] = {
      {"tls_ca", &flags.tls_ca}, {"tls_cert", &flags.tls_cert}, {"tls_key", &flags.tls_key}};
  std::string* out[] = {&c.root_pem, &c.cert_pem, &c.key_pem};
  for (int i = 0; i < 3; ++i) {
    if (!files[i].second->has_value()) continue;
    absl::StatusOr<std::string> pem = ReadFileToString(**files[i].second);
    if (!pem.ok()) return absl::InvalidArgumentError(absl::StrCat("--", files[i].first, ": ", pem.status().message()));
    if (pem->find("-----BEGIN") == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("--", files[i].first, ": ", **files[i].second, " is not PEM"));
    }
    *out[i] = std::move(*pem);
  }
  return c;
}

}  // namespace echokv::client
