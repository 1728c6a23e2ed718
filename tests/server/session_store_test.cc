// SessionStore: limits with real numbers (exactly N sessions fit), byte accounting on
// commit (the session's old bytes are freed, not forgotten), TTL with a fake clock,
// busy claims, tenant isolation without an existence oracle, and the id grammar.
#include "server/engine/session_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <set>

#include "tests/testing/status_matchers.h"

namespace echokv::server {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;
using ::testing::HasSubstr;

SessionInfo Meta(int64_t hot, int64_t cold = 0, bool cold_in_memory = false) {
  SessionInfo m;
  m.retained_kv_bytes = hot;
  m.cold_kv_bytes = cold;
  m.cold_in_memory = cold_in_memory;
  m.ttl = absl::Minutes(10);
  return m;
}

// Creates a session of `hot` bytes for `tenant`; returns its id.
std::string Create(SessionStore& store, int64_t hot, const std::string& tenant = "") {
  absl::StatusOr<SessionStore::Reservation> r = store.Reserve(tenant, hot, 0, false);
  EXPECT_THAT(r.status(), IsOk());
  EXPECT_THAT(store.Insert(*r, Meta(hot), nullptr), IsOk());
  return r->id;
}

TEST(SessionStoreTest, MaxKvBytesAdmitsExactlyNSessions) {
  FakeClock clock;
  SessionLimits l;
  l.max_kv_bytes = 3 * 4096;  // exactly three sessions of 4096 bytes
  SessionStore store(l, &clock, "");
  for (int i = 0; i < 3; ++i) Create(store, 4096);
  EXPECT_THAT(store.Reserve("", 4096, 0, false).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_kv_bytes"));
  // Not even one byte more fits (a zero-byte reservation would not test the limit).
  EXPECT_THAT(store.Reserve("", 1, 0, false).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_kv_bytes"));
}

TEST(SessionStoreTest, MaxSessionsCountsReservationsAndIsExact) {
  FakeClock clock;
  SessionLimits l;
  l.max_sessions = 2;
  SessionStore store(l, &clock, "");
  Create(store, 1);
  absl::StatusOr<SessionStore::Reservation> r = store.Reserve("", 1, 0, false);  // the 2nd, in flight
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_THAT(store.Reserve("", 1, 0, false).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_sessions (2)"));
  store.Unreserve(*r);
  EXPECT_THAT(store.Reserve("", 1, 0, false).status(), IsOk());
}

TEST(SessionStoreTest, CommitFreesTheSessionsOldBytes) {
  FakeClock clock;
  SessionLimits l;
  l.max_kv_bytes = 10000;
  SessionStore store(l, &clock, "");
  const std::string a = Create(store, 6000);
  Create(store, 3000);
  ASSERT_THAT(store.Claim(a, "").status(), IsOk());
  // 6000 -> 7000: 7000 + 3000 = 10000 fits only if a's old 6000 are freed.
  EXPECT_THAT(store.Commit(a, Meta(7000), nullptr), IsOk());
  EXPECT_EQ(store.Totals().hot_bytes, 10000);
  ASSERT_THAT(store.Claim(a, "").status(), IsOk());
  EXPECT_THAT(store.Commit(a, Meta(7001), nullptr),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_kv_bytes"));
  // A refused commit leaves the session as it was, still claimed.
  absl::StatusOr<SessionInfo> m = store.Get(a, "", false);
  ASSERT_THAT(m.status(), IsOk());
  EXPECT_EQ(m->retained_kv_bytes, 7000);
  EXPECT_TRUE(m->busy);
  store.Release(a);
  EXPECT_THAT(store.Delete(a, ""), IsOk());
  EXPECT_EQ(store.Totals().hot_bytes, 3000);
}

TEST(SessionStoreTest, InsertChecksExactBytesAgainstTheEstimate) {
  FakeClock clock;
  SessionLimits l;
  l.max_kv_bytes = 100;
  SessionStore store(l, &clock, "");
  absl::StatusOr<SessionStore::Reservation> r = store.Reserve("", 50, 0, false);
  ASSERT_THAT(r.status(), IsOk());
  Create(store, 40);
  EXPECT_THAT(store.Insert(*r, Meta(61), nullptr), StatusIs(absl::StatusCode::kResourceExhausted, "max_kv_bytes"));
  EXPECT_EQ(store.Totals().hot_bytes, 40);  // the reservation is released too
  EXPECT_EQ(store.Totals().reserved, 0);
}

TEST(SessionStoreTest, ColdBytesInMemoryHaveTheirOwnLimit) {
  FakeClock clock;
  SessionLimits l;
  l.max_cold_bytes = 1000;
  SessionStore store(l, &clock, "");
  absl::StatusOr<SessionStore::Reservation> r = store.Reserve("", 10, 800, true);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_THAT(store.Insert(*r, Meta(10, 800, true), nullptr), IsOk());
  EXPECT_THAT(store.Reserve("", 10, 201, true).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_cold_bytes"));
  EXPECT_THAT(store.Reserve("", 10, 5000, false).status(), IsOk());  // on disk: not counted
}

TEST(SessionStoreTest, TtlExpiresIdleSessionsAndTouchRestartsTheTimer) {
  FakeClock clock;
  SessionStore store(SessionLimits{}, &clock, "");
  const std::string a = Create(store, 1);
  const std::string b = Create(store, 1);
  clock.Advance(absl::Minutes(9));
  ASSERT_THAT(store.Get(a, "", /*touch=*/true).status(), IsOk());
  clock.Advance(absl::Minutes(2));  // b idle 11 min > 10, a idle 2 min
  EXPECT_THAT(store.Get(b, "", false).status(), StatusIs(absl::StatusCode::kNotFound, ""));
  EXPECT_THAT(store.Get(a, "", false).status(), IsOk());
  std::vector<std::string> gone = store.ReapExpired();
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0], b);
  EXPECT_EQ(store.Totals().sessions, 1);
}

TEST(SessionStoreTest, BusySessionsNeverExpireAndRefuseASecondClaim) {
  FakeClock clock;
  SessionStore store(SessionLimits{}, &clock, "");
  const std::string a = Create(store, 1);
  ASSERT_THAT(store.Claim(a, "").status(), IsOk());
  EXPECT_THAT(store.Claim(a, "").status(), StatusIs(absl::StatusCode::kFailedPrecondition, "busy"));
  EXPECT_THAT(store.Delete(a, "").status(), StatusIs(absl::StatusCode::kFailedPrecondition, "busy"));
  clock.Advance(absl::Hours(1));
  EXPECT_TRUE(store.ReapExpired().empty());
  store.Release(a);  // the idle timer restarts now
  clock.Advance(absl::Minutes(9));
  EXPECT_THAT(store.Get(a, "", false).status(), IsOk());
}

TEST(SessionStoreTest, AnotherTenantsSessionLooksExactlyLikeAnUnknownOne) {
  FakeClock clock;
  SessionStore store(SessionLimits{}, &clock, "");
  const std::string a = Create(store, 1, "alice");
  const std::string unknown(32, 'a');
  const absl::Status foreign = store.Get(a, "bob", false).status();
  const absl::Status missing = store.Get(unknown, "bob", false).status();
  EXPECT_EQ(foreign.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  // Same message shape apart from the (echoed, caller-supplied) id.
  std::string f(foreign.message()), m(missing.message());
  EXPECT_EQ(f.substr(f.find("' ")), m.substr(m.find("' ")));
  EXPECT_THAT(store.Claim(a, "bob").status(), StatusIs(absl::StatusCode::kNotFound, ""));
  EXPECT_THAT(store.Delete(a, "bob").status(), StatusIs(absl::StatusCode::kNotFound, ""));
  EXPECT_TRUE(store.List("bob").empty());
  EXPECT_EQ(store.List("alice").size(), 1u);
}

// Per-tenant quotas (the tokens file's max_sessions / max_kv_bytes / max_cold_bytes):
// each tenant is held to its own numbers exactly, other tenants are unaffected, and
// every path that frees bytes (delete, reap, unreserve, a smaller commit) gives them
// back to the right tenant.
TEST(SessionStoreTest, TenantQuotasAreExactAndPerTenant) {
  FakeClock clock;
  SessionStore store(SessionLimits{}, &clock, "");
  TenantQuota a;
  a.max_sessions = 2;
  a.max_kv_bytes = 1000;
  store.SetTenantQuotas({{"a", a}});
  const std::string a1 = Create(store, 400, "a");
  Create(store, 600, "a");  // exactly 1000 bytes
  EXPECT_THAT(store.Reserve("a", 0, 0, false).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_sessions (2 for tenant 'a') reached"));
  // Tenant b has no quota of its own; the server-wide limits alone apply.
  for (int i = 0; i < 5; ++i) Create(store, 1000, "b");
  EXPECT_EQ(store.UsageOf("b").sessions, 5);
  EXPECT_EQ(store.UsageOf("b").hot_bytes, 5000);
  // Deleting frees a's slot and bytes: 400 bytes room, not 401.
  ASSERT_THAT(store.Delete(a1, "a").status(), IsOk());
  EXPECT_EQ(store.UsageOf("a").sessions, 1);
  EXPECT_EQ(store.UsageOf("a").hot_bytes, 600);
  EXPECT_THAT(store.Reserve("a", 401, 0, false).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_kv_bytes (1000 for tenant 'a')"));
  absl::StatusOr<SessionStore::Reservation> r = store.Reserve("a", 400, 0, false);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(store.UsageOf("a").hot_bytes, 1000);
  store.Unreserve(*r);
  EXPECT_EQ(store.UsageOf("a").hot_bytes, 600);
  EXPECT_EQ(store.UsageOf("a").sessions, 1);
}

TEST(SessionStoreTest, TenantQuotaAppliesToCommitGrowthAndColdBytes) {
  FakeClock clock;
  SessionStore store(SessionLimits{}, &clock, "");
  TenantQuota q;
  q.max_kv_bytes = 1000;
  q.max_cold_bytes = 500;
  store.SetTenantQuotas({{"t", q}});
  const std::string id = Create(store, 300, "t");
  ASSERT_THAT(store.Claim(id, "t").status(), IsOk());
  EXPECT_THAT(store.Commit(id, Meta(1001), nullptr),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_kv_bytes (1000 for tenant 't')"));
  EXPECT_THAT(store.Commit(id, Meta(1000, 500, true), nullptr), IsOk());  // the old 300 are freed
  EXPECT_EQ(store.UsageOf("t").hot_bytes, 1000);
  EXPECT_EQ(store.UsageOf("t").cold_memory_bytes, 500);
  // A cold tier spilled to disk no longer counts; reloaded it counts again.
  store.ReplaceData(id, nullptr, /*cold_in_memory=*/false);
  EXPECT_EQ(store.UsageOf("t").cold_memory_bytes, 0);
  EXPECT_THAT(store.Reserve("t", 0, 1, true).status(), IsOk());
  EXPECT_THAT(store.Reserve("t", 0, 500, true).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_cold_bytes (500 for tenant 't')"));
  // Reaping an expired session gives its bytes back to its tenant.
  clock.Advance(absl::Hours(1));
  store.ReapExpired();
  EXPECT_EQ(store.UsageOf("t").hot_bytes, 0);
}

TEST(SessionStoreTest, ReloadedQuotasApplyFromNowOnAndNeverEvict) {
  FakeClock clock;
  SessionStore store(SessionLimits{}, &clock, "");
  Create(store, 10, "t");
  Create(store, 10, "t");
  TenantQuota q;
  q.max_sessions = 1;
  store.SetTenantQuotas({{"t", q}});  // lowered below usage: both sessions stay
  EXPECT_EQ(store.List("t").size(), 2u);
  EXPECT_THAT(store.Reserve("t", 1, 0, false).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_sessions (1 for tenant 't')"));
  store.SetTenantQuotas({});  // quota removed: the server-wide limits alone
  EXPECT_THAT(store.Reserve("t", 1, 0, false).status(), IsOk());
}

TEST(SessionStoreTest, IdsCarryTheReplicaPrefixAndAreUnique) {
  FakeClock clock;
  SessionStore store(SessionLimits{}, &clock, "echokv-2");
  std::set<std::string> ids;
  for (int i = 0; i < 50; ++i) {
    const std::string id = Create(store, 0);
    EXPECT_TRUE(IsValidSessionId(id)) << id;
    EXPECT_EQ(SessionIdOwner(id), "echokv-2");
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 50u);
  EXPECT_THAT(store.ReserveId(*ids.begin(), "", 0, 0, false).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, ""));
}

// ImportSession with keep_id (issue 25 point 7): the answer for an id issued to another
// tenant is ALREADY_EXISTS with the message of a taken id, whether that tenant's session
// is live or gone, so it says nothing about the other tenant; the caller's own ids are
// reserved as before.
TEST(SessionStoreTest, KeepIdAnswersForAnotherTenantsIdLikeATakenId) {
  FakeClock clock;
  SessionStore store(SessionLimits{}, &clock, "r1");
  const std::string a_live = Create(store, 1, "a");
  const std::string a_gone = Create(store, 1, "a");
  ASSERT_THAT(store.Delete(a_gone, "a").status(), IsOk());
  const std::string b_own = Create(store, 1, "b");
  EXPECT_TRUE(IdIssuedTo(a_live, "a"));
  EXPECT_FALSE(IdIssuedTo(a_live, "b"));
  EXPECT_TRUE(IdIssuedTo(b_own, "b"));

  auto answer = [&](const std::string& id, const std::string& tenant) {
    absl::StatusOr<SessionStore::Reservation> r = store.ReserveImportedId(id, tenant, 1, 0, false);
    if (r.ok()) store.Unreserve(*r);
    return r.status();
  };
  const absl::Status taken = answer(b_own, "b");
  ASSERT_THAT(taken, StatusIs(absl::StatusCode::kAlreadyExists, "already exists"));
  auto same_as_taken = [&](const std::string& id) {
    const absl::Status s = answer(id, "b");
    EXPECT_EQ(s.code(), taken.code()) << id;
    std::string expected(taken.message());
    expected.replace(expected.find(EscapedIdPrefix(b_own)), EscapedIdPrefix(b_own).size(), EscapedIdPrefix(id));
    EXPECT_EQ(s.message(), expected) << id;
  };
  same_as_taken(a_live);  // live for tenant a
  same_as_taken(a_gone);  // deleted: free, yet still a's
  // An id b's own snapshot could hold after b rewrote it: not issued to b either.
  same_as_taken("r1.0123456789abcdef0123456789abcdef");

  // b's own id, once free again, is b's to keep; a's answer is the same either way.
  ASSERT_THAT(store.Delete(b_own, "b").status(), IsOk());
  EXPECT_THAT(answer(b_own, "b"), IsOk());
  EXPECT_THAT(answer(a_gone, "a"), IsOk());
  EXPECT_THAT(answer(a_live, "a"), StatusIs(absl::StatusCode::kAlreadyExists, "already exists"));
  // A malformed id is still named as such.
  EXPECT_THAT(answer("nope", "b"), StatusIs(absl::StatusCode::kInvalidArgument, "malformed"));
}

TEST(SessionIdTest, Grammar) {
  const std::string hex = "0123456789abcdef0123456789abcdef";
  EXPECT_TRUE(IsValidSessionId(hex));
  EXPECT_TRUE(IsValidSessionId("a." + hex));
  EXPECT_TRUE(IsValidSessionId("echokv-0." + hex));
  EXPECT_TRUE(IsValidSessionId(std::string(63, 'x') + "." + hex));
  EXPECT_FALSE(IsValidSessionId(std::string(64, 'x') + "." + hex));
  EXPECT_FALSE(IsValidSessionId(hex.substr(1)));
  EXPECT_FALSE(IsValidSessionId("0123456789ABCDEF0123456789abcdef"));
  EXPECT_FALSE(IsValidSessionId("-a." + hex));
  EXPECT_FALSE(IsValidSessionId("a-." + hex));
  EXPECT_FALSE(IsValidSessionId("." + hex));
  EXPECT_FALSE(IsValidSessionId("../." + hex));
  EXPECT_FALSE(IsValidSessionId("a.b." + hex));
  EXPECT_FALSE(IsValidSessionId(hex + "0"));
  EXPECT_FALSE(IsValidSessionId(""));
  EXPECT_EQ(SessionIdOwner(hex), "");
  EXPECT_EQ(SessionIdOwner("r1." + hex), "r1");
}

TEST(SessionIdTest, EscapedPrefixIsShortAndPrintable) {
  EXPECT_EQ(EscapedIdPrefix("abc"), "'abc'");
  EXPECT_EQ(EscapedIdPrefix(std::string("a\n\xff", 3)), "'a\\x0a\\xff'");
  const std::string big(10000, 'z');
  const std::string e = EscapedIdPrefix(big);
  EXPECT_LT(e.size(), 70u);
  EXPECT_THAT(e, HasSubstr("10000 bytes"));
}

}  // namespace
}  // namespace echokv::server
