// check.cpp — turning CUDA / cuBLAS statuses into ferry::BackendError messages.
// Not here: the macros themselves (check.h).
#include "check.h"

#include <cstring>

#include "cublas_library.h"

namespace ferry::cuda {

namespace {
// "/abs/path/to/ferry/src/cuda/copy.cpp" -> "src/cuda/copy.cpp": the part a reader can find.
const char* short_path(const char* file) {
  const char* best = file;
  for (const char* p = std::strstr(file, "/src/"); p; p = std::strstr(p + 1, "/src/")) best = p + 1;
  if (best == file) {
    for (const char* p = std::strstr(file, "/tests/"); p; p = std::strstr(p + 1, "/tests/")) best = p + 1;
  }
  return best;
}
}  // namespace

std::string current_device_text() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) {
    cudaGetLastError();
    return "no CUDA device";
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return "no CUDA device";
  }
  return "cuda:" + std::to_string(device);
}

void throw_backend_error(const char* library, const std::string& name, const std::string& text, const char* call,
                         const char* file, int line) {
  cudaGetLastError();  // a non-sticky error must not poison the next check
  throw BackendError(detail::concat(library, " error ", name, " (", text, ") in ", call, " at ", short_path(file), ":",
                                    line, " on ", current_device_text()));
}

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  throw_backend_error("CUDA", cudaGetErrorName(status), cudaGetErrorString(status), call, file, line);
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  const CublasLibrary& cublas = cublas_library();  // loaded already: the status came from it
  throw_backend_error("cuBLAS", cublas.cublasGetStatusName(status), cublas.cublasGetStatusString(status), call, file,
                      line);
}

}  // namespace ferry::cuda
