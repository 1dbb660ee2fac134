// batchnorm.cpp — BatchNorm1d/2d: parameters, running-statistics buffers and PyTorch's train/eval
// choice around functional::batch_norm.
#include "ferry/nn/batchnorm.h"

#include "ferry/autograd.h"
#include "ferry/factories.h"
#include "ferry/nn/functional.h"

namespace ferry::nn {

BatchNorm::BatchNorm(std::int64_t num_features, const BatchNormOptions& bn, const TensorOptions& tensor_options)
    : num_features(num_features), options(bn) {
  FERRY_CHECK(num_features > 0, InvalidArgument, "BatchNorm: expected num_features > 0, got ", num_features);
  const TensorOptions like{.device = tensor_options.device, .dtype = tensor_options.dtype};
  if (options.affine) {
    weight = register_parameter("weight", ones({num_features}, like));
    bias = register_parameter("bias", zeros({num_features}, like));
  }
  if (options.track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({num_features}, like));
    running_var = register_buffer("running_var", ones({num_features}, like));
    num_batches_tracked = register_buffer("num_batches_tracked",
                                          zeros({}, {.device = tensor_options.device, .dtype = DType::Int64}));
  }
}

Tensor BatchNorm::forward(const Tensor& input) { return run(input, Tail::None); }
Tensor BatchNorm::forward_relu(const Tensor& input) { return run(input, Tail::ReLU); }
Tensor BatchNorm::forward_relu_max_pool(const Tensor& input) {
  if (input.dim() != 4) return Module::forward_relu_max_pool(input);  // max_pool2d says what is wrong
  return run(input, Tail::ReLUMaxPool);
}

Tensor BatchNorm::run(const Tensor& input, Tail tail) {
  check_input(input);
  FERRY_CHECK(input.size(1) == num_features, ShapeMismatch, type_name(), ": expected ", num_features,
              " channels in dim 1, got input of shape ", shape_str(input.shape()));
  const bool tracking = options.track_running_stats;
  if (is_training() && tracking) {
    autograd::NoGradGuard no_grad;
    num_batches_tracked.add_(scalar_tensor(1, {.device = num_batches_tracked.device(), .dtype = DType::Int64}));
  }
  // PyTorch: batch statistics in training, or always when no running statistics are kept.
  const bool use_batch_statistics = is_training() || !tracking;
  if (tail == Tail::ReLUMaxPool) {
    return functional::batch_norm_relu_max_pool2d(input, tracking ? running_mean : Tensor(),
                                                  tracking ? running_var : Tensor(), weight, bias, use_batch_statistics,
                                                  options.momentum, options.eps, tracking ? num_batches_tracked : Tensor());
  }
  return functional::batch_norm(input, tracking ? running_mean : Tensor(), tracking ? running_var : Tensor(), weight,
                                bias, use_batch_statistics, options.momentum, options.eps,
                                tracking ? num_batches_tracked : Tensor(),
                                tail == Tail::ReLU ? functional::Activation::ReLU : functional::Activation::None);
}

std::string BatchNorm::extra_repr() const {
  return ferry::detail::concat(num_features, ", eps=", options.eps, ", momentum=",
                        options.momentum ? ferry::detail::concat(*options.momentum) : std::string("None"),
                        ", affine=", options.affine ? "True" : "False",
                        ", track_running_stats=", options.track_running_stats ? "True" : "False");
}

void BatchNorm1d::check_input(const Tensor& input) const {
  FERRY_CHECK(input.dim() == 2 || input.dim() == 3, ShapeMismatch, "BatchNorm1d: expected 2D or 3D input (got ",
              input.dim(), "D input of shape ", shape_str(input.shape()), ")");
}

void BatchNorm2d::check_input(const Tensor& input) const {
  FERRY_CHECK(input.dim() == 4, ShapeMismatch, "BatchNorm2d: expected 4D input (got ", input.dim(),
              "D input of shape ", shape_str(input.shape()), ")");
}

}  // namespace ferry::nn
