// Who is calling over HTTP: the one place where an HTTP request becomes a Caller (the
// HTTP twin of the gRPC service's CallerFromGrpc, server/doors/grpc/grpc_auth.h). The
// `Authorization: Bearer <token>` header is verified with the same TokenStore as the
// gRPC door (server/doors/auth.h): UNAUTHENTICATED (-> 401) for a missing, malformed or
// unknown token; the API maps the status with ToHttpError and never runs the request.
//
//   absl::StatusOr<Caller> caller = CallerFromHttp(req, tokens);   // tokens null: open
//   if (!caller.ok()) return Reply(res, ToHttpError(caller.status()));
//
// CallerFromHead does the same on the headers alone, before the body is read (the
// front's gate, HttpOptions::gate): OpenAiServer refuses an unauthenticated request
// there, so its body is never read (docs/SECURITY.md).
#ifndef ECHOKV_SERVER_DOORS_HTTP_HTTP_AUTH_H_
#define ECHOKV_SERVER_DOORS_HTTP_HTTP_AUTH_H_

#include "absl/status/statusor.h"
#include "server/doors/auth.h"
#include "server/engine/engine.h"
#include "server/doors/http/http_util.h"

namespace httplib {
struct Request;
}  // namespace httplib

namespace echokv::server {

// Caller{""} when `tokens` is null (--insecure); else the bearer token's tenant.
absl::StatusOr<Caller> CallerFromHttp(const httplib::Request& request, const TokenStore* tokens);
absl::StatusOr<Caller> CallerFromHead(const HttpRequestHead& head, const TokenStore* tokens);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_DOORS_HTTP_HTTP_AUTH_H_
