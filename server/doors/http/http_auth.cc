#include "server/doors/http/http_auth.h"

#include <httplib.h>

#include <string>

namespace echokv::server {

absl::StatusOr<Caller> CallerFromHttp(const httplib::Request& request, const TokenStore* tokens) {
  if (tokens == nullptr) return Caller{};
  const std::string header = request.get_header_value("Authorization");
  absl::StatusOr<AuthResult> who = tokens->VerifyAuthorization(header);
  if (!who.ok()) return who.status();
  return Caller{who->tenant};
}

absl::StatusOr<Caller> CallerFromHead(const HttpRequestHead& head, const TokenStore* tokens) {
  if (tokens == nullptr) return Caller{};
  absl::StatusOr<AuthResult> who = tokens->VerifyAuthorization(head.Header("authorization"));
  if (!who.ok()) return who.status();
  return Caller{who->tenant};
}

}  // namespace echokv::server
