// rnn_cells.cpp — the fused LSTM and GRU steps as autograd nodes (see the header); the arithmetic is the
// backend's (src/cpu/rnn_cells.cpp, src/cuda/rnn_cells.cu). Forward keeps the activated gates (and tanh(c') for
// the LSTM) for backward, so backward computes no transcendental function.
#include "rnn_cells.h"

#include <vector>

#include "../core/internal.h"
#include "ferry/autograd.h"
#include "ferry/backend.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/nn/functional.h"

namespace ferry::nn::detail {

bool use_fused_rnn_cells(Device device, DType dtype, std::int64_t batch, std::int64_t hidden) {
  return functional::library_layers() &&
         backend(device).rnn_cell_library({.batch = batch, .hidden = hidden}, dtype, device.index);
}

namespace {

using Grads = std::vector<Tensor>;
using ferry::detail::compute_stream;
using ferry::detail::kernel_view;
using ferry::detail::kernel_view_or_null;

// The inputs of a step as contiguous detached tensors (a step's x_gates is a select of the (L, N, G) projection,
// already contiguous; c and h come from the previous step).
Tensor plain(const Tensor& t) { return t.detach().contiguous(); }

Backend::RnnCellShape check_step(const char* op, const Tensor& x_gates, const Tensor& h_gates, const Tensor& state,
                                 int gates) {
  FERRY_CHECK(state.dim() == 2, ShapeMismatch, op, ": expected a state (N, H), got ", shape_str(state.shape()));
  const std::int64_t n = state.size(0), hidden = state.size(1);
  FERRY_CHECK(x_gates.dim() == 2 && h_gates.dim() == 2 && x_gates.shape() == h_gates.shape() &&
                  x_gates.size(0) == n && x_gates.size(1) == gates * hidden && x_gates.dtype() == state.dtype() &&
                  h_gates.dtype() == state.dtype(),
              ShapeMismatch, op, ": expected gates (N, ", gates, " H) and a state (N, H) of one dtype, got ",
              shape_str(x_gates.shape()), ", ", shape_str(h_gates.shape()), " and ", shape_str(state.shape()));
  FERRY_CHECK(x_gates.device() == state.device() && h_gates.device() == state.device(), DeviceMismatch, op,
              ": expected the gates and the state on one device, got ", x_gates.device().str(), ", ",
              h_gates.device().str(), " and ", state.device().str());
  return {.batch = n, .hidden = hidden};
}

}  // namespace

Tensor lstm_cell(const Tensor& x_gates, const Tensor& h_gates, const Tensor& c) {
  const Backend::RnnCellShape shape = check_step("lstm_cell", x_gates, h_gates, c, 4);
  const std::int64_t N = shape.batch, H = shape.hidden;
  const Tensor xg = plain(x_gates), hg = plain(h_gates), c0 = plain(c);
  const Device device = c.device();
  const TensorOptions like{.device = device, .dtype = c.dtype()};
  Tensor out = empty({2, N, H}, like);                                        // [h', c']
  const Tensor act = empty({N, 4 * H}, like), tanh_c = empty({N, H}, like);  // for backward
  backend(device).lstm_cell_forward(kernel_view(out), kernel_view(act), kernel_view(tanh_c), kernel_view(xg),
                                    kernel_view(hg), kernel_view(c0), shape, compute_stream(device));
  if (autograd::needs_grad({&x_gates, &h_gates, &c})) {
    const bool want_c = c.requires_grad();
    autograd::record(
        "lstm_cell", {x_gates, h_gates, c}, out,
        [act, tanh_c, c0, want_c, shape](const Tensor& grad) {
          const Tensor g = grad.contiguous();
          const TensorOptions like{.device = c0.device(), .dtype = c0.dtype()};
          Tensor d_gates = empty({shape.batch, 4 * shape.hidden}, like);
          Tensor d_c = want_c ? empty({shape.batch, shape.hidden}, like) : Tensor();
          backend(c0.device()).lstm_cell_backward(kernel_view(d_gates), kernel_view_or_null(d_c), kernel_view(g),
                                                  kernel_view(act), kernel_view(tanh_c), kernel_view(c0), shape,
                                                  compute_stream(c0.device()));
          return Grads{d_gates, d_gates, d_c};
        },
        autograd::Saved::Inputs);  // reads c (the LSTM) or h_gates and h (the GRU): refuse them written in place
  }
  return out;
}

Tensor gru_cell(const Tensor& x_gates, const Tensor& h_gates, const Tensor& h) {
  const Backend::RnnCellShape shape = check_step("gru_cell", x_gates, h_gates, h, 3);
  const std::int64_t N = shape.batch, H = shape.hidden;
  const Tensor xg = plain(x_gates), hg = plain(h_gates), h0 = plain(h);
  const Device device = h.device();
  const TensorOptions like{.device = device, .dtype = h.dtype()};
  Tensor out = empty({N, H}, like);
  const Tensor act = empty({N, 3 * H}, like);  // r, z, n: for backward
  backend(device).gru_cell_forward(kernel_view(out), kernel_view(act), kernel_view(xg), kernel_view(hg),
                                   kernel_view(h0), shape, compute_stream(device));
  if (autograd::needs_grad({&x_gates, &h_gates, &h})) {
    const bool want_h = h.requires_grad();
    autograd::record(
        "gru_cell", {x_gates, h_gates, h}, out,
        [act, hg, h0, want_h, shape](const Tensor& grad) {
          const Tensor g = grad.contiguous();
          const TensorOptions like{.device = h0.device(), .dtype = h0.dtype()};
          Tensor d_x = empty({shape.batch, 3 * shape.hidden}, like), d_h_gates = empty(d_x.shape(), like);
          Tensor d_h = want_h ? empty({shape.batch, shape.hidden}, like) : Tensor();
          backend(h0.device()).gru_cell_backward(kernel_view(d_x), kernel_view(d_h_gates), kernel_view_or_null(d_h),
                                                 kernel_view(g), kernel_view(act), kernel_view(hg), kernel_view(h0),
                                                 shape, compute_stream(h0.device()));
          return Grads{d_x, d_h_gates, d_h};
        },
        autograd::Saved::Inputs);
  }
  return out;
}

}  // namespace ferry::nn::detail
