#include "server/doors/grpc/grpc_auth.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpcpp/security/server_credentials.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status_macros.h"

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

// Number of certificates in a PEM text (0 when none parse); an error when something
// after them is not a certificate block that parses (a file cut short mid-chain).
absl::StatusOr<int> CountCertificates(const std::string& pem) {
  ERR_clear_error();
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  int n = 0;
  while (X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    X509_free(x);
    ++n;
  }
  BIO_free(bio);
  const unsigned long err = ERR_peek_last_error();
  ERR_clear_error();
  // The loop ends with "no start line" at the end of the text; anything else is damage.
  if (n > 0 && err != 0 && !(ERR_GET_LIB(err) == ERR_LIB_PEM && ERR_GET_REASON(err) == PEM_R_NO_START_LINE)) {
    return absl::InvalidArgumentError(absl::StrCat("a damaged PEM block after certificate ", n));
  }
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

absl::StatusOr<TlsMaterial> LoadTlsMaterial(const TlsFiles& tls) {
  TlsMaterial m;
  ECHOKV_ASSIGN_OR_RETURN(m.cert, ReadPem("tls_cert", tls.cert));
  ECHOKV_ASSIGN_OR_RETURN(m.key, ReadPem("tls_key", tls.key));
  absl::StatusOr<int> certs = CountCertificates(m.cert);
  if (!certs.ok()) return absl::InvalidArgumentError(absl::StrCat("--tls_cert: ", tls.cert, ": ", certs.status().message()));
  if (*certs == 0) return absl::InvalidArgumentError(absl::StrCat("--tls_cert: ", tls.cert, " holds no PEM certificate"));
  BIO* cbio = BIO_new_mem_buf(m.cert.data(), static_cast<int>(m.cert.size()));
  X509* x509 = PEM_read_bio_X509(cbio, nullptr, nullptr, nullptr);
  BIO_free(cbio);
  BIO* kbio = BIO_new_mem_buf(m.key.data(), static_cast<int>(m.key.size()));
  EVP_PKEY* pkey = PEM_read_bio_PrivateKey(kbio, nullptr, nullptr, nullptr);
  BIO_free(kbio);
  const bool matches = x509 != nullptr && pkey != nullptr && X509_check_private_key(x509, pkey) == 1;
  X509_free(x509);
  EVP_PKEY_free(pkey);
  ERR_clear_error();  // X509_check_private_key queues an error on a mismatch
  if (!matches) {
    return absl::InvalidArgumentError(absl::StrCat("--tls_key: ", tls.key,
                                                   " is not an unencrypted PEM private key of the --tls_cert certificate"));
  }
  if (!tls.client_ca.empty()) {
    ECHOKV_ASSIGN_OR_RETURN(m.client_ca, ReadPem("tls_client_ca", tls.client_ca));
    absl::StatusOr<int> cas = CountCertificates(m.client_ca);
    if (!cas.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--tls_client_ca: ", tls.client_ca, ": ", cas.status().message()));
    }
    if (*cas == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--tls_client_ca: ", tls.client_ca, " holds no PEM certificate"));
    }
  }
  return m;
}

absl::Status ValidateTlsFiles(const TlsFiles& tls) {
  if (!tls.enabled()) return absl::OkStatus();
  if (tls.cert.empty() || tls.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together (and --tls_client_ca needs both)");
  }
  if (tls.refresh_seconds < 1) return absl::InvalidArgumentError("--tls_refresh_interval must be >= 1s");
  return LoadTlsMaterial(tls).status();
}

namespace {

// The TLS files as gRPC's SSL credentials see them: the last set that passed
// LoadTlsMaterial. Its thread re-reads the files every refresh_seconds; gRPC asks
// Fetch at every new handshake and gets a new config only when the set changed. gRPC
// never reads the files itself, so an empty or half-written file never reaches it
// (FileWatcherCertificateProvider handed an empty file to the handshaker factory,
// which aborted the process).
class TlsReloader {
 public:
  TlsReloader(TlsFiles files, TlsMaterial initial, Metrics* metrics)
      : files_(std::move(files)), metrics_(metrics), current_(std::move(initial)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~TlsReloader() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  TlsReloader(const TlsReloader&) = delete;
  TlsReloader& operator=(const TlsReloader&) = delete;

  // grpc_ssl_server_certificate_config_callback: the first call (port creation) and
  // every call after a change get the current set.
  static grpc_ssl_certificate_config_reload_status Fetch(void* self, grpc_ssl_server_certificate_config** config) {
    auto* r = static_cast<TlsReloader*>(self);
    absl::MutexLock lock(&r->mu_);
    if (r->handed_ == r->generation_) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
    grpc_ssl_pem_key_cert_pair pair{r->current_.key.c_str(), r->current_.cert.c_str()};
    // grpc_ssl_server_certificate_config_create copies the strings. gRPC 1.51 asserts
    // that a fetched config has roots even when no client certificate is requested;
    // then they are never used (no CertificateRequest is sent), so the server's own
    // chain stands in.
    const std::string& roots = r->current_.client_ca.empty() ? r->current_.cert : r->current_.client_ca;
    *config = grpc_ssl_server_certificate_config_create(roots.c_str(), &pair, 1);
    if (*config == nullptr) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
    r->handed_ = r->generation_;
    return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
  }

 private:
  void Loop() {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Seconds(files_.refresh_seconds));
        if (stop_) return;
      }
      Reload();
    }
  }

  void Reload() {
    absl::StatusOr<TlsMaterial> fresh = LoadTlsMaterial(files_);
    if (!fresh.ok()) {
      if (metrics_ != nullptr) metrics_->OnTlsReloadFailure();
      ECHOKV_LOG(ERROR) << "TLS files not reloaded, the last good certificate and key stay in use (next try in "
                        << files_.refresh_seconds << " s): " << fresh.status().message();
      return;
    }
    absl::MutexLock lock(&mu_);
    if (*fresh == current_) return;
    current_ = std::move(*fresh);
    ++generation_;
    ECHOKV_LOG(INFO) << "TLS: new certificate, key or client CA from " << files_.cert << " / " << files_.key
                     << (files_.client_ca.empty() ? "" : " / ") << files_.client_ca << ": used for new connections";
  }

  const TlsFiles files_;
  Metrics* const metrics_;  // not owned; may be null
  absl::Mutex mu_;
  TlsMaterial current_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t handed_ ABSL_GUARDED_BY(mu_) = 0;  // the generation gRPC has
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// grpc::AuthContext over the core's context of a call being authenticated (what
// gRPC's own C++ wrapper, not installed with the headers, does).
class CoreAuthContext : public grpc::AuthContext {
 public:
  explicit CoreAuthContext(grpc_auth_context* ctx) : ctx_(ctx) {}
  bool IsPeerAuthenticated() const override { return grpc_auth_context_peer_is_authenticated(ctx_) != 0; }
  std::vector<grpc::string_ref> GetPeerIdentity() const override {
    return Values(grpc_auth_context_peer_identity(ctx_));
  }
  std::string GetPeerIdentityPropertyName() const override {
    const char* name = grpc_auth_context_peer_identity_property_name(ctx_);
    return name == nullptr ? "" : name;
  }
  std::vector<grpc::string_ref> FindPropertyValues(const std::string& name) const override {
    return Values(grpc_auth_context_find_properties_by_name(ctx_, name.c_str()));
  }
  grpc::AuthPropertyIterator begin() const override {
    grpc_auth_property_iterator it = grpc_auth_context_property_iterator(ctx_);
    const grpc_auth_property* first = grpc_auth_property_iterator_next(&it);
    return Iterator(first, &it);
  }
  grpc::AuthPropertyIterator end() const override { return Iterator(); }
  void AddProperty(const std::string& key, const grpc::string_ref& value) override {
    grpc_auth_context_add_property(ctx_, key.c_str(), value.data(), value.size());
  }
  bool SetPeerIdentityPropertyName(const std::string& name) override {
    return grpc_auth_context_set_peer_identity_property_name(ctx_, name.c_str()) != 0;
  }

 private:
  // AuthPropertyIterator's constructors are protected.
  struct Iterator : grpc::AuthPropertyIterator {
    Iterator() = default;
    Iterator(const grpc_auth_property* p, const grpc_auth_property_iterator* it) : grpc::AuthPropertyIterator(p, it) {}
  };
  static std::vector<grpc::string_ref> Values(grpc_auth_property_iterator it) {
    std::vector<grpc::string_ref> out;
    while (const grpc_auth_property* p = grpc_auth_property_iterator_next(&it)) out.emplace_back(p->value, p->value_length);
    return out;
  }
  grpc_auth_context* ctx_;  // not owned
};

grpc::string_ref SliceRef(const grpc_slice& s) {
  return grpc::string_ref(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)), GRPC_SLICE_LENGTH(s));
}

std::vector<grpc_metadata> ToCore(const grpc::AuthMetadataProcessor::OutputMetadata& md) {
  std::vector<grpc_metadata> out;
  for (const auto& [key, value] : md) {
    grpc_metadata m{};
    m.key = grpc_slice_from_static_buffer(key.data(), key.size());  // `md` outlives the callback
    m.value = grpc_slice_from_static_buffer(value.data(), value.size());
    out.push_back(m);
  }
  return out;
}

// grpc_auth_metadata_processor running a (non-blocking) grpc::AuthMetadataProcessor.
void ProcessOnCore(void* state, grpc_auth_context* context, const grpc_metadata* md, size_t num_md,
                   grpc_process_auth_metadata_done_cb cb, void* user_data) {
  auto* processor = static_cast<std::shared_ptr<grpc::AuthMetadataProcessor>*>(state);
  grpc::AuthMetadataProcessor::InputMetadata input;
  for (size_t i = 0; i < num_md; ++i) input.insert(std::make_pair(SliceRef(md[i].key), SliceRef(md[i].value)));
  CoreAuthContext ctx(context);
  grpc::AuthMetadataProcessor::OutputMetadata consumed;
  grpc::AuthMetadataProcessor::OutputMetadata response;
  const grpc::Status status = (*processor)->Process(input, &ctx, &consumed, &response);
  std::vector<grpc_metadata> consumed_md = ToCore(consumed);
  std::vector<grpc_metadata> response_md = ToCore(response);
  cb(user_data, consumed_md.empty() ? nullptr : consumed_md.data(), consumed_md.size(),
     response_md.empty() ? nullptr : response_md.data(), response_md.size(),
     static_cast<grpc_status_code>(status.error_code()), status.error_message().c_str());
}

void DestroyProcessor(void* state) { delete static_cast<std::shared_ptr<grpc::AuthMetadataProcessor>*>(state); }

// SSL server credentials with a certificate config fetcher (gRPC's C API; the C++ API
// of 1.51 has no fetcher), built when the server adds the port. The reloader lives as
// long as these credentials (main keeps them beyond the server).
class ReloadingTlsCredentials final : public grpc::ServerCredentials {
 public:
  ReloadingTlsCredentials(std::unique_ptr<TlsReloader> reloader, bool require_client_certificate)
      : reloader_(std::move(reloader)), require_client_certificate_(require_client_certificate) {}
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>& processor) override {
    processor_ = processor;
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    grpc_ssl_server_credentials_options* options = grpc_ssl_server_credentials_create_options_using_config_fetcher(
        require_client_certificate_ ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                    : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        &TlsReloader::Fetch, reloader_.get());
    grpc_server_credentials* creds = grpc_ssl_server_credentials_create_with_options(options);  // owns options
    if (creds == nullptr) return 0;
    if (processor_ != nullptr) {
      grpc_server_credentials_set_auth_metadata_processor(
          creds, {&ProcessOnCore, &DestroyProcessor, new std::shared_ptr<grpc::AuthMetadataProcessor>(processor_)});
    }
    const int port = grpc_server_add_http2_port(server, addr.c_str(), creds);
    grpc_server_credentials_release(creds);
    return port;
  }

  std::unique_ptr<TlsReloader> reloader_;
  const bool require_client_certificate_;
  std::shared_ptr<grpc::AuthMetadataProcessor> processor_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsFiles& tls, std::shared_ptr<grpc::AuthMetadataProcessor> processor, Metrics* metrics) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  if (absl::Status s = ValidateTlsFiles(tls); !s.ok()) return s;
  ECHOKV_ASSIGN_OR_RETURN(TlsMaterial initial, LoadTlsMaterial(tls));
  auto creds = std::make_shared<ReloadingTlsCredentials>(std::make_unique<TlsReloader>(tls, std::move(initial), metrics),
                                                         !tls.client_ca.empty());
  if (processor != nullptr) creds->SetAuthMetadataProcessor(processor);
  return creds;
}

}  // namespace echokv::server
