#include "compression/policy.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/selection.h"

namespace echokv::compression {
namespace {

// Checks that `input` carries what `config.policy` needs; every message names the field.
absl::Status CheckInput(const CompressionConfig& config, const CompressionInput& input,
                        bool over_budget) {
  if (input.context == nullptr) return absl::InvalidArgumentError("context: must not be null");
  const model::KvCache& ctx = *input.context;
  const int layers = ctx.num_layers();
  const int64_t groups = ctx.num_kv_heads();
  const int64_t d = ctx.head_dim();
  if (layers < 1 || groups < 1 || d < 1) {
    return absl::InvalidArgumentError(absl::StrCat("context: empty cache shape (layers=", layers,
                                                   ", kv heads=", groups, ", head dim=", d, ")"));
  }
  if (!over_budget || config.policy == PolicyKind::kFull) return absl::OkStatus();
  const absl::string_view name = PolicyName(config.policy);
  const PrefillNeeds needs = NeedsFor(config);

  if (needs.last_queries != 0) {
    if (static_cast<int>(input.last_queries.size()) != layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "last_queries: ", name, " needs the prefill's last context queries for each of the ",
          layers, " layers, got ", input.last_queries.size()));
    }
    for (int l = 0; l < layers; ++l) {
      const at::Tensor& q = input.last_queries[l];
      if (!q.defined() || q.dim() != 3 || q.size(2) != d || q.size(0) % groups != 0 ||
          q.size(0) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "last_queries: layer ", l, " must be [H, N, ", d, "] with H a multiple of ", groups));
      }
      if (q.size(1) != static_cast<int64_t>(input.last_query_positions.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "last_query_positions: holds ", input.last_query_positions.size(),
            " positions but last_queries[", l, "] has ", q.size(1), " queries"));
      }
    }
  }
  if (config.policy == PolicyKind::kLaq || config.policy == PolicyKind::kEchoKv) {
    if (input.decoder == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("decoder: ", name, " needs a LookaheadDecoder for its lookahead steps"));
    }
    if (!input.last_logits.defined() || input.last_logits.numel() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("last_logits: ", name, " needs the prefill's last logits [V]"));
    }
  }
  if (needs.anchor_queries) {
    if (static_cast<int>(input.anchor_queries.size()) != layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "anchor_queries: echokv needs the last token's pre-RoPE queries for each of the ",
          layers, " layers, got ", input.anchor_queries.size()));
    }
    for (int l = 0; l < layers; ++l) {
      const at::Tensor& a = input.anchor_queries[l];
      if (!a.defined() || a.dim() != 2 || a.size(1) != d || a.size(0) % groups != 0 ||
          a.size(0) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "anchor_queries: layer ", l, " must be [H, ", d, "] with H a multiple of ", groups));
      }
    }
    if (!input.rope_inv_freq.defined() || input.rope_inv_freq.numel() != d / 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("rope_inv_freq: echokv needs the model's RoPE inverse frequencies [",
                       d / 2, "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status Dispatch(const CompressionConfig& config, const CompressionInput& input,
                      CompressionResult* result) {
  switch (config.policy) {
    case PolicyKind::kFull:
      return internal::RunFull(config, input, result);
    case PolicyKind::kStreamingLlm:
      return internal::RunStreamingLlm(config, input, result);
    case PolicyKind::kH2o:
      return internal::RunH2o(config, input, result);
    case PolicyKind::kSnapKv:
      return internal::RunSnapKv(config, input, result);
    case PolicyKind::kPyramidKv:
      return internal::RunPyramidKv(config, input, result);
    case PolicyKind::kLaq:
      return internal::RunLaq(config, input, result);
    case PolicyKind::kEchoKv:
      return internal::RunEchoKv(config, input, result);
  }
  return absl::InvalidArgumentError("policy: unknown policy kind");
}

absl::StatusOr<CompressionResult> CompressImpl(const CompressionConfig& config,
                                               const CompressionInput& input) {
  const model::KvCache& ctx = *input.context;
  const int layers = ctx.num_layers();
  const int64_t groups = ctx.num_kv_heads();

  CompressionResult result;
  CompressionReport& report = result.report;
  report.config = config;
  if (config.policy == PolicyKind::kLaq || config.policy == PolicyKind::kEchoKv) {
    report.config.workspace = config.EffectiveWorkspace();
  }
  report.num_layers = layers;
  report.num_kv_heads = static_cast<int>(groups);
  int64_t max_n = 0;
  for (int l = 0; l < layers; ++l) max_n = std::max(max_n, ctx.size(l));
  report.context_tokens = max_n;

  if (max_n <= config.budget && config.policy != PolicyKind::kFull) {
    // ALGORITHM.md §8.10: L <= B keeps everything and runs no lookahead.
    internal::PhaseClock clock(input, &report);
    for (int l = 0; l < layers; ++l) result.indices.push_back(internal::KeepAll(groups, ctx.size(l)));
    clock.End("select");
  } else {
    ECHOKV_RETURN_IF_ERROR(Dispatch(config, input, &result));
  }

  if (static_cast<int>(result.indices.size()) != layers) {
    return absl::InternalError(absl::StrCat(PolicyName(config.policy), " selected ",
                                            result.indices.size(), " layers, expected ", layers));
  }
  // §7 accounting: 2 · Σ_l G · n_l · d · sizeof(dtype).
  const int64_t entry_bytes = 2 * ctx.head_dim() * static_cast<int64_t>(ctx.options().dtype().itemsize());
  for (int l = 0; l < layers; ++l) {
    const at::Tensor& idx = result.indices[l];
    if (idx.dim() != 2 || idx.size(0) != groups || idx.size(1) > ctx.size(l)) {
      return absl::InternalError(absl::StrCat(PolicyName(config.policy), ": layer ", l,
                                              " selection has a wrong shape"));
    }
    report.retained_per_layer.push_back(idx.size(1));
    report.retained_entries += groups * idx.size(1);
    report.total_entries += groups * ctx.size(l);
  }
  report.retained_kv_bytes = report.retained_entries * entry_bytes;
  report.full_kv_bytes = report.total_entries * entry_bytes;
  report.evicted = report.retained_entries < report.total_entries;
  return result;
}

}  // namespace

absl::StatusOr<CompressionResult> Compress(const CompressionConfig& config,
                                           const CompressionInput& input) {
  ECHOKV_RETURN_IF_ERROR(config.Validate());
  bool over_budget = false;
  if (input.context != nullptr) {
    for (int l = 0; l < input.context->num_layers(); ++l) {
      over_budget = over_budget || input.context->size(l) > config.budget;
    }
  }
  ECHOKV_RETURN_IF_ERROR(CheckInput(config, input, over_budget));
  // No exception leaves the library: LibTorch errors become a Status naming the policy.
  try {
    return CompressImpl(config, input);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("compression (", PolicyName(config.policy),
                                            "): ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("compression (", PolicyName(config.policy), "): ", e.what()));
  }
}

}  // namespace echokv::compression
