// What one compression did (torch-free, so the server and tools can carry it).
//
//   const CompressionReport& r = result.report;
//   double ratio = static_cast<double>(r.retained_kv_bytes) / r.full_kv_bytes;
//   for (const PhaseTime& p : r.phases) printf("%s %.3f s\n", p.phase.c_str(), p.seconds);
//   std::string json = ReportToJson(r);
#ifndef ECHOKV_COMPRESSION_REPORT_H_
#define ECHOKV_COMPRESSION_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "compression/config.h"

namespace echokv::compression {

struct PhaseTime {
  std::string phase;   // "prefill", "bootstrap", "round1", "repair", "round2", "final", "select"
  double seconds = 0;
};

struct CompressionReport {
  CompressionConfig config;          // as run, workspace resolved
  int64_t context_tokens = 0;        // L (max over layers for grown sessions)
  int num_layers = 0;
  int num_kv_heads = 0;
  // retained[l] = entries kept per group in layer l (equal for every group).
  std::vector<int64_t> retained_per_layer;
  int64_t retained_entries = 0;      // sum over layers and groups
  int64_t total_entries = 0;         // context entries over layers and groups before eviction
  int64_t retained_kv_bytes = 0;     // §7 bytes of the kept entries
  int64_t full_kv_bytes = 0;         // §7 bytes of all context entries
  std::vector<PhaseTime> phases;     // in execution order; each policy reports its own
  int forward_passes = 0;            // one-token passes between prefill and final selection
  int scoring_passes = 0;            // Eq. 3 / pooling passes over the context
  bool evicted = false;              // false when L <= B (nothing evicted, no lookahead)
  // Lookahead policies: mean over layers/groups of |A ∩ B| / |B| (-1 = not applicable).
  double overlap_w1_w2 = -1;         // workspace before vs after repair (echokv)
  double overlap_w1_final = -1;      // bootstrap workspace vs final set
  double overlap_w2_final = -1;      // repaired workspace vs final set (echokv)
  std::vector<int> lookahead_tokens; // x_1..x_T greedy lookahead ids (discarded after)
  // The fidelity signal: retained_mass[l * num_kv_heads + g] = the share of attention
  // mass that the policy's probe queries (the ones it ranks by: EchoKV's lookahead
  // queries Q1;Q2, LAQ's lookahead + last 8 context queries, SnapKV's and PyramidKV's
  // observation window, H2O's context queries) put on the entries layer l / group g
  // kept, summed over the group's heads and queries: sum_{i kept} s_i / sum_i s_i with
  // s = the unpooled Eq. 3 scores. 1 for a layer that kept everything; -1 where nothing
  // scored it (StreamingLLM, a window-only budget). Empty for reports saved before it.
  std::vector<double> retained_mass;
  double RetainedMassMean() const;   // over the measured entries; -1 when none
  double RetainedMassMin() const;    // likewise

  double SecondsOf(const std::string& phase) const;  // 0 when absent
  double TotalSeconds(bool include_prefill) const;
};

// A JSON object with every field above ("policy", "budget", ..., "phases": {...}).
std::string ReportToJson(const CompressionReport& report);
// The inverse of ReportToJson (saved sessions carry their last report); the config's
// workspace comes back set explicitly. INVALID_ARGUMENT naming a missing/bad field.
absl::StatusOr<CompressionReport> ReportFromJson(absl::string_view json);

}  // namespace echokv::compression

#endif  // ECHOKV_COMPRESSION_REPORT_H_
