#include "server/doors/grpc/request_convert.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/echo.h"

namespace echokv::server {

namespace pb = ::echokv::v1;

InputSpec ToInput(const pb::Input& in) {
  InputSpec spec;
  switch (in.content_case()) {
    case pb::Input::kText:
      spec.kind = InputSpec::Kind::kText;
      spec.text = in.text();
      break;
    case pb::Input::kTokens:
      spec.kind = InputSpec::Kind::kTokens;
      spec.tokens.assign(in.tokens().ids().begin(), in.tokens().ids().end());
      break;
    case pb::Input::kChat:
      spec.kind = InputSpec::Kind::kChat;
      for (const pb::ChatMessage& m : in.chat().messages()) {
        model::ChatMessage msg{m.role(), m.content()};
        msg.name = m.name();
        msg.tool_call_id = m.tool_call_id();
        for (const pb::ToolCall& c : m.tool_calls()) {
          msg.tool_calls.push_back({c.id(), c.type().empty() ? "function" : c.type(), c.function_name(),
                                    c.arguments_json()});
        }
        spec.chat.push_back(std::move(msg));
      }
      spec.tools_json = in.chat().tools_json();
      spec.add_generation_prompt =
          in.chat().has_add_generation_prompt() ? in.chat().add_generation_prompt() : true;
      break;
    case pb::Input::CONTENT_NOT_SET:
      spec.kind = InputSpec::Kind::kNone;
      break;
  }
  if (in.has_add_special_tokens()) spec.add_special_tokens = in.add_special_tokens();
  return spec;
}

// Request overrides on top of the server defaults; unknown names -> INVALID_ARGUMENT.
absl::StatusOr<compression::CompressionConfig> ToConfig(const pb::CompressionConfig& c,
                                                        const compression::CompressionConfig& defaults) {
  compression::CompressionConfig cfg = defaults;
  if (c.has_policy()) {
    absl::StatusOr<compression::PolicyKind> kind = compression::ParsePolicyKind(c.policy());
    if (!kind.ok()) {
      std::vector<std::string> names;
      for (compression::PolicyKind k : compression::AllPolicies()) names.emplace_back(compression::PolicyName(k));
      return absl::InvalidArgumentError(absl::StrCat("compression.policy: unknown policy ", EchoPrefix(c.policy()),
                                                     "; one of ", absl::StrJoin(names, ", ")));
    }
    cfg.policy = *kind;
  }
  if (c.has_budget()) cfg.budget = c.budget();
  if (c.has_lookahead()) cfg.lookahead = c.lookahead();
  if (c.has_workspace()) cfg.workspace = c.workspace();
  if (c.has_window()) cfg.stage2_window = c.window();
  if (c.has_bootstrap()) {
    absl::StatusOr<compression::Bootstrap> b = compression::ParseBootstrap(c.bootstrap());
    if (!b.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("compression.bootstrap: unknown bootstrap ",
                                                     EchoPrefix(c.bootstrap()), "; one of proposals, snapkv"));
    }
    cfg.bootstrap = *b;
  }
  if (c.has_repair()) cfg.repair = c.repair();
  if (c.has_snapkv_window()) cfg.snapkv_window = c.snapkv_window();
  if (c.has_snapkv_kernel()) cfg.snapkv_kernel = c.snapkv_kernel();
  if (c.has_cache_dtype()) {
    kernels::KvDtype dtype;
    if (!kernels::ParseKvDtype(c.cache_dtype(), &dtype) || dtype == kernels::KvDtype::kBFloat16) {
      return absl::InvalidArgumentError(absl::StrCat("compression.cache_dtype: unknown cache dtype ",
                                                     EchoPrefix(c.cache_dtype()), "; one of float32, int8"));
    }
    cfg.cache_dtype = dtype;
  }
  if (c.has_target_mass()) cfg.target_mass = c.target_mass();
  return cfg;
}

std::optional<absl::Duration> ToTtl(bool has, int64_t seconds) {
  if (!has) return std::nullopt;
  return absl::Seconds(seconds);
}

}  // namespace echokv::server
