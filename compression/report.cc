#include "compression/report.h"

#include "absl/strings/str_cat.h"

#include <string>

#include "nlohmann/json.hpp"

namespace echokv::compression {

double CompressionReport::SecondsOf(const std::string& phase) const {
  double total = 0;
  for (const PhaseTime& p : phases) {
    if (p.phase == phase) total += p.seconds;
  }
  return total;
}

double CompressionReport::TotalSeconds(bool include_prefill) const {
  double total = 0;
  for (const PhaseTime& p : phases) {
    if (!include_prefill && p.phase == "prefill") continue;
    total += p.seconds;
  }
  return total;
}

double CompressionReport::RetainedMassMean() const {
  double sum = 0;
  int64_t count = 0;
  for (double m : retained_mass) {
    if (m < 0) continue;
    sum += m;
    ++count;
  }
  return count > 0 ? sum / static_cast<double>(count) : -1;
}

double CompressionReport::RetainedMassMin() const {
  double best = -1;
  for (double m : retained_mass) {
    if (m >= 0 && (best < 0 || m < best)) best = m;
  }
  return best;
}

std::string ReportToJson(const CompressionReport& report) {
  // ordered_json keeps the fields (and the phases) in the order written here.
  nlohmann::ordered_json j;
  const CompressionConfig& c = report.config;
  j["policy"] = std::string(PolicyName(c.policy));
  j["budget"] = c.budget;
  j["lookahead"] = c.lookahead;
  j["workspace"] = c.EffectiveWorkspace();
  j["stage2_window"] = c.stage2_window;
  j["bootstrap"] = std::string(BootstrapName(c.bootstrap));
  j["repair"] = c.repair;
  j["snapkv_window"] = c.snapkv_window;
  j["snapkv_kernel"] = c.snapkv_kernel;
  j["cache_dtype"] = kernels::KvDtypeName(c.cache_dtype);
  if (c.target_mass.has_value()) j["target_mass"] = *c.target_mass;  // only when set (§9)
  j["context_tokens"] = report.context_tokens;
  j["num_layers"] = report.num_layers;
  j["num_kv_heads"] = report.num_kv_heads;
  j["retained_per_layer"] = report.retained_per_layer;
  j["retained_entries"] = report.retained_entries;
  j["total_entries"] = report.total_entries;
  j["retained_kv_bytes"] = report.retained_kv_bytes;
  j["full_kv_bytes"] = report.full_kv_bytes;
  j["saved_kv_bytes"] = report.full_kv_bytes - report.retained_kv_bytes;
  nlohmann::ordered_json phases = nlohmann::ordered_json::object();
  for (const PhaseTime& p : report.phases) {
    phases[p.phase] = report.SecondsOf(p.phase);
  }
  j["phases"] = phases;
  j["compression_seconds"] = report.TotalSeconds(/*include_prefill=*/false);
  j["forward_passes"] = report.forward_passes;
  j["scoring_passes"] = report.scoring_passes;
  j["evicted"] = report.evicted;
  j["overlap_w1_w2"] = report.overlap_w1_w2;
  j["overlap_w1_final"] = report.overlap_w1_final;
  j["overlap_w2_final"] = report.overlap_w2_final;
  j["lookahead_tokens"] = report.lookahead_tokens;
  j["retained_mass"] = report.retained_mass;
  j["retained_mass_mean"] = report.RetainedMassMean();
  j["retained_mass_min"] = report.RetainedMassMin();
  return j.dump();
}

absl::StatusOr<CompressionReport> ReportFromJson(absl::string_view json) {
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("report: not a JSON object");
  CompressionReport r;
  try {
    CompressionConfig& c = r.config;
    auto policy = ParsePolicyKind(j.at("policy").get<std::string>());
    if (!policy.ok()) return policy.status();
    c.policy = *policy;
    c.budget = j.at("budget").get<int>();
    c.lookahead = j.at("lookahead").get<int>();
    c.workspace = j.at("workspace").get<int>();
    c.stage2_window = j.at("stage2_window").get<int>();
    auto bootstrap = ParseBootstrap(j.at("bootstrap").get<std::string>());
    if (!bootstrap.ok()) return bootstrap.status();
    c.bootstrap = *bootstrap;
    c.repair = j.at("repair").get<bool>();
    c.snapkv_window = j.at("snapkv_window").get<int>();
    c.snapkv_kernel = j.at("snapkv_kernel").get<int>();
    if (j.contains("cache_dtype")) {  // absent before issue 31: float32
      if (!kernels::ParseKvDtype(j.at("cache_dtype").get<std::string>(), &c.cache_dtype)) {
        return absl::InvalidArgumentError("report: unknown cache_dtype");
      }
    }
    if (j.contains("target_mass")) c.target_mass = j.at("target_mass").get<double>();
    r.context_tokens = j.at("context_tokens").get<int64_t>();
    r.num_layers = j.at("num_layers").get<int>();
    r.num_kv_heads = j.at("num_kv_heads").get<int>();
    r.retained_per_layer = j.at("retained_per_layer").get<std::vector<int64_t>>();
    r.retained_entries = j.at("retained_entries").get<int64_t>();
    r.total_entries = j.at("total_entries").get<int64_t>();
    r.retained_kv_bytes = j.at("retained_kv_bytes").get<int64_t>();
    r.full_kv_bytes = j.at("full_kv_bytes").get<int64_t>();
    for (const auto& [phase, seconds] : j.at("phases").items()) r.phases.push_back({phase, seconds.get<double>()});
    r.forward_passes = j.at("forward_passes").get<int>();
    r.scoring_passes = j.at("scoring_passes").get<int>();
    r.evicted = j.at("evicted").get<bool>();
    r.overlap_w1_w2 = j.at("overlap_w1_w2").get<double>();
    r.overlap_w1_final = j.at("overlap_w1_final").get<double>();
    r.overlap_w2_final = j.at("overlap_w2_final").get<double>();
    r.lookahead_tokens = j.at("lookahead_tokens").get<std::vector<int>>();
    // Absent from reports saved before the fidelity signal (their sessions load as
    // "not measured").
    if (j.contains("retained_mass")) r.retained_mass = j.at("retained_mass").get<std::vector<double>>();
    if (!r.retained_mass.empty() &&
        r.retained_mass.size() != static_cast<size_t>(r.num_layers) * static_cast<size_t>(r.num_kv_heads)) {
      return absl::InvalidArgumentError("report: retained_mass must hold num_layers x num_kv_heads values");
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("report: ", e.what()));
  }
  return r;
}

}  // namespace echokv::compression
