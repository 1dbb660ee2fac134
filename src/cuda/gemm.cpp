// gemm.cpp — batched strided GEMM through cuBLAS. ferry is row-major and cuBLAS column-major: a
// row-major (r, c) matrix with row stride ld is the column-major (c, r) matrix with the same ld, so
// C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T by swapping the operands. fp32 runs in full
// precision unless set_allow_tf32(true). Not here: the operand layout decisions (src/core/ops.cpp).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <climits>
#include <memory>
#include <mutex>

#include "check.h"
#include "cublas_library.h"
#include "cuda_backend.h"
#include "device_state.h"
#include "ferry/error.h"
#include "kernels.h"

namespace ferry::cuda {

namespace {

std::atomic<bool> g_allow_tf32{false};

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;  // cuBLAS's recommendation for Hopper

// One cuBLAS handle per device. A handle is not safe to use from two threads at once: the mutex
// covers setting its stream and enqueuing one GEMM.
struct CublasState {
  std::mutex mutex;
  cublasHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;  // the stream the handle is set to
  void* workspace = nullptr;      // ours, used only on the device's compute stream
  bool tf32 = false;
};

std::array<std::atomic<CublasState*>, kMaxDevices> g_handles{};
std::array<std::once_flag, kMaxDevices> g_handle_once;

CublasState& cublas_state(int device) {
  std::call_once(g_handle_once[static_cast<std::size_t>(device)], [device] {
    DeviceGuard guard(device);
    const CublasLibrary& cublas = cublas_library();  // loads cuBLAS at the process's first GEMM on a cuda device
    auto state = std::make_unique<CublasState>();
    FERRY_CUBLAS_CHECK(cublas.cublasCreate(&state->handle));
    FERRY_CUBLAS_CHECK(cublas.cublasSetMathMode(state->handle, CUBLAS_DEFAULT_MATH));  // no TF32 for fp32
    DeviceState& s = device_state(device);  // counted as PyTorch counts its cuBLAS workspace
    // Once per device, at the first GEMM, outside ferry's pool. The pool keeps freed blocks, so a full pool
    // is given back to the device (as on a failed allocation in it) before the workspace is called missing.
    cudaError_t status = cudaMalloc(&state->workspace, kWorkspaceBytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      FERRY_CUDA_CHECK(cudaStreamSynchronize(s.compute_stream));
      FERRY_CUDA_CHECK(cudaStreamSynchronize(s.copy_stream));
      FERRY_CUDA_CHECK(cudaMemPoolTrimTo(s.pool, 0));
      status = cudaMalloc(&state->workspace, kWorkspaceBytes);
    }
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw OutOfMemory(detail::concat("CUDA out of memory on cuda:", device, ": cuBLAS's workspace (", kWorkspaceBytes,
                                       " bytes) cannot be allocated; ferry has ", s.allocated.load(),
                                       " bytes allocated. Free tensors that are no longer needed or use a smaller batch"));
    }
    if (status != cudaSuccess) throw_cuda_error(status, "cudaMalloc (cuBLAS workspace)", __FILE__, __LINE__);
    s.library.fetch_add(static_cast<std::int64_t>(kWorkspaceBytes));
    s.count_allocated(static_cast<std::int64_t>(kWorkspaceBytes));
    g_handles[static_cast<std::size_t>(device)].store(state.release());  // kept for the process
  });
  return *g_handles[static_cast<std::size_t>(device)].load();
}

int as_int(std::int64_t value, const char* what) {
  FERRY_CHECK(value >= 0 && value <= INT_MAX, InvalidArgument, "gemm: ", what, " = ", value,
              " does not fit cuBLAS's 32-bit sizes");
  return static_cast<int>(value);
}

}  // namespace

void prepare_cublas(int device) { (void)cublas_state(device); }

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow); }
bool allow_tf32() { return g_allow_tf32.load(); }

void gemm(const Backend::GemmArgs& g, int device, cudaStream_t stream) {
  FERRY_CHECK(g.dtype == DType::Float32 || g.dtype == DType::Float64, DTypeMismatch,
              "gemm: expected float32 or float64, got ", dtype_name(g.dtype));
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  // Column-major view: C^T (n, m) = op(B)^T (n, k) . op(A)^T (k, m).
  const int m = as_int(g.n, "n"), n = as_int(g.m, "m"), k = as_int(g.k, "k");
  const int lda = as_int(g.ldb, "ldb"), ldb = as_int(g.lda, "lda"), ldc = as_int(g.ldc, "ldc");
  const int batch = as_int(g.batch, "batch");
  const cublasOperation_t op_first = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;   // applied to B
  const cublasOperation_t op_second = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // applied to A

  CublasState& state = cublas_state(device);
  const CublasLibrary& cublas = cublas_library();
  std::lock_guard lock(state.mutex);
  if (state.stream != stream) {
    FERRY_CUBLAS_CHECK(cublas.cublasSetStream(state.handle, stream));  // resets the workspace to cuBLAS's own
    if (stream == device_state(device).compute_stream) {
      FERRY_CUBLAS_CHECK(cublas.cublasSetWorkspace(state.handle, state.workspace, kWorkspaceBytes));
    }
    state.stream = stream;
  }
  const bool tf32 = g_allow_tf32.load();
  if (tf32 != state.tf32) {
    FERRY_CUBLAS_CHECK(cublas.cublasSetMathMode(state.handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    state.tf32 = tf32;
  }

  if (g.dtype == DType::Float32) {
    const float alpha = g.alpha, beta = g.beta;
    const auto* b = static_cast<const float*>(g.b);
    const auto* a = static_cast<const float*>(g.a);
    auto* c = static_cast<float*>(g.c);
    if (batch == 1) {
      FERRY_CUBLAS_CHECK(
          cublas.cublasSgemm(state.handle, op_first, op_second, m, n, k, &alpha, b, lda, a, ldb, &beta, c, ldc));
    } else {
      FERRY_CUBLAS_CHECK(cublas.cublasSgemmStridedBatched(state.handle, op_first, op_second, m, n, k, &alpha, b, lda,
                                                   g.stride_b, a, ldb, g.stride_a, &beta, c, ldc, g.stride_c, batch));
    }
  } else {
    const double alpha = g.alpha, beta = g.beta;
    const auto* b = static_cast<const double*>(g.b);
    const auto* a = static_cast<const double*>(g.a);
    auto* c = static_cast<double*>(g.c);
    if (batch == 1) {
      FERRY_CUBLAS_CHECK(
          cublas.cublasDgemm(state.handle, op_first, op_second, m, n, k, &alpha, b, lda, a, ldb, &beta, c, ldc));
    } else {
      FERRY_CUBLAS_CHECK(cublas.cublasDgemmStridedBatched(state.handle, op_first, op_second, m, n, k, &alpha, b, lda,
                                                   g.stride_b, a, ldb, g.stride_a, &beta, c, ldc, g.stride_c, batch));
    }
  }
}

}  // namespace ferry::cuda
