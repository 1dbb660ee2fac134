// cublas.cpp — the part of cuBLAS ferry uses, emulated on the host for tests (see emulator.h): handles with
// their stream, workspace and math mode; version and status queries; and {S,D}gemm and
// {S,D}gemmStridedBatched with cuBLAS's column-major semantics and argument checks, enqueued on the
// handle's stream (they run when it is flushed). Each function is the ferry_emu_ twin of the cuBLAS
// function of the same name (include/cublas_v2.h renames them).
// Not here: the rest of cuBLAS; pointer mode device (alpha and beta are host values read at the call, the
// default mode and the one ferry uses). The arithmetic is the host BLAS's (OpenBLAS).
#include <cblas.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "emulator.h"

namespace {

struct Handle {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;  // the user's (cublasSetWorkspace); nullptr: cuBLAS's own
  std::size_t workspace_bytes = 0;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

std::mutex g_mutex;                 // guards the handle set and handles' settings
std::unordered_set<Handle*> g_handles;

Handle* find(cublasHandle_t handle) {
  auto* h = reinterpret_cast<Handle*>(handle);
  return g_handles.count(h) ? h : nullptr;
}

// C = alpha op(A) op(B) + beta C, column-major: the host's BLAS (OpenBLAS) has cuBLAS's semantics, beta == 0
// included (C is not read, so a NaN there does not survive). With TF32 allowed, the inputs are rounded first,
// as tensor cores round them.
template <typename T>
void host_gemm(bool tf32, bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda, const T* b,
               int ldb, T beta, T* c, int ldc) {
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    std::vector<float> a_rounded, b_rounded;
    if (tf32) {
      // stored column-major: `columns` columns of `rows` elements, lda apart (the last one ends at its rows)
      const auto span = [](int rows, int columns, int ld) {
        return columns == 0 ? std::size_t{0} : static_cast<std::size_t>(ld) * (columns - 1) + rows;
      };
      a_rounded.assign(a, a + span(trans_a ? k : m, trans_a ? m : k, lda));
      b_rounded.assign(b, b + span(trans_b ? n : k, trans_b ? k : n, ldb));
      for (float& v : a_rounded) v = ferry::emu::to_tf32(v);
      for (float& v : b_rounded) v = ferry::emu::to_tf32(v);
      a = a_rounded.data();
      b = b_rounded.data();
    }
    cblas_sgemm(CblasColMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    cblas_dgemm(CblasColMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

bool valid_op(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

// One strided-batched GEMM (a plain GEMM is a batch of one): checked as cuBLAS checks it, then enqueued.
template <typename T>
cublasStatus_t gemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                    const T* alpha, const T* A, int lda, long long stride_a, const T* B, int ldb, long long stride_b,
                    const T* beta, T* C, int ldc, long long stride_c, int batch) {
  Handle settings;
  {
    std::lock_guard lock(g_mutex);
    Handle* h = find(handle);
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    settings = *h;
  }
  if (!valid_op(transa) || !valid_op(transb) || m < 0 || n < 0 || k < 0 || batch < 0) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool trans_a = transa != CUBLAS_OP_N, trans_b = transb != CUBLAS_OP_N;  // real types: C is T
  if (lda < std::max(1, trans_a ? k : m) || ldb < std::max(1, trans_b ? n : k) || ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  const T al = *alpha, be = *beta;  // pointer mode host: read now
  const bool tf32 = std::is_same_v<T, float> && (settings.math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH;
  void* workspace = settings.workspace;
  const std::size_t scribble = std::min<std::size_t>(settings.workspace_bytes, 4096);
  ferry::emu::enqueue(settings.stream, [=] {
    // cuBLAS writes its workspace: a workspace freed or shared too early shows up under AddressSanitizer.
    if (workspace && scribble) std::memset(workspace, 0, scribble);
    for (int i = 0; i < batch; ++i) {
      const T* a = A + stride_a * i;
      const T* b = B + stride_b * i;
      T* c = C + stride_c * i;
      host_gemm(tf32, trans_a, trans_b, m, n, k, al, a, lda, b, ldb, be, c, ldc);
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

// === handles ======================================================================================

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  std::lock_guard lock(g_mutex);
  auto* h = new Handle();
  g_handles.insert(h);
  *handle = reinterpret_cast<cublasHandle_t>(h);
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS synchronizes the device when a handle is destroyed.
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  {
    std::lock_guard lock(g_mutex);
    Handle* h = find(handle);
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    g_handles.erase(h);
    delete h;
  }
  if (cudaDeviceSynchronize() != cudaSuccess) cudaGetLastError();
  return CUBLAS_STATUS_SUCCESS;
}

// As in cuBLAS, setting the stream drops a user workspace (back to cuBLAS's own).
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  std::lock_guard lock(g_mutex);
  Handle* h = find(handle);
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = streamId;
  h->workspace = nullptr;
  h->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* streamId) {
  std::lock_guard lock(g_mutex);
  Handle* h = find(handle);
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!streamId) return CUBLAS_STATUS_INVALID_VALUE;
  *streamId = h->stream;
  return CUBLAS_STATUS_SUCCESS;
}

// The workspace must be aligned to 256 bytes.
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t workspaceSizeInBytes) {
  std::lock_guard lock(g_mutex);
  Handle* h = find(handle);
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  h->workspace = workspace;
  h->workspace_bytes = workspace ? workspaceSizeInBytes : 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  std::lock_guard lock(g_mutex);
  Handle* h = find(handle);
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  const unsigned flag = CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  const unsigned base = static_cast<unsigned>(mode) & ~flag;
  const bool known = base == CUBLAS_DEFAULT_MATH || base == CUBLAS_TENSOR_OP_MATH || base == CUBLAS_PEDANTIC_MATH ||
                     base == CUBLAS_TF32_TENSOR_OP_MATH || base == CUBLAS_FP32_EMULATED_BF16X9_MATH ||
                     base == CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH;
  if (!known) return CUBLAS_STATUS_INVALID_VALUE;
  h->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  std::lock_guard lock(g_mutex);
  Handle* h = find(handle);
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = h->math;
  return CUBLAS_STATUS_SUCCESS;
}

// === library queries ==============================================================================

// The version of the cuBLAS headers the emulator was built against.
cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  if (!value) return CUBLAS_STATUS_INVALID_VALUE;
  switch (type) {
    case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION: *value = CUBLAS_VER_MINOR; return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "the functionality requested requires some license";
  }
  return "unknown error";
}

// === GEMM =========================================================================================

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                              const float* beta, float* C, int ldc) {
  return gemm(handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

cublasStatus_t cublasDgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const double* alpha, const double* A, int lda, const double* B, int ldb,
                              const double* beta, double* C, int ldc) {
  return gemm(handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* A, int lda,
                                         long long int strideA, const float* B, int ldb, long long int strideB,
                                         const float* beta, float* C, int ldc, long long int strideC, int batchCount) {
  return gemm(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
              batchCount);
}

cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const double* alpha, const double* A, int lda,
                                         long long int strideA, const double* B, int ldb, long long int strideB,
                                         const double* beta, double* C, int ldc, long long int strideC,
                                         int batchCount) {
  return gemm(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
              batchCount);
}
