// linear.cpp — the Linear layer: PyTorch's parameters and initialisation around functional::linear.
#include "ferry/nn/linear.h"

#include <cmath>

#include "ferry/factories.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/init.h"

namespace ferry::nn {

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool bias, const TensorOptions& options)
    : in_features(in_features), out_features(out_features) {
  FERRY_CHECK(in_features >= 0 && out_features >= 0, InvalidArgument,
              "Linear: expected non-negative in_features and out_features, got ", in_features, " and ", out_features);
  const TensorOptions like{.device = options.device, .dtype = options.dtype};
  weight = register_parameter("weight", empty({out_features, in_features}, like));  // (out, in)
  if (in_features > 0) init::kaiming_uniform_(weight, std::sqrt(5.0));
  else init::zeros_(weight);
  if (bias) {
    this->bias = register_parameter("bias", empty({out_features}, like));  // (out)
    const double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
    init::uniform_(this->bias, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& input) { return functional::linear(input, weight, bias); }
Tensor Linear::forward_relu(const Tensor& input) {
  return functional::linear(input, weight, bias, functional::Activation::ReLU);
}

std::string Linear::extra_repr() const {
  return ferry::detail::concat("in_features=", in_features, ", out_features=", out_features,
                        ", bias=", bias.defined() ? "True" : "False");
}

}  // namespace ferry::nn
