// The gRPC door of authentication (docs/SECURITY.md): TokenAuthProcessor checks the
// `authorization: Bearer …` metadata of every call on a TLS port with gRPC's own
// AuthMetadataProcessor and puts the tenant in the call's AuthContext;
// CallerFromGrpc reads it back in the service (on a plaintext port, where gRPC 1.51
// cannot run a processor, it verifies the metadata itself with the same TokenStore).
// ServerCredentialsFor builds TLS / mTLS credentials that re-read the certificate
// files while the server runs and keep the last good pair when a re-read finds a bad
// one (an empty, truncated or mismatched file: what a non-atomic rotation shows for a
// moment).
//
//   auto processor = std::make_shared<TokenAuthProcessor>(tokens.get(), metrics.get());
//   ECHOKV_ASSIGN_OR_RETURN(auto creds, ServerCredentialsFor(tls, processor));
//   builder.AddListeningPort(address, creds, &port);
//   // in a handler:
//   absl::StatusOr<Caller> caller = CallerFromGrpc(*ctx, tokens.get());
#ifndef ECHOKV_SERVER_DOORS_GRPC_GRPC_AUTH_H_
#define ECHOKV_SERVER_DOORS_GRPC_GRPC_AUTH_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/doors/auth.h"
#include "server/engine/engine.h"
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

// The PEM texts of one usable set of TLS files.
struct TlsMaterial {
  std::string cert;
  std::string key;
  std::string client_ca;  // "" without mTLS
  bool operator==(const TlsMaterial& o) const { return cert == o.cert && key == o.key && client_ca == o.client_ca; }
};

// Reads the files and checks them: readable, the certificate file holds certificates
// and nothing damaged after them, the key is an unencrypted PEM private key of the
// first certificate, the CA bundle (when set) holds certificates. Errors name the flag
// and the path (for the server's log; never sent to a client).
absl::StatusOr<TlsMaterial> LoadTlsMaterial(const TlsFiles& tls);

// Checks the flags and LoadTlsMaterial now, so a bad path fails at start with a clear
// error.
absl::Status ValidateTlsFiles(const TlsFiles& tls);

// Insecure credentials without TLS. With TLS (mTLS with client_ca): credentials whose
// own thread re-reads the files every refresh_seconds; a set that passes
// LoadTlsMaterial and differs from the current one is handed to gRPC for new
// handshakes (established connections keep theirs); a set that fails is logged,
// counted in echokv_tls_reload_failures_total (`metrics`, may be null) and changes
// nothing: the last good certificate and key stay in use and the files are tried
// again at the next interval. `processor` (may be null) is installed on the port.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsFiles& tls, std::shared_ptr<grpc::AuthMetadataProcessor> processor, Metrics* metrics = nullptr);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_DOORS_GRPC_GRPC_AUTH_H_
