// Bearer-token authentication of echokv-server's tenants (docs/SECURITY.md): the
// tokens file, constant-time verification of a presented token, each tenant's quotas,
// and reloading the file (SIGHUP). Both doors use it: the gRPC service (through
// TokenAuthProcessor, grpc_auth.h) and the HTTP API (CallerFromHttp). No gRPC here.
//
// The file holds one tenant per line: its name, the SHA-256 (hex) of its bearer token
// and optional quotas; '#' starts a comment, blank lines are skipped:
//
//   # tenant   sha256(token)                                                      quotas
//   acme       2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae  max_sessions=10
//   research   fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9  max_kv_bytes=1073741824 max_streams=4
//
//   ECHOKV_ASSIGN_OR_RETURN(std::unique_ptr<TokenStore> tokens, TokenStore::Load(path));
//   absl::StatusOr<AuthResult> who = tokens->VerifyAuthorization("Bearer s3cret");
//   if (!who.ok()) return who.status();   // UNAUTHENTICATED, never says which part failed
//   tokens->Reload();                      // on SIGHUP; a bad file keeps the old tenants
#ifndef ECHOKV_SERVER_DOORS_AUTH_H_
#define ECHOKV_SERVER_DOORS_AUTH_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/engine/tenant_quota.h"

namespace echokv::server {

struct TenantEntry {
  std::string name;                      // [A-Za-z0-9][A-Za-z0-9._-]{0,63}
  std::array<unsigned char, 32> digest;  // SHA-256 of the bearer token
  TenantQuota quota;
};

// Parses the contents of a tokens file. Errors are INVALID_ARGUMENT naming
// "<source>:<line>: " and what is wrong (never echoing a digest). Duplicate tenant
// names and duplicate digests are errors; an empty file is an error.
absl::StatusOr<std::vector<TenantEntry>> ParseTokensFile(absl::string_view text, absl::string_view source);

// SHA-256 of `data` (OpenSSL libcrypto).
std::array<unsigned char, 32> Sha256(absl::string_view data);
// Lowercase hex of a digest.
std::string DigestHex(const std::array<unsigned char, 32>& digest);

// Who a verified token belongs to.
struct AuthResult {
  std::string tenant;
  TenantQuota quota;
};

// The tenants of the tokens file, swapped atomically by Reload. Thread-safe.
class TokenStore {
 public:
  // Reads and parses `path`.
  static absl::StatusOr<std::unique_ptr<TokenStore>> Load(const std::string& path);
  // The same from entries (tests, embedded configurations); `path` may be "".
  static absl::StatusOr<std::unique_ptr<TokenStore>> FromEntries(std::vector<TenantEntry> entries);

  // Re-reads the file. On any error the current tenants stay and the error is
  // returned; on success tokens verified from now on use the new file (calls already
  // authenticated keep running).
  absl::Status Reload();

  // Verifies a bearer token: UNAUTHENTICATED for an unknown token. The comparison runs
  // over every tenant's digest with CRYPTO_memcmp, so its time does not depend on
  // which tenant (if any) matches.
  absl::StatusOr<AuthResult> VerifyToken(absl::string_view token) const;
  // Verifies an `authorization` header value "Bearer <token>" (scheme case-insensitive):
  // UNAUTHENTICATED when absent (""), malformed or unknown.
  absl::StatusOr<AuthResult> VerifyAuthorization(absl::string_view header) const;

  // The quota of `tenant` (zeros when unknown or "").
  TenantQuota QuotaOf(absl::string_view tenant) const;
  // Every tenant's quota (for the session store).
  absl::flat_hash_map<std::string, TenantQuota> Quotas() const;
  std::vector<std::string> TenantNames() const;
  int tenant_count() const;

 private:
  TokenStore(std::string path, std::vector<TenantEntry> entries);
  const std::string path_;  // "" when built from entries
  mutable absl::Mutex mu_;
  std::shared_ptr<const std::vector<TenantEntry>> entries_ ABSL_GUARDED_BY(mu_);  // swapped by Reload
};

// The UNAUTHENTICATED of a failed verification. `why` is one of a few fixed phrases
// (missing, malformed, unknown token): it never depends on which tenants exist.
absl::Status Unauthenticated(absl::string_view why);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_DOORS_AUTH_H_
