// ferry/factories.h — make tensors: empty, zeros, ones, full, arange, rand, randn, randint, from_vector.
// Factories take options (DESIGN.md invariant 2); random ones follow invariant 8 (see ferry/random.h).
#pragma once

#include <optional>
#include <vector>

#include "ferry/tensor.h"

namespace ferry {

Tensor empty(const Shape& shape, const TensorOptions& options = {});
Tensor zeros(const Shape& shape, const TensorOptions& options = {});
Tensor ones(const Shape& shape, const TensorOptions& options = {});
Tensor full(const Shape& shape, double value, const TensorOptions& options = {});
Tensor zeros_like(const Tensor& like);
Tensor ones_like(const Tensor& like);
Tensor empty_like(const Tensor& like);
Tensor full_like(const Tensor& like, double value);
// The (n, m) identity (m -1: square): ones on the diagonal. float32 unless options say otherwise.
Tensor eye(std::int64_t n, std::int64_t m = -1, const TensorOptions& options = {});
// `steps` values from start to end inclusive, evenly spaced (float32 unless options say otherwise).
Tensor linspace(double start, double end, std::int64_t steps, const TensorOptions& options = {});
// TensorOptions whose dtype may be left unset, for arange (TensorOptions' dtype cannot tell "not given" from float32).
struct ArangeOptions {
  Device device = kCPU;
  std::optional<DType> dtype = std::nullopt;  // unset: PyTorch's choice (see arange)
  bool requires_grad = false;
  bool pinned = false;
};
// [start, end) by step. dtype as PyTorch's: arange(5) and arange(0, 6, 2) are int64 (the C++ API cannot tell 2 from
// 2.0: whole-number doubles count as integers), arange(0, 1, 0.25) float32; pass options.dtype to choose, e.g.
// arange(0, 6, 1, {.dtype = DType::Float32}).
Tensor arange(double end, const ArangeOptions& options = {});
Tensor arange(double start, double end, double step, const ArangeOptions& options = {});
Tensor rand(const Shape& shape, const TensorOptions& options = {});   // uniform [0, 1)
Tensor randn(const Shape& shape, const TensorOptions& options = {});  // normal(0, 1)
Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, const TensorOptions& options = {});  // int64 by default
Tensor uniform(const Shape& shape, double low, double high, const TensorOptions& options = {});
Tensor normal(const Shape& shape, double mean, double std, const TensorOptions& options = {});
// A random permutation of 0..n-1 (int64, on options.device), from the generator.
Tensor randperm(std::int64_t n, const TensorOptions& options = {});

// Host values -> tensor on options.device (options.dtype is ignored: the dtype is T's).
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, const TensorOptions& options = {});
template <typename T>
Tensor from_vector(const std::vector<T>& values, const TensorOptions& options = {}) {
  return from_vector(values, Shape{static_cast<std::int64_t>(values.size())}, options);
}
// Wraps scalar `value` as a 0-d tensor.
Tensor scalar_tensor(double value, const TensorOptions& options = {});

}  // namespace ferry
