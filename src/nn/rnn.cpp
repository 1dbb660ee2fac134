// rnn.cpp — RNN, LSTM and GRU: PyTorch's recurrences composed of tensor ops. Per layer and direction, the input
// projections of all L steps are one linear (a GEMM of L * N rows); each step then adds h W_hh^T + b_hh and applies
// its gates: on cpu and sim an LSTM or GRU step is one fused node (rnn_cells.h), elsewhere a dozen tensor ops.
// Autograd differentiates the whole unrolled graph (backpropagation through time).
#include "ferry/nn/rnn.h"

#include <cmath>

#include "checks.h"
#include "ferry/factories.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/init.h"
#include "ferry/ops.h"
#include "repr.h"
#include "rnn_cells.h"

namespace ferry::nn {

namespace {
std::int64_t gate_count(bool lstm, bool gru) { return lstm ? 4 : gru ? 3 : 1; }
}  // namespace

RNNBase::RNNBase(Cell cell, std::int64_t input_size, std::int64_t hidden_size, const RNNOptions& options,
                 const TensorOptions& tensor_options)
    : input_size(input_size), hidden_size(hidden_size), options(options), cell_(cell) {
  FERRY_CHECK(input_size > 0 && hidden_size > 0 && options.num_layers > 0, InvalidArgument, name(),
              ": expected positive input_size, hidden_size and num_layers, got ", input_size, ", ", hidden_size,
              " and ", options.num_layers);
  FERRY_CHECK(options.dropout >= 0 && options.dropout <= 1, InvalidArgument, name(),
              ": dropout should be a number in [0, 1], got ", options.dropout);
  const std::int64_t gates = gate_count(cell == Cell::LSTM, cell == Cell::GRU) * hidden_size;
  const int directions = options.bidirectional ? 2 : 1;
  const TensorOptions like{.device = tensor_options.device, .dtype = tensor_options.dtype};
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden_size));
  auto parameter = [&](const std::string& key, const Shape& shape) {
    Tensor t = register_parameter(key, empty(shape, like));
    init::uniform_(t, -bound, bound);
    return t;
  };
  for (std::int64_t layer = 0; layer < options.num_layers; ++layer) {
    const std::int64_t in = layer == 0 ? input_size : directions * hidden_size;
    for (int direction = 0; direction < directions; ++direction) {
      const std::string suffix = "_l" + std::to_string(layer) + (direction == 1 ? "_reverse" : "");
      Weights w;
      w.w_ih = parameter("weight_ih" + suffix, {gates, in});
      w.w_hh = parameter("weight_hh" + suffix, {gates, hidden_size});
      if (options.bias) {
        w.b_ih = parameter("bias_ih" + suffix, {gates});
        w.b_hh = parameter("bias_hh" + suffix, {gates});
      }
      weights_.push_back(w);
    }
  }
}

const char* RNNBase::name() const {
  switch (cell_) {
    case Cell::LSTM: return "LSTM";
    case Cell::GRU: return "GRU";
    default: return "RNN";
  }
}

std::string RNNBase::extra_repr() const {
  std::string text = ferry::detail::concat(input_size, ", ", hidden_size);
  if (options.num_layers != 1) text += ferry::detail::concat(", num_layers=", options.num_layers);
  if (!options.bias) text += ", bias=False";
  if (options.batch_first) text += ", batch_first=True";
  if (options.dropout != 0) text += ", dropout=" + python_float(options.dropout);
  if (options.bidirectional) text += ", bidirectional=True";
  return text;
}

void RNNBase::run(const Tensor& x, const Weights& w, bool reverse, Tensor& h, Tensor& c,
                  std::vector<Tensor>& steps) const {
  const std::int64_t L = x.size(0);
  const Tensor projected = functional::linear(x, w.w_ih, w.b_ih);  // (L, N, G * H): every step's x W_ih^T + b_ih
  steps.assign(static_cast<std::size_t>(L), Tensor());
  const bool fused = (cell_ == Cell::LSTM || cell_ == Cell::GRU) &&  // one backend call each way (rnn_cells.h)
                     detail::use_fused_rnn_cells(x.device(), x.dtype(), h.size(0), h.size(1));
  for (std::int64_t s = 0; s < L; ++s) {
    const std::int64_t t = reverse ? L - 1 - s : s;
    const Tensor xt = projected.select(0, t);                      // (N, G * H)
    const Tensor ht = functional::linear(h, w.w_hh, w.b_hh);       // (N, G * H)
    switch (cell_) {
      case Cell::Tanh: h = tanh(add(xt, ht)); break;
      case Cell::Relu: h = relu(add(xt, ht)); break;
      case Cell::LSTM: {
        if (fused) {  // one node: the same values, one pass each way
          const Tensor hc = detail::lstm_cell(xt, ht, c);  // (2, N, H)
          h = hc.select(0, 0);
          c = hc.select(0, 1);
          break;
        }
        const std::vector<Tensor> g = chunk(add(xt, ht), 4, 1);  // i, f, g, o
        c = add(mul(sigmoid(g[1]), c), mul(sigmoid(g[0]), tanh(g[2])));
        h = mul(sigmoid(g[3]), tanh(c));
        break;
      }
      case Cell::GRU: {
        if (fused) {
          h = detail::gru_cell(xt, ht, h);
          break;
        }
        const std::vector<Tensor> xg = chunk(xt, 3, 1), hg = chunk(ht, 3, 1);  // r, z, n
        const Tensor r = sigmoid(add(xg[0], hg[0])), z = sigmoid(add(xg[1], hg[1]));
        const Tensor n = tanh(add(xg[2], mul(r, hg[2])));
        h = add(n, mul(z, sub(h, n)));  // (1 - z) n + z h
        break;
      }
    }
    steps[static_cast<std::size_t>(t)] = h;
  }
}

RNNOutput RNNBase::forward(const Tensor& input, const Tensor& h0, const Tensor& c0) {
  check_floating(name(), input);
  FERRY_CHECK(input.dim() == 2 || input.dim() == 3, ShapeMismatch, name(), ": expected a 2-d (unbatched) or 3-d "
              "input, got shape ", shape_str(input.shape()));
  FERRY_CHECK(input.size(-1) == input_size, ShapeMismatch, name(), ": input.size(-1) must be equal to input_size. "
              "Expected ", input_size, ", got ", input.size(-1));
  const bool batched = input.dim() == 3;
  FERRY_CHECK(input.size(batched && options.batch_first ? 1 : 0) > 0, ShapeMismatch, name(),
              ": expected a sequence of at least one step, got shape ", shape_str(input.shape()));
  // time-major (L, N, in) from here on
  const Tensor x = !batched ? input.unsqueeze(1) : options.batch_first ? input.transpose(0, 1) : input;
  const std::int64_t N = x.size(1);
  const int directions = options.bidirectional ? 2 : 1;
  const Shape state_shape{options.num_layers * directions, N, hidden_size};
  const bool lstm = cell_ == Cell::LSTM;
  FERRY_CHECK(lstm || !c0.defined(), InvalidArgument, name(), ": takes no cell state c0 (that is LSTM's)");
  auto state = [&](const Tensor& given, const char* what) {
    if (!given.defined()) return zeros(state_shape, {.device = x.device(), .dtype = x.dtype()});
    FERRY_CHECK(given.dim() == (batched ? 3 : 2), ShapeMismatch, name(), ": expected ", what, " of ",
                batched ? 3 : 2, " dims for a ", input.dim(), "-d input, got shape ", shape_str(given.shape()));
    const Tensor s = batched ? given : given.unsqueeze(1);
    FERRY_CHECK(s.shape() == state_shape, ShapeMismatch, name(), ": expected ", what, " ",
                shape_str(batched ? state_shape : Shape{state_shape[0], hidden_size}), ", got ",
                shape_str(given.shape()));
    return s;
  };
  const Tensor h_init = state(h0, "hidden state h0");
  const Tensor c_init = lstm ? state(c0, "cell state c0") : Tensor();

  Tensor layer_input = x;
  std::vector<Tensor> h_last, c_last, steps;
  for (std::int64_t layer = 0; layer < options.num_layers; ++layer) {
    std::vector<Tensor> outputs;
    for (int direction = 0; direction < directions; ++direction) {
      const std::int64_t index = layer * directions + direction;
      Tensor h = h_init.select(0, index);
      Tensor c = lstm ? c_init.select(0, index) : Tensor();
      run(layer_input, weights_[static_cast<std::size_t>(index)], direction == 1, h, c, steps);
      outputs.push_back(stack(steps, 0));  // (L, N, H)
      h_last.push_back(h);
      if (lstm) c_last.push_back(c);
    }
    layer_input = directions == 1 ? outputs[0] : cat(outputs, 2);  // (L, N, D * H)
    if (options.dropout > 0 && layer + 1 < options.num_layers) {
      layer_input = functional::dropout(layer_input, options.dropout, is_training());
    }
  }
  RNNOutput result{layer_input, stack(h_last, 0), lstm ? stack(c_last, 0) : Tensor()};
  if (!batched) {
    result.output = result.output.squeeze(1);
    result.h_n = result.h_n.squeeze(1);
    if (lstm) result.c_n = result.c_n.squeeze(1);
  } else if (options.batch_first) {
    result.output = result.output.transpose(0, 1);
  }
  return result;
}

Tensor RNNBase::forward(const Tensor& input) { return forward(input, Tensor()).output; }

RNN::RNN(std::int64_t input_size, std::int64_t hidden_size, const RNNOptions& options, const std::string& nonlinearity,
         const TensorOptions& tensor_options)
    : RNNBase(nonlinearity == "relu" ? Cell::Relu : Cell::Tanh, input_size, hidden_size, options, tensor_options) {
  FERRY_CHECK(nonlinearity == "tanh" || nonlinearity == "relu", InvalidArgument, "RNN: unknown nonlinearity '",
              ferry::detail::printable(nonlinearity), "' (expected 'tanh' or 'relu')");
}

LSTM::LSTM(std::int64_t input_size, std::int64_t hidden_size, const RNNOptions& options,
           const TensorOptions& tensor_options)
    : RNNBase(Cell::LSTM, input_size, hidden_size, options, tensor_options) {}

GRU::GRU(std::int64_t input_size, std::int64_t hidden_size, const RNNOptions& options,
         const TensorOptions& tensor_options)
    : RNNBase(Cell::GRU, input_size, hidden_size, options, tensor_options) {}

}  // namespace ferry::nn
