#include "server/http_auth.h"

#include <httplib.h>

namespace echokv::server {

absl::StatusOr<Caller> CallerFromHttp(const httplib::Request& request) {
  (void)request;  // TODO(#12): the bearer token in request.get_header_value("Authorization")
  return Caller{};
}

}  // namespace echokv::server
