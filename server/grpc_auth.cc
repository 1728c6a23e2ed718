#include "server/grpc_auth.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace echokv::server {
namespace {

constexpr char kServicePrefix[] = "/echokv.v1.EchoKV/";

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::FailedPreconditionError(absl::StrCat("--", flag, ": cannot read ", path, ": ", std::strerror(errno)));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Number of certificates in a PEM text (0 when none parse).
int CountCertificates(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  int n = 0;
  while (X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    X509_free(x);
    ++n;
  }
  BIO_free(bio);
  return n;
}

}  // namespace

std::string MethodLabel(absl::string_view path) {
  static constexpr const char* kMethods[] = {"GetServerInfo", "CreateSession", "AppendToSession", "Generate",
                                             "ForkSession",   "GetSession",    "ListSessions",    "DeleteSession",
                                             "InspectCache",  "Compress",      "ExportSession",   "ImportSession"};
  if (!absl::StartsWith(path, kServicePrefix)) return "other";
  const absl::string_view name = path.substr(sizeof(kServicePrefix) - 1);
  for (const char* m : kMethods) {
    if (name == m) return m;
  }
  return "other";
}

grpc::Status TokenAuthProcessor::Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                                         OutputMetadata* consumed_auth_metadata, OutputMetadata* response_metadata) {
  absl::string_view path;
  if (auto it = auth_metadata.find(":path"); it != auth_metadata.end()) {
    path = absl::string_view(it->second.data(), it->second.size());
  }
  if (absl::StartsWith(path, kHealthServicePrefix)) return grpc::Status::OK;
  absl::string_view header;
  if (auto it = auth_metadata.find("authorization"); it != auth_metadata.end()) {
    header = absl::string_view(it->second.data(), it->second.size());
    // The token stops here: handlers never see it.
    consumed_auth_metadata->insert(std::make_pair(std::string(it->first.data(), it->first.size()),
                                                  std::string(it->second.data(), it->second.size())));
  }
  absl::StatusOr<AuthResult> who = tokens_->VerifyAuthorization(header);
  if (!who.ok()) {
    if (metrics_ != nullptr) metrics_->OnRequest(MethodLabel(path), "UNAUTHENTICATED");
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(who.status().message()));
  }
  context->AddProperty(kTenantProperty, who->tenant);
  context->SetPeerIdentityPropertyName(kTenantProperty);
  return grpc::Status::OK;
}

absl::StatusOr<Caller> CallerFromGrpc(const grpc::ServerContextBase& ctx, const TokenStore* tokens) {
  if (tokens == nullptr) return Caller{};
  if (std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context(); auth != nullptr) {
    std::vector<grpc::string_ref> tenant = auth->FindPropertyValues(kTenantProperty);
    if (!tenant.empty()) return Caller{std::string(tenant.front().data(), tenant.front().size())};
  }
  absl::string_view header;
  const auto& md = ctx.client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) header = absl::string_view(it->second.data(), it->second.size());
  absl::StatusOr<AuthResult> who = tokens->VerifyAuthorization(header);
  if (!who.ok()) return who.status();
  return Caller{who->tenant};
}

absl::Status ValidateTlsFiles(const TlsFiles& tls) {
  if (!tls.enabled()) return absl::OkStatus();
  if (tls.cert.empty() || tls.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together (and --tls_client_ca needs both)");
  }
  if (tls.refresh_seconds < 1) return absl::InvalidArgumentError("--tls_refresh_interval must be >= 1s");
  absl::StatusOr<std::string> cert = ReadPem("tls_cert", tls.cert);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem("tls_key", tls.key);
  if (!key.ok()) return key.status();
  BIO* cbio = BIO_new_mem_buf(cert->data(), static_cast<int>(cert->size()));
  X509* x509 = PEM_read_bio_X509(cbio, nullptr, nullptr, nullptr);
  BIO_free(cbio);
  if (x509 == nullptr) return absl::InvalidArgumentError(absl::StrCat("--tls_cert: ", tls.cert, " holds no PEM certificate"));
  BIO* kbio = BIO_new_mem_buf(key->data(), static_cast<int>(key->size()));
  EVP_PKEY* pkey = PEM_read_bio_PrivateKey(kbio, nullptr, nullptr, nullptr);
  BIO_free(kbio);
  const bool matches = pkey != nullptr && X509_check_private_key(x509, pkey) == 1;
  X509_free(x509);
  EVP_PKEY_free(pkey);
  if (!matches) {
    return absl::InvalidArgumentError(absl::StrCat("--tls_key: ", tls.key,
                                                   " is not an unencrypted PEM private key of the --tls_cert certificate"));
  }
  if (!tls.client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem("tls_client_ca", tls.client_ca);
    if (!ca.ok()) return ca.status();
    if (CountCertificates(*ca) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--tls_client_ca: ", tls.client_ca, " holds no PEM certificate"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsFiles& tls, std::shared_ptr<grpc::AuthMetadataProcessor> processor) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  if (absl::Status s = ValidateTlsFiles(tls); !s.ok()) return s;
  // The provider re-reads the files every refresh_seconds and hands new certificates
  // to new handshakes; established connections keep theirs.
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  if (tls.client_ca.empty()) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        tls.key, tls.cert, static_cast<unsigned int>(tls.refresh_seconds));
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        tls.key, tls.cert, tls.client_ca, static_cast<unsigned int>(tls.refresh_seconds));
  }
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (tls.client_ca.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::experimental::TlsServerCredentials(options);
  if (creds == nullptr) return absl::InternalError("grpc: cannot build TLS server credentials");
  if (processor != nullptr) creds->SetAuthMetadataProcessor(processor);
  return creds;
}

}  // namespace echokv::server
