// cublas_library.h — cuBLAS, loaded when a cuda device first needs it rather than when the process starts.
// Linking libcublas makes every process that links ferry run libcublasLt's static constructors at start-up,
// GPU or not, GEMM or not: ~0.1 s and ~94 MB of private memory per process on a 2-core EPYC (docs/BENCHMARKS.md,
// "Process start-up"). So `ferry plan`, a cpu training rank or a cpu test pays nothing for cuBLAS, and the first
// GEMM on a cuda device (or `ferry devices` on a GPU machine, which names cuBLAS's version) loads it.
// Not here: the GEMMs themselves (gemm.cpp) and the status check (check.h).
#pragma once

#include <cublas_v2.h>

#include <string>
#include <vector>

namespace ferry::cuda {

// Every cuBLAS call ferry makes, by the name the library exports (cublas_v2.h maps cublasSgemm to cublasSgemm_v2).
#define FERRY_CUBLAS_FUNCTIONS(X)                                                                            \
  X(cublasCreate_v2) X(cublasSetStream_v2) X(cublasSetWorkspace_v2) X(cublasSetMathMode) X(cublasSgemm_v2)  \
  X(cublasDgemm_v2) X(cublasSgemmStridedBatched) X(cublasDgemmStridedBatched) X(cublasGetProperty)           \
  X(cublasGetStatusName) X(cublasGetStatusString)

// One member per call, named as the call: `cublas.cublasSgemm(handle, ...)` reads as the C call it makes
// (cublas_v2.h's own macros turn it into the _v2 member). Every member is set once the library is loaded.
struct CublasLibrary {
#define FERRY_CUBLAS_MEMBER(name) decltype(&::name) name = nullptr;
  FERRY_CUBLAS_FUNCTIONS(FERRY_CUBLAS_MEMBER)
#undef FERRY_CUBLAS_MEMBER
};

// cuBLAS, loaded by the first call in the process (thread-safe) and kept until it ends. Throws BackendError
// naming each file tried and why it failed when cuBLAS cannot be loaded; the next call tries again.
// On the emulated card (tests/cuda_on_host) the members are the emulator's functions, linked in.
const CublasLibrary& cublas_library();

// "cuBLAS 13.1.0 (GEMM), " for `ferry devices`, or, where cuBLAS cannot be loaded, "cuBLAS missing: <why>; ".
// Loads it. Never throws.
std::string cublas_description();

// Loads the first of `files` (a soname searched as the dynamic loader searches, or a path) that opens; a file that
// opens but lacks one of the calls is not cuBLAS, and is an error of its own. cublas_library()'s list in the real
// build: the soname ferry was built against, then the same file in the build's toolkit folder.
CublasLibrary load_cublas(const std::vector<std::string>& files);

}  // namespace ferry::cuda
