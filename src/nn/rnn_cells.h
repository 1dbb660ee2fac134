// rnn_cells.h — one step of an LSTM or GRU layer as one autograd node over the backend's recurrent cell
// (Backend::lstm_cell_* and gru_cell_*: host loops on cpu and sim, one kernel each way on cuda): the gate
// activations, the state update and the new hidden state in one call forward and one backward, where the composed
// step (rnn.cpp) runs about ten elementwise ops forward and twenty backward, each a node, an allocation and a pass
// (a launch, on cuda) of its own over a small (N, H) tensor. PyTorch's cells fuse the same way.
// Not here: the projections (two GEMMs per step, in rnn.cpp), the composed form (where the backend has no cell).
#pragma once

#include "ferry/tensor.h"

namespace ferry::nn::detail {

// True when the backend of `device` runs the fused cells for (N, H) states of `dtype` (float32 and float64 on cpu,
// sim and cuda) and the library layers are on (functional::library_layers).
bool use_fused_rnn_cells(Device device, DType dtype, std::int64_t batch, std::int64_t hidden);

// x_gates, h_gates (N, 4H): the step's input and hidden projections with their biases, gates in PyTorch's order
// (i, f, g, o); c (N, H) -> (2, N, H): [h', c'] with c' = sigmoid(f) c + sigmoid(i) tanh(g) and
// h' = sigmoid(o) tanh(c'). The gradient reaches x_gates, h_gates (the same) and c.
Tensor lstm_cell(const Tensor& x_gates, const Tensor& h_gates, const Tensor& c);

// x_gates, h_gates (N, 3H), gates (r, z, n); h (N, H) -> h' (N, H): r = sigmoid(x_r + h_r), z = sigmoid(x_z + h_z),
// n = tanh(x_n + r h_n), h' = n + z (h - n), as PyTorch's GRU.
Tensor gru_cell(const Tensor& x_gates, const Tensor& h_gates, const Tensor& h);

}  // namespace ferry::nn::detail
