#include "server/state/session_id.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/echo.h"

namespace echokv::state {
namespace {

bool IsLowerHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }
bool IsLabelEnd(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z'); }
bool IsLabelInner(char c) { return IsLabelEnd(c) || c == '-'; }

// Empty when `id` is valid, otherwise what is wrong with it.
std::string Problem(absl::string_view id) {
  if (id.size() > kMaxSessionIdLength) {
    return absl::StrCat("is ", id.size(), " bytes long; at most ", kMaxSessionIdLength);
  }
  if (id.size() < 32) return "is shorter than 32 hex digits";
  absl::string_view hex = id.substr(id.size() - 32);
  for (char c : hex) {
    if (!IsLowerHex(c)) return "does not end in 32 lowercase hex digits";
  }
  if (id.size() == 32) return "";
  // A prefix must be "<label>." with a non-empty label.
  absl::string_view prefix = id.substr(0, id.size() - 32);
  if (prefix.back() != '.') return "has a prefix that does not end with '.'";
  absl::string_view label = prefix.substr(0, prefix.size() - 1);
  if (label.empty()) return "has an empty replica label before '.'";
  if (label.size() > 63) return "has a replica label longer than 63 characters";
  if (!IsLabelEnd(label.front()) || !IsLabelEnd(label.back())) {
    return "has a replica label that does not start and end with [a-z0-9]";
  }
  for (char c : label) {
    if (!IsLabelInner(c)) return "has a replica label with a character outside [a-z0-9-]";
  }
  return "";
}

}  // namespace

bool IsValidSessionId(absl::string_view id) { return Problem(id).empty(); }

absl::Status ValidateSessionId(absl::string_view id) {
  std::string problem = Problem(id);
  if (problem.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("session id ", EchoPrefix(id), " ", problem, " (expected [<dns-label>.]<32 lowercase hex>)"));
}

}  // namespace echokv::state
