// init.cpp — torch.nn.init's formulas over ferry's generator: each initialiser draws a fresh tensor on the
// target's device and copies it in without history. Not here: which layer calls which (the layer files).
#include "ferry/nn/init.h"

#include <cmath>

#include "ferry/autograd.h"
#include "ferry/error.h"
#include "ferry/factories.h"

namespace ferry::nn::init {

namespace {
Tensor& assign(Tensor& tensor, const Tensor& values) {
  autograd::NoGradGuard no_grad;
  tensor.copy_(values);
  return tensor;
}
TensorOptions like(const Tensor& t) { return {.device = t.device(), .dtype = t.dtype()}; }

std::int64_t fan(const Tensor& tensor, FanMode mode) {
  const auto [fan_in, fan_out] = fan_in_and_fan_out(tensor);
  return mode == FanMode::FanIn ? fan_in : fan_out;
}
}  // namespace

std::pair<std::int64_t, std::int64_t> fan_in_and_fan_out(const Tensor& weight) {
  FERRY_CHECK(weight.dim() >= 2, InvalidArgument,
              "Fan in and fan out can not be computed for tensor with fewer than 2 dimensions (shape ",
              shape_str(weight.shape()), ")");
  std::int64_t receptive_field = 1;
  for (int d = 2; d < weight.dim(); ++d) receptive_field *= weight.size(d);
  return {weight.size(1) * receptive_field, weight.size(0) * receptive_field};
}

double calculate_gain(const std::string& nonlinearity, double param) {
  for (const char* one : {"linear", "sigmoid", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                          "conv_transpose3d"}) {
    if (nonlinearity == one) return 1.0;
  }
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  if (nonlinearity == "selu") return 3.0 / 4.0;
  throw InvalidArgument("calculate_gain: unsupported nonlinearity \"" + nonlinearity +
                        "\" (expected linear, conv1d/2d/3d, conv_transpose1d/2d/3d, sigmoid, tanh, relu, leaky_relu "
                        "or selu)");
}

Tensor& uniform_(Tensor& tensor, double low, double high) {
  return assign(tensor, uniform(tensor.shape(), low, high, like(tensor)));
}
Tensor& normal_(Tensor& tensor, double mean, double std) {
  return assign(tensor, normal(tensor.shape(), mean, std, like(tensor)));
}
Tensor& constant_(Tensor& tensor, double value) {
  autograd::NoGradGuard no_grad;
  return tensor.fill_(value);
}
Tensor& zeros_(Tensor& tensor) { return constant_(tensor, 0); }
Tensor& ones_(Tensor& tensor) { return constant_(tensor, 1); }

Tensor& kaiming_uniform_(Tensor& tensor, double a, FanMode mode, const std::string& nonlinearity) {
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan(tensor, mode)));
  const double bound = std::sqrt(3.0) * std;
  return uniform_(tensor, -bound, bound);
}

Tensor& kaiming_normal_(Tensor& tensor, double a, FanMode mode, const std::string& nonlinearity) {
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan(tensor, mode)));
  return normal_(tensor, 0, std);
}

Tensor& xavier_uniform_(Tensor& tensor, double gain) {
  const auto [fan_in, fan_out] = fan_in_and_fan_out(tensor);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_(tensor, -bound, bound);
}

Tensor& xavier_normal_(Tensor& tensor, double gain) {
  const auto [fan_in, fan_out] = fan_in_and_fan_out(tensor);
  return normal_(tensor, 0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)));
}

}  // namespace ferry::nn::init
