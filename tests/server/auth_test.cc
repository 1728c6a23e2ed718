// The tokens file and bearer-token verification (server/doors/auth.h), and the fair stream
// slots (server/sessions/stream_slots.h). Digests are checked against Debian's sha256sum (an
// independent implementation) and the FIPS 180-2 test vector.
#include "server/doors/auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "server/sessions/stream_slots.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::server {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

// sha256sum of `text` from the coreutils binary (not our code).
std::string Sha256sum(const std::string& text) {
  const std::string dir = ::echokv::testing::MakeTempDir("echokv_auth_test");
  const std::string path = dir + "/in";
  ::echokv::testing::WriteFileOrDie(path, text);
  FILE* p = popen(("sha256sum " + path).c_str(), "r");
  char buf[65] = {};
  const size_t n = fread(buf, 1, 64, p);
  pclose(p);
  return std::string(buf, n);
}

TEST(Sha256Test, MatchesTheStandardVectorAndSha256sum) {
  EXPECT_EQ(DigestHex(Sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  for (const std::string& t : std::vector<std::string>{"s3cret", "", "a token with spaces", std::string(1000, 'x')}) {
    EXPECT_EQ(DigestHex(Sha256(t)), Sha256sum(t)) << t;
  }
}

std::string Line(const std::string& tenant, const std::string& token, const std::string& rest = "") {
  return tenant + " " + DigestHex(Sha256(token)) + (rest.empty() ? "" : " " + rest) + "\n";
}

TEST(TokensFileTest, ParsesTenantsQuotasCommentsAndBlankLines) {
  const std::string text = "# tenants of the test\n\n" + Line("acme", "tok-a", "max_sessions=10 max_streams=3") +
                           "   \t\n" + Line("research.lab_2", "tok-r", "max_kv_bytes=1073741824 max_cold_bytes=5") +
                           "solo " + DigestHex(Sha256("tok-s")) + "   # trailing comment\n";
  absl::StatusOr<std::vector<TenantEntry>> e = ParseTokensFile(text, "tokens.txt");
  ASSERT_THAT(e.status(), IsOk());
  ASSERT_EQ(e->size(), 3u);
  EXPECT_EQ((*e)[0].name, "acme");
  EXPECT_EQ((*e)[0].quota.max_sessions, 10);
  EXPECT_EQ((*e)[0].quota.max_streams, 3);
  EXPECT_EQ((*e)[0].quota.max_kv_bytes, 0);
  EXPECT_EQ((*e)[1].name, "research.lab_2");
  EXPECT_EQ((*e)[1].quota.max_kv_bytes, int64_t{1} << 30);
  EXPECT_EQ((*e)[1].quota.max_cold_bytes, 5);
  EXPECT_EQ((*e)[2].name, "solo");
  EXPECT_EQ((*e)[2].quota, TenantQuota{});
}

TEST(TokensFileTest, ErrorsNameTheLineAndNeverEchoTheSecretField) {
  const std::string good = Line("a", "x");
  struct Case {
    std::string text;
    std::string message;
  };
  const Case cases[] = {
      {"", "f: no tenants"},
      {"# only a comment\n", "f: no tenants"},
      {good + "lonely\n", "f:2: expected '<tenant> <sha256"},
      {good + "b not-a-digest-my-secret-token\n", "f:2: tenant 'b': the second field must be the SHA-256"},
      {good + "-bad " + DigestHex(Sha256("y")) + "\n", "f:2: tenant name '-bad'"},
      {good + "b/c " + DigestHex(Sha256("y")) + "\n", "f:2: tenant name 'b/c'"},
      {good + Line("b", "y", "max_sessions=0"), "f:2: tenant 'b': max_sessions: expected a positive integer"},
      {good + Line("b", "y", "max_streams=99999999999"), "f:2: tenant 'b': max_streams: 99999999999 is too large"},
      {good + Line("b", "y", "max_bogus=1"), "f:2: tenant 'b': unknown quota 'max_bogus'"},
      {good + Line("b", "y", "max_sessions"), "f:2: tenant 'b': expected key=value"},
      {good + Line("a", "y"), "f:2: tenant 'a' is listed twice"},
      {good + Line("b", "x"), "f:2: tenant 'b' has the same token digest"},
      {"z " + std::string(64, '0') + "\n", "f:1: tenant 'z': an all-zero digest"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<TenantEntry>> e = ParseTokensFile(c.text, "f");
    EXPECT_THAT(e.status(), StatusIs(absl::StatusCode::kInvalidArgument, c.message)) << c.text;
    EXPECT_THAT(std::string(e.status().message()), Not(HasSubstr("my-secret-token")));
  }
}

TEST(TokenStoreTest, VerifiesBearerTokensAndRefusesEverythingElse) {
  ASSERT_OK_AND_ASSIGN(std::vector<TenantEntry> entries,
                       ParseTokensFile(Line("acme", "tok-a", "max_streams=2") + Line("beta", "tok-b"), "f"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TokenStore> store, TokenStore::FromEntries(std::move(entries)));
  ASSERT_OK_AND_ASSIGN(AuthResult a, store->VerifyAuthorization("Bearer tok-a"));
  EXPECT_EQ(a.tenant, "acme");
  EXPECT_EQ(a.quota.max_streams, 2);
  ASSERT_OK_AND_ASSIGN(AuthResult b, store->VerifyAuthorization("bearer   tok-b "));
  EXPECT_EQ(b.tenant, "beta");
  const std::vector<std::string> refused = {"",      "Bearer",        "Bearer ",     "Basic dG9rLWE=", "tok-a",
                                            "Bearer tok-a2", "Bearer tok-", "Bearer TOK-A", "Bearertok-a"};
  for (const std::string& h : refused) {
    EXPECT_THAT(store->VerifyAuthorization(h).status(), StatusIs(absl::StatusCode::kUnauthenticated, "")) << h;
  }
  EXPECT_THAT(store->VerifyAuthorization("").status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "missing bearer token"));
  EXPECT_THAT(store->VerifyAuthorization("Bearer nope").status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "invalid bearer token"));
  EXPECT_EQ(store->QuotaOf("acme").max_streams, 2);
  EXPECT_EQ(store->QuotaOf("nobody"), TenantQuota{});
  EXPECT_EQ(store->tenant_count(), 2);
}

TEST(TokenStoreTest, ReloadSwapsTenantsAndKeepsThemOnABadFile) {
  const std::string path = ::echokv::testing::MakeTempDir("echokv_auth_test") + "/tokens";
  ::echokv::testing::WriteFileOrDie(path, Line("old", "t1"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TokenStore> store, TokenStore::Load(path));
  EXPECT_THAT(store->VerifyToken("t1").status(), IsOk());
  ::echokv::testing::WriteFileOrDie(path, Line("new", "t2", "max_sessions=1"));
  ASSERT_THAT(store->Reload(), IsOk());
  EXPECT_THAT(store->VerifyToken("t1").status(), StatusIs(absl::StatusCode::kUnauthenticated, ""));
  ASSERT_OK_AND_ASSIGN(AuthResult r, store->VerifyToken("t2"));
  EXPECT_EQ(r.tenant, "new");
  // A broken file is reported with its line and the tenants stay as they were.
  ::echokv::testing::WriteFileOrDie(path, Line("x", "t3") + "oops\n");
  EXPECT_THAT(store->Reload(), StatusIs(absl::StatusCode::kInvalidArgument, path + ":2:"));
  EXPECT_THAT(store->VerifyToken("t2").status(), IsOk());
  std::remove(path.c_str());
  EXPECT_THAT(store->Reload(), StatusIs(absl::StatusCode::kFailedPrecondition, "cannot read"));
  EXPECT_THAT(store->VerifyToken("t2").status(), IsOk());
  EXPECT_THAT(TokenStore::Load(path).status(), StatusIs(absl::StatusCode::kFailedPrecondition, "--auth_tokens_file"));
}

TEST(StreamSlotsTest, GlobalLimitAndTenantQuotaNameTheirLimits) {
  StreamSlots slots(4, 0);
  ASSERT_THAT(slots.Acquire("a", 2), IsOk());
  ASSERT_THAT(slots.Acquire("a", 2), IsOk());
  EXPECT_THAT(slots.Acquire("a", 2), StatusIs(absl::StatusCode::kResourceExhausted, "max_streams (2 for tenant 'a')"));
  ASSERT_THAT(slots.Acquire("b", 0), IsOk());
  ASSERT_THAT(slots.Acquire("b", 0), IsOk());
  EXPECT_THAT(slots.Acquire("c", 0), StatusIs(absl::StatusCode::kResourceExhausted, "max_concurrent_streams (4)"));
  slots.Release("a");
  EXPECT_EQ(slots.in_flight(), 3);
  EXPECT_THAT(slots.Acquire("c", 0), IsOk());
  slots.Release("never-acquired");  // ignored
  EXPECT_EQ(slots.in_flight(), 4);
}

// One greedy tenant takes what it can; the reserve still admits other tenants, each
// up to its fair share, and the greedy one gets slots back only when it is below its
// share again.
TEST(StreamSlotsTest, OneTenantCannotTakeEverySlot) {
  const int n = 16;
  StreamSlots slots(n, DefaultStreamReserve(n, /*tenants=*/3));
  ASSERT_EQ(slots.reserve(), 2);
  int greedy = 0;
  while (slots.Acquire("greedy", 0).ok()) ++greedy;
  EXPECT_EQ(greedy, n - 2);
  EXPECT_THAT(slots.Acquire("greedy", 0), StatusIs(absl::StatusCode::kResourceExhausted, "fair share"));
  // Two other tenants each get a slot out of the reserve.
  EXPECT_THAT(slots.Acquire("b", 0), IsOk());
  EXPECT_THAT(slots.Acquire("c", 0), IsOk());
  EXPECT_EQ(slots.in_flight(), n);
  EXPECT_THAT(slots.Acquire("b", 0), StatusIs(absl::StatusCode::kResourceExhausted, "max_concurrent_streams"));
}

TEST(StreamSlotsTest, OneTenantServerHasNoReserve) {
  EXPECT_EQ(DefaultStreamReserve(64, 1), 0);
  EXPECT_EQ(DefaultStreamReserve(64, 2), 8);
  EXPECT_EQ(DefaultStreamReserve(4, 2), 1);
  EXPECT_EQ(DefaultStreamReserve(1, 5), 0);
  StreamSlots slots(3, DefaultStreamReserve(3, 1));
  for (int i = 0; i < 3; ++i) EXPECT_THAT(slots.Acquire("", 0), IsOk());
}

}  // namespace
}  // namespace echokv::server
