// ferry/nn/init.h — in-place initialisers with PyTorch's formulas (torch.nn.init), drawing from ferry's
// counter-based generator on the tensor's own device. Not here: which layer uses which (the layers).
#pragma once

#include <string>
#include <utility>

#include "ferry/tensor.h"

namespace ferry::nn::init {

enum class FanMode { FanIn, FanOut };

// (fan_in, fan_out) of a weight: (in, out) for (out, in); (in * kh * kw, out * kh * kw) for
// (out, in, kh, kw). Throws InvalidArgument for fewer than 2 dims.
std::pair<std::int64_t, std::int64_t> fan_in_and_fan_out(const Tensor& weight);
// PyTorch's calculate_gain: 1 for "linear", "sigmoid" and the conv names ("conv2d", "conv_transpose2d", ...),
// sqrt(2) "relu", sqrt(2 / (1 + param^2)) "leaky_relu" (param = negative slope), 5/3 "tanh", 3/4 "selu".
double calculate_gain(const std::string& nonlinearity, double param = 0.01);

Tensor& uniform_(Tensor& tensor, double low = 0, double high = 1);
Tensor& normal_(Tensor& tensor, double mean = 0, double std = 1);
Tensor& constant_(Tensor& tensor, double value);
Tensor& zeros_(Tensor& tensor);
Tensor& ones_(Tensor& tensor);
// U(-bound, bound), bound = gain * sqrt(3 / fan), gain = calculate_gain(nonlinearity, a).
Tensor& kaiming_uniform_(Tensor& tensor, double a = 0, FanMode mode = FanMode::FanIn,
                         const std::string& nonlinearity = "leaky_relu");
Tensor& kaiming_normal_(Tensor& tensor, double a = 0, FanMode mode = FanMode::FanIn,
                        const std::string& nonlinearity = "leaky_relu");
// U(-bound, bound), bound = gain * sqrt(6 / (fan_in + fan_out)).
Tensor& xavier_uniform_(Tensor& tensor, double gain = 1);
// N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor& xavier_normal_(Tensor& tensor, double gain = 1);

}  // namespace ferry::nn::init
