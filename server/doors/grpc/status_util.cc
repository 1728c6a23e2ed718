#include "server/doors/grpc/status_util.h"

#include <string>

namespace echokv::server {

grpc::StatusCode GrpcCode(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return grpc::StatusCode::INVALID_ARGUMENT;
    case ErrorKind::kContextLengthExceeded: return grpc::StatusCode::INVALID_ARGUMENT;
    case ErrorKind::kOutOfRange: return grpc::StatusCode::OUT_OF_RANGE;
    case ErrorKind::kNotFound: return grpc::StatusCode::NOT_FOUND;
    case ErrorKind::kAlreadyExists: return grpc::StatusCode::ALREADY_EXISTS;
    case ErrorKind::kFailedPrecondition: return grpc::StatusCode::FAILED_PRECONDITION;
    case ErrorKind::kBusy: return grpc::StatusCode::FAILED_PRECONDITION;
    case ErrorKind::kConversationMismatch: return grpc::StatusCode::FAILED_PRECONDITION;
    case ErrorKind::kAborted: return grpc::StatusCode::ABORTED;
    case ErrorKind::kLimitReached: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case ErrorKind::kCancelled: return grpc::StatusCode::CANCELLED;
    case ErrorKind::kDeadlineExceeded: return grpc::StatusCode::DEADLINE_EXCEEDED;
    case ErrorKind::kUnavailable: return grpc::StatusCode::UNAVAILABLE;
    case ErrorKind::kUnimplemented: return grpc::StatusCode::UNIMPLEMENTED;
    case ErrorKind::kUnauthenticated: return grpc::StatusCode::UNAUTHENTICATED;
    case ErrorKind::kPermissionDenied: return grpc::StatusCode::PERMISSION_DENIED;
    case ErrorKind::kDataLoss: return grpc::StatusCode::DATA_LOSS;
    case ErrorKind::kInternal: return grpc::StatusCode::INTERNAL;
    case ErrorKind::kUnknown: return grpc::StatusCode::UNKNOWN;
  }
  return grpc::StatusCode::UNKNOWN;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(GrpcCode(ErrorInfoOf(status).kind), std::string(status.message()));
}

}  // namespace echokv::server
