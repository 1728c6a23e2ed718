// proto -> native conversion of request fields at the gRPC edge (service.cc), kept apart
// from the reactors so tests/fuzz/fuzz_edge.cc can drive exactly what the service
// runs on a parsed request (wire_check.h parses the bytes first).
//
//   pb::CreateSessionRequest req;  // parsed by ParseRequest
//   ECHOKV_ASSIGN_OR_RETURN(compression::CompressionConfig cfg, ToConfig(req.compression(), defaults));
//   InputSpec input = ToInput(req.input());
#ifndef ECHOKV_SERVER_DOORS_GRPC_REQUEST_CONVERT_H_
#define ECHOKV_SERVER_DOORS_GRPC_REQUEST_CONVERT_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "compression/config.h"
#include "proto/echokv/v1/echokv.pb.h"
#include "server/engine/engine.h"

namespace echokv::server {

// The request's input (text, token ids or chat messages) as the engine takes it.
InputSpec ToInput(const ::echokv::v1::Input& in);

// Request overrides on top of the server defaults; unknown policy or bootstrap names ->
// INVALID_ARGUMENT naming the field.
absl::StatusOr<compression::CompressionConfig> ToConfig(const ::echokv::v1::CompressionConfig& c,
                                                        const compression::CompressionConfig& defaults);

// An optional ttl_seconds field; nullopt when absent (the server default applies).
std::optional<absl::Duration> ToTtl(bool has, int64_t seconds);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_DOORS_GRPC_REQUEST_CONVERT_H_
