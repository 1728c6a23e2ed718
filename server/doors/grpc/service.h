// The gRPC face of echokv-server: echokv.v1.EchoKV on the callback API (docs/DESIGN.md
// rule 8). Each call converts its proto to native structs, hands the work to the
// session layer (server/sessions/sessions.h) and returns; its callbacks queue messages
// on the call's reactor.
// One ServerWriteReactor per stream, at most one write in flight, nothing blocks in a
// reaction, OnCancel sets the job's cancel flag, `delete this` only in OnDone.
//
// Requests arrive as raw bytes (the generated WithRawCallbackMethod_ variants) and are
// parsed by ParseRequest (wire_check.h), so invalid UTF-8 and garbage get our
// INVALID_ARGUMENT naming the field instead of gRPC's empty UNIMPLEMENTED, and are
// counted. Every call is authenticated first (CallerFromGrpc, grpc_auth.h); streaming
// calls then take a fair stream slot (Sessions::AcquireStream, shared with the HTTP door).
//
//   Sessions sessions(engine.get(), metrics.get(), {/*stream_reserve=*/8, quota_of});
//   EchoKvService service(&sessions, metrics.get(), tokens.get());
//   grpc::ServerBuilder builder;
//   builder.RegisterService(&service);
#ifndef ECHOKV_SERVER_DOORS_GRPC_SERVICE_H_
#define ECHOKV_SERVER_DOORS_GRPC_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "proto/echokv/v1/echokv.grpc.pb.h"
#include "server/doors/auth.h"
#include "server/metrics.h"
#include "server/sessions/sessions.h"

namespace echokv::server {

// Every method takes raw bytes (parsed and checked by wire_check.h at the edge).
using EchoKvServiceBase = v1::EchoKV::WithRawCallbackMethod_GetServerInfo<
    v1::EchoKV::WithRawCallbackMethod_CreateSession<v1::EchoKV::WithRawCallbackMethod_AppendToSession<
        v1::EchoKV::WithRawCallbackMethod_Generate<v1::EchoKV::WithRawCallbackMethod_ForkSession<
            v1::EchoKV::WithRawCallbackMethod_GetSession<v1::EchoKV::WithRawCallbackMethod_ListSessions<
                v1::EchoKV::WithRawCallbackMethod_DeleteSession<v1::EchoKV::WithRawCallbackMethod_InspectCache<
                    v1::EchoKV::WithRawCallbackMethod_Compress<v1::EchoKV::WithRawCallbackMethod_ExportSession<
                        v1::EchoKV::WithRawCallbackMethod_ImportSession<v1::EchoKV::Service>>>>>>>>>>>>;

class EchoKvService final : public EchoKvServiceBase {
 public:
  // `sessions`, `metrics` (may be null) and `tokens` (null = no authentication,
  // --insecure) must outlive the service.
  EchoKvService(Sessions* sessions, Metrics* metrics, const TokenStore* tokens = nullptr);

  using Unary = grpc::ServerUnaryReactor;
  using Stream = grpc::ServerWriteReactor<grpc::ByteBuffer>;
  Unary* GetServerInfo(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                       grpc::ByteBuffer* response) override;
  Stream* CreateSession(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) override;
  Stream* AppendToSession(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) override;
  Stream* Generate(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) override;
  Unary* ForkSession(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                     grpc::ByteBuffer* response) override;
  Unary* GetSession(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                    grpc::ByteBuffer* response) override;
  Unary* ListSessions(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                      grpc::ByteBuffer* response) override;
  Unary* DeleteSession(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                       grpc::ByteBuffer* response) override;
  Unary* InspectCache(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                      grpc::ByteBuffer* response) override;
  Unary* Compress(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                  grpc::ByteBuffer* response) override;
  Stream* ExportSession(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* ImportSession(grpc::CallbackServerContext* ctx,
                                                           grpc::ByteBuffer* response) override;

  // Calls of this service whose reactor lives (unary ones too; gRPC door only): main's
  // shutdown cuts idle connections once none is left.
  int calls_in_flight() const { return calls_.load(); }
  void OnCallStarted() { calls_.fetch_add(1); }
  void OnCallEnded() { calls_.fetch_sub(1); }

  // Shared with the reactors (service.cc).
  Metrics* metrics() const { return metrics_; }
  Sessions* sessions() const { return sessions_; }
  const TokenStore* tokens() const { return tokens_; }

 private:
  Sessions* sessions_;         // not owned
  Metrics* metrics_;           // not owned; may be null
  const TokenStore* tokens_;   // not owned; null = no authentication
  std::atomic<int> calls_{0};  // live reactors
};

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_DOORS_GRPC_SERVICE_H_
