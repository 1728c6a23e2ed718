#include "server/doors/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace echokv::server {
namespace {

bool IsTenantChar(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'; }

bool ValidTenantName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  if (!absl::ascii_isalnum(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), IsTenantChar);
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool ParseDigest(absl::string_view hex, std::array<unsigned char, 32>* out) {
  if (hex.size() != 64) return false;
  for (size_t i = 0; i < 32; ++i) {
    const int hi = HexValue(hex[2 * i]);
    const int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

// One "key=value" quota; the value a positive integer.
absl::Status ParseQuota(absl::string_view item, TenantQuota* q) {
  const size_t eq = item.find('=');
  if (eq == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("expected key=value, got '", item.substr(0, 40), "'"));
  }
  const absl::string_view key = item.substr(0, eq);
  const absl::string_view value = item.substr(eq + 1);
  int64_t v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": expected a positive integer, got '", value.substr(0, 40), "'"));
  }
  const bool is_int = key == "max_sessions" || key == "max_streams";
  if (is_int && v > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": ", v, " is too large"));
  }
  if (key == "max_sessions") {
    q->max_sessions = static_cast<int>(v);
  } else if (key == "max_streams") {
    q->max_streams = static_cast<int>(v);
  } else if (key == "max_kv_bytes") {
    q->max_kv_bytes = v;
  } else if (key == "max_cold_bytes") {
    q->max_cold_bytes = v;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown quota '", key.substr(0, 40),
                                                   "'; one of max_sessions, max_kv_bytes, max_cold_bytes, "
                                                   "max_streams"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("--auth_tokens_file: cannot read ", path, ": ", std::strerror(errno)));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

absl::Status Unauthenticated(absl::string_view why) {
  return absl::UnauthenticatedError(
      absl::StrCat(why, ": send 'authorization: Bearer <token>' with a token of the server's tokens file"));
}

std::array<unsigned char, 32> Sha256(absl::string_view data) {
  std::array<unsigned char, 32> out{};
  unsigned int len = 0;
  // EVP_Digest only fails on allocation failure; the digest is then all zeros, which
  // matches no tenant (a file line of 64 zeros is refused by ParseTokensFile).
  if (EVP_Digest(data.data(), data.size(), out.data(), &len, EVP_sha256(), nullptr) != 1 || len != 32) {
    out.fill(0);
  }
  return out;
}

std::string DigestHex(const std::array<unsigned char, 32>& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < 32; ++i) {
    s[2 * i] = kHex[digest[i] >> 4];
    s[2 * i + 1] = kHex[digest[i] & 15];
  }
  return s;
}

absl::StatusOr<std::vector<TenantEntry>> ParseTokensFile(absl::string_view text, absl::string_view source) {
  std::vector<TenantEntry> entries;
  absl::flat_hash_set<std::string> names;
  absl::flat_hash_set<std::string> digests;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    auto fail = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": ", what));
    };
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    if (fields.size() < 2) return fail("expected '<tenant> <sha256 hex of the token> [quota=value ...]'");
    TenantEntry e;
    if (!ValidTenantName(fields[0])) {
      return fail(absl::StrCat("tenant name '", fields[0].substr(0, 64),
                               "' must be 1-64 characters of [A-Za-z0-9._-], starting with a letter or digit"));
    }
    e.name = std::string(fields[0]);
    if (!ParseDigest(fields[1], &e.digest)) {
      // Never echo the field: it may be a token pasted by mistake.
      return fail(absl::StrCat("tenant '", e.name, "': the second field must be the SHA-256 of the token as 64 hex "
                               "digits (printf %s TOKEN | sha256sum), got ", fields[1].size(), " characters"));
    }
    if (std::all_of(e.digest.begin(), e.digest.end(), [](unsigned char c) { return c == 0; })) {
      return fail(absl::StrCat("tenant '", e.name, "': an all-zero digest is not a SHA-256 of any token"));
    }
    for (size_t i = 2; i < fields.size(); ++i) {
      if (absl::Status s = ParseQuota(fields[i], &e.quota); !s.ok()) {
        return fail(absl::StrCat("tenant '", e.name, "': ", s.message()));
      }
    }
    if (!names.insert(e.name).second) return fail(absl::StrCat("tenant '", e.name, "' is listed twice"));
    if (!digests.insert(DigestHex(e.digest)).second) {
      return fail(absl::StrCat("tenant '", e.name, "' has the same token digest as an earlier tenant"));
    }
    entries.push_back(std::move(e));
  }
  if (entries.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no tenants"));
  return entries;
}

TokenStore::TokenStore(std::string path, std::vector<TenantEntry> entries)
    : path_(std::move(path)), entries_(std::make_shared<const std::vector<TenantEntry>>(std::move(entries))) {}

absl::StatusOr<std::unique_ptr<TokenStore>> TokenStore::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<TenantEntry>> entries = ParseTokensFile(*text, path);
  if (!entries.ok()) return entries.status();
  return std::unique_ptr<TokenStore>(new TokenStore(path, std::move(*entries)));
}

absl::StatusOr<std::unique_ptr<TokenStore>> TokenStore::FromEntries(std::vector<TenantEntry> entries) {
  if (entries.empty()) return absl::InvalidArgumentError("tokens: no tenants");
  return std::unique_ptr<TokenStore>(new TokenStore("", std::move(entries)));
}

absl::Status TokenStore::Reload() {
  if (path_.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> text = ReadFile(path_);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<TenantEntry>> entries = ParseTokensFile(*text, path_);
  if (!entries.ok()) return entries.status();
  auto fresh = std::make_shared<const std::vector<TenantEntry>>(std::move(*entries));
  absl::MutexLock lock(&mu_);
  entries_ = std::move(fresh);
  return absl::OkStatus();
}

absl::StatusOr<AuthResult> TokenStore::VerifyToken(absl::string_view token) const {
  if (token.empty()) return Unauthenticated("empty bearer token");
  const std::array<unsigned char, 32> digest = Sha256(token);
  std::shared_ptr<const std::vector<TenantEntry>> entries;
  {
    absl::MutexLock lock(&mu_);
    entries = entries_;
  }
  // Every digest is compared (no early exit), each in constant time.
  const TenantEntry* match = nullptr;
  for (const TenantEntry& e : *entries) {
    const bool equal = CRYPTO_memcmp(e.digest.data(), digest.data(), digest.size()) == 0;
    if (equal) match = &e;
  }
  if (match == nullptr) return Unauthenticated("invalid bearer token");
  return AuthResult{match->name, match->quota};
}

absl::StatusOr<AuthResult> TokenStore::VerifyAuthorization(absl::string_view header) const {
  if (header.empty()) return Unauthenticated("missing bearer token");
  absl::string_view v = absl::StripAsciiWhitespace(header);
  constexpr absl::string_view kScheme = "bearer ";
  if (v.size() <= kScheme.size() || !absl::EqualsIgnoreCase(v.substr(0, kScheme.size()), kScheme)) {
    return Unauthenticated("malformed authorization header (expected the Bearer scheme)");
  }
  return VerifyToken(absl::StripLeadingAsciiWhitespace(v.substr(kScheme.size())));
}

TenantQuota TokenStore::QuotaOf(absl::string_view tenant) const {
  absl::MutexLock lock(&mu_);
  for (const TenantEntry& e : *entries_) {
    if (e.name == tenant) return e.quota;
  }
  return TenantQuota{};
}

absl::flat_hash_map<std::string, TenantQuota> TokenStore::Quotas() const {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<std::string, TenantQuota> out;
  for (const TenantEntry& e : *entries_) out[e.name] = e.quota;
  return out;
}

std::vector<std::string> TokenStore::TenantNames() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const TenantEntry& e : *entries_) out.push_back(e.name);
  return out;
}

int TokenStore::tenant_count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(entries_->size());
}

}  // namespace echokv::server
