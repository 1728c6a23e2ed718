// Request parsing at the gRPC edge (docs/SECURITY.md "Edge validation"). protobuf's
// C++ parser refuses a proto3 string field holding invalid UTF-8 (and any malformed
// wire data) before a handler runs, and gRPC then answers UNIMPLEMENTED with an empty
// message. The service therefore takes its requests as raw bytes and parses them here:
// one pass over the wire format, guided by the message's descriptor, finds the first
// string field that is not valid UTF-8 (by protobuf's own check, so the two always
// agree) and names it; malformed wire data is refused as such. Both INVALID_ARGUMENT;
// neither echoes client bytes.
//
//   pb::CreateSessionRequest req;
//   if (absl::Status s = ParseRequest(raw_bytes, &req); !s.ok()) return s;
//   // e.g. "input.chat.messages[1].content: not valid UTF-8"
#ifndef ECHOKV_SERVER_DOORS_GRPC_WIRE_CHECK_H_
#define ECHOKV_SERVER_DOORS_GRPC_WIRE_CHECK_H_

#include <google/protobuf/message.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace echokv::server {

// Checks `wire` against `descriptor` without building the message: INVALID_ARGUMENT
// "<field path>: not valid UTF-8 ..." for the first bad string field (repeated fields
// with their index), "... is not a valid <type> message" for malformed wire data or
// nesting deeper than protobuf's recursion limit (100). Unknown fields are skipped as
// protobuf does.
absl::Status CheckWire(absl::string_view wire, const google::protobuf::Descriptor* descriptor);

// CheckWire, then parses into `message` (which is cleared first).
absl::Status ParseRequest(absl::string_view wire, google::protobuf::Message* message);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_DOORS_GRPC_WIRE_CHECK_H_
