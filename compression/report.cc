#include "compression/report.h"

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
  return j.dump();
}

}  // namespace echokv::compression
