// rnn_cells.cu — one LSTM or GRU step after its projections as one launch each way (Backend::lstm_cell_* and
// gru_cell_*, ferry/backend.h), where the composed step launches about ten elementwise kernels forward and twenty
// backward on (N, H) tensors a few kilobytes large: at a char-rnn's (32, 64) each of those is a launch and little
// else. One thread per (n, j) reads its unit's 4 (LSTM) or 3 (GRU) gate pre-activations and writes everything of
// that unit, so no thread waits for another. The arithmetic is the host loops' (src/cpu/rnn_cells.cpp): the
// sigmoid as UnaryOp::Sigmoid's 1 / (1 + e^-x), the sums in the composed step's order; float32 and float64.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "check.h"
#include "kernels.h"

namespace ferry::cuda {

namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 4096;  // the loops stride over the rest

template <typename T>
__device__ __forceinline__ T sigmoid_of(T x) {
  return T(1) / (T(1) + exp(-x));
}

// A grid-stride loop over the step's N * H units: for (e = first_unit(); e < units; e += unit_stride()).
__device__ __forceinline__ std::int64_t first_unit() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t unit_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

template <typename T>
__global__ void lstm_forward_kernel(T* out, T* act, T* tanh_c, const T* x, const T* hh, const T* c, std::int64_t N,
                                    std::int64_t H) {
  for (std::int64_t e = first_unit(); e < N * H; e += unit_stride()) {
    const std::int64_t n = e / H, j = e % H, row = n * 4 * H + j;
    const T i = sigmoid_of(x[row] + hh[row]);
    const T f = sigmoid_of(x[row + H] + hh[row + H]);
    const T g = tanh(x[row + 2 * H] + hh[row + 2 * H]);
    const T o = sigmoid_of(x[row + 3 * H] + hh[row + 3 * H]);
    act[row] = i;
    act[row + H] = f;
    act[row + 2 * H] = g;
    act[row + 3 * H] = o;
    const T next = f * c[e] + i * g;
    const T t = tanh(next);
    out[N * H + e] = next;  // c'
    tanh_c[e] = t;
    out[e] = o * t;         // h'
  }
}

template <typename T>
__global__ void lstm_backward_kernel(T* d_gates, T* d_c, const T* grad, const T* act, const T* tanh_c, const T* c,
                                     std::int64_t N, std::int64_t H) {
  for (std::int64_t e = first_unit(); e < N * H; e += unit_stride()) {
    const std::int64_t n = e / H, j = e % H, row = n * 4 * H + j;
    const T i = act[row], f = act[row + H], g = act[row + 2 * H], o = act[row + 3 * H];
    const T t = tanh_c[e], dh = grad[e];
    const T dct = grad[N * H + e] + dh * o * (T(1) - t * t);  // through h' = o tanh(c') too
    d_gates[row] = dct * g * i * (T(1) - i);
    d_gates[row + H] = dct * c[e] * f * (T(1) - f);
    d_gates[row + 2 * H] = dct * i * (T(1) - g * g);
    d_gates[row + 3 * H] = dh * t * o * (T(1) - o);
    if (d_c) d_c[e] = dct * f;
  }
}

template <typename T>
__global__ void gru_forward_kernel(T* out, T* act, const T* x, const T* hh, const T* h, std::int64_t N,
                                   std::int64_t H) {
  for (std::int64_t e = first_unit(); e < N * H; e += unit_stride()) {
    const std::int64_t n = e / H, j = e % H, row = n * 3 * H + j;
    const T r = sigmoid_of(x[row] + hh[row]);
    const T z = sigmoid_of(x[row + H] + hh[row + H]);
    const T cand = tanh(x[row + 2 * H] + r * hh[row + 2 * H]);
    act[row] = r;
    act[row + H] = z;
    act[row + 2 * H] = cand;
    out[e] = cand + z * (h[e] - cand);
  }
}

template <typename T>
__global__ void gru_backward_kernel(T* d_x, T* d_hg, T* d_h, const T* grad, const T* act, const T* hh, const T* h,
                                    std::int64_t N, std::int64_t H) {
  for (std::int64_t e = first_unit(); e < N * H; e += unit_stride()) {
    const std::int64_t n = e / H, j = e % H, row = n * 3 * H + j;
    const T r = act[row], z = act[row + H], cand = act[row + 2 * H], dy = grad[e];
    const T d_cand = dy * (T(1) - z) * (T(1) - cand * cand);  // through tanh
    const T d_r = d_cand * hh[row + 2 * H] * r * (T(1) - r);
    const T d_z = dy * (h[e] - cand) * z * (T(1) - z);
    d_x[row] = d_hg[row] = d_r;
    d_x[row + H] = d_hg[row + H] = d_z;
    d_x[row + 2 * H] = d_cand;
    d_hg[row + 2 * H] = d_cand * r;
    if (d_h) d_h[e] = dy * z;
  }
}

// Runs launch(T{}, blocks) for float32 or float64 over the step's N * H units, then checks the launch; other dtypes
// are refused (rnn_cell_supported said no to them).
template <typename F>
void launch_cell(DType dtype, const char* op, const Backend::RnnCellShape& s, F&& launch) {
  const std::int64_t units = s.batch * s.hidden;
  if (units == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((units + kThreads - 1) / kThreads, kMaxBlocks));
  if (dtype == DType::Float32) launch(float{}, blocks);
  else if (dtype == DType::Float64) launch(double{}, blocks);
  else throw DTypeMismatch(detail::concat(op, ": expected float32 or float64, got ", dtype_name(dtype)));
  FERRY_LAUNCH_CHECK();
}

}  // namespace

bool rnn_cell_supported(DType dtype) { return dtype == DType::Float32 || dtype == DType::Float64; }

void launch_lstm_cell_forward(const KernelTensor& out, const KernelTensor& act, const KernelTensor& tanh_c,
                              const KernelTensor& x_gates, const KernelTensor& h_gates, const KernelTensor& c,
                              const Backend::RnnCellShape& s, cudaStream_t stream) {
  launch_cell(c.dtype, "lstm_cell", s, [&](auto zero, unsigned blocks) {
    using T = decltype(zero);
    lstm_forward_kernel<T><<<blocks, kThreads, 0, stream>>>(out.ptr<T>(), act.ptr<T>(), tanh_c.ptr<T>(),
                                                           x_gates.ptr<const T>(), h_gates.ptr<const T>(),
                                                           c.ptr<const T>(), s.batch, s.hidden);
  });
}

void launch_lstm_cell_backward(const KernelTensor& d_gates, const KernelTensor& d_c, const KernelTensor& grad_out,
                               const KernelTensor& act, const KernelTensor& tanh_c, const KernelTensor& c,
                               const Backend::RnnCellShape& s, cudaStream_t stream) {
  launch_cell(c.dtype, "lstm_cell", s, [&](auto zero, unsigned blocks) {
    using T = decltype(zero);
    lstm_backward_kernel<T><<<blocks, kThreads, 0, stream>>>(d_gates.ptr<T>(), d_c.ptr<T>(), grad_out.ptr<const T>(),
                                                            act.ptr<const T>(), tanh_c.ptr<const T>(),
                                                            c.ptr<const T>(), s.batch, s.hidden);
  });
}

void launch_gru_cell_forward(const KernelTensor& out, const KernelTensor& act, const KernelTensor& x_gates,
                             const KernelTensor& h_gates, const KernelTensor& h, const Backend::RnnCellShape& s,
                             cudaStream_t stream) {
  launch_cell(h.dtype, "gru_cell", s, [&](auto zero, unsigned blocks) {
    using T = decltype(zero);
    gru_forward_kernel<T><<<blocks, kThreads, 0, stream>>>(out.ptr<T>(), act.ptr<T>(), x_gates.ptr<const T>(),
                                                          h_gates.ptr<const T>(), h.ptr<const T>(), s.batch,
                                                          s.hidden);
  });
}

void launch_gru_cell_backward(const KernelTensor& d_x_gates, const KernelTensor& d_h_gates, const KernelTensor& d_h,
                              const KernelTensor& grad_out, const KernelTensor& act, const KernelTensor& h_gates,
                              const KernelTensor& h, const Backend::RnnCellShape& s, cudaStream_t stream) {
  launch_cell(h.dtype, "gru_cell", s, [&](auto zero, unsigned blocks) {
    using T = decltype(zero);
    gru_backward_kernel<T><<<blocks, kThreads, 0, stream>>>(d_x_gates.ptr<T>(), d_h_gates.ptr<T>(), d_h.ptr<T>(),
                                                           grad_out.ptr<const T>(), act.ptr<const T>(),
                                                           h_gates.ptr<const T>(), h.ptr<const T>(), s.batch,
                                                           s.hidden);
  });
}

}  // namespace ferry::cuda
