// The one place where absl::Status becomes grpc::Status (docs/DESIGN.md rule 3): codes map
// one to one (both follow google.rpc.Code) and the message is kept.
//
//   absl::Status s = absl::NotFoundError("session ... not found");
//   reactor->Finish(ToGrpcStatus(s));   // grpc::StatusCode::NOT_FOUND, same message
#ifndef ECHOKV_SERVER_STATUS_UTIL_H_
#define ECHOKV_SERVER_STATUS_UTIL_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace echokv::server {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_STATUS_UTIL_H_
