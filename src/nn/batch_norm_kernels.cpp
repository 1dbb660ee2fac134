// batch_norm_kernels.cpp — BatchNorm's per-channel passes: fused OpenMP loops over host memory (cpu, and
// sim, whose memory is host memory computed by the cpu kernels) and the same maths composed from tensor
// ops for every other device. Not here: the autograd node and the running statistics (functional.cpp).
#include "batch_norm_kernels.h"

#include <algorithm>
#include <atomic>

#include "../cpu/strided.h"
#include "batch_norm_rule.h"
#include "ferry/autograd.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/graph.h"
#include "ferry/nn/functional.h"
#include "ferry/ops.h"

namespace ferry::nn {

namespace {
std::atomic<bool> g_fused_host_kernels{true};
}  // namespace

void functional::set_fused_host_kernels(bool enabled) { g_fused_host_kernels = enabled; }
bool functional::fused_host_kernels() { return g_fused_host_kernels; }

namespace detail {

bool use_fused_host_kernels(Device device) {
  // Not inside a graph capture (sim): these loops compute at once on the host, where a capture records only
  // the backend's calls; the layers then take the backend kernels, as on cuda.
  return g_fused_host_kernels && (device.type == DeviceType::CPU || device.type == DeviceType::Sim) &&
         !capturing_device().has_value();
}

namespace {

template <typename F>
void dispatch_float(DType dtype, F&& body) {
  if (dtype == DType::Float32) body(float{});
  else if (dtype == DType::Float64) body(double{});
  else throw DTypeMismatch(ferry::detail::concat("batch_norm: expected float32 or float64, got ", dtype_name(dtype)));
}

// (N, C, inner) as (1, C, 1)-broadcastable per-channel vectors for the composed path.
Tensor per_channel(const Tensor& v, const ChannelView& view) { return v.reshape({1, view.channels, 1}); }
Tensor as3d(const Tensor& x, const ChannelView& view) { return x.reshape({view.batch, view.channels, view.inner}); }
// Sum over N and inner without a permute: (N, C, inner) -> (N, C) -> (C).
Tensor channel_sum(const Tensor& x3) { return sum(sum(x3, {2}), {0}); }

}  // namespace

void channel_statistics(const Tensor& x, const ChannelView& view, Tensor& mean, Tensor& variance) {
  autograd::NoGradGuard no_grad;
  const double count = static_cast<double>(view.count());
  if (!use_fused_host_kernels(x.device())) {
    const Tensor x3 = as3d(x, view);
    mean = div(channel_sum(x3), count);
    variance = div(channel_sum(square(sub(x3, per_channel(mean, view)))), count);
    return;
  }
  mean = empty({view.channels}, {.device = x.device(), .dtype = x.dtype()});
  variance = empty({view.channels}, {.device = x.device(), .dtype = x.dtype()});
  dispatch_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = x.data<T>();
    T* m = mean.data<T>();
    T* v = variance.data<T>();
    cpu::parallel_for(view.channels, view.count(), [&](std::int64_t c) {
      // Sums of (x - first) in double: shifting by a sample of the channel avoids cancellation.
      const double shift = view.count() > 0 ? static_cast<double>(in[c * view.inner]) : 0.0;
      double s = 0, ss = 0;
      for (std::int64_t n = 0; n < view.batch; ++n) {
        const T* p = in + (n * view.channels + c) * view.inner;
#pragma omp simd reduction(+ : s, ss)
        for (std::int64_t i = 0; i < view.inner; ++i) {
          const double d = static_cast<double>(p[i]) - shift;
          s += d;
          ss += d * d;
        }
      }
      const BatchNormStatistics st = batch_norm_statistics(shift, {s, ss}, count);
      m[c] = static_cast<T>(st.mean);
      v[c] = static_cast<T>(st.var);
    });
  });
}

Tensor channel_affine(const Tensor& x, const ChannelView& view, const Tensor& scale, const Tensor& shift) {
  autograd::NoGradGuard no_grad;
  if (!use_fused_host_kernels(x.device())) {
    return add(mul(as3d(x, view), per_channel(scale, view)), per_channel(shift, view));
  }
  Tensor out = empty(x.shape(), {.device = x.device(), .dtype = x.dtype()});
  const Tensor sc = scale.contiguous(), sh = shift.contiguous();
  dispatch_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = x.data<T>();
    T* o = out.data<T>();
    const T* a = sc.data<T>();
    const T* b = sh.data<T>();
    cpu::parallel_for(view.batch * view.channels, view.inner, [&](std::int64_t plane) {
      const std::int64_t c = plane % view.channels;
      const T ac = a[c], bc = b[c];
      const T* p = in + plane * view.inner;
      T* q = o + plane * view.inner;
#pragma omp simd
      for (std::int64_t i = 0; i < view.inner; ++i) q[i] = p[i] * ac + bc;
    });
  });
  return out;
}

void channel_backward_sums(const Tensor& dy, const Tensor& x, const Tensor& mean, const ChannelView& view,
                           Tensor& sum_dy, Tensor& sum_dy_xmu) {
  autograd::NoGradGuard no_grad;
  if (!use_fused_host_kernels(x.device())) {
    const Tensor g3 = as3d(dy, view);
    sum_dy = channel_sum(g3);
    sum_dy_xmu = channel_sum(mul(g3, sub(as3d(x, view), per_channel(mean, view))));
    return;
  }
  sum_dy = empty({view.channels}, {.device = x.device(), .dtype = x.dtype()});
  sum_dy_xmu = empty({view.channels}, {.device = x.device(), .dtype = x.dtype()});
  const Tensor mu = mean.contiguous();
  dispatch_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* g = dy.data<T>();
    const T* in = x.data<T>();
    const T* m = mu.data<T>();
    T* s1 = sum_dy.data<T>();
    T* s2 = sum_dy_xmu.data<T>();
    cpu::parallel_for(view.channels, 2 * view.count(), [&](std::int64_t c) {
      const double mc = static_cast<double>(m[c]);
      double a = 0, b = 0;
      for (std::int64_t n = 0; n < view.batch; ++n) {
        const std::int64_t at = (n * view.channels + c) * view.inner;
        const T* gp = g + at;
        const T* xp = in + at;
#pragma omp simd reduction(+ : a, b)
        for (std::int64_t i = 0; i < view.inner; ++i) {
          const double gi = static_cast<double>(gp[i]);
          a += gi;
          b += gi * (static_cast<double>(xp[i]) - mc);
        }
      }
      s1[c] = static_cast<T>(a);
      s2[c] = static_cast<T>(b);
    });
  });
}

Tensor channel_affine2(const Tensor& dy, const Tensor& x, const ChannelView& view, const Tensor& k, const Tensor& a,
                       const Tensor& b) {
  autograd::NoGradGuard no_grad;
  if (!use_fused_host_kernels(x.device())) {
    return add(add(mul(as3d(dy, view), per_channel(k, view)), mul(as3d(x, view), per_channel(a, view))),
               per_channel(b, view));
  }
  Tensor out = empty(x.shape(), {.device = x.device(), .dtype = x.dtype()});
  const Tensor kc = k.contiguous(), ac = a.contiguous(), bc = b.contiguous();
  dispatch_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* g = dy.data<T>();
    const T* in = x.data<T>();
    T* o = out.data<T>();
    const T* kp = kc.data<T>();
    const T* ap = ac.data<T>();
    const T* bp = bc.data<T>();
    cpu::parallel_for(view.batch * view.channels, 2 * view.inner, [&](std::int64_t plane) {
      const std::int64_t c = plane % view.channels;
      const T kk = kp[c], aa = ap[c], bb = bp[c];
      const std::int64_t at = plane * view.inner;
      const T* gp = g + at;
      const T* xp = in + at;
      T* q = o + at;
#pragma omp simd
      for (std::int64_t i = 0; i < view.inner; ++i) q[i] = gp[i] * kk + xp[i] * aa + bb;
    });
  });
  return out;
}

}  // namespace detail
}  // namespace ferry::nn
