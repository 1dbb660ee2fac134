// ferry/nn/rnn.h — the recurrent layers RNN, LSTM and GRU: PyTorch's equations, gate order, parameter names
// (weight_ih_l0, weight_hh_l0_reverse, ...), shapes and initialisation; several layers, batch_first, dropout
// between layers, bidirectional. Each step is composed of tensor ops on the input's device (the input projections
// of all steps first, as one GEMM per layer and direction), so autograd differentiates through time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/nn/module.h"

namespace ferry::nn {

struct RNNOptions {
  std::int64_t num_layers = 1;
  bool bias = true;
  bool batch_first = false;  // input and output (N, L, *) instead of (L, N, *); the states stay (layers * D, N, H)
  double dropout = 0;        // on each layer's output but the last, in training
  bool bidirectional = false;
};

// What a recurrent layer returns (D = 2 when bidirectional, else 1; H = hidden_size):
struct RNNOutput {
  Tensor output;  // (L, N, D * H), batch_first (N, L, D * H): the last layer's h at every step, directions side by side
  Tensor h_n;     // (num_layers * D, N, H): each layer's and direction's last h (index layer * D + direction)
  Tensor c_n;     // LSTM: the last cell states, shaped as h_n; undefined for RNN and GRU
};

// The shared machinery; make an RNN, LSTM or GRU.
class RNNBase : public Module {
 public:
  // input (L, N, input_size) (batch_first: (N, L, input_size)) or unbatched (L, input_size). h0 (and, for LSTM,
  // c0): (num_layers * D, N, H), unbatched (num_layers * D, H); undefined = zeros.
  RNNOutput forward(const Tensor& input, const Tensor& h0, const Tensor& c0 = Tensor());
  Tensor forward(const Tensor& input) override;  // the output alone, from zero states
  std::string extra_repr() const override;       // "10, 20, num_layers=2, batch_first=True", as torch

  std::int64_t input_size, hidden_size;
  RNNOptions options;

 protected:
  enum class Cell { Tanh, Relu, LSTM, GRU };
  // Registers, per layer l and direction (suffix "" or "_reverse"): weight_ih_l<l> (G * H, in), weight_hh_l<l>
  // (G * H, H), bias_ih_l<l> and bias_hh_l<l> (G * H), G = 1, 4 (LSTM: gates i, f, g, o) or 3 (GRU: r, z, n);
  // in = input_size for the first layer, D * H after. All drawn from U(-1/sqrt(H), 1/sqrt(H)), as PyTorch.
  RNNBase(Cell cell, std::int64_t input_size, std::int64_t hidden_size, const RNNOptions& options,
          const TensorOptions& tensor_options);

 private:
  struct Weights {
    Tensor w_ih, w_hh, b_ih, b_hh;  // biases undefined without bias
  };
  // One direction of one layer over x (L, N, in): fills steps[t] (N, H) and the final h (and c).
  void run(const Tensor& x, const Weights& w, bool reverse, Tensor& h, Tensor& c, std::vector<Tensor>& steps) const;
  const char* name() const;

  Cell cell_;
  std::vector<Weights> weights_;  // [layer * D + direction]
};

// h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh), or relu with nonlinearity "relu".
class RNN : public RNNBase {
 public:
  RNN(std::int64_t input_size, std::int64_t hidden_size, const RNNOptions& options = {},
      const std::string& nonlinearity = "tanh", const TensorOptions& tensor_options = {});
  std::string type_name() const override { return "RNN"; }
};

// i, f, g, o = sigmoid, sigmoid, tanh, sigmoid of (x W_ih^T + b_ih + h W_hh^T + b_hh) in four chunks;
// c' = f c + i g; h' = o tanh(c').
class LSTM : public RNNBase {
 public:
  LSTM(std::int64_t input_size, std::int64_t hidden_size, const RNNOptions& options = {},
       const TensorOptions& tensor_options = {});
  std::string type_name() const override { return "LSTM"; }
};

// r, z = sigmoid of the first two chunks of (x W_ih^T + b_ih) + (h W_hh^T + b_hh); n = tanh(x_n + r * h_n) with
// x_n, h_n the third chunks of each; h' = (1 - z) n + z h.
class GRU : public RNNBase {
 public:
  GRU(std::int64_t input_size, std::int64_t hidden_size, const RNNOptions& options = {},
      const TensorOptions& tensor_options = {});
  std::string type_name() const override { return "GRU"; }
};

}  // namespace ferry::nn
