#include "compression/config.h"

#include <cmath>
#include <string>

#include "compression/report.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace echokv::compression {
namespace {

using ::absl::StatusCode;
using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;

TEST(CompressionConfig, DefaultsFollowAlgorithmSection5) {
  CompressionConfig c;
  EXPECT_EQ(c.policy, PolicyKind::kEchoKv);
  EXPECT_EQ(c.budget, 512);
  EXPECT_EQ(c.lookahead, 8);
  EXPECT_FALSE(c.workspace.has_value());
  EXPECT_EQ(c.stage2_window, 0);
  EXPECT_EQ(c.bootstrap, Bootstrap::kProposals);
  EXPECT_TRUE(c.repair);
  EXPECT_EQ(c.snapkv_window, 32);
  EXPECT_EQ(c.snapkv_kernel, 7);
  EXPECT_THAT(c.Validate(), IsOk());
}

TEST(CompressionConfig, BoundsAreAccepted) {
  CompressionConfig c;
  c.budget = 1;
  c.lookahead = 2;
  c.stage2_window = 0;
  c.snapkv_window = 1;
  c.snapkv_kernel = 1;
  EXPECT_THAT(c.Validate(), IsOk());
  c.budget = 1048576;
  c.lookahead = 64;
  c.workspace = 1048576;
  c.stage2_window = 1048575;
  EXPECT_THAT(c.Validate(), IsOk());
  c.workspace = c.budget;  // B1 == B is allowed
  EXPECT_THAT(c.Validate(), IsOk());
}

struct BadCase {
  const char* name;
  void (*mutate)(CompressionConfig*);
  const char* field;
};

TEST(CompressionConfig, EachViolatedBoundNamesItsField) {
  const BadCase cases[] = {
      {"budget 0", [](CompressionConfig* c) { c->budget = 0; }, "budget"},
      {"budget negative", [](CompressionConfig* c) { c->budget = -5; }, "budget"},
      {"budget too large", [](CompressionConfig* c) { c->budget = 1048577; }, "budget"},
      {"lookahead odd", [](CompressionConfig* c) { c->lookahead = 7; }, "lookahead must be even, got 7"},
      {"lookahead 0", [](CompressionConfig* c) { c->lookahead = 0; }, "lookahead"},
      {"lookahead 66", [](CompressionConfig* c) { c->lookahead = 66; }, "lookahead"},
      {"lookahead 1", [](CompressionConfig* c) { c->lookahead = 1; }, "lookahead"},
      {"workspace < budget", [](CompressionConfig* c) { c->workspace = 511; }, "workspace"},
      {"workspace 0", [](CompressionConfig* c) { c->workspace = 0; }, "workspace"},
      {"workspace huge", [](CompressionConfig* c) { c->workspace = 1048577; }, "workspace"},
      {"window = budget", [](CompressionConfig* c) { c->stage2_window = 512; }, "stage2_window"},
      {"window negative", [](CompressionConfig* c) { c->stage2_window = -1; }, "stage2_window"},
      {"snapkv window 0", [](CompressionConfig* c) { c->snapkv_window = 0; }, "snapkv_window"},
      {"kernel even", [](CompressionConfig* c) { c->snapkv_kernel = 6; }, "snapkv_kernel"},
      {"kernel 0", [](CompressionConfig* c) { c->snapkv_kernel = 0; }, "snapkv_kernel"},
      {"kernel negative", [](CompressionConfig* c) { c->snapkv_kernel = -3; }, "snapkv_kernel"},
      {"target_mass 0", [](CompressionConfig* c) { c->target_mass = 0.0; }, "target_mass must be in (0, 1], got 0"},
      {"target_mass > 1", [](CompressionConfig* c) { c->target_mass = 1.01; }, "target_mass"},
      {"target_mass negative", [](CompressionConfig* c) { c->target_mass = -0.5; }, "target_mass"},
      {"target_mass NaN", [](CompressionConfig* c) { c->target_mass = std::nan(""); }, "target_mass"},
      {"target_mass with h2o", [](CompressionConfig* c) {
         c->policy = PolicyKind::kH2o;
         c->target_mass = 0.9;
       }, "target_mass is a budget of echokv and snapkv only; policy is h2o"},
      {"target_mass with pyramidkv", [](CompressionConfig* c) {
         c->policy = PolicyKind::kPyramidKv;
         c->target_mass = 0.9;
       }, "target_mass"},
  };
  for (const BadCase& bc : cases) {
    SCOPED_TRACE(bc.name);
    CompressionConfig c;
    bc.mutate(&c);
    EXPECT_THAT(c.Validate(), StatusIs(StatusCode::kInvalidArgument, bc.field));
  }
}

TEST(CompressionConfig, TargetMassBoundsAndPolicies) {
  CompressionConfig c;  // echokv
  for (double t : {1e-9, 0.5, 0.95, 1.0}) {
    c.target_mass = t;
    EXPECT_THAT(c.Validate(), IsOk()) << t;
  }
  c.policy = PolicyKind::kSnapKv;
  EXPECT_THAT(c.Validate(), IsOk());
  for (PolicyKind kind : {PolicyKind::kFull, PolicyKind::kStreamingLlm, PolicyKind::kLaq}) {
    c.policy = kind;
    EXPECT_THAT(c.Validate(), StatusIs(StatusCode::kInvalidArgument, "target_mass")) << PolicyName(kind);
  }
}

TEST(CompressionConfig, SmallBudgetMakesWindowCheckRelative) {
  CompressionConfig c;
  c.budget = 4;
  c.stage2_window = 3;
  EXPECT_THAT(c.Validate(), IsOk());
  c.stage2_window = 4;
  EXPECT_THAT(c.Validate(), StatusIs(StatusCode::kInvalidArgument, "stage2_window"));
}

TEST(CompressionConfig, EffectiveWorkspace) {
  CompressionConfig c;
  c.budget = 128;
  EXPECT_EQ(c.EffectiveWorkspace(), 1024);  // echokv default
  c.budget = 2048;
  EXPECT_EQ(c.EffectiveWorkspace(), 2048);  // never below B
  c.policy = PolicyKind::kLaq;
  c.budget = 128;
  EXPECT_EQ(c.EffectiveWorkspace(), 128);   // LAQ: = B
  c.workspace = 300;
  EXPECT_EQ(c.EffectiveWorkspace(), 300);
  c.policy = PolicyKind::kEchoKv;
  EXPECT_EQ(c.EffectiveWorkspace(), 300);
}

TEST(PolicyNames, RoundTripAndUnknown) {
  const char* names[] = {"full", "streamingllm", "h2o", "snapkv", "pyramidkv", "laq", "echokv"};
  ASSERT_EQ(AllPolicies().size(), 7u);
  for (size_t i = 0; i < AllPolicies().size(); ++i) {
    EXPECT_EQ(PolicyName(AllPolicies()[i]), names[i]);
    auto parsed = ParsePolicyKind(names[i]);
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(*parsed, AllPolicies()[i]);
  }
  EXPECT_THAT(ParsePolicyKind("snapKV"), StatusIs(StatusCode::kInvalidArgument, "policy"));
  EXPECT_THAT(ParsePolicyKind(""), StatusIs(StatusCode::kInvalidArgument, "policy"));
  // The message lists the valid names.
  EXPECT_THAT(ParsePolicyKind("lru"), StatusIs(StatusCode::kInvalidArgument, "streamingllm"));
  EXPECT_THAT(ParsePolicyKind("lru"), StatusIs(StatusCode::kInvalidArgument, "echokv"));
}

TEST(BootstrapNames, RoundTripAndUnknown) {
  for (Bootstrap b : {Bootstrap::kProposals, Bootstrap::kSnapKv}) {
    auto parsed = ParseBootstrap(BootstrapName(b));
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(*parsed, b);
  }
  EXPECT_EQ(BootstrapName(Bootstrap::kProposals), "proposals");
  EXPECT_EQ(BootstrapName(Bootstrap::kSnapKv), "snapkv");
  EXPECT_THAT(ParseBootstrap("random"), StatusIs(StatusCode::kInvalidArgument, "bootstrap"));
}

TEST(NeedsFor, EachPolicy) {
  CompressionConfig c;
  c.snapkv_window = 16;
  c.policy = PolicyKind::kEchoKv;
  PrefillNeeds n = NeedsFor(c);
  EXPECT_TRUE(n.anchor_queries);
  EXPECT_EQ(n.last_queries, 0);
  c.bootstrap = Bootstrap::kSnapKv;
  n = NeedsFor(c);
  EXPECT_TRUE(n.anchor_queries);
  EXPECT_EQ(n.last_queries, 16);

  c.policy = PolicyKind::kLaq;
  n = NeedsFor(c);
  EXPECT_FALSE(n.anchor_queries);
  EXPECT_EQ(n.last_queries, 16);
  c.snapkv_window = 4;
  EXPECT_EQ(NeedsFor(c).last_queries, 8);  // LAQ's final scoring uses the last 8

  c.policy = PolicyKind::kSnapKv;
  EXPECT_EQ(NeedsFor(c).last_queries, 4);
  c.policy = PolicyKind::kPyramidKv;
  EXPECT_EQ(NeedsFor(c).last_queries, 4);
  c.policy = PolicyKind::kH2o;
  EXPECT_EQ(NeedsFor(c).last_queries, -1);
  for (PolicyKind k : {PolicyKind::kFull, PolicyKind::kStreamingLlm}) {
    c.policy = k;
    EXPECT_EQ(NeedsFor(c).last_queries, 0);
    EXPECT_FALSE(NeedsFor(c).anchor_queries);
  }
}

TEST(CompressionReport, SecondsAndJson) {
  CompressionReport r;
  r.config.policy = PolicyKind::kLaq;
  r.config.budget = 64;
  r.phases = {{"prefill", 2.0}, {"bootstrap", 0.25}, {"round1", 0.5}, {"final", 0.125}};
  r.retained_entries = 10;
  r.total_entries = 40;
  r.retained_kv_bytes = 320;
  r.full_kv_bytes = 1280;
  r.lookahead_tokens = {5, 7};
  EXPECT_DOUBLE_EQ(r.SecondsOf("round1"), 0.5);
  EXPECT_DOUBLE_EQ(r.SecondsOf("repair"), 0.0);
  EXPECT_DOUBLE_EQ(r.TotalSeconds(true), 2.875);
  EXPECT_DOUBLE_EQ(r.TotalSeconds(false), 0.875);
  const std::string json = ReportToJson(r);
  EXPECT_THAT(json, ::testing::HasSubstr("\"policy\":\"laq\""));
  EXPECT_THAT(json, ::testing::HasSubstr("\"budget\":64"));
  EXPECT_THAT(json, ::testing::HasSubstr("\"retained_kv_bytes\":320"));
  EXPECT_THAT(json, ::testing::HasSubstr("\"full_kv_bytes\":1280"));
  EXPECT_THAT(json, ::testing::HasSubstr("\"phases\":{\"prefill\":2.0,\"bootstrap\":0.25"));
  EXPECT_THAT(json, ::testing::HasSubstr("\"lookahead_tokens\":[5,7]"));
}

}  // namespace
}  // namespace echokv::compression
