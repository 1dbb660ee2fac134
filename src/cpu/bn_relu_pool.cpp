// bn_relu_pool.cpp — BatchNorm (training) + ReLU + 2x2/2 max pooling in one layer over host memory, the host
// devices' Backend::batch_norm_relu_max_pool_* (cpu, and sim, which records the calls in a capture): the CNNs'
// block tail. The normalised activation is never stored: forward pools it as it is computed, and backward rebuilds
// the sparse gradient it would have had from the pooled output and the argmax. Per channel, one OpenMP task:
//   forward:  sums of x (one pass); then a block of row pairs at a time, relu(x * scale + shift) into a small
//             buffer and the pooled rows from it (one pass over x; only the pooled output and argmax are written);
//   backward: the sums over the pooled gradient at the argmax positions (a quarter of the elements); then
//             grad_x = x * a + b over the plane and g * k + x * a + b at each argmax (one pass).
// Against BatchNorm + ReLU (3 passes forward, 7 backward) then pooling (1 + a zeroing pass and a scatter):
// the full-size tensor between them is neither written nor read, and the backward's dy is never materialised.
#include <algorithm>
#include <vector>

#include "../nn/batch_norm_rule.h"
#include "batch_norm_channel.h"
#include "dispatch.h"
#include "host_kernels.h"
#include "max_pool_2x2.h"
#include "strided.h"

namespace ferry::cpu {

namespace {
constexpr std::int64_t kBlockElements = 4096;  // the forward's buffer of normalised rows: 16 KB of float32
using nn::detail::BatchNormBackward;
using nn::detail::BatchNormForward;
using nn::detail::BatchNormSums;
using nn::detail::relu_masked;
using nn::detail::relu_value;
}  // namespace

void HostKernels::batch_norm_relu_max_pool_forward(const KernelTensor& out, const KernelTensor& argmax,
                                                   const KernelTensor& x, const KernelTensor& weight,
                                                   const KernelTensor& bias, const KernelTensor& running_mean,
                                                   const KernelTensor& running_var, const KernelTensor& save_mean,
                                                   const KernelTensor& save_invstd, const BnReluPoolShape& s,
                                                   double factor, const Stream& /*stream*/) {
  const std::int64_t N = s.batch, C = s.channels, H = s.height, W = s.width;
  const std::int64_t inner = H * W, oh = H / 2, ow = W / 2;
  const double eps = s.eps;
  dispatch_float(x.dtype, "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = x.ptr<const T>();
    const T* w = weight.ptr<const T>();  // null: ones
    const T* b = bias.ptr<const T>();    // null: zeros
    T* rm = running_mean.ptr<T>();
    T* rv = running_var.ptr<T>();
    T* o = out.ptr<T>();
    std::int64_t* arg = argmax.ptr<std::int64_t>();
    T* mean_out = save_mean.ptr<T>();
    T* invstd_out = save_invstd.ptr<T>();
    parallel_for(C, N * inner * 2, [&](std::int64_t c) {
      const BatchNormForward f =
          channel_statistics(in, N, C, inner, c, eps, w, b, rm, rv, factor, mean_out, invstd_out);
      // A block of row pairs at a time (~16 KB, all of a small plane), normalised and rectified into `rows` in one
      // loop, then pooled from there row by row.
      const T scale = static_cast<T>(f.scale), shift = static_cast<T>(f.shift);
      const std::int64_t pairs_per_block = std::max<std::int64_t>(1, kBlockElements / (2 * W));
      std::vector<T> rows(static_cast<std::size_t>(std::min(pairs_per_block, oh) * 2 * W));
      for (std::int64_t n = 0; n < N; ++n) {
        const T* plane = in + (n * C + c) * inner;
        T* out_plane = o + (n * C + c) * oh * ow;
        std::int64_t* arg_plane = arg + (n * C + c) * oh * ow;
        for (std::int64_t y0 = 0; y0 < oh; y0 += pairs_per_block) {
          const std::int64_t pairs = std::min(pairs_per_block, oh - y0);
          const T* src = plane + 2 * y0 * W;  // rows 2 y0 .. 2 (y0 + pairs) - 1, contiguous
          T* block = rows.data();
#pragma omp simd
          for (std::int64_t i = 0; i < 2 * W * pairs; ++i) block[i] = relu_value<T>(src[i] * scale + shift);
          for (std::int64_t y = y0; y < y0 + pairs; ++y) {
            const T* top = block + 2 * (y - y0) * W;
            T* out_row = out_plane + y * ow;
            std::int64_t* arg_row = arg_plane + y * ow;
            if (max_pool_2x2_row(top, top + W, out_row, arg_row, ow, 2 * y * W, W)) {
              max_pool_2x2_row_in_window_order(top, top + W, out_row, arg_row, ow, 2 * y * W, W);
            }
          }
        }
      }
    });
  });
}

void HostKernels::batch_norm_relu_max_pool_backward(const KernelTensor& grad_x, const KernelTensor& grad_weight,
                                                    const KernelTensor& grad_bias, const KernelTensor& grad_out,
                                                    const KernelTensor& out, const KernelTensor& argmax,
                                                    const KernelTensor& x, const KernelTensor& weight,
                                                    const KernelTensor& save_mean, const KernelTensor& save_invstd,
                                                    const BnReluPoolShape& s, const Stream& /*stream*/) {
  const std::int64_t N = s.batch, C = s.channels, H = s.height, W = s.width;
  const std::int64_t inner = H * W, pooled = (H / 2) * (W / 2);
  const double count = static_cast<double>(N * inner);
  dispatch_float(x.dtype, "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = grad_out.ptr<const T>();
    const T* y = out.ptr<const T>();
    const std::int64_t* arg = argmax.ptr<const std::int64_t>();
    const T* in = x.ptr<const T>();
    const T* w = weight.ptr<const T>();  // null: ones
    T* dx = grad_x.ptr<T>();
    T* gw = grad_weight.ptr<T>();
    T* gb = grad_bias.ptr<T>();
    parallel_for(C, N * (inner + pooled), [&](std::int64_t c) {
      const double mean = static_cast<double>(save_mean.ptr<const T>()[c]);
      const double invstd = static_cast<double>(save_invstd.ptr<const T>()[c]);
      // The ReLU-masked gradient is g at each window's winner (where its output is > 0) and 0 elsewhere: the
      // backward's sums need only the winners.
      BatchNormSums sums;
      for (std::int64_t n = 0; n < N; ++n) {
        const std::int64_t p = (n * C + c);
        const T* plane = in + p * inner;
        const T* gp = g + p * pooled;
        const T* yp = y + p * pooled;
        const std::int64_t* ap = arg + p * pooled;
        double s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
        for (std::int64_t o = 0; o < pooled; ++o) {
          const double d = static_cast<double>(relu_masked(gp[o], yp[o]));
          s1 += d;
          s2 += d * (static_cast<double>(plane[ap[o]]) - mean);
        }
        sums.s1 += s1;
        sums.s2 += s2;
      }
      const BatchNormBackward r =
          nn::detail::batch_norm_backward_numbers(sums, mean, invstd, w ? static_cast<double>(w[c]) : 1.0, count);
      gw[c] = static_cast<T>(r.grad_weight);
      gb[c] = static_cast<T>(r.grad_bias);
      const T k = static_cast<T>(r.k), a = static_cast<T>(r.a), b = static_cast<T>(r.b);
      for (std::int64_t n = 0; n < N; ++n) {
        const std::int64_t p = (n * C + c);
        const T* plane = in + p * inner;
        T* dst = dx + p * inner;
#pragma omp simd
        for (std::int64_t i = 0; i < inner; ++i) dst[i] = plane[i] * a + b;  // dy' = 0 here
        for (std::int64_t o = 0; o < pooled; ++o) {
          const std::int64_t i = arg[p * pooled + o];
          dst[i] = relu_masked(g[p * pooled + o], y[p * pooled + o]) * k + plane[i] * a + b;
        }
      }
    });
  });
}

}  // namespace ferry::cpu
