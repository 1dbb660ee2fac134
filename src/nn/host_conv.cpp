// host_conv.cpp — conv2d forward and backward over host memory (cpu, and sim, whose memory is host memory
// computed by the cpu kernels): samples split over OpenMP threads, each running im2col (the backend's host
// kernel, serial inside the region) and single-threaded OpenBLAS GEMMs on a buffer that stays in its cache.
// Many small GEMMs each split over OpenBLAS's own threads cost a thread hand-off per call; this costs one
// parallel region per layer. Not here: the autograd node and argument checks (functional.cpp).
#include "host_conv.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "../core/internal.h"
#include "../cpu/blas_threads.h"
#include "batch_norm_kernels.h"
#include "ferry/error.h"
#include "ferry/factories.h"

namespace ferry::nn::detail {

namespace {

using cpu::SingleThreadedBlas;

// Row-major C (m, n) = alpha op(A) op(B) + beta C.
void gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta, float* c,
          int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda, b,
              ldb, beta, c, ldc);
}
void gemm(bool ta, bool tb, int m, int n, int k, const double* a, int lda, const double* b, int ldb, double beta,
          double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0, a, lda, b,
              ldb, beta, c, ldc);
}

// A KernelTensor over raw host memory: contiguous `shape`.
KernelTensor host_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape) {
  KernelTensor k;
  k.data = data;
  k.dtype = dtype;
  k.ndim = static_cast<int>(shape.size());
  int d = 0;
  for (std::int64_t n : shape) k.shape[d++] = n;
  std::int64_t stride = 1;
  for (int i = k.ndim - 1; i >= 0; --i) {
    k.strides[i] = stride;
    stride *= k.shape[i];
  }
  return k;
}

bool is_pointwise(const Backend::Conv2dShape& s) {
  return s.kernel_h == 1 && s.kernel_w == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 && s.pad_w == 0;
}

struct Geometry {
  std::int64_t N, C, O, K, L, image;  // image = C * H * W
  explicit Geometry(const Backend::Conv2dShape& s)
      : N(s.batch), C(s.in_channels), O(s.out_channels), K(s.in_channels * s.kernel_h * s.kernel_w),
        L(s.out_h() * s.out_w()), image(s.in_channels * s.height * s.width) {}
};

// Sample n's columns (K, L) in `buffer` (or the image itself when the kernel is 1x1 without stride/padding).
template <typename T>
const T* columns_of(Backend& be, const Stream& stream, const T* x, T* buffer, std::int64_t n, const Geometry& g,
                    const Backend::Conv2dShape& s, DType dtype) {
  const T* image = x + n * g.image;
  if (is_pointwise(s)) return image;
  Backend::Conv2dShape one = s;
  one.batch = 1;
  be.im2col(host_view(buffer, dtype, {g.K, g.L}), host_view(const_cast<T*>(image), dtype, {g.C, s.height, s.width}),
            one, stream);
  return buffer;
}

template <typename F>
void dispatch(DType dtype, F&& body) {
  if (dtype == DType::Float32) body(float{});
  else if (dtype == DType::Float64) body(double{});
  else throw DTypeMismatch(ferry::detail::concat("conv2d: expected float32 or float64, got ", dtype_name(dtype)));
}

}  // namespace

bool use_host_conv(Device device, const Backend::Conv2dShape& s) {
  constexpr std::int64_t kMinMultiplyAdds = std::int64_t{1} << 21;  // about 40 us of one core's GEMM
  const Geometry g(s);
  return use_fused_host_kernels(device) && g.N > 1 && g.N * g.O * g.K * g.L >= kMinMultiplyAdds &&
         omp_get_max_threads() > 1 && !omp_in_parallel();
}

void host_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                         const Backend::Conv2dShape& s, const Tensor& keep_columns) {
  const Geometry g(s);
  Backend& be = backend(x.device());
  const Stream stream = ferry::detail::compute_stream(x.device());
  const int threads = static_cast<int>(std::min<std::int64_t>(omp_get_max_threads(), g.N));
  const bool keep = keep_columns.defined() && !is_pointwise(s);
  const Tensor buffers =
      empty({threads, is_pointwise(s) || keep ? 1 : g.K * g.L}, {.device = x.device(), .dtype = x.dtype()});
  dispatch(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.data<T>();
    const T* wp = w.data<T>();
    const T* bp = bias.defined() ? bias.data<T>() : nullptr;
    T* op = out.data<T>();
    T* buffer_base = buffers.data<T>();
    T* kept = keep ? keep_columns.data<T>() : nullptr;
    SingleThreadedBlas single;
#pragma omp parallel num_threads(threads)
    {
      T* buffer = buffer_base + omp_get_thread_num() * buffers.size(1);
#pragma omp for schedule(static)
      for (std::int64_t n = 0; n < g.N; ++n) {
        const T* cols = columns_of(be, stream, xp, keep ? kept + n * g.K * g.L : buffer, n, g, s, x.dtype());
        T* o = op + n * g.O * g.L;  // (O, L)
        if (bp) {
          for (std::int64_t c = 0; c < g.O; ++c) std::fill(o + c * g.L, o + (c + 1) * g.L, bp[c]);
        }
        gemm(false, false, static_cast<int>(g.O), static_cast<int>(g.L), static_cast<int>(g.K), wp,
             static_cast<int>(g.K), cols, static_cast<int>(g.L), bp ? T(1) : T(0), o, static_cast<int>(g.L));
      }
    }
  });
}

void host_conv2d_backward(const Tensor& grad, const Tensor& x, const Tensor& w, const Backend::Conv2dShape& s,
                          Tensor* grad_input, Tensor* grad_weight, const Tensor& kept_columns) {
  const Geometry g(s);
  Backend& be = backend(grad.device());
  const Stream stream = ferry::detail::compute_stream(grad.device());
  const int threads = static_cast<int>(std::min<std::int64_t>(omp_get_max_threads(), g.N));
  const bool pointwise = is_pointwise(s);
  const TensorOptions like{.device = grad.device(), .dtype = grad.dtype()};
  // Per thread: columns (K, L), their gradient (K, L), and a partial weight gradient (O, K).
  const std::int64_t columns_size = pointwise ? 1 : g.K * g.L;
  const bool kept = kept_columns.defined() && !pointwise;
  const Tensor columns = empty({threads, kept ? 1 : columns_size}, like);
  const Tensor column_grads = empty({threads, columns_size}, like);
  const Tensor partial_weight_grads = empty({threads, grad_weight ? g.O * g.K : 1}, like);
  dispatch(grad.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* gp = grad.data<T>();
    const T* xp = grad_weight && !kept ? x.data<T>() : nullptr;  // x is read for the weight only
    const T* wp = grad_input ? w.data<T>() : nullptr;  // w is read for the input only
    T* gxp = grad_input ? grad_input->data<T>() : nullptr;
    T* partials = partial_weight_grads.data<T>();
    const T* kept_base = kept ? kept_columns.data<T>() : nullptr;
    SingleThreadedBlas single;
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      T* cols_buffer = kept ? nullptr : columns.data<T>() + t * columns_size;
      T* dcols_buffer = column_grads.data<T>() + t * columns_size;
      T* partial = partials + t * partial_weight_grads.size(1);
      bool first = true;
#pragma omp for schedule(static)
      for (std::int64_t n = 0; n < g.N; ++n) {
        const T* gn = gp + n * g.O * g.L;  // (O, L)
        if (grad_weight) {                  // partial (O, K) += g[n] (O, L) @ columns[n]^T (L, K)
          const T* cols = kept ? kept_base + n * g.K * g.L : columns_of(be, stream, xp, cols_buffer, n, g, s, grad.dtype());
          gemm(false, true, static_cast<int>(g.O), static_cast<int>(g.K), static_cast<int>(g.L), gn,
               static_cast<int>(g.L), cols, static_cast<int>(g.L), first ? T(0) : T(1), partial, static_cast<int>(g.K));
          first = false;
        }
        if (gxp) {  // columns' gradient (K, L) = w^T (K, O) @ g[n] (O, L), folded back into the image
          T* gx = gxp + n * g.image;
          T* dcols = pointwise ? gx : dcols_buffer;
          gemm(true, false, static_cast<int>(g.K), static_cast<int>(g.L), static_cast<int>(g.O), wp,
               static_cast<int>(g.K), gn, static_cast<int>(g.L), T(0), dcols, static_cast<int>(g.L));
          if (!pointwise) {
            Backend::Conv2dShape one = s;
            one.batch = 1;
            be.col2im(host_view(gx, grad.dtype(), {g.C, s.height, s.width}), host_view(dcols, grad.dtype(), {g.K, g.L}), one,
                      stream);
          }
        }
      }
      if (first && grad_weight) std::fill(partial, partial + g.O * g.K, T(0));  // a thread without samples
    }
    if (grad_weight) {  // the partials, summed in thread order (deterministic for a given thread count)
      T* gw = grad_weight->data<T>();
      std::copy(partials, partials + g.O * g.K, gw);
      for (int t = 1; t < threads; ++t) {
        const T* p = partials + t * g.O * g.K;
        for (std::int64_t i = 0; i < g.O * g.K; ++i) gw[i] += p[i];
      }
    }
  });
}

}  // namespace ferry::nn::detail
