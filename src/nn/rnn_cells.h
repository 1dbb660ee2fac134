// rnn_cells.h — one step of an LSTM or GRU layer as one autograd node over host memory (cpu, and sim outside a
// capture): the gate activations, the state update and the new hidden state in one pass forward and one pass
// backward, where the composed step (rnn.cpp) runs about ten elementwise ops forward and twenty backward, each a
// node, an allocation and a pass of its own over a small (N, H) tensor. PyTorch's CPU cells fuse the same way.
// Not here: the projections (two GEMMs per step, in rnn.cpp), the composed form (every other device).
#pragma once

#include "ferry/tensor.h"

namespace ferry::nn::detail {

// True when `device` runs the fused cells for `dtype`: the fused host kernels on (functional::fused_host_kernels),
// cpu or sim outside a capture, float32 or float64.
bool use_fused_rnn_cells(Device device, DType dtype);

// x_gates, h_gates (N, 4H): the step's input and hidden projections with their biases, gates in PyTorch's order
// (i, f, g, o); c (N, H) -> (2, N, H): [h', c'] with c' = sigmoid(f) c + sigmoid(i) tanh(g) and
// h' = sigmoid(o) tanh(c'). The gradient reaches x_gates, h_gates (the same) and c.
Tensor lstm_cell(const Tensor& x_gates, const Tensor& h_gates, const Tensor& c);

// x_gates, h_gates (N, 3H), gates (r, z, n); h (N, H) -> h' (N, H): r = sigmoid(x_r + h_r), z = sigmoid(x_z + h_z),
// n = tanh(x_n + r h_n), h' = n + z (h - n), as PyTorch's GRU.
Tensor gru_cell(const Tensor& x_gates, const Tensor& h_gates, const Tensor& h);

}  // namespace ferry::nn::detail
