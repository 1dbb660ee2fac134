// Tests for src/cuda/cublas_library.h in the real CUDA build: cuBLAS is loaded when asked for, with every call ferry
// makes, and a file that is missing or is not cuBLAS gives an error that names it. No GPU is needed: loading
// cuBLAS and asking its version do not touch a device. (That a command starts without it: tests/cli/test_plan.sh.)
// Not built for the emulated card, whose cuBLAS is linked in (tests/cuda_on_host), nor without CUDA.
#ifdef FERRY_HAVE_CUDA
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "../src/cuda/cublas_library.h"
#include "ferry/error.h"
#include "test_helpers.h"

namespace {

TEST(CublasLibrary, LoadsOnFirstUseWithEveryCallFerryMakes) {
  const ferry::cuda::CublasLibrary& cublas = ferry::cuda::cublas_library();
#define FERRY_EXPECT_RESOLVED(name) EXPECT_NE(cublas.name, nullptr) << #name;
  FERRY_CUBLAS_FUNCTIONS(FERRY_EXPECT_RESOLVED)
#undef FERRY_EXPECT_RESOLVED
  EXPECT_NE(ferry::testing::read_file("/proc/self/maps").find("libcublas.so"), std::string::npos) << "cuBLAS is not mapped after loading it";
  EXPECT_EQ(&ferry::cuda::cublas_library(), &cublas) << "loaded once per process";
  int major = 0;
  ASSERT_EQ(cublas.cublasGetProperty(MAJOR_VERSION, &major), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(major, CUBLAS_VER_MAJOR) << "the loaded cuBLAS is not the one ferry was built against";
  EXPECT_TRUE(std::regex_match(ferry::cuda::cublas_description(), std::regex(R"(cuBLAS \d+\.\d+\.\d+ \(GEMM\), )")))
      << ferry::cuda::cublas_description();
  EXPECT_STREQ(cublas.cublasGetStatusName(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
}

TEST(CublasLibrary, NamesEveryFileItTriedWhenNoneOpens) {
  try {
    (void)ferry::cuda::load_cublas({"libcublas-not-here.so.13", "/nonexistent/folder/libcublas.so.13"});
    FAIL() << "expected a BackendError";
  } catch (const ferry::BackendError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cuBLAS could not be loaded"), std::string::npos) << message;
    EXPECT_NE(message.find("libcublas-not-here.so.13"), std::string::npos) << message;
    EXPECT_NE(message.find("/nonexistent/folder/libcublas.so.13"), std::string::npos) << message;
    EXPECT_NE(message.find("LD_LIBRARY_PATH"), std::string::npos) << message;
  }
}

TEST(CublasLibrary, RefusesALibraryThatIsNotCublas) {
  // zlib opens (ferry links it) but exports none of cuBLAS's calls: the first one missing is named, and the files
  // after it are not tried.
  try {
    (void)ferry::cuda::load_cublas({"libz.so.1", "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR)});
    FAIL() << "expected a BackendError";
  } catch (const ferry::BackendError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("libz.so.1 opened but has no cublasCreate_v2"), std::string::npos) << message;
  }
}

}  // namespace
#endif  // FERRY_HAVE_CUDA
