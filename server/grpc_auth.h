// The gRPC door of authentication (docs/SECURITY.md): TokenAuthProcessor checks the
// `authorization: Bearer …` metadata of every call on a TLS port with gRPC's own
// AuthMetadataProcessor and puts the tenant in the call's AuthContext;
// CallerFromGrpc reads it back in the service (on a plaintext port, where gRPC 1.51
// cannot run a processor, it verifies the metadata itself with the same TokenStore).
// ServerCredentialsFor builds TLS / mTLS credentials that re-read the certificate
// files while the server runs.
//
//   auto processor = std::make_shared<TokenAuthProcessor>(tokens.get(), metrics.get());
//   ECHOKV_ASSIGN_OR_RETURN(auto creds, ServerCredentialsFor(tls, processor));
//   builder.AddListeningPort(address, creds, &port);
//   // in a handler:
//   absl::StatusOr<Caller> caller = CallerFromGrpc(*ctx, tokens.get());
#ifndef ECHOKV_SERVER_GRPC_AUTH_H_
#define ECHOKV_SERVER_GRPC_AUTH_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/auth.h"
#include "server/engine.h"
#include "server/metrics.h"

namespace echokv::server {

// The AuthContext property holding the authenticated tenant.
inline constexpr char kTenantProperty[] = "echokv.tenant";
// Calls of this service need no token (kubelet probes and load balancers send none).
inline constexpr char kHealthServicePrefix[] = "/grpc.health.v1.Health/";

class TokenAuthProcessor : public grpc::AuthMetadataProcessor {
 public:
  // `tokens` must outlive the processor; `metrics` (may be null) counts refusals in
  // echokv_requests_total (method from the call's path, code UNAUTHENTICATED).
  TokenAuthProcessor(const TokenStore* tokens, Metrics* metrics) : tokens_(tokens), metrics_(metrics) {}
  // Verification is a SHA-256 and a few constant-time compares: no I/O, so it runs on
  // gRPC's own thread.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata, OutputMetadata* response_metadata) override;

 private:
  const TokenStore* tokens_;  // not owned
  Metrics* metrics_;          // not owned; may be null
};

// The tenant of a call: Caller{""} when `tokens` is null (--insecure); else the
// tenant the processor put in the AuthContext, or (plaintext port) the tenant of the
// call's bearer token. UNAUTHENTICATED otherwise.
absl::StatusOr<Caller> CallerFromGrpc(const grpc::ServerContextBase& ctx, const TokenStore* tokens);

// The method name of an echokv.v1.EchoKV path for metrics ("Generate"), "other"
// for anything else (bounded label values).
std::string MethodLabel(absl::string_view path);

struct TlsFiles {
  std::string cert;       // PEM certificate chain of the server
  std::string key;        // PEM private key
  std::string client_ca;  // PEM CA bundle; set = mTLS (client certificates required)
  int refresh_seconds = 60;  // how often the files are re-read
  bool enabled() const { return !cert.empty() || !key.empty() || !client_ca.empty(); }
};

// Checks the files now (readable, PEM, the key matches the certificate, the CA
// bundle holds certificates) so a bad path fails at start with a clear error.
absl::Status ValidateTlsFiles(const TlsFiles& tls);

// Insecure credentials without TLS; TLS (mTLS with client_ca) credentials watching
// the files otherwise, with `processor` (may be null) installed.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsFiles& tls, std::shared_ptr<grpc::AuthMetadataProcessor> processor);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_GRPC_AUTH_H_
