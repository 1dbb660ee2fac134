// cublas_v2.h (emulator shim) — found before cuBLAS's own header when the cuda backend is built for the
// host-emulated GPU (tests/cuda_on_host). It renames the cuBLAS entry points ferry calls to ferry_emu_<name>
// and includes the real header, whose declarations then declare the renamed functions that
// tests/cuda_on_host/cublas.cpp defines; the real libcublas is left alone. cuBLAS's header maps some names
// itself (cublasSgemm -> cublasSgemm_v2): those are renamed at their _v2 target, so both spellings land here.
// Not an implementation, and no declarations of its own.
#pragma once

#if defined(CUBLAS_V2_H_) || defined(CUBLAS_API_H_)
#error "cuBLAS's header was included before the emulator's shim (tests/cuda_on_host/include)"
#endif

// The runtime shim first: cuBLAS's headers pull in CUDA types, and every later CUDA header must find the
// runtime's declarations already renamed.
#include <cuda_runtime_api.h>

#define cublasCreate_v2 ferry_emu_cublasCreate_v2
#define cublasDestroy_v2 ferry_emu_cublasDestroy_v2
#define cublasSetStream_v2 ferry_emu_cublasSetStream_v2
#define cublasGetStream_v2 ferry_emu_cublasGetStream_v2
#define cublasSetWorkspace_v2 ferry_emu_cublasSetWorkspace_v2
#define cublasSetMathMode ferry_emu_cublasSetMathMode
#define cublasGetMathMode ferry_emu_cublasGetMathMode
#define cublasGetProperty ferry_emu_cublasGetProperty
#define cublasGetStatusName ferry_emu_cublasGetStatusName
#define cublasGetStatusString ferry_emu_cublasGetStatusString
#define cublasSgemm_v2 ferry_emu_cublasSgemm_v2
#define cublasDgemm_v2 ferry_emu_cublasDgemm_v2
#define cublasSgemmStridedBatched ferry_emu_cublasSgemmStridedBatched
#define cublasDgemmStridedBatched ferry_emu_cublasDgemmStridedBatched

#include_next <cublas_v2.h>
