// rnn_cells.cpp — one LSTM or GRU step after its projections, over host memory: the host devices'
// Backend::lstm_cell_* and gru_cell_* (cpu, and sim, which records the calls in a capture). One pass forward
// (the gate activations, the state update, the new h) and one backward, where the composed step runs about ten
// elementwise ops forward and twenty backward, each a pass of its own over a small (N, H) tensor; PyTorch's CPU
// cells fuse the same way. Forward keeps the activated gates (and tanh(c') for the LSTM), so backward computes no
// transcendental function. The sigmoid and tanh are UnaryOp::Sigmoid's and UnaryOp::Tanh's (in float vec_math.h's
// branch-free exp_f32 and tanh_f32, so each loop below vectorises), and the sums in the composed order, so the
// forward gives the composed step's values up to rounding (the compiler may fuse a multiply-add). One thread: a
// step's (32, 64) gates are too small for a parallel region to pay (BENCHMARKS v0.23).
#include <cmath>
#include <type_traits>

#include "dispatch.h"
#include "host_kernels.h"
#include "vec_math.h"

namespace ferry::cpu {

void HostKernels::lstm_cell_forward(const KernelTensor& out, const KernelTensor& act, const KernelTensor& tanh_c,
                                    const KernelTensor& x_gates, const KernelTensor& h_gates, const KernelTensor& c,
                                    const RnnCellShape& s, const Stream& /*stream*/) {
  const std::int64_t N = s.batch, H = s.hidden;
  dispatch_float(c.dtype, "lstm_cell", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *x = x_gates.ptr<const T>(), *hh = h_gates.ptr<const T>(), *cp = c.ptr<const T>();
    T *a = act.ptr<T>(), *tc = tanh_c.ptr<T>(), *h_out = out.ptr<T>(), *c_out = h_out + N * H;
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t row = n * 4 * H;
#pragma omp simd
      for (std::int64_t k = row; k < row + 2 * H; ++k) a[k] = sigmoid_of(x[k] + hh[k]);  // i, f
#pragma omp simd
      for (std::int64_t k = row + 2 * H; k < row + 3 * H; ++k) a[k] = tanh_of(x[k] + hh[k]);  // g
#pragma omp simd
      for (std::int64_t k = row + 3 * H; k < row + 4 * H; ++k) a[k] = sigmoid_of(x[k] + hh[k]);  // o
#pragma omp simd
      for (std::int64_t j = 0; j < H; ++j) {
        const T i = a[row + j], f = a[row + H + j], g = a[row + 2 * H + j], o = a[row + 3 * H + j];
        const T next = f * cp[n * H + j] + i * g;
        const T t = tanh_of(next);
        c_out[n * H + j] = next;
        tc[n * H + j] = t;
        h_out[n * H + j] = o * t;
      }
    }
  });
}

void HostKernels::lstm_cell_backward(const KernelTensor& d_gates, const KernelTensor& d_c,
                                     const KernelTensor& grad_out, const KernelTensor& act,
                                     const KernelTensor& tanh_c, const KernelTensor& c, const RnnCellShape& s,
                                     const Stream& /*stream*/) {
  const std::int64_t N = s.batch, H = s.hidden;
  dispatch_float(c.dtype, "lstm_cell", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *a = act.ptr<const T>(), *tc = tanh_c.ptr<const T>(), *cp = c.ptr<const T>();
    const T *dh = grad_out.ptr<const T>(), *dc_next = dh + N * H;
    T* dg = d_gates.ptr<T>();
    T* dc = d_c.ptr<T>();  // null: not wanted
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
}

void HostKernels::gru_cell_forward(const KernelTensor& out, const KernelTensor& act, const KernelTensor& x_gates,
                                   const KernelTensor& h_gates, const KernelTensor& h, const RnnCellShape& s,
                                   const Stream& /*stream*/) {
  const std::int64_t N = s.batch, H = s.hidden;
  dispatch_float(h.dtype, "gru_cell", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *x = x_gates.ptr<const T>(), *hh = h_gates.ptr<const T>(), *hp = h.ptr<const T>();
    T *a = act.ptr<T>(), *h_out = out.ptr<T>();
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t row = n * 3 * H;
#pragma omp simd
      for (std::int64_t k = row; k < row + 2 * H; ++k) a[k] = sigmoid_of(x[k] + hh[k]);  // r, z
#pragma omp simd
      for (std::int64_t j = 0; j < H; ++j) {
        const T r = a[row + j], z = a[row + H + j];
        const T cand = tanh_of(x[row + 2 * H + j] + r * hh[row + 2 * H + j]);
        a[row + 2 * H + j] = cand;
        h_out[n * H + j] = cand + z * (hp[n * H + j] - cand);
      }
    }
  });
}

void HostKernels::gru_cell_backward(const KernelTensor& d_x_gates, const KernelTensor& d_h_gates,
                                    const KernelTensor& d_h, const KernelTensor& grad_out, const KernelTensor& act,
                                    const KernelTensor& h_gates, const KernelTensor& h, const RnnCellShape& s,
                                    const Stream& /*stream*/) {
  const std::int64_t N = s.batch, H = s.hidden;
  dispatch_float(h.dtype, "gru_cell", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *a = act.ptr<const T>(), *hh = h_gates.ptr<const T>(), *hp = h.ptr<const T>();
    const T* dy = grad_out.ptr<const T>();
    T *dx = d_x_gates.ptr<T>(), *dhg = d_h_gates.ptr<T>();
    T* dh = d_h.ptr<T>();  // null: not wanted
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
}

}  // namespace ferry::cpu
