// native -> proto conversion of the replies at the gRPC edge (service.cc): the one
// conversion of a session (SessionInfo, server/engine/session_store.h) to pb::Session,
// and of its compression settings, report and per-layer cache to theirs.
// request_convert.h is the other direction.
//
//   pb::Session* out = reactor->response();
//   FillSession(info, out);
#ifndef ECHOKV_SERVER_DOORS_GRPC_REPLY_CONVERT_H_
#define ECHOKV_SERVER_DOORS_GRPC_REPLY_CONVERT_H_

#include <vector>

#include "compression/config.h"
#include "compression/report.h"
#include "proto/echokv/v1/echokv.pb.h"
#include "server/engine/engine.h"

namespace echokv::server {

void FillConfig(const compression::CompressionConfig& cfg, ::echokv::v1::CompressionConfig* out);
void FillReport(const compression::CompressionReport& r, ::echokv::v1::CompressionReport* out);
// Every field of pb::Session; the engine's own fields (tenant, cold_in_memory) stay out.
void FillSession(const SessionInfo& s, ::echokv::v1::Session* out);
void FillLayers(const std::vector<LayerCacheInfo>& layers,
                google::protobuf::RepeatedPtrField<::echokv::v1::LayerCache>* out);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_DOORS_GRPC_REPLY_CONVERT_H_
