// Who is calling over HTTP: the one place where an HTTP request becomes a Caller (the
// HTTP twin of the gRPC service's CallerOf). Today the server runs open: every request
// is Caller{} (tenant ""). TODO(#12): read `Authorization: Bearer <token>` and return
// the token's tenant, UNAUTHENTICATED (-> 401) for a missing/unknown token and
// PERMISSION_DENIED (-> 403) for a token without access; the API maps the status with
// ToHttpError and never runs the request.
//
//   absl::StatusOr<Caller> caller = CallerFromHttp(req);
//   if (!caller.ok()) return Reply(res, ToHttpError(caller.status()));
#ifndef ECHOKV_SERVER_HTTP_AUTH_H_
#define ECHOKV_SERVER_HTTP_AUTH_H_

#include "absl/status/statusor.h"
#include "server/engine.h"

namespace httplib {
struct Request;
}  // namespace httplib

namespace echokv::server {

absl::StatusOr<Caller> CallerFromHttp(const httplib::Request& request);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_HTTP_AUTH_H_
