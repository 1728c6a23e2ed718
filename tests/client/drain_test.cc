// The pure parts of `echokv-cli drain` (client/drain.h): ordinals, heirs, ids, the
// Kubernetes API's StatefulSet JSON, peer addresses, token and kube directories. The
// moves themselves run against real servers in deploy/tests/drain_test.py.
#include "client/drain.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/testing/test_data.h"

namespace echokv::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

TEST(SplitOrdinal, NameAndOrdinal) {
  auto p = SplitOrdinal("echokv-12");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->first, "echokv");
  EXPECT_EQ(p->second, 12);
  auto q = SplitOrdinal("my-release-echokv-0");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->first, "my-release-echokv");
  EXPECT_EQ(q->second, 0);
  for (const char* bad : {"echokv", "echokv-", "-3", "echokv-x", "echokv--1", "echokv-+1", ""}) {
    EXPECT_FALSE(SplitOrdinal(bad).ok()) << bad;
  }
  EXPECT_THAT(std::string(SplitOrdinal("nope").status().message()), HasSubstr("--pod 'nope'"));
}

// An independent oracle: the heirs of j are j/2, j/4, ..., 0; the home of j among
// R pods is the first of j and its heirs below R.
int HomeByList(int j, int replicas) {
  std::vector<int> chain = {j};
  while (chain.back() > 0) chain.push_back(chain.back() / 2);
  for (int c : chain) {
    if (c < replicas) return c;
  }
  return 0;
}

TEST(HomeOrdinal, FirstHeirBelowTheReplicas) {
  EXPECT_EQ(HomeOrdinal(2, 3), 2);  // still there
  EXPECT_EQ(HomeOrdinal(2, 2), 1);
  EXPECT_EQ(HomeOrdinal(2, 1), 0);
  EXPECT_EQ(HomeOrdinal(7, 4), 3);
  EXPECT_EQ(HomeOrdinal(5, 2), 1);  // 5 -> 2 -> 1
  EXPECT_EQ(HomeOrdinal(0, 1), 0);
  for (int j = 0; j < 64; ++j) {
    for (int r = 1; r <= 64; ++r) EXPECT_EQ(HomeOrdinal(j, r), HomeByList(j, r)) << j << " " << r;
  }
}

TEST(HomeOrdinal, RemovingTheHighestPodMovesOnlyItsSessions) {
  // The property routing relies on: going from R to R-1 pods, a session not on pod
  // R-1 stays where it is, and those on R-1 go to the home the smaller fleet gives.
  for (int r = 2; r <= 40; ++r) {
    for (int j = 0; j < 200; ++j) {
      const int before = HomeOrdinal(j, r);
      const int after = HomeOrdinal(j, r - 1);
      if (before != r - 1) {
        EXPECT_EQ(after, before) << j << " " << r;
      } else {
        EXPECT_EQ(after, HomeOrdinal(r - 1, r - 1)) << j << " " << r;
      }
    }
  }
}

TEST(OwnerOrdinal, FromTheIdPrefix) {
  const std::string hex = "0123456789abcdef0123456789abcdef";
  EXPECT_EQ(OwnerOrdinal("echokv-3." + hex, "echokv"), 3);
  EXPECT_EQ(OwnerOrdinal("other-3." + hex, "echokv"), -1);
  EXPECT_EQ(OwnerOrdinal(hex, "echokv"), -1);
  EXPECT_EQ(OwnerOrdinal("echokv." + hex, "echokv"), -1);
}

TEST(ParseStatefulSetReplicas, SpecReplicas) {
  auto n = ParseStatefulSetReplicas(R"({"kind":"StatefulSet","spec":{"replicas":2},"status":{"replicas":3}})");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2);
  EXPECT_EQ(*ParseStatefulSetReplicas(R"({"spec":{"replicas":0}})"), 0);
  for (const char* bad : {"", "[]", "{", R"({"spec":{}})", R"({"spec":{"replicas":-1}})",
                          R"({"spec":{"replicas":"2"}})", R"({"spec":{"replicas":2.5}})", R"({"status":{"replicas":3}})"}) {
    EXPECT_FALSE(ParseStatefulSetReplicas(bad).ok()) << bad;
  }
}

TEST(PeerAddress, TemplateOrMap) {
  EXPECT_EQ(*PeerAddress("{pod}.h.ns.svc.cluster.local:50051", {}, "echokv-1"), "echokv-1.h.ns.svc.cluster.local:50051");
  EXPECT_EQ(*PeerAddress("", {{"echokv-0", "127.0.0.1:9"}}, "echokv-0"), "127.0.0.1:9");
  EXPECT_FALSE(PeerAddress("127.0.0.1:9", {}, "echokv-0").ok());
  auto map = ParsePeerMap("echokv-0=127.0.0.1:5001, echokv-1=[::1]:5002");
  ASSERT_TRUE(map.ok());
  EXPECT_THAT(*map, ElementsAre(Pair("echokv-0", "127.0.0.1:5001"), Pair("echokv-1", "[::1]:5002")));
  for (const char* bad : {"echokv-0", "=x", "echokv=1.2.3.4:5", "echokv-0="}) {
    EXPECT_FALSE(ParsePeerMap(bad).ok()) << bad;
  }
}

TEST(ReadTokenDir, OneTenantPerFileSkippingDotEntries) {
  const std::string dir = testing::MakeTempDir("echokv_tokens");
  Write(dir + "/b-tenant", "token-b\n");
  Write(dir + "/a-tenant", "  token-a  ");
  Write(dir + "/..data", "not a token");  // a Secret volume's bookkeeping entries
  auto tokens = ReadTokenDir(dir);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_THAT(*tokens, ElementsAre("token-a", "token-b"));
  Write(dir + "/c-empty", "\n");
  EXPECT_THAT(std::string(ReadTokenDir(dir).status().message()), HasSubstr("c-empty is empty"));
  EXPECT_FALSE(ReadTokenDir(dir + "/missing").ok());
  EXPECT_FALSE(ReadTokenDir(testing::MakeTempDir("echokv_no_tokens")).ok());
}

TEST(KubeApiFromDir, FilesAndServiceEnvironment) {
  const std::string dir = testing::MakeTempDir("echokv_kube");
  Write(dir + "/token", "tok\n");
  Write(dir + "/namespace", "ns\n");
  auto api = KubeApiFromDir(dir, "http://127.0.0.1:8001");
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_EQ(api->token, "tok");
  EXPECT_EQ(api->namespace_, "ns");
  EXPECT_EQ(api->ca_file, "");
  setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "6443", 1);
  auto v6 = KubeApiFromDir(dir, "");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->url, "https://[fd00::1]:6443");
  EXPECT_EQ(v6->ca_file, dir + "/ca.crt");
  unsetenv("KUBERNETES_SERVICE_HOST");
  EXPECT_FALSE(KubeApiFromDir(dir, "").ok());
  EXPECT_FALSE(KubeApiFromDir(dir + "/missing", "http://x").ok());
}

TEST(FetchReplicas, UnreachableApiIsUnavailable) {
  KubeApi api;
  api.url = "http://127.0.0.1:1";  // nothing listens on port 1
  api.token = "t";
  api.namespace_ = "ns";
  auto n = FetchReplicas(api, "echokv", absl::Seconds(2));
  EXPECT_TRUE(absl::IsUnavailable(n.status())) << n.status();
}

TEST(Drain, NothingWithinTheReplicasOrWithNoPodLeft) {
  DrainConfig config;
  config.pod = "echokv-1";
  config.peer = "{pod}:1";
  config.replicas = 2;  // within: a rolling update
  auto within = Drain(config, nullptr, nullptr, {});
  ASSERT_TRUE(within.ok());
  EXPECT_FALSE(within->scaled_away);
  config.replicas = 0;  // scaled to zero: nowhere to go
  auto zero = Drain(config, nullptr, nullptr, {});
  ASSERT_TRUE(zero.ok());
  EXPECT_FALSE(zero->scaled_away);
  config.pod = "not-a-pod";
  EXPECT_FALSE(Drain(config, nullptr, nullptr, {}).ok());
}

}  // namespace
}  // namespace echokv::client
