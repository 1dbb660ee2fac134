// host_bn_relu_pool.cpp — BatchNorm + ReLU + 2x2/2 max pooling in one layer over host memory (see the header).
// Per channel, one OpenMP task:
//   forward:  sums of x (one pass); then a block of row pairs at a time, relu(x * scale + shift) into a small
//             buffer and the pooled rows from it (one pass over x; only the pooled output and argmax are written);
//   backward: the sums over the pooled gradient at the argmax positions (a quarter of the elements); then
//             grad_x = x * a + b over the plane and g * k + x * a + b at each argmax (one pass).
// Against BatchNorm + ReLU (3 passes forward, 7 backward) then pooling (1 + a zeroing pass and a scatter):
// the full-size tensor between them is neither written nor read, and the backward's dy is never materialised.
#include "host_bn_relu_pool.h"

#include <algorithm>
#include <vector>

#include "../cpu/batch_norm_channel.h"
#include "../cpu/dispatch.h"
#include "../cpu/max_pool_2x2.h"
#include "../cpu/strided.h"
#include "batch_norm_kernels.h"
#include "batch_norm_rule.h"

namespace ferry::nn::detail {

bool use_host_bn_relu_pool(Device device, DType dtype, std::int64_t height, std::int64_t width) {
  return use_fused_host_kernels(device) && (dtype == DType::Float32 || dtype == DType::Float64) && height >= 2 &&
         width >= 2;
}

namespace {

constexpr std::int64_t kBlockElements = 4096;  // the forward's buffer of normalised rows: 16 KB of float32

template <typename T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

void host_bn_relu_pool_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                               const Tensor& running_var, double factor, double eps, const Tensor& out,
                               const Tensor& argmax, const Tensor& save_mean, const Tensor& save_invstd) {
  const std::int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const std::int64_t inner = H * W, oh = H / 2, ow = W / 2;
  cpu::dispatch_float(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = x.data<T>();
    const T* w = data_or_null<T>(weight);
    const T* b = data_or_null<T>(bias);
    T* rm = running_mean.defined() ? running_mean.data<T>() : nullptr;
    T* rv = running_var.defined() ? running_var.data<T>() : nullptr;
    T* o = out.data<T>();
    std::int64_t* arg = argmax.data<std::int64_t>();
    T* mean_out = save_mean.data<T>();
    T* invstd_out = save_invstd.data<T>();
    cpu::parallel_for(C, N * inner * 2, [&](std::int64_t c) {
      const BatchNormForward f =
          cpu::channel_statistics(in, N, C, inner, c, eps, w, b, rm, rv, factor, mean_out, invstd_out);
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
            if (cpu::max_pool_2x2_row(top, top + W, out_row, arg_row, ow, 2 * y * W, W)) {
              cpu::max_pool_2x2_row_in_window_order(top, top + W, out_row, arg_row, ow, 2 * y * W, W);
            }
          }
        }
      }
    });
  });
}

void host_bn_relu_pool_backward(const Tensor& grad_out, const Tensor& out, const Tensor& argmax, const Tensor& x,
                                const Tensor& weight, const Tensor& save_mean, const Tensor& save_invstd,
                                const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias) {
  const std::int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const std::int64_t inner = H * W, pooled = (H / 2) * (W / 2);
  const double count = static_cast<double>(N * inner);
  cpu::dispatch_float(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = grad_out.data<T>();
    const T* y = out.data<T>();
    const std::int64_t* arg = argmax.data<std::int64_t>();
    const T* in = x.data<T>();
    const T* w = data_or_null<T>(weight);
    T* dx = grad_x.data<T>();
    T* gw = grad_weight.data<T>();
    T* gb = grad_bias.data<T>();
    cpu::parallel_for(C, N * (inner + pooled), [&](std::int64_t c) {
      const double mean = static_cast<double>(save_mean.data<T>()[c]);
      const double invstd = static_cast<double>(save_invstd.data<T>()[c]);
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
          batch_norm_backward_numbers(sums, mean, invstd, w ? static_cast<double>(w[c]) : 1.0, count);
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

}  // namespace ferry::nn::detail
