// test_openblas_info.cpp — what ferry says of the cpu's BLAS and its kernels (src/cpu/openblas_info.h).
#include <cblas.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "../src/cpu/openblas_info.h"

namespace {

using ferry::cpu::describe_openblas;

const std::string kConfig = "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64";

TEST(OpenblasInfo, TheVersionAndTheKernelsOpenblasChose) {
  EXPECT_EQ(describe_openblas(kConfig, "Cooperlake", nullptr, true), "OpenBLAS 0.3.21, Cooperlake kernels");
  EXPECT_EQ(describe_openblas(kConfig, "Haswell", nullptr, false), "OpenBLAS 0.3.21, Haswell kernels");
  EXPECT_EQ(describe_openblas("OpenBLAS", "Haswell", nullptr, false), "OpenBLAS, Haswell kernels");
}

TEST(OpenblasInfo, KernelsSetByTheVariableAreSaidSo) {
  EXPECT_EQ(describe_openblas(kConfig, "SkylakeX", "SkylakeX", true),
            "OpenBLAS 0.3.21, SkylakeX kernels (OPENBLAS_CORETYPE=SkylakeX)");
  EXPECT_EQ(describe_openblas(kConfig, "Haswell", "Haswell", false),
            "OpenBLAS 0.3.21, Haswell kernels (OPENBLAS_CORETYPE=Haswell)");  // no wider kernels to miss
  // an OpenBLAS built for one target does not read the variable
  EXPECT_EQ(describe_openblas("OpenBLAS 0.3.21 NO_AFFINITY HASWELL MAX_THREADS=64", "Haswell", "SkylakeX", true),
            "OpenBLAS 0.3.21, Haswell kernels");
}

TEST(OpenblasInfo, AnAvx2SetOnAnAvx512CpuIsSaidToBeNarrower) {
  EXPECT_EQ(describe_openblas(kConfig, "Haswell", "Haswell", true),
            "OpenBLAS 0.3.21, Haswell kernels "
            "(OPENBLAS_CORETYPE=Haswell: kernels without AVX-512 on a CPU that has it)");
  EXPECT_TRUE(ferry::cpu::is_avx512_kernel_set("SKYLAKEX"));
  EXPECT_TRUE(ferry::cpu::is_avx512_kernel_set("Cooperlake"));
  EXPECT_TRUE(ferry::cpu::is_avx512_kernel_set("SapphireRapids"));
  EXPECT_FALSE(ferry::cpu::is_avx512_kernel_set("Zen"));
  EXPECT_FALSE(ferry::cpu::is_avx512_kernel_set("Haswell"));
}

TEST(OpenblasInfo, ThisProcessSaysWhatItRunsOn) {
  const std::string text = ferry::cpu::openblas_description();
  EXPECT_EQ(text.rfind("OpenBLAS ", 0), 0U) << text;
  EXPECT_NE(text.find(std::string(openblas_get_corename()) + " kernels"), std::string::npos) << text;
  const char* variable = std::getenv("OPENBLAS_CORETYPE");
  EXPECT_EQ(text.find("OPENBLAS_CORETYPE=") != std::string::npos, variable != nullptr) << text;
}

}  // namespace
