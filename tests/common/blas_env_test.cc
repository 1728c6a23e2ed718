// Which OpenBLAS core echokv asks for (common/blas_env.h) and how it says so.
#include "common/blas_env.h"

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace echokv {
namespace {

CpuFeatures Avx512() {
  CpuFeatures f;
  f.avx2 = f.fma = true;
  f.avx512f = f.avx512cd = f.avx512bw = f.avx512dq = f.avx512vl = true;
  return f;
}

CpuFeatures Avx2() {
  CpuFeatures f;
  f.avx2 = f.fma = true;
  return f;
}

TEST(BlasCoretypeTest, FallbackCoresAreReplacedByWhatTheCpuCanRun) {
  // OpenBLAS 0.3.21 falls back to Prescott on Xeons it does not know (this machine).
  EXPECT_EQ(ChooseBlasCoretype("Prescott", Avx512()), "SkylakeX");
  EXPECT_EQ(ChooseBlasCoretype("prescott", Avx512()), "SkylakeX");
  EXPECT_EQ(ChooseBlasCoretype("Nehalem", Avx2()), "Haswell");
  EXPECT_EQ(ChooseBlasCoretype("Sandybridge", Avx2()), "Haswell");
  // AVX-512 needs all five of F, CD, BW, DQ, VL for OpenBLAS's SkylakeX kernels.
  CpuFeatures partial = Avx512();
  partial.avx512vl = false;
  EXPECT_EQ(ChooseBlasCoretype("Prescott", partial), "Haswell");
  // AVX2 without FMA (none shipped, but the Haswell kernels need both).
  CpuFeatures no_fma = Avx2();
  no_fma.fma = false;
  EXPECT_EQ(ChooseBlasCoretype("Prescott", no_fma), "");
}

TEST(BlasCoretypeTest, BestFollowsTheCpuAlone) {
  EXPECT_EQ(BestBlasCoretype(Avx512()), "SkylakeX");
  EXPECT_EQ(BestBlasCoretype(Avx2()), "Haswell");
  EXPECT_EQ(BestBlasCoretype(CpuFeatures{}), "");
}

TEST(BlasCoretypeTest, AGoodChoiceOfOpenBlasIsKept) {
  for (const char* core : {"Haswell", "SkylakeX", "Cooperlake", "Zen", "SapphireRapids"}) {
    EXPECT_EQ(ChooseBlasCoretype(core, Avx512()), "") << core;
  }
  EXPECT_EQ(ChooseBlasCoretype("Prescott", CpuFeatures{}), "");  // an SSE-only CPU: Prescott is right
}

TEST(BlasCoretypeTest, DescribeSaysWhatWasSetAndWhy) {
  // This binary links no BLAS: load the OpenBLAS that LibTorch uses (scripts/setup.sh
  // installs it), so the description has a core to name.
  ASSERT_NE(dlopen("libopenblas.so.0", RTLD_NOW | RTLD_GLOBAL), nullptr) << dlerror();
  // This test binary does not re-exec; fake what a re-exec'ed process sees.
  ASSERT_EQ(setenv("OPENBLAS_CORETYPE", "SkylakeX", 1), 0);
  ASSERT_EQ(setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1), 0);
  ASSERT_EQ(setenv("ECHOKV_BLAS_SET", "coretype:Prescott,timeout", 1), 0);
  const std::string d = DescribeBlasSetup();
  EXPECT_EQ(d.rfind("OpenBLAS core ", 0), 0u) << d;
  {
    EXPECT_NE(
        d.find("OPENBLAS_CORETYPE=SkylakeX (set by echokv, re-exec: OpenBLAS chose Prescott on a CPU with AVX-512)"),
        std::string::npos)
        << d;
    EXPECT_NE(d.find("OPENBLAS_THREAD_TIMEOUT=4 (set by echokv, re-exec)"), std::string::npos) << d;
  }
  ASSERT_EQ(unsetenv("ECHOKV_BLAS_SET"), 0);
  const std::string user = DescribeBlasSetup();
  {
    EXPECT_NE(user.find("OPENBLAS_CORETYPE=SkylakeX (from the environment)"), std::string::npos) << user;
    EXPECT_EQ(user.find("set by echokv"), std::string::npos) << user;
  }
  // Left to OpenBLAS: the line names its choice, and what to export when it fell back.
  ASSERT_EQ(unsetenv("OPENBLAS_CORETYPE"), 0);
  const std::string own = DescribeBlasSetup();
  EXPECT_NE(own.find("OPENBLAS_CORETYPE=(unset: OpenBLAS's own detection"), std::string::npos) << own;
  const std::string core = own.substr(14, own.find(';') - 14);  // "OpenBLAS core <name>;"
  const std::string better = ChooseBlasCoretype(core, DetectCpuFeatures());
  if (!better.empty()) {
    EXPECT_NE(own.find("fell back to " + core + " on this CPU; export OPENBLAS_CORETYPE=" + better),
              std::string::npos)
        << own;
  } else {
    EXPECT_EQ(own.find("export"), std::string::npos) << own;
  }
}

}  // namespace
}  // namespace echokv
