// rnn_cells.cpp — the fused LSTM and GRU steps (see the header). Forward keeps the activated gates (and tanh(c')
// for the LSTM) for backward, so backward computes no transcendental function. The sigmoid is the backend's
// (1 / (1 + e^-x), e^x from vec_math.h in float), tanh std::tanh as the backend's, and the sums in the composed
// order, so the forward gives the composed step's values up to rounding (the compiler may fuse a multiply-add).
#include "rnn_cells.h"

#include <cmath>
#include <vector>

#include "../cpu/vec_math.h"
#include "batch_norm_kernels.h"
#include "ferry/autograd.h"
#include "ferry/error.h"
#include "ferry/factories.h"

namespace ferry::nn::detail {

bool use_fused_rnn_cells(Device device, DType dtype) {
  return use_fused_host_kernels(device) && (dtype == DType::Float32 || dtype == DType::Float64);
}

namespace {

using Grads = std::vector<Tensor>;

template <typename T>
T sigmoid_of(T x) {
  if constexpr (std::is_same_v<T, float>) return 1.0f / (1.0f + ferry::cpu::exp_f32(-x));
  else return T(1) / (T(1) + std::exp(-x));
}

template <typename F>
void dispatch_float(DType dtype, F&& body) {
  if (dtype == DType::Float32) body(float{});
  else body(double{});
}

// The inputs of a step as contiguous detached tensors (a step's x_gates is a select of the (L, N, G) projection,
// already contiguous; c and h come from the previous step).
Tensor plain(const Tensor& t) { return t.detach().contiguous(); }

void check_step(const char* op, const Tensor& x_gates, const Tensor& h_gates, const Tensor& state, int gates) {
  const std::int64_t n = state.size(0), hidden = state.size(1);
  FERRY_CHECK(x_gates.dim() == 2 && h_gates.dim() == 2 && state.dim() == 2 && x_gates.shape() == h_gates.shape() &&
                  x_gates.size(0) == n && x_gates.size(1) == gates * hidden && x_gates.dtype() == state.dtype() &&
                  h_gates.dtype() == state.dtype(),
              ShapeMismatch, op, ": expected gates (N, ", gates, " H) and a state (N, H) of one dtype, got ",
              shape_str(x_gates.shape()), ", ", shape_str(h_gates.shape()), " and ", shape_str(state.shape()));
}

}  // namespace

Tensor lstm_cell(const Tensor& x_gates, const Tensor& h_gates, const Tensor& c) {
  check_step("lstm_cell", x_gates, h_gates, c, 4);
  const std::int64_t N = c.size(0), H = c.size(1);
  const Tensor xg = plain(x_gates), hg = plain(h_gates), c0 = plain(c);
  const TensorOptions like{.device = c.device(), .dtype = c.dtype()};
  Tensor out = empty({2, N, H}, like);
  const Tensor act = empty({N, 4 * H}, like), tanh_c = empty({N, H}, like);  // for backward
  dispatch_float(c.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T *x = xg.data<T>(), *hh = hg.data<T>(), *cp = c0.data<T>();
    T *a = act.data<T>(), *tc = tanh_c.data<T>(), *h_out = out.data<T>(), *c_out = h_out + N * H;
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t row = n * 4 * H;
      for (std::int64_t k = 0; k < 4 * H; ++k) {  // i, f, o: sigmoid; g: tanh
        const T pre = x[row + k] + hh[row + k];
        a[row + k] = (k >= 2 * H && k < 3 * H) ? static_cast<T>(std::tanh(pre)) : sigmoid_of(pre);
      }
      for (std::int64_t j = 0; j < H; ++j) {
        const T i = a[row + j], f = a[row + H + j], g = a[row + 2 * H + j], o = a[row + 3 * H + j];
        const T next = f * cp[n * H + j] + i * g;
        const T t = std::tanh(next);
        c_out[n * H + j] = next;
        tc[n * H + j] = t;
        h_out[n * H + j] = o * t;
      }
    }
  });
  if (autograd::needs_grad({&x_gates, &h_gates, &c})) {
    const bool want_c = c.requires_grad();
    autograd::record(
        "lstm_cell", {x_gates, h_gates, c}, out,
        [act, tanh_c, c0, want_c, N, H](const Tensor& grad) {
          const Tensor g_out = grad.contiguous();
          const TensorOptions like{.device = c0.device(), .dtype = c0.dtype()};
          Tensor d_gates = empty({N, 4 * H}, like);
          Tensor d_c = want_c ? empty({N, H}, like) : Tensor();
          dispatch_float(c0.dtype(), [&](auto zero) {
            using T = decltype(zero);
            const T *a = act.data<T>(), *tc = tanh_c.data<T>(), *cp = c0.data<T>();
            const T *dh = g_out.data<T>(), *dc_next = dh + N * H;
            T* dg = d_gates.data<T>();
            T* dc = want_c ? d_c.data<T>() : nullptr;
            for (std::int64_t n = 0; n < N; ++n) {
              const std::int64_t row = n * 4 * H;
              for (std::int64_t j = 0; j < H; ++j) {
                const std::int64_t e = n * H + j;
                const T i = a[row + j], f = a[row + H + j], g = a[row + 2 * H + j], o = a[row + 3 * H + j];
                const T t = tc[e];
                const T dct = dc_next[e] + dh[e] * o * (T(1) - t * t);  // through h' = o tanh(c') too
                dg[row + j] = dct * g * i * (T(1) - i);
                dg[row + H + j] = dct * cp[e] * f * (T(1) - f);
                dg[row + 2 * H + j] = dct * i * (T(1) - g * g);
                dg[row + 3 * H + j] = dh[e] * t * o * (T(1) - o);
                if (dc) dc[e] = dct * f;
              }
            }
          });
          return Grads{d_gates, d_gates, d_c};
        },
        autograd::Saved::Inputs);  // reads c (the LSTM) or h_gates and h (the GRU): refuse them written in place
  }
  return out;
}

Tensor gru_cell(const Tensor& x_gates, const Tensor& h_gates, const Tensor& h) {
  check_step("gru_cell", x_gates, h_gates, h, 3);
  const std::int64_t N = h.size(0), H = h.size(1);
  const Tensor xg = plain(x_gates), hg = plain(h_gates), h0 = plain(h);
  const TensorOptions like{.device = h.device(), .dtype = h.dtype()};
  Tensor out = empty({N, H}, like);
  const Tensor act = empty({N, 3 * H}, like);  // r, z, n: for backward
  dispatch_float(h.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T *x = xg.data<T>(), *hh = hg.data<T>(), *hp = h0.data<T>();
    T *a = act.data<T>(), *h_out = out.data<T>();
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t row = n * 3 * H;
      for (std::int64_t k = 0; k < 2 * H; ++k) a[row + k] = sigmoid_of(x[row + k] + hh[row + k]);  // r, z
      for (std::int64_t j = 0; j < H; ++j) {
        const T r = a[row + j], z = a[row + H + j];
        const T cand = static_cast<T>(std::tanh(x[row + 2 * H + j] + r * hh[row + 2 * H + j]));
        a[row + 2 * H + j] = cand;
        h_out[n * H + j] = cand + z * (hp[n * H + j] - cand);
      }
    }
  });
  if (autograd::needs_grad({&x_gates, &h_gates, &h})) {
    const bool want_h = h.requires_grad();
    autograd::record(
        "gru_cell", {x_gates, h_gates, h}, out,
        [act, hg, h0, want_h, N, H](const Tensor& grad) {
          const Tensor g_out = grad.contiguous();
          const TensorOptions like{.device = h0.device(), .dtype = h0.dtype()};
          Tensor d_x = empty({N, 3 * H}, like), d_h_gates = empty({N, 3 * H}, like);
          Tensor d_h = want_h ? empty({N, H}, like) : Tensor();
          dispatch_float(h0.dtype(), [&](auto zero) {
            using T = decltype(zero);
            const T *a = act.data<T>(), *hh = hg.data<T>(), *hp = h0.data<T>(), *dy = g_out.data<T>();
            T *dx = d_x.data<T>(), *dhg = d_h_gates.data<T>();
            T* dh = want_h ? d_h.data<T>() : nullptr;
            for (std::int64_t n = 0; n < N; ++n) {
              const std::int64_t row = n * 3 * H;
              for (std::int64_t j = 0; j < H; ++j) {
                const std::int64_t e = n * H + j;
                const T r = a[row + j], z = a[row + H + j], cand = a[row + 2 * H + j];
                const T d_cand = dy[e] * (T(1) - z) * (T(1) - cand * cand);  // through tanh
                const T d_r = d_cand * hh[row + 2 * H + j] * r * (T(1) - r);
                const T d_z = dy[e] * (hp[e] - cand) * z * (T(1) - z);
                dx[row + j] = dhg[row + j] = d_r;
                dx[row + H + j] = dhg[row + H + j] = d_z;
                dx[row + 2 * H + j] = d_cand;
                dhg[row + 2 * H + j] = d_cand * r;
                if (dh) dh[e] = dy[e] * z;
              }
            }
          });
          return Grads{d_x, d_h_gates, d_h};
        },
        autograd::Saved::Inputs);
  }
  return out;
}

}  // namespace ferry::nn::detail
