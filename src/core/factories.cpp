// factories.cpp — empty, zeros, ones, full, arange, rand, randn, randint, from_vector.
#include "ferry/factories.h"

#include <cmath>
#include <cstring>

#include "ferry/ops.h"
#include "ferry/random.h"
#include "internal.h"

namespace ferry {

namespace {
Tensor with_grad(Tensor t, const TensorOptions& options) {
  if (options.requires_grad) t.requires_grad_(true);
  return t;
}
TensorOptions without_grad(TensorOptions options) {
  options.requires_grad = false;
  return options;
}
}  // namespace

Tensor empty(const Shape& shape, const TensorOptions& options) {
  return with_grad(make_tensor(shape, without_grad(options)), options);
}

Tensor full(const Shape& shape, double value, const TensorOptions& options) {
  Tensor t = make_tensor(shape, without_grad(options));
  t.fill_(value);
  return with_grad(t, options);
}
Tensor zeros(const Shape& shape, const TensorOptions& options) { return full(shape, 0, options); }
Tensor ones(const Shape& shape, const TensorOptions& options) { return full(shape, 1, options); }
Tensor zeros_like(const Tensor& like) { return zeros(like.shape(), {.device = like.device(), .dtype = like.dtype()}); }
Tensor ones_like(const Tensor& like) { return ones(like.shape(), {.device = like.device(), .dtype = like.dtype()}); }
Tensor empty_like(const Tensor& like) { return empty(like.shape(), {.device = like.device(), .dtype = like.dtype()}); }
Tensor full_like(const Tensor& like, double value) {
  return full(like.shape(), value, {.device = like.device(), .dtype = like.dtype()});
}

Tensor eye(std::int64_t n, std::int64_t m, const TensorOptions& options) {
  if (m == -1) m = n;
  FERRY_CHECK(n >= 0 && m >= 0, InvalidArgument, "eye: n and m must be greater or equal to 0, got n = ", n,
              " and m = ", m);
  // Row index == column index, made on the device (no host copy crosses the link).
  const ArangeOptions index{.device = options.device, .dtype = DType::Int64};
  Tensor t = eq(arange(0, static_cast<double>(n), 1, index).unsqueeze(1),
                arange(0, static_cast<double>(m), 1, index).unsqueeze(0)).to(options.dtype);
  return with_grad(t, options);
}

Tensor linspace(double start, double end, std::int64_t steps, const TensorOptions& options) {
  FERRY_CHECK(steps >= 0, InvalidArgument, "linspace: number of steps must be non-negative, got ", steps);
  FERRY_CHECK(is_floating(options.dtype), DTypeMismatch, "linspace: ferry makes floating dtypes only, got ",
              dtype_name(options.dtype), "; make it as float64 and convert");
  if (steps <= 1) return full({steps}, start, options);
  // As PyTorch: the first half counts up from start, the second down from end, so both ends are exact. In
  // float64 on the device, then converted.
  const double step = (end - start) / static_cast<double>(steps - 1);
  const Tensor i = arange(0, static_cast<double>(steps), 1, {.device = options.device, .dtype = DType::Float64});
  const Tensor up = add(mul(i, step), start);
  const Tensor down = rsub(mul(rsub(i, static_cast<double>(steps - 1)), step), end);
  Tensor t = where(lt(i, static_cast<double>(steps / 2)), up, down).to(options.dtype);
  return with_grad(t, options);
}

Tensor arange(double end, const ArangeOptions& options) { return arange(0, end, 1, options); }

Tensor arange(double start, double end, double step, const ArangeOptions& arange_options) {
  FERRY_CHECK(step != 0 && std::isfinite(step) && std::isfinite(start) && std::isfinite(end), InvalidArgument,
              "arange: expected a finite non-zero step and finite bounds, got start=", start, " end=", end,
              " step=", step);
  FERRY_CHECK((end - start) / step >= 0, InvalidArgument, "arange: the step ", step,
              " does not lead from ", start, " to ", end);
  // Unset dtype: int64 when all three are whole numbers an int64 holds ([-2^63, 2^63)), else float32.
  const auto whole = [](double v) { return std::floor(v) == v && v >= -0x1p63 && v < 0x1p63; };
  const DType dtype = arange_options.dtype.value_or(whole(start) && whole(end) && whole(step) ? DType::Int64
                                                                                           : DType::Float32);
  const TensorOptions options{.device = arange_options.device, .dtype = dtype,
                              .requires_grad = arange_options.requires_grad, .pinned = arange_options.pinned};
  const auto n = static_cast<std::int64_t>(std::ceil((end - start) / step));
  Tensor t = make_tensor({n}, without_grad(options));
  backend(t.device()).arange(detail::kernel_view(t), start, step, detail::compute_stream(t.device()));
  return with_grad(t, options);
}

namespace {
Tensor random_tensor(const Shape& shape, RandomKind kind, double a, double b, const TensorOptions& options) {
  Tensor t = make_tensor(shape, without_grad(options));
  const GeneratorState state = generator_state();
  const std::uint64_t offset = reserve_random_counters(static_cast<std::uint64_t>(t.numel()));
  backend(t.device()).random(detail::kernel_view(t), kind, a, b, state.seed, offset,
                             detail::compute_stream(t.device()));
  return with_grad(t, options);
}
}  // namespace

Tensor rand(const Shape& shape, const TensorOptions& options) { return uniform(shape, 0, 1, options); }
Tensor randn(const Shape& shape, const TensorOptions& options) { return normal(shape, 0, 1, options); }

Tensor uniform(const Shape& shape, double low, double high, const TensorOptions& options) {
  FERRY_CHECK(is_floating(options.dtype), InvalidArgument, "uniform/rand: expected a floating dtype, got ",
              dtype_name(options.dtype));
  FERRY_CHECK(low <= high, InvalidArgument, "uniform: expected low <= high, got [", low, ", ", high, ")");
  return random_tensor(shape, RandomKind::Uniform, low, high, options);
}

Tensor normal(const Shape& shape, double mean, double std, const TensorOptions& options) {
  FERRY_CHECK(is_floating(options.dtype), InvalidArgument, "normal/randn: expected a floating dtype, got ",
              dtype_name(options.dtype));
  FERRY_CHECK(std >= 0, InvalidArgument, "normal: expected std >= 0, got ", std);
  return random_tensor(shape, RandomKind::Normal, mean, std, options);
}

Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, const TensorOptions& options) {
  FERRY_CHECK(low < high, InvalidArgument, "randint: expected low < high, got [", low, ", ", high, ")");
  FERRY_CHECK(high - low <= (std::int64_t{1} << 32), InvalidArgument, "randint: the range [", low, ", ", high,
              ") is wider than 2^32");
  TensorOptions opts = options;
  if (opts.dtype == DType::Float32) opts.dtype = DType::Int64;  // PyTorch's default for randint
  return random_tensor(shape, RandomKind::Integer, static_cast<double>(low), static_cast<double>(high), opts);
}

Tensor randperm(std::int64_t n, const TensorOptions& options) {
  FERRY_CHECK(n >= 0, InvalidArgument, "randperm: expected n >= 0, got ", n);
  // Fisher-Yates on the host with counter-based draws, so every device agrees; then one move.
  const GeneratorState state = generator_state();
  const std::uint64_t offset = reserve_random_counters(static_cast<std::uint64_t>(n));
  Tensor keys = make_tensor({n}, {.device = kCPU, .dtype = DType::Int64});
  Tensor draws = make_tensor({n}, {.device = kCPU, .dtype = DType::Int64});
  backend(kCPU).random(detail::kernel_view(draws), RandomKind::Integer, 0, 4294967296.0, state.seed, offset,
                       detail::compute_stream(kCPU));
  auto* p = keys.data<std::int64_t>();
  const auto* r = draws.data<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) p[i] = i;
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>((static_cast<std::uint64_t>(r[i]) * static_cast<std::uint64_t>(i + 1)) >> 32);
    std::swap(p[i], p[j]);
  }
  return keys.to(options.device);
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, const TensorOptions& options) {
  const std::int64_t n = shape_numel(shape);
  FERRY_CHECK(n == static_cast<std::int64_t>(values.size()), ShapeMismatch, "from_vector: ", values.size(),
              " values do not fill shape ", shape_str(shape), " (", n, " elements)");
  Tensor host = make_tensor(shape, {.device = kCPU, .dtype = dtype_of<T>()});
  if constexpr (std::is_same_v<T, bool>) {
    auto* p = host.data<bool>();
    for (std::int64_t i = 0; i < n; ++i) p[i] = values[static_cast<std::size_t>(i)];
  } else if (n > 0) {
    std::memcpy(host.data_ptr(), values.data(), static_cast<std::size_t>(n) * sizeof(T));
  }
  Tensor t = host.to(options.device);
  if (options.requires_grad) t.requires_grad_(true);
  return t;
}

template Tensor from_vector<float>(const std::vector<float>&, const Shape&, const TensorOptions&);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, const TensorOptions&);
template Tensor from_vector<std::int32_t>(const std::vector<std::int32_t>&, const Shape&, const TensorOptions&);
template Tensor from_vector<std::int64_t>(const std::vector<std::int64_t>&, const Shape&, const TensorOptions&);
template Tensor from_vector<std::uint8_t>(const std::vector<std::uint8_t>&, const Shape&, const TensorOptions&);
template Tensor from_vector<bool>(const std::vector<bool>&, const Shape&, const TensorOptions&);
template Tensor from_vector<Float16>(const std::vector<Float16>&, const Shape&, const TensorOptions&);
template Tensor from_vector<BFloat16>(const std::vector<BFloat16>&, const Shape&, const TensorOptions&);

Tensor scalar_tensor(double value, const TensorOptions& options) { return full({}, value, options); }

}  // namespace ferry
