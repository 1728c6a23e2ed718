// The gRPC face of echokv-server: echokv.v1.EchoKV on the callback API (DESIGN.md
// rule 8). Each call converts its proto to native structs, hands the work to the
// Engine and returns; the engine's callbacks queue messages on the call's reactor.
// One ServerWriteReactor per stream, at most one write in flight, nothing blocks in a
// reaction, OnCancel sets the job's cancel flag, `delete this` only in OnDone.
//
//   EchoKvService service(engine.get(), metrics.get());
//   grpc::ServerBuilder builder;
//   builder.RegisterService(&service);
#ifndef ECHOKV_SERVER_SERVICE_H_
#define ECHOKV_SERVER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>

#include "proto/echokv/v1/echokv.grpc.pb.h"
#include "server/engine.h"
#include "server/metrics.h"

namespace echokv::server {

class EchoKvService final : public echokv::v1::EchoKV::CallbackService {
 public:
  // `engine` and `metrics` (may be null) must outlive the service.
  EchoKvService(Engine* engine, Metrics* metrics);

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx,
                                          const v1::GetServerInfoRequest* request,
                                          v1::ServerInfo* response) override;
  grpc::ServerWriteReactor<v1::SessionProgress>* CreateSession(
      grpc::CallbackServerContext* ctx, const v1::CreateSessionRequest* request) override;
  grpc::ServerWriteReactor<v1::SessionProgress>* AppendToSession(
      grpc::CallbackServerContext* ctx, const v1::AppendToSessionRequest* request) override;
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* ForkSession(grpc::CallbackServerContext* ctx,
                                        const v1::ForkSessionRequest* request,
                                        v1::Session* response) override;
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* ctx,
                                       const v1::GetSessionRequest* request,
                                       v1::Session* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* ctx,
                                         const v1::ListSessionsRequest* request,
                                         v1::ListSessionsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteSession(grpc::CallbackServerContext* ctx,
                                          const v1::DeleteSessionRequest* request,
                                          v1::DeleteSessionResponse* response) override;
  grpc::ServerUnaryReactor* InspectCache(grpc::CallbackServerContext* ctx,
                                         const v1::InspectCacheRequest* request,
                                         v1::InspectCacheResponse* response) override;
  grpc::ServerUnaryReactor* Compress(grpc::CallbackServerContext* ctx,
                                     const v1::CompressRequest* request,
                                     v1::CompressResponse* response) override;

  // Streaming RPCs (and Compress) in flight.
  int streams_in_flight() const { return streams_.load(); }

  // Shared with the reactors (service.cc).
  Metrics* metrics() const { return metrics_; }
  Engine* engine() const { return engine_; }
  // Claims a stream slot; false (and nothing claimed) when max_concurrent_streams
  // are already in flight.
  bool AcquireStream();
  void ReleaseStream();

 private:
  Engine* engine_;               // not owned
  Metrics* metrics_;             // not owned; may be null
  std::atomic<int> streams_{0};  // streaming calls in flight
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_SERVICE_H_
