// The one place where absl::Status becomes grpc::Status: the code comes from the status's
// ErrorKind (common/errors.h) through GrpcCode, the one table of the gRPC door, and the
// message is kept. Every kind's code is its status code (both follow google.rpc.Code),
// so the answer is what the status says; the kind, field and limit themselves do not
// travel on the gRPC wire (docs/API.md "Errors").
//
//   absl::Status s = SessionNotFound(id);   // kind kNotFound
//   reactor->Finish(ToGrpcStatus(s));       // grpc::StatusCode::NOT_FOUND, same message
#ifndef ECHOKV_SERVER_DOORS_GRPC_STATUS_UTIL_H_
#define ECHOKV_SERVER_DOORS_GRPC_STATUS_UTIL_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "common/errors.h"

namespace echokv::server {

// The gRPC status code of each kind (docs/API.md "Errors").
grpc::StatusCode GrpcCode(ErrorKind kind);

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_DOORS_GRPC_STATUS_UTIL_H_
