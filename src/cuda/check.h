// check.h — the one check-macro family of the cuda backend: a CUDA, cuBLAS, cuDNN or NCCL status
// that is not success becomes a ferry::BackendError naming the call, file:line and device.
// Not here: user mistakes (FERRY_CHECK in ferry/error.h) and kernel-side index errors (device_state.h).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

#include "ferry/error.h"

#if __has_include(<cudnn.h>)
#include <cudnn.h>
#define FERRY_HAVE_CUDNN_HEADER 1
#endif
#if __has_include(<nccl.h>)
#include <nccl.h>
#define FERRY_HAVE_NCCL_HEADER 1
#endif

namespace ferry::cuda {

// "cuda:N" for the calling thread's current device, or "no CUDA device" when there is none.
std::string current_device_text();

// Builds "<library> error <name> (<text>) in <call> at <file:line> on <device>" and throws it as a
// BackendError. Clears the runtime's last (non-sticky) error first, so the process can carry on.
[[noreturn]] void throw_backend_error(const char* library, const std::string& name, const std::string& text,
                                      const char* call, const char* file, int line);

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);

#ifdef FERRY_HAVE_CUDNN_HEADER
// Inline so that a build that never calls cuDNN needs no cuDNN library at link time.
[[noreturn]] inline void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line) {
  throw_backend_error("cuDNN", std::to_string(static_cast<int>(status)), cudnnGetErrorString(status), call, file,
                      line);
}
#endif
#ifdef FERRY_HAVE_NCCL_HEADER
[[noreturn]] inline void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line) {
  throw_backend_error("NCCL", std::to_string(static_cast<int>(status)), ncclGetErrorString(status), call, file, line);
}
#endif

}  // namespace ferry::cuda

#define FERRY_CUDA_CHECK(call)                                                                  \
  do {                                                                                          \
    const cudaError_t ferry_status_ = (call);                                                   \
    if (ferry_status_ != cudaSuccess) ::ferry::cuda::throw_cuda_error(ferry_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define FERRY_CUBLAS_CHECK(call)                                                                \
  do {                                                                                          \
    const cublasStatus_t ferry_status_ = (call);                                                \
    if (ferry_status_ != CUBLAS_STATUS_SUCCESS)                                                 \
      ::ferry::cuda::throw_cublas_error(ferry_status_, #call, __FILE__, __LINE__);              \
  } while (0)

#define FERRY_CUDNN_CHECK(call)                                                                 \
  do {                                                                                          \
    const cudnnStatus_t ferry_status_ = (call);                                                 \
    if (ferry_status_ != CUDNN_STATUS_SUCCESS)                                                  \
      ::ferry::cuda::throw_cudnn_error(ferry_status_, #call, __FILE__, __LINE__);               \
  } while (0)

#define FERRY_NCCL_CHECK(call)                                                                  \
  do {                                                                                          \
    const ncclResult_t ferry_status_ = (call);                                                  \
    if (ferry_status_ != ncclSuccess) ::ferry::cuda::throw_nccl_error(ferry_status_, #call, __FILE__, __LINE__); \
  } while (0)

// After every kernel launch: a bad launch configuration (or an earlier asynchronous fault) throws.
#define FERRY_LAUNCH_CHECK()                                                                    \
  do {                                                                                          \
    const cudaError_t ferry_status_ = cudaGetLastError();                                       \
    if (ferry_status_ != cudaSuccess)                                                           \
      ::ferry::cuda::throw_cuda_error(ferry_status_, "kernel launch", __FILE__, __LINE__);      \
  } while (0)
