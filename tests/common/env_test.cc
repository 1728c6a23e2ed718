// The default thread count: $ECHOKV_THREADS, else the affinity mask capped by the
// cgroup CPU quota (v2 cpu.max, v1 cfs files), read from a fake cgroup root.
#include "common/env.h"

#include <sched.h>
#include <stdlib.h>

#include <fstream>
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/test_data.h"

namespace echokv {
namespace {

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

int Affine() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  return CPU_COUNT(&set);
}

class ThreadCountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = getenv("ECHOKV_THREADS")) saved_ = v;
    unsetenv("ECHOKV_THREADS");
    root_ = testing::MakeTempDir("echokv-cgroup");
  }
  void TearDown() override {
    if (saved_.has_value()) setenv("ECHOKV_THREADS", saved_->c_str(), 1);
  }
  std::string root_;
  std::optional<std::string> saved_;
};

TEST_F(ThreadCountTest, CgroupV2QuotaCapsTheAffinityMaskRoundingUp) {
  Write(root_ + "/cpu.max", "150000 100000\n");
  EXPECT_DOUBLE_EQ(*CgroupCpuQuota(root_), 1.5);
  const ThreadChoice c = ChooseThreadCount(root_);
  EXPECT_EQ(c.threads, std::min(2, Affine()));
  EXPECT_NE(c.reason.find("cgroup CPU quota 1.5"), std::string::npos) << c.reason;
  Write(root_ + "/cpu.max", "50000 100000\n");  // half a CPU still gets one thread
  EXPECT_EQ(ChooseThreadCount(root_).threads, 1);
}

TEST_F(ThreadCountTest, UnlimitedOrMissingQuotaUsesTheAffinityMask) {
  EXPECT_FALSE(CgroupCpuQuota(root_).has_value());
  EXPECT_EQ(ChooseThreadCount(root_).threads, Affine());
  Write(root_ + "/cpu.max", "max 100000\n");
  EXPECT_FALSE(CgroupCpuQuota(root_).has_value());
  EXPECT_EQ(ChooseThreadCount(root_).threads, Affine());
}

TEST_F(ThreadCountTest, CgroupV1CfsFiles) {
  const std::string dir = root_ + "/cpu,cpuacct";
  ASSERT_EQ(system(("mkdir -p '" + dir + "'").c_str()), 0);
  Write(dir + "/cpu.cfs_quota_us", "-1\n");
  Write(dir + "/cpu.cfs_period_us", "100000\n");
  EXPECT_FALSE(CgroupCpuQuota(root_).has_value());
  Write(dir + "/cpu.cfs_quota_us", "100000\n");
  EXPECT_DOUBLE_EQ(*CgroupCpuQuota(root_), 1.0);
  EXPECT_EQ(ChooseThreadCount(root_).threads, 1);
}

TEST_F(ThreadCountTest, EnvironmentWinsAndBadValuesAreIgnored) {
  Write(root_ + "/cpu.max", "100000 100000\n");
  setenv("ECHOKV_THREADS", "3", 1);
  EXPECT_EQ(ChooseThreadCount(root_).threads, 3);
  EXPECT_EQ(ChooseThreadCount(root_).reason, "ECHOKV_THREADS=3");
  setenv("ECHOKV_THREADS", "zero", 1);
  EXPECT_EQ(ChooseThreadCount(root_).threads, 1);  // the quota of 1 CPU
  setenv("ECHOKV_THREADS", "-2", 1);
  EXPECT_EQ(ChooseThreadCount(root_).threads, 1);
}

TEST_F(ThreadCountTest, SmallModelsDecodeOnOneThreadUnlessAsked) {
  const ThreadChoice four{4, "4 CPUs in the affinity mask"};
  const ThreadChoice small = CapForModelSize(four, 260'000);
  EXPECT_EQ(small.threads, 1);
  EXPECT_NE(small.reason.find("small model (260000 parameters"), std::string::npos) << small.reason;
  EXPECT_EQ(CapForModelSize(four, kSmallModelParameters - 1).threads, 1);
  EXPECT_EQ(CapForModelSize(four, kSmallModelParameters).threads, 4);  // 40M-class models keep them
  EXPECT_EQ(CapForModelSize(four, 40'000'000).threads, 4);
  EXPECT_EQ(CapForModelSize({3, "ECHOKV_THREADS=3"}, 260'000).threads, 3);  // asked for
}

}  // namespace
}  // namespace echokv
