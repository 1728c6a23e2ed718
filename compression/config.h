// Which eviction policy to run and with what parameters (docs/ALGORITHM.md §4-§5).
// Plain values with the published defaults; Validate() names the bad field.
//
//   CompressionConfig cfg;                          // EchoKV, B=512, T=8, B1=1024
//   cfg.policy = PolicyKind::kLaq; cfg.budget = 128;
//   ECHOKV_RETURN_IF_ERROR(cfg.Validate());
//   int b1 = cfg.EffectiveWorkspace();              // LAQ: = budget unless set
#ifndef ECHOKV_COMPRESSION_CONFIG_H_
#define ECHOKV_COMPRESSION_CONFIG_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/kv_quant.h"

namespace echokv::compression {

enum class PolicyKind { kFull, kStreamingLlm, kH2o, kSnapKv, kPyramidKv, kLaq, kEchoKv };
enum class Bootstrap { kProposals, kSnapKv };

// "full", "streamingllm", "h2o", "snapkv", "pyramidkv", "laq", "echokv".
absl::string_view PolicyName(PolicyKind kind);
// Inverse of PolicyName (case-sensitive); unknown -> InvalidArgument naming "policy".
absl::StatusOr<PolicyKind> ParsePolicyKind(absl::string_view name);
// Every policy, in the order above.
std::vector<PolicyKind> AllPolicies();
absl::string_view BootstrapName(Bootstrap b);               // "proposals", "snapkv"
absl::StatusOr<Bootstrap> ParseBootstrap(absl::string_view name);

struct CompressionConfig {
  PolicyKind policy = PolicyKind::kEchoKv;
  int budget = 512;                   // B: entries kept per layer and KV group, 1..1048576
  int lookahead = 8;                  // T: even, 2..64 (laq, echokv)
  std::optional<int> workspace;       // B1 >= B; default 1024 (echokv), = budget (laq)
  int stage2_window = 0;              // w: 0..B-1, most recent tokens always kept (echokv)
  Bootstrap bootstrap = Bootstrap::kProposals;  // echokv ablation
  bool repair = true;                 // echokv ablation
  int snapkv_window = 32;             // >= 1 (snapkv, pyramidkv, laq workspace)
  int snapkv_kernel = 7;              // odd >= 1
  // The retained (hot) tier's storage (issue 31): float32 or int8 (kernels/kv_quant.h:
  // per-token rows with a float32 scale). Selection always scores full precision; only
  // what is kept is quantized. bfloat16 is a kernels format, not offered as a storage.
  kernels::KvDtype cache_dtype = kernels::KvDtype::kFloat32;
  // Quality-targeted budget (echokv, snapkv; docs/ALGORITHM.md §9): when set, each
  // layer keeps the fewest entries (at least 1 beyond the window) whose share of the
  // scoring queries' attention mass reaches target_mass in every KV group, at most
  // `budget`, which becomes the ceiling. (0, 1].
  std::optional<double> target_mass;

  // Checks the bounds of docs/ALGORITHM.md §5; the message names the field
  // ("lookahead must be even ...", "workspace ...").
  absl::Status Validate() const;
  // B1 after defaults: workspace if set, else 1024 for echokv and budget for laq.
  int EffectiveWorkspace() const;
};

// What the prefill must keep for a policy to run.
struct PrefillNeeds {
  bool anchor_queries = false;  // pre-RoPE queries of the last context token (echokv proposals)
  int last_queries = 0;         // post-RoPE queries of the last N context tokens; -1 = all (h2o)
};
PrefillNeeds NeedsFor(const CompressionConfig& config);

}  // namespace echokv::compression

#endif  // ECHOKV_COMPRESSION_CONFIG_H_
