#include "compression/config.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/echo.h"
#include "common/errors.h"

namespace echokv::compression {
namespace {

// Upper bound of every size-like field (docs/ALGORITHM.md §5's budget bound); keeps any
// allocation derived from a config value bounded.
constexpr int kMaxEntries = 1048576;
constexpr int kEchoKvDefaultWorkspace = 1024;

}  // namespace

absl::string_view PolicyName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kFull:
      return "full";
    case PolicyKind::kStreamingLlm:
      return "streamingllm";
    case PolicyKind::kH2o:
      return "h2o";
    case PolicyKind::kSnapKv:
      return "snapkv";
    case PolicyKind::kPyramidKv:
      return "pyramidkv";
    case PolicyKind::kLaq:
      return "laq";
    case PolicyKind::kEchoKv:
      return "echokv";
  }
  return "unknown";
}

std::vector<PolicyKind> AllPolicies() {
  return {PolicyKind::kFull,      PolicyKind::kStreamingLlm, PolicyKind::kH2o,
          PolicyKind::kSnapKv,    PolicyKind::kPyramidKv,    PolicyKind::kLaq,
          PolicyKind::kEchoKv};
}

absl::StatusOr<PolicyKind> ParsePolicyKind(absl::string_view name) {
  std::string valid;
  for (PolicyKind kind : AllPolicies()) {
    if (PolicyName(kind) == name) return kind;
    absl::StrAppend(&valid, valid.empty() ? "" : ", ", PolicyName(kind));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("policy: unknown policy ", EchoPrefix(name), " (valid: ", valid, ")"));
}

absl::string_view BootstrapName(Bootstrap b) {
  switch (b) {
    case Bootstrap::kProposals:
      return "proposals";
    case Bootstrap::kSnapKv:
      return "snapkv";
  }
  return "unknown";
}

absl::StatusOr<Bootstrap> ParseBootstrap(absl::string_view name) {
  for (Bootstrap b : {Bootstrap::kProposals, Bootstrap::kSnapKv}) {
    if (BootstrapName(b) == name) return b;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("bootstrap: unknown value ", EchoPrefix(name), " (valid: proposals, snapkv)"));
}

absl::Status CompressionConfig::Validate() const {
  // docs/ALGORITHM.md §5: reject, never clamp.
  if (cache_dtype != kernels::KvDtype::kFloat32 && cache_dtype != kernels::KvDtype::kInt8) {
    return MakeError(ErrorKind::kInvalidArgument, "cache_dtype",
                     absl::StrCat("cache_dtype must be float32 or int8, got ", kernels::KvDtypeName(cache_dtype)));
  }
  if (budget < 1 || budget > kMaxEntries) {
    return MakeError(ErrorKind::kInvalidArgument, "budget",
        absl::StrCat("budget must be in [1, ", kMaxEntries, "], got ", budget));
  }
  if (lookahead < 2 || lookahead > 64) {
    return MakeError(ErrorKind::kInvalidArgument, "lookahead",
        absl::StrCat("lookahead must be in [2, 64], got ", lookahead));
  }
  if (lookahead % 2 != 0) {
    return MakeError(ErrorKind::kInvalidArgument, "lookahead", absl::StrCat("lookahead must be even, got ", lookahead));
  }
  if (workspace.has_value()) {
    if (*workspace < budget) {
      return MakeError(ErrorKind::kInvalidArgument, "workspace", absl::StrCat("workspace (B1) must be >= budget (",
                                                     budget, "), got ", *workspace));
    }
    if (*workspace > kMaxEntries) {
      return MakeError(ErrorKind::kInvalidArgument, "workspace",
          absl::StrCat("workspace (B1) must be <= ", kMaxEntries, ", got ", *workspace));
    }
  }
  if (stage2_window < 0 || stage2_window > budget - 1) {
    return MakeError(ErrorKind::kInvalidArgument, "stage2_window", absl::StrCat(
        "stage2_window must be in [0, budget-1 = ", budget - 1, "], got ", stage2_window));
  }
  if (snapkv_window < 1 || snapkv_window > kMaxEntries) {
    return MakeError(ErrorKind::kInvalidArgument, "snapkv_window",
        absl::StrCat("snapkv_window must be in [1, ", kMaxEntries, "], got ", snapkv_window));
  }
  if (snapkv_kernel < 1 || snapkv_kernel > kMaxEntries) {
    return MakeError(ErrorKind::kInvalidArgument, "snapkv_kernel",
        absl::StrCat("snapkv_kernel must be in [1, ", kMaxEntries, "], got ", snapkv_kernel));
  }
  if (snapkv_kernel % 2 == 0) {
    return MakeError(ErrorKind::kInvalidArgument, "snapkv_kernel",
        absl::StrCat("snapkv_kernel must be odd, got ", snapkv_kernel));
  }
  if (target_mass.has_value()) {
    // !(x > 0) also rejects NaN.
    if (!(*target_mass > 0.0) || *target_mass > 1.0) {
      return MakeError(ErrorKind::kInvalidArgument, "target_mass",
                       absl::StrCat("target_mass must be in (0, 1], got ", *target_mass));
    }
    if (policy != PolicyKind::kEchoKv && policy != PolicyKind::kSnapKv) {
      return MakeError(ErrorKind::kInvalidArgument, "target_mass",
                       absl::StrCat("target_mass is a budget of echokv and snapkv only; policy is ",
                                    PolicyName(policy)));
    }
  }
  return absl::OkStatus();
}

int CompressionConfig::EffectiveWorkspace() const {
  if (workspace.has_value()) return *workspace;
  switch (policy) {
    case PolicyKind::kEchoKv:
      // The paper's 1024, raised to B when B is larger (B1 >= B must hold).
      return std::max(kEchoKvDefaultWorkspace, budget);
    case PolicyKind::kLaq:
    case PolicyKind::kFull:
    case PolicyKind::kStreamingLlm:
    case PolicyKind::kH2o:
    case PolicyKind::kSnapKv:
    case PolicyKind::kPyramidKv:
      return budget;
  }
  return budget;
}

PrefillNeeds NeedsFor(const CompressionConfig& config) {
  PrefillNeeds needs;
  switch (config.policy) {
    case PolicyKind::kFull:
    case PolicyKind::kStreamingLlm:
      break;
    case PolicyKind::kH2o:
      needs.last_queries = -1;
      break;
    case PolicyKind::kSnapKv:
    case PolicyKind::kPyramidKv:
      needs.last_queries = config.snapkv_window;
      break;
    case PolicyKind::kLaq:
      // SnapKV workspace (window queries) and the final scoring's last 8 queries.
      needs.last_queries = std::max(config.snapkv_window, 8);
      break;
    case PolicyKind::kEchoKv:
      needs.anchor_queries = true;
      if (config.bootstrap == Bootstrap::kSnapKv) needs.last_queries = config.snapkv_window;
      break;
  }
  return needs;
}

}  // namespace echokv::compression
