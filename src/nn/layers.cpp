// layers.cpp — the small layers without parameters (ReLU, GELU, SiLU, Sigmoid, Tanh, LeakyReLU, Softplus,
// Softmax, LogSoftmax, Flatten, Dropout, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Upsample), Sequential and
// ModuleList. Not here: anything with weights (linear.cpp, conv.cpp, batchnorm.cpp, layernorm_embedding.cpp,
// attention.cpp).
#include <cmath>

#include "ferry/nn/activation.h"
#include "ferry/nn/fold.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/module_list.h"
#include "ferry/nn/pooling.h"
#include "ferry/nn/sequential.h"
#include "ferry/ops.h"
#include "checks.h"
#include "repr.h"

namespace ferry::nn {

namespace {
std::string size_str(Size2 s) { return s.h == s.w ? ferry::detail::concat(s.h) : ferry::detail::concat("(", s.h, ", ", s.w, ")"); }
}  // namespace

Tensor ReLU::forward(const Tensor& input) { return functional::relu(input); }

GELU::GELU(std::string approximate) : approximate(std::move(approximate)) {
  FERRY_CHECK(this->approximate == "none" || this->approximate == "tanh", InvalidArgument,
              "GELU: approximate must be 'none' or 'tanh', got '", ferry::detail::printable(this->approximate), "'");
}
Tensor GELU::forward(const Tensor& input) { return functional::gelu(input, approximate); }
std::string GELU::extra_repr() const { return ferry::detail::concat("approximate='", approximate, "'"); }
Tensor SiLU::forward(const Tensor& input) { return functional::silu(input); }
Tensor Sigmoid::forward(const Tensor& input) { return ferry::sigmoid(input); }
Tensor Tanh::forward(const Tensor& input) { return ferry::tanh(input); }
Tensor LeakyReLU::forward(const Tensor& input) { return functional::leaky_relu(input, negative_slope); }
std::string LeakyReLU::extra_repr() const { return ferry::detail::concat("negative_slope=", negative_slope); }
Softplus::Softplus(double beta, double threshold) : beta(beta), threshold(threshold) {
  FERRY_CHECK(beta > 0 && std::isfinite(beta), InvalidArgument, "Softplus: beta must be a positive number, got ", beta);
}
Tensor Softplus::forward(const Tensor& input) { return functional::softplus(input, beta, threshold); }
std::string Softplus::extra_repr() const { return ferry::detail::concat("beta=", beta, ", threshold=", threshold); }
Tensor Module::forward_relu(const Tensor& input) { return functional::relu(forward(input)); }
Tensor Module::forward_relu_max_pool(const Tensor& input) { return functional::max_pool2d(forward_relu(input), 2, 2); }

Tensor Softmax::forward(const Tensor& input) { return ferry::softmax(input, dim); }
std::string Softmax::extra_repr() const { return ferry::detail::concat("dim=", dim); }
Tensor LogSoftmax::forward(const Tensor& input) { return ferry::log_softmax(input, dim); }
std::string LogSoftmax::extra_repr() const { return ferry::detail::concat("dim=", dim); }

Tensor Flatten::forward(const Tensor& input) { return input.flatten(start_dim, end_dim); }
std::string Flatten::extra_repr() const { return ferry::detail::concat("start_dim=", start_dim, ", end_dim=", end_dim); }

Dropout::Dropout(double p) : p(p) {
  check_dropout_probability(p);
}
Tensor Dropout::forward(const Tensor& input) { return functional::dropout(input, p, is_training()); }
std::string Dropout::extra_repr() const { return "p=" + python_float(p) + ", inplace=False"; }

Dropout2d::Dropout2d(double p) : p(p) {
  check_dropout_probability(p);
}
Tensor Dropout2d::forward(const Tensor& input) { return functional::dropout2d(input, p, is_training()); }
std::string Dropout2d::extra_repr() const { return "p=" + python_float(p) + ", inplace=False"; }

Dropout1d::Dropout1d(double p) : p(p) {
  check_dropout_probability(p);
}
Tensor Dropout1d::forward(const Tensor& input) { return functional::dropout1d(input, p, is_training()); }
std::string Dropout1d::extra_repr() const { return "p=" + python_float(p) + ", inplace=False"; }

Tensor MaxPool2d::forward(const Tensor& input) { return functional::max_pool2d(input, kernel_size, stride, padding); }
std::string MaxPool2d::extra_repr() const {
  return "kernel_size=" + size_str(kernel_size) + ", stride=" + size_str(stride) + ", padding=" + size_str(padding) +
         ", dilation=1, ceil_mode=False";
}

Tensor AvgPool2d::forward(const Tensor& input) { return functional::avg_pool2d(input, kernel_size, stride, padding); }
std::string AvgPool2d::extra_repr() const {
  return "kernel_size=" + size_str(kernel_size) + ", stride=" + size_str(stride) + ", padding=" + size_str(padding);
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& input) { return functional::adaptive_avg_pool2d(input, output_size); }
std::string AdaptiveAvgPool2d::extra_repr() const { return "output_size=" + size_str(output_size); }
Tensor AdaptiveMaxPool2d::forward(const Tensor& input) { return functional::adaptive_max_pool2d(input, output_size); }
std::string AdaptiveMaxPool2d::extra_repr() const { return "output_size=" + size_str(output_size); }

Tensor Unfold::forward(const Tensor& input) {
  return functional::unfold(input, kernel_size, dilation, padding, stride);
}
std::string Unfold::extra_repr() const {
  return "kernel_size=" + size_str(kernel_size) + ", dilation=" + size_str(dilation) + ", padding=" +
         size_str(padding) + ", stride=" + size_str(stride);
}

Tensor Fold::forward(const Tensor& input) {
  return functional::fold(input, output_size, kernel_size, dilation, padding, stride);
}
std::string Fold::extra_repr() const {
  return "output_size=" + size_str(output_size) + ", kernel_size=" + size_str(kernel_size) + ", dilation=" +
         size_str(dilation) + ", padding=" + size_str(padding) + ", stride=" + size_str(stride);
}

Upsample::Upsample(Size2 scale_factor, std::string mode, bool align_corners)
    : scale_factor(scale_factor), mode(std::move(mode)), align_corners(align_corners) {
  FERRY_CHECK(this->mode == "nearest" || this->mode == "bilinear", NotSupported, "Upsample: mode '",
              ferry::detail::printable(this->mode), "' is not supported (only 'nearest' and 'bilinear')");
  FERRY_CHECK(!align_corners || this->mode == "bilinear", InvalidArgument, "Upsample: align_corners can only be set "
              "with the interpolating mode 'bilinear', not '", this->mode, "'");
  FERRY_CHECK(scale_factor.h >= 1 && scale_factor.w >= 1, InvalidArgument, "Upsample: scale factors must be whole "
              "numbers >= 1, got (", scale_factor.h, ", ", scale_factor.w, ")");
}
Tensor Upsample::forward(const Tensor& input) {
  if (mode == "nearest") return functional::upsample_nearest2d(input, scale_factor);
  FERRY_CHECK(input.dim() == 4, ShapeMismatch, "Upsample: expected a 4-d (N, C, H, W) input, got ",
              shape_str(input.shape()));
  return functional::upsample_bilinear2d(input, Size2(input.size(2) * scale_factor.h, input.size(3) * scale_factor.w),
                                         align_corners);
}
std::string Upsample::extra_repr() const {
  const std::string factor = scale_factor.h == scale_factor.w
                                 ? ferry::detail::concat(scale_factor.h, ".0")
                                 : ferry::detail::concat("(", scale_factor.h, ".0, ", scale_factor.w, ".0)");
  return "scale_factor=" + factor + ", mode=" + mode;  // as torch 1.13 prints it
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(size()), std::move(module));
}

std::size_t Sequential::stage_length(std::size_t first) const {
  const auto& children = named_children();
  FERRY_CHECK(first < children.size(), InvalidArgument, "Sequential: stage at ", first, " is out of range for ",
              children.size(), " modules");
  const Module& child = *children[first].second;
  const bool relu_next = functional::fused_activations() && first + 1 < children.size() &&
                         dynamic_cast<const ReLU*>(children[first + 1].second.get()) != nullptr;
  if (!relu_next) return 1;
  if (child.fuses_relu_max_pool() && first + 2 < children.size()) {
    const auto* pool = dynamic_cast<const MaxPool2d*>(children[first + 2].second.get());
    if (pool != nullptr && pool->kernel_size == Size2(2) && pool->stride == Size2(2) && pool->padding == Size2(0)) {
      return 3;  // the layer, the ReLU and the 2x2 pooling after it as one
    }
  }
  return child.fuses_relu() ? 2 : 1;  // the layer and the ReLU after it as one
}

namespace {
// A stage of `length` children starting at `child` (Sequential::stage_length), on `input`.
Tensor run_stage(Module& child, std::size_t length, const Tensor& input) {
  switch (length) {
    case 3: return child.forward_relu_max_pool(input);
    case 2: return child.forward_relu(input);
    default: return child.forward(input);
  }
}
}  // namespace

Tensor Sequential::forward_stage(std::size_t first, const Tensor& input) {
  return run_stage((*this)[first], stage_length(first), input);
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (std::size_t i = 0; i < size();) {
    const std::size_t length = stage_length(i);
    x = run_stage((*this)[i], length, x);
    i += length;
  }
  return x;
}

Module& Sequential::operator[](std::size_t index) const {
  FERRY_CHECK(index < size(), InvalidArgument, "Sequential: index ", index, " is out of range for ", size(), " modules");
  return *named_children()[index].second;
}

Tensor ModuleList::forward(const Tensor&) {
  throw InvalidArgument(ferry::detail::concat("ModuleList has no forward: it holds ", size(),
                                       " modules; call them in the owner's forward"));
}

Module& ModuleList::operator[](std::size_t index) const {
  FERRY_CHECK(index < size(), InvalidArgument, "ModuleList: index ", index, " is out of range for ", size(),
              " modules");
  return *named_children()[index].second;
}

std::vector<std::shared_ptr<Module>> ModuleList::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, child] : named_children()) out.push_back(child);
  return out;
}

}  // namespace ferry::nn
