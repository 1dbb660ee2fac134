// test_core_ops.cpp — the op-by-op parity suite (every op on every device against cpu, like ggml's
// test-backend-ops), the ops' values on cpu, and the checks every op makes before dispatch.
#include <functional>
#include <limits>

#include "test_helpers.h"

namespace ferry {
namespace {

using testing::accelerators;
using testing::all_close;

struct OpCase {
  std::string name;
  std::function<std::vector<Tensor>(Device)> inputs;  // made on the device from the same seed
  std::function<Tensor(const std::vector<Tensor>&)> op;
  double rtol = 1e-5;
};

std::vector<Tensor> seeded(Device d, std::vector<Shape> shapes, std::uint64_t seed = 1) {
  manual_seed(seed);
  std::vector<Tensor> out;
  for (const Shape& s : shapes) out.push_back(randn(s, {.device = d}));
  return out;
}

// A float as the shortest text torch's tolist() would print for these values (3, -1, inf, nan).
std::string fmt_value(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

std::vector<OpCase> op_cases() {
  auto two = [](Shape a, Shape b) { return [a, b](Device d) { return seeded(d, {a, b}); }; };
  auto one = [](Shape a) { return [a](Device d) { return seeded(d, {a}); }; };
  auto positive = [](Shape a) { return [a](Device d) { return std::vector<Tensor>{add(abs(seeded(d, {a})[0]), 0.1)}; }; };
  using V = const std::vector<Tensor>&;
  std::vector<OpCase> cases = {
      {"add", two({3, 4}, {3, 4}), [](V x) { return add(x[0], x[1]); }},
      {"add_broadcast", two({2, 3, 4}, {4}), [](V x) { return x[0] + x[1]; }},
      {"add_broadcast_middle", two({2, 3, 4}, {3, 1}), [](V x) { return x[0] + x[1]; }},
      {"add_alpha", two({5}, {5}), [](V x) { return add(x[0], x[1], 2.5); }},
      {"sub", two({3, 4}, {1, 4}), [](V x) { return x[0] - x[1]; }},
      {"mul", two({3, 4}, {3, 4}), [](V x) { return x[0] * x[1]; }},
      {"div", two({3, 4}, {3, 4}), [](V x) { return x[0] / x[1]; }},
      {"pow", [](Device d) { auto v = seeded(d, {{6}, {6}}); return std::vector<Tensor>{add(abs(v[0]), 0.5), v[1]}; },
       [](V x) { return pow(x[0], x[1]); }},
      {"maximum", two({7}, {7}), [](V x) { return maximum(x[0], x[1]); }},
      {"minimum", two({7}, {1}), [](V x) { return minimum(x[0], x[1]); }},
      {"scalar_ops", one({10}), [](V x) { return ((x[0] + 1.5) * 2.0 - 0.5) / 3.0; }},
      {"rsub_rdiv", positive({10}), [](V x) { return (1.0 - x[0]) + (2.0 / x[0]); }},
      {"pow_scalar", positive({10}), [](V x) { return pow(x[0], 2.5); }},
      {"neg", one({10}), [](V x) { return -x[0]; }},
      {"exp", one({10}), [](V x) { return exp(x[0]); }},
      {"log", positive({10}), [](V x) { return log(x[0]); }},
      {"sqrt", positive({10}), [](V x) { return sqrt(x[0]); }},
      {"rsqrt", positive({10}), [](V x) { return rsqrt(x[0]); }},
      {"abs", one({10}), [](V x) { return abs(x[0]); }},
      {"sign", one({10}), [](V x) { return sign(x[0]); }},
      {"relu", one({10}), [](V x) { return relu(x[0]); }},
      {"sigmoid", one({10}), [](V x) { return sigmoid(x[0]); }},
      {"tanh", one({10}), [](V x) { return tanh(x[0]); }},
      {"erf", one({10}), [](V x) { return erf(x[0]); }},
      {"square", one({10}), [](V x) { return square(x[0]); }},
      {"sin_cos", one({10}), [](V x) { return cat({sin(mul(x[0], 3.0)), cos(mul(x[0], 3.0))}); }},
      {"log1p_expm1", positive({10}), [](V x) { return cat({log1p(x[0]), expm1(neg(x[0])), expm1(mul(x[0], 1e-4))}); }},
      {"rounding", one({4, 12}), [](V x) {
         const Tensor y = mul(x[0], 3.0);
         const Tensor ties = from_vector<float>({-2.5, -0.5, 0.5, 1.5, 2.5}, {.device = y.device()});
         return cat({floor(y).flatten(), ceil(y).flatten(), round(y).flatten(), trunc(y).flatten(), round(ties)});
       }, 0},
      {"rounding_int64",
       [](Device d) { return std::vector<Tensor>{from_vector<std::int64_t>({(1LL << 53) + 1, -7, 0}, {.device = d})}; },
       [](V x) { return cat({floor(x[0]), ceil(x[0]), round(x[0]), trunc(x[0])}); }, 0},
      {"tril_triu", one({2, 4, 5}), [](V x) {
         return cat({tril(x[0]).flatten(), triu(x[0]).flatten(), tril(x[0], -1).flatten(), triu(x[0], 2).flatten(),
                     tril(x[0].transpose(1, 2), 1).flatten()});
       }, 0},
      {"eq", two({10}, {10}), [](V x) { return eq(x[0], x[0]); }},
      {"lt", two({10}, {10}), [](V x) { return lt(x[0], x[1]); }},
      {"ge_scalar", one({10}), [](V x) { return ge(x[0], 0.0); }},
      {"logical_not", one({10}), [](V x) { return logical_not(gt(x[0], 0.0)); }},
      {"where", two({3, 4}, {4}), [](V x) { return where(gt(x[0], 0.0), x[0], x[1]); }},
      {"where_0d_float64", one({3, 4}), [](V x) {
         return where(gt(x[0], 0.0), x[0], scalar_tensor(0.25, {.device = x[0].device(), .dtype = DType::Float64}));
       }},
      {"sum_all", one({5, 6}), [](V x) { return sum(x[0]); }},
      {"sum_dim0", one({5, 6}), [](V x) { return sum(x[0], {0}); }},
      {"sum_dims_keep", one({2, 3, 4}), [](V x) { return sum(x[0], {0, 2}, true); }},
      {"mean_dim", one({5, 6}), [](V x) { return mean(x[0], {1}); }},
      {"var", one({5, 6}), [](V x) { return var(x[0], {1}); }},
      {"var_biased", one({5, 6}), [](V x) { return var(x[0], {0}, false, true); }},
      {"max_all", one({5, 6}), [](V x) { return max(x[0]); }},
      {"max_dim", one({5, 6}), [](V x) { return max(x[0], 1).first; }},
      {"min_dim_indices", one({5, 6}), [](V x) { return min(x[0], 0).second; }},
      {"argmax", one({5, 6}), [](V x) { return argmax(x[0], 1); }},
      {"amax_amin", one({3, 4, 5}), [](V x) {
         return cat({amax(x[0], {0, 2}).flatten(), amin(x[0], {1}, true).flatten(), amax(x[0]).reshape({1}),
                     amin(x[0], {-1, 0}).flatten()});
       }, 0},
      {"index_add", two({5, 3}, {4, 3}), [](V x) {
         const Tensor index = from_vector<std::int64_t>({4, 0, 4, 2}, {.device = x[0].device()});
         return cat({index_add(x[0], 0, index, x[1], 0.5).flatten(),
                     index_add(x[0].t(), 1, index, x[1].t()).flatten()});
       }},
      {"argmin_keepdim", one({5, 6}), [](V x) { return argmin(x[0], 0, true); }},
      {"matmul", two({5, 7}, {7, 3}), [](V x) { return matmul(x[0], x[1]); }, 1e-4},
      {"matmul_transposed", two({7, 5}, {3, 7}), [](V x) { return matmul(x[0].t(), x[1].t()); }, 1e-4},
      {"matmul_vector", two({5, 7}, {7}), [](V x) { return matmul(x[0], x[1]); }, 1e-4},
      {"matmul_dot", two({7}, {7}), [](V x) { return matmul(x[0], x[1]); }, 1e-4},
      {"matmul_batched_2d", two({2, 5, 7}, {7, 3}), [](V x) { return matmul(x[0], x[1]); }, 1e-4},
      {"matmul_broadcast", two({2, 1, 5, 7}, {3, 7, 4}), [](V x) { return matmul(x[0], x[1]); }, 1e-4},
      {"bmm", two({3, 4, 5}, {3, 5, 2}), [](V x) { return bmm(x[0], x[1]); }, 1e-4},
      {"bmm_transposed_views", two({3, 5, 4}, {3, 2, 5}), [](V x) { return bmm(x[0].transpose(1, 2), x[1].transpose(1, 2)); }, 1e-4},
      {"matmul_head_views", two({2, 6, 3, 4}, {2, 5, 3, 4}),  // attention's q k^T on (N, L, H, D) heads
       [](V x) { return matmul(x[0].transpose(1, 2), x[1].transpose(1, 2).transpose(-2, -1)); }, 1e-4},
      {"index_select",
       [](Device d) { return std::vector<Tensor>{seeded(d, {{5, 3}})[0], from_vector<std::int64_t>({4, 0, 4, 2}, {.device = d})}; },
       [](V x) { return index_select(x[0], 0, x[1]); }},
      {"index_select_dim1",
       [](Device d) { return std::vector<Tensor>{seeded(d, {{2, 5, 3}})[0], from_vector<std::int64_t>({1, 3}, {.device = d})}; },
       [](V x) { return index_select(x[0], 1, x[1]); }},
      {"cat", two({2, 3}, {4, 3}), [](V x) { return cat({x[0], x[1]}, 0); }},
      {"cat_dim1", two({2, 3}, {2, 1}), [](V x) { return cat({x[0], x[1]}, 1); }},
      {"stack", two({2, 3}, {2, 3}), [](V x) { return stack({x[0], x[1]}, 1); }},
      {"transpose_contiguous", one({3, 4, 5}), [](V x) { return x[0].transpose(0, 2).contiguous(); }},
      {"to_int64", one({10}), [](V x) { return mul(x[0], 10.0).to(DType::Int64); }},
      {"strided_binary", two({4, 6}, {6, 4}), [](V x) { return x[0] + x[1].t(); }},
      {"narrow_then_op", one({6, 6}), [](V x) { return exp(x[0].narrow(1, 2, 3)); }},
      {"float64", [](Device d) { return std::vector<Tensor>{seeded(d, {{4, 4}})[0].to(DType::Float64)}; },
       [](V x) { return matmul(x[0], exp(x[0])); }, 1e-12},
      // integer pow: exact and wrapping, the same on every device
      {"pow_int", [](Device d) { return std::vector<Tensor>{from_vector<std::int64_t>({3, -2, 7, 0, 1, -1}, {.device = d}),
                                                            from_vector<std::int64_t>({39, 5, 30, 0, -3, -3}, {.device = d})}; },
       [](V x) { return pow(x[0], x[1]); }, 0},
      {"pow_uint8_scalar", [](Device d) { return std::vector<Tensor>{arange(0, 20, 1, {.device = d, .dtype = DType::UInt8})}; },
       [](V x) { return pow(x[0], 3.0); }, 0},
      // composed ops
      {"clamp", one({10}), [](V x) { return clamp(x[0], -0.5, 0.5); }},
      {"clamp_max_int", [](Device d) { return std::vector<Tensor>{arange(-5, 5, 1, {.device = d})}; },
       [](V x) { return clamp(x[0], std::nullopt, 2.0); }, 0},
      {"masked_fill", one({3, 4}), [](V x) { return masked_fill(x[0], gt(x[0].narrow(0, 0, 1), 0.0), -1.0); }},
      {"isnan_isinf_isfinite", one({10}), [](V x) {
         const Tensor y = div(log(x[0]), add(x[0], -x[0]));  // NaN for x < 0, +-inf for x > 0 (but 1)
         return stack({isnan(y), isinf(y), isfinite(log(x[0]))});
       }},
      {"std_norm", one({4, 5}), [](V x) { return cat({std(x[0], {1}), norm(x[0], {0}), norm(x[0]).reshape({1})}); }},
      {"all_any", one({4, 5}), [](V x) { return cat({all(gt(x[0], -1.0), {1}), any(gt(x[0], 1.0), {0})}); }},
      {"isclose", two({8}, {8}), [](V x) { return isclose(x[0], add(x[0], mul(x[1], 1e-6)), 1e-5, 1e-6); }},
      {"chunk_split", one({7, 3}), [](V x) {
         const auto c = chunk(x[0], 3), s = split(x[0].t(), 2, 1);
         return cat({c[2], s[3].t(), c[0]}, 0);
       }},
      {"repeat", one({2, 3}), [](V x) { return repeat(x[0], {2, 1, 2}); }},
      {"flip", one({2, 3, 4}), [](V x) { return flip(x[0], {0, 2}); }},
      {"one_hot", [](Device d) { return std::vector<Tensor>{from_vector<std::int64_t>({2, 0, 4, 1}, {.device = d})}; },
       [](V x) { return one_hot(x[0], 5); }, 0},
      {"dot_outer", two({6}, {6}), [](V x) { return cat({outer(x[0], x[1]).flatten(), dot(x[0], x[1]).reshape({1})}); }},
      {"eye_linspace", [](Device d) { return std::vector<Tensor>{eye(3, 4, {.device = d}), linspace(-1, 2, 7, {.device = d})}; },
       [](V x) { return cat({x[0].flatten(), x[1]}); }, 0},
      {"strided_view", one({4, 6}), [](V x) { return x[0].t().view({2, 3, 4, 1}).select(0, 1); }},
      // element-wise indexing and running sums
      {"gather", one({5, 6}), [](V x) {
         const Tensor index = from_vector<std::int64_t>({4, 0, 2, 2, 1, 3, 0, 0}, {2, 4}, {.device = x[0].device()});
         return cat({gather(x[0], 0, index).flatten(), gather(x[0], 1, index.t().contiguous()).flatten()});
       }},
      {"scatter_add", two({3, 5}, {4, 6}), [](V x) {
         const Tensor index = from_vector<std::int64_t>({0, 2, 2, 1, 0, 2, 2, 2, 0, 1}, {2, 5}, {.device = x[0].device()});
         return cat({scatter_add(x[0], 0, index, x[1]).flatten(), scatter_add(x[0].t(), 1, index.t(), x[1].t()).flatten()});
       }},
      {"cumsum", one({3, 4, 5}), [](V x) { return cat({cumsum(x[0], 0), cumsum(x[0], 1), cumsum(x[0], -1)}); }},
      {"cumsum_int", [](Device d) { return std::vector<Tensor>{arange(-50, 50, 1, {.device = d}).reshape({10, 10})}; },
       [](V x) { return cumsum(x[0].t(), 1); }, 0},
      {"prod", one({3, 4, 5}), [](V x) { return cat({prod(x[0], {1}).flatten(), prod(x[0], {0, 2}), prod(x[0]).reshape({1})}); }},
      {"sort_topk", one({4, 37}), [](V x) {
         auto [values, order] = sort(x[0], 1, true);
         auto [top, top_at] = topk(x[0], 3, 0, false);
         return cat({values.flatten(), order.to(DType::Float32).flatten(), top.flatten(), top_at.to(DType::Float32).flatten()});
       }},
      {"in_place_ops", two({3, 4}, {4}), [](V x) {
         Tensor y = x[0].clone();
         y.mul_(x[1]).sub_(x[1], 0.5).div_(add(abs(x[1]), 1.0)).add_(2.0).div_(4.0);
         return y;
       }},
  };
  return cases;
}

TEST(CoreOpsParity, EveryOpOnEveryDeviceMatchesCpu) {
  for (const OpCase& c : op_cases()) {
    const Tensor expected = c.op(c.inputs(kCPU));
    for (const Device& device : accelerators()) {
      const Tensor got = c.op(c.inputs(device));
      EXPECT_EQ(got.device(), device) << c.name;
      EXPECT_TRUE(all_close(got.cpu(), expected, c.rtol, c.rtol)) << c.name << " on " << device.str();
    }
  }
}

// sin, cos, log1p, expm1 and the rounding ops with torch 1.13's values (printed with torch.set_printoptions(
// precision=10) for these inputs), their dtypes and refusals.
TEST(CoreOps, TrigonometryLog1pExpm1AndRoundingFollowPyTorch) {
  const Tensor ties = from_vector<double>({-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.6, -0.4, -1.7});
  EXPECT_EQ(round(ties).to_vector<double>(), (std::vector<double>{-2, -2, -0.0, 0, 2, 2, 3, -0.0, -2}));
  EXPECT_TRUE(std::signbit(round(ties).to_vector<double>()[2]));  // -0.5 rounds to -0, as torch
  EXPECT_EQ(floor(ties).to_vector<double>(), (std::vector<double>{-3, -2, -1, 0, 1, 2, 2, -1, -2}));
  EXPECT_EQ(ceil(ties).to_vector<double>(), (std::vector<double>{-2, -1, -0.0, 1, 2, 3, 3, -0.0, -1}));
  EXPECT_EQ(trunc(ties).to_vector<double>(), (std::vector<double>{-2, -1, -0.0, 0, 1, 2, 2, -0.0, -1}));
  const Tensor big = from_vector<std::int64_t>({(1LL << 53) + 1, -3});  // beyond double's integers: unchanged
  EXPECT_EQ(floor(big).dtype(), DType::Int64);
  EXPECT_EQ(round(big).to_vector<std::int64_t>(), (std::vector<std::int64_t>{(1LL << 53) + 1, -3}));
  EXPECT_THROW(floor(from_vector<bool>({true})), InvalidArgument);  // torch: "not implemented for 'Bool'"

  // Where log(1 + x) and exp(x) - 1 in float32 give 0, log1p and expm1 keep every digit.
  const Tensor tiny = from_vector<float>({1e-10f, -1e-7f});
  EXPECT_EQ(log(add(tiny, 1.0)).to_vector<float>()[0], 0.0f);
  EXPECT_NEAR(log1p(tiny).to_vector<float>()[0], 1e-10f, 1e-16);
  EXPECT_NEAR(log1p(tiny).to_vector<float>()[1], -1.00000005e-7f, 1e-13);
  EXPECT_NEAR(expm1(tiny).to_vector<float>()[0], 1e-10f, 1e-16);
  EXPECT_NEAR(expm1(tiny).to_vector<float>()[1], -9.9999995e-8f, 1e-13);
  EXPECT_EQ(log1p(from_vector<double>({-1})).item<double>(), -std::numeric_limits<double>::infinity());

  const Tensor angles = from_vector<std::int64_t>({0, 1, 2, 3});  // integers give float32, as torch
  EXPECT_EQ(sin(angles).dtype(), DType::Float32);
  const std::vector<float> s = sin(angles).to_vector<float>(), c = cos(angles).to_vector<float>();
  const std::vector<float> torch_sin = {0.0f, 0.8414709568f, 0.9092974067f, 0.1411200017f};
  const std::vector<float> torch_cos = {1.0f, 0.5403023362f, -0.4161468446f, -0.9899924994f};
  for (std::size_t i = 0; i < s.size(); ++i) {
    EXPECT_NEAR(s[i], torch_sin[i], 1e-7) << i;
    EXPECT_NEAR(c[i], torch_cos[i], 1e-7) << i;
  }

  // A step function's gradient: zero, as torch's.
  Tensor x = from_vector<double>({0.3, 1.7, -2.2}).requires_grad_();
  sum(add(add(floor(x), ceil(x)), add(round(x), trunc(x)))).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 0}));
}

// amax / amin (ties share the gradient, as torch's) and index_add (repeated indices add up), with their refusals.
TEST(CoreOps, AmaxAminAndIndexAddFollowPyTorch) {
  const Tensor m = from_vector<double>({1, 3, 3, -2, 5, 0}, {2, 3});
  EXPECT_EQ(amax(m, {1}).to_vector<double>(), (std::vector<double>{3, 5}));
  EXPECT_EQ(amin(m, {0}, true).shape(), (Shape{1, 3}));
  EXPECT_EQ(amin(m, {0}, true).to_vector<double>(), (std::vector<double>{-2, 3, 0}));
  EXPECT_EQ(amax(m).item<double>(), 5);
  EXPECT_EQ(amax(arange(6).reshape({2, 3}), {0, 1}).dtype(), DType::Int64);
  Tensor x = m.clone().requires_grad_();
  sum(amax(x, {1})).backward();  // row 0: 3 twice, each gets half
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0.5, 0.5, 0, 1, 0}));
  EXPECT_THROW(amax(empty({2, 0}), {1}), InvalidArgument);
  EXPECT_EQ(amax(empty({2, 0}), {0}).shape(), (Shape{0}));  // nothing to reduce into: an empty result
  EXPECT_THROW(amin(m, {1, 1}), InvalidArgument);

  const Tensor self = zeros({3, 2}, {.dtype = DType::Float64});
  const Tensor source = from_vector<double>({1, 2, 3, 4, 5, 6}, {3, 2});
  const Tensor index = from_vector<std::int64_t>({2, 0, 2});
  EXPECT_EQ(index_add(self, 0, index, source).to_vector<double>(), (std::vector<double>{3, 4, 0, 0, 6, 8}));
  EXPECT_EQ(index_add(self, 0, index, source, -1).to_vector<double>(), (std::vector<double>{-3, -4, 0, 0, -6, -8}));
  EXPECT_EQ(self.to_vector<double>(), std::vector<double>(6, 0.0));  // self is left as it was
  EXPECT_EQ(index_add(arange(4).reshape({2, 2}), 1, from_vector<std::int64_t>({1, 1}), arange(4).reshape({2, 2}))
                .to_vector<std::int64_t>(),
            (std::vector<std::int64_t>{0, 2, 2, 8}));
  EXPECT_THROW(index_add(self, 0, index, source.narrow(0, 0, 2)), ShapeMismatch);  // 3 indices, 2 slices
  EXPECT_THROW(index_add(self, 0, index.reshape({3, 1}), source), InvalidArgument);
  EXPECT_THROW(index_add(arange(3), 0, from_vector<std::int64_t>({0}), arange(1), 0.5), InvalidArgument);
  Tensor s = self.clone().requires_grad_(), src = source.clone().requires_grad_();
  sum(mul(index_add(s, 0, index, src, 2), from_vector<double>({1, 2, 3, 4, 5, 6}, {3, 2}))).backward();
  EXPECT_EQ(s.grad().to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(src.grad().to_vector<double>(), (std::vector<double>{10, 12, 2, 4, 10, 12}));
}

// tril and triu on matrices, batches, rectangles and both signs of diagonal, as torch.tril / torch.triu.
TEST(CoreOps, TrilAndTriuKeepTheirTriangle) {
  const Tensor m = add(arange(12, {.dtype = DType::Float32}), 1.0).reshape({3, 4});  // 1..12
  EXPECT_EQ(tril(m).to_vector<float>(), (std::vector<float>{1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0}));
  EXPECT_EQ(triu(m).to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12}));
  EXPECT_EQ(tril(m, 1).to_vector<float>(), (std::vector<float>{1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12}));
  EXPECT_EQ(triu(m, -1).to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12}));
  EXPECT_EQ(tril(m, -5).to_vector<float>(), std::vector<float>(12, 0.0f));
  EXPECT_EQ(triu(m, -5).to_vector<float>(), m.to_vector<float>());
  // the causal mask of attention: true above the diagonal (the keys a query may not see)
  EXPECT_EQ(triu(ones({3, 3}, {.dtype = DType::Bool}), 1).to_vector<bool>(),
            (std::vector<bool>{false, true, true, false, false, true, false, false, false}));
  const Tensor batch = stack({m, mul(m, -1.0)});
  EXPECT_EQ(tril(batch).select(0, 1).to_vector<float>(), mul(tril(m), -1.0).to_vector<float>());
  EXPECT_EQ(triu(arange(6).reshape({2, 3})).dtype(), DType::Int64);
  // a NaN outside the triangle becomes 0, as torch's
  const Tensor with_nan = from_vector<float>({1, std::numeric_limits<float>::quiet_NaN(), 3, 4}, {2, 2});
  EXPECT_EQ(tril(with_nan).to_vector<float>(), (std::vector<float>{1, 0, 3, 4}));
  try {
    tril(arange(3));
    FAIL() << "tril of a vector";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("at least 2 dims"), std::string::npos) << e.what();
  }
}

// The composed ops, integer pow, strided views and the in-place ops with PyTorch's values and refusals.
TEST(CoreOps, ComposedOpsFollowPyTorch) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const Tensor x = from_vector<double>({-2, -0.5, 0.5, 2, nan});
  std::vector<double> c = clamp(x, -1.0, 1.0).to_vector<double>();
  EXPECT_EQ(std::vector<double>(c.begin(), c.end() - 1), (std::vector<double>{-1, -0.5, 0.5, 1}));
  EXPECT_TRUE(std::isnan(c.back()));
  EXPECT_EQ(clamp(x.narrow(0, 0, 4), 1.0, -1.0).to_vector<double>(), (std::vector<double>{-1, -1, -1, -1}));
  const Tensor ints = from_vector<std::int64_t>({-3, 0, 3});
  EXPECT_EQ(clamp(ints, 0.0).dtype(), DType::Int64);
  EXPECT_EQ(clamp(ints, 0.0).to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 0, 3}));
  EXPECT_EQ(clamp(ints, 0.5).dtype(), DType::Float32);
  EXPECT_THROW(clamp(ints, std::nullopt, std::nullopt), InvalidArgument);

  EXPECT_EQ(masked_fill(ints, from_vector<bool>({true, false, true}), 7).to_vector<std::int64_t>(),
            (std::vector<std::int64_t>{7, 0, 7}));
  EXPECT_THROW(masked_fill(ints, from_vector<bool>({true, false, true}), 0.5), InvalidArgument);
  EXPECT_THROW(masked_fill(ints, from_vector<std::int64_t>({1, 0, 1}), 1), DTypeMismatch);
  EXPECT_THROW(masked_fill(ints, zeros({2, 3}, {.dtype = DType::Bool}), 1), ShapeMismatch);

  const Tensor odd = from_vector<double>({nan, inf, -inf, 1});
  EXPECT_EQ(isnan(odd).to_vector<bool>(), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(isinf(odd).to_vector<bool>(), (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(isfinite(odd).to_vector<bool>(), (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(isfinite(ints).to_vector<bool>(), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(isclose(odd, from_vector<double>({nan, inf, inf, 1 + 1e-9})).to_vector<bool>(),
            (std::vector<bool>{false, true, false, true}));
  EXPECT_TRUE(isclose(odd, odd, 1e-5, 1e-8, /*equal_nan=*/true).to_vector<bool>()[0]);
  EXPECT_TRUE(allclose(ints, ints));
  EXPECT_FALSE(allclose(odd, odd));
  EXPECT_THROW(isclose(ints, odd.narrow(0, 0, 3)), DTypeMismatch);

  EXPECT_TRUE(all(empty({0})).item<bool>());
  EXPECT_FALSE(any(empty({0})).item<bool>());
  EXPECT_TRUE(all(odd).item<bool>());  // NaN counts as nonzero
  EXPECT_EQ(any(from_vector<double>({0, 0, 0, 1}, {2, 2}), {1}).to_vector<bool>(), (std::vector<bool>{false, true}));
  EXPECT_DOUBLE_EQ(std(from_vector<double>({1, 2, 3, 4})).item<double>(), std::sqrt(5.0 / 3.0));
  EXPECT_DOUBLE_EQ(norm(from_vector<double>({3, 4})).item<double>(), 5.0);
  Tensor zero = zeros({3}, {.dtype = DType::Float64, .requires_grad = true});
  norm(zero).backward();
  EXPECT_EQ(zero.grad().to_vector<double>(), (std::vector<double>{0, 0, 0}));  // not NaN

  const Tensor seven = arange(7);
  std::vector<std::int64_t> sizes;
  for (const Tensor& piece : chunk(seven, 3)) sizes.push_back(piece.numel());
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{3, 3, 1}));
  EXPECT_EQ(chunk(arange(6), 4).size(), 3u);  // pieces of ceil(6 / 4) = 2, as PyTorch
  EXPECT_EQ(split(seven, 3)[2].to_vector<std::int64_t>(), (std::vector<std::int64_t>{6}));
  EXPECT_EQ(split(seven, 3)[1].storage(), seven.storage());  // views
  EXPECT_THROW(chunk(seven, 0), InvalidArgument);
  EXPECT_THROW(split(seven, 0), InvalidArgument);

  const Tensor pair = from_vector<std::int64_t>({1, 2});
  EXPECT_EQ(repeat(pair, {2, 2}).to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 2, 1, 2, 1, 2, 1, 2}));
  EXPECT_EQ(repeat(pair, {2, 2}).shape(), (Shape{2, 4}));
  EXPECT_NE(repeat(pair, {1}).storage(), pair.storage());  // always a copy
  EXPECT_THROW(repeat(ones({2, 2}), {2}), InvalidArgument);
  EXPECT_EQ(flip(arange(6).view({2, 3}), {0, 1}).to_vector<std::int64_t>(),
            (std::vector<std::int64_t>{5, 4, 3, 2, 1, 0}));
  EXPECT_THROW(flip(arange(6).view({2, 3}), {1, -1}), InvalidArgument);

  EXPECT_EQ(one_hot(from_vector<std::int64_t>({1, 0})).to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 1, 1, 0}));
  EXPECT_THROW(one_hot(from_vector<std::int64_t>({1, 5}), 5), InvalidArgument);
  EXPECT_THROW(one_hot(from_vector<std::int64_t>({1, -1}), 5), InvalidArgument);
  EXPECT_THROW(one_hot(ints.to(DType::Int32), 5), DTypeMismatch);

  EXPECT_EQ(eye(2, 3).to_vector<float>(), (std::vector<float>{1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(linspace(0, 1, 5).to_vector<float>(), (std::vector<float>{0, 0.25f, 0.5f, 0.75f, 1}));
  EXPECT_EQ(linspace(3, 9, 1).to_vector<float>(), (std::vector<float>{3}));
  EXPECT_EQ(linspace(0, 0.3, 4, {.dtype = DType::Float64}).to_vector<double>().back(), 0.3);  // the end is exact
  EXPECT_EQ(full_like(ints, 4).to_vector<std::int64_t>(), (std::vector<std::int64_t>{4, 4, 4}));

  // Integer pow: exact beyond 2^53, integer dtype; a negative exponent tensor truncates; a negative scalar refused.
  const Tensor p = pow(from_vector<std::int64_t>({3, 2, 1, -1, 2}), from_vector<std::int64_t>({39, 10, -4, -3, -1}));
  EXPECT_EQ(p.dtype(), DType::Int64);
  EXPECT_EQ(p.to_vector<std::int64_t>(), (std::vector<std::int64_t>{4052555153018976267, 1024, 1, -1, 0}));
  EXPECT_EQ(pow(ints, 2.0).to_vector<std::int64_t>(), (std::vector<std::int64_t>{9, 0, 9}));
  EXPECT_EQ(pow(ints, 2.5).dtype(), DType::Float32);
  EXPECT_THROW(pow(ints, -1.0), InvalidArgument);

  // view() of a stride-compatible non-contiguous tensor is a view; reshape() copies only when it must.
  const Tensor m = arange(12).view({3, 4});
  const Tensor mt = m.t();  // (4, 3), strides (1, 4)
  EXPECT_EQ(mt.view({4, 3, 1}).storage(), m.storage());
  EXPECT_EQ(mt.reshape({2, 2, 3}).storage(), m.storage());  // splitting a dim keeps it in one chunk
  EXPECT_EQ(mt.reshape({2, 2, 3}).to_vector<std::int64_t>(), mt.contiguous().to_vector<std::int64_t>());
  EXPECT_THROW(mt.view({12}), InvalidArgument);
  EXPECT_NE(mt.reshape({12}).storage(), m.storage());
  EXPECT_EQ(mt.reshape({12}).to_vector<std::int64_t>(), mt.contiguous().to_vector<std::int64_t>());
  EXPECT_THROW(arange(8).view({2, 2, 2}).t(), InvalidArgument);

  // In place: PyTorch's casting rule, no growing by broadcast.
  Tensor i = ints.clone();
  EXPECT_THROW(i.div_(2.0), DTypeMismatch);
  EXPECT_THROW(i.div_(ints), DTypeMismatch);
  EXPECT_THROW(i.mul_(ones({3})), DTypeMismatch);
  EXPECT_THROW(i.add_(ones({3}), 2), DTypeMismatch);  // float into int64, alpha or not
  EXPECT_EQ(i.to_vector<std::int64_t>(), ints.to_vector<std::int64_t>());  // nothing written by a refused op
  EXPECT_THROW(ones({3}).mul_(ones({2, 3})), ShapeMismatch);
  EXPECT_THROW(from_vector<bool>({true}).sub_(from_vector<bool>({true})), InvalidArgument);
  EXPECT_THROW(from_vector<bool>({true}).mul_(2.0), DTypeMismatch);  // a number times bools is not bool
  EXPECT_THROW(from_vector<bool>({true}).add_(1.0), DTypeMismatch);
  i.sub_(ints, 2).mul_(ints);
  EXPECT_EQ(i.to_vector<std::int64_t>(), (std::vector<std::int64_t>{-9, 0, -9}));
  Tensor u = from_vector<std::uint8_t>({1, 2});
  u.sub_(from_vector<std::uint8_t>({2, 2}));
  EXPECT_EQ(u.to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{255, 0}));  // wraps, as PyTorch's uint8
  // alpha of the out-of-place add/sub: in the result's dtype, never fractional for integers.
  EXPECT_THROW(add(ints, ints, 0.5), InvalidArgument);
  const Tensor w = sub(from_vector<std::uint8_t>({10}), from_vector<std::uint8_t>({4}), 3);
  EXPECT_EQ(w.dtype(), DType::UInt8);
  EXPECT_EQ(w.to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{254}));  // 10 - 12 wraps
}

TEST(CoreOps, ValuesOnCpu) {
  Tensor a = from_vector<float>({1, 2, 3, 4}, {2, 2});
  Tensor b = from_vector<float>({10, 20}, {2});
  EXPECT_EQ((a + b).to_vector<float>(), (std::vector<float>{11, 22, 13, 24}));
  EXPECT_EQ(matmul(a, a).to_vector<float>(), (std::vector<float>{7, 10, 15, 22}));
  EXPECT_EQ(sum(a, {0}).to_vector<float>(), (std::vector<float>{4, 6}));
  EXPECT_EQ(sum(a, {1}, true).shape(), (Shape{2, 1}));
  EXPECT_FLOAT_EQ(mean(a).item<float>(), 2.5f);
  EXPECT_FLOAT_EQ(var(a).item<float>(), 5.f / 3.f);
  EXPECT_EQ(argmax(a, 1).to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 1}));
  EXPECT_EQ(max(a, 0).first.to_vector<float>(), (std::vector<float>{3, 4}));
  EXPECT_EQ(gt(a, 2.0).to_vector<bool>(), (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(sum(gt(a, 2.0)).item<std::int64_t>(), 2);
  EXPECT_EQ(sum(from_vector<std::int64_t>({1, 2})).dtype(), DType::Int64);
  EXPECT_EQ(div(from_vector<std::int64_t>({1}), from_vector<std::int64_t>({2})).item<float>(), 0.5f);
  EXPECT_EQ(cat({a, a}, 1).shape(), (Shape{2, 4}));
  EXPECT_EQ(stack({b, b}).shape(), (Shape{2, 2}));
  EXPECT_EQ(index_select(a, 1, from_vector<std::int64_t>({1})).to_vector<float>(), (std::vector<float>{2, 4}));
  // NaN propagates through max, as in PyTorch.
  EXPECT_TRUE(std::isnan(max(from_vector<float>({1, NAN, 3})).item<float>()));
  // Large inputs take the OpenMP path; still exact.
  Tensor big = ones({1 << 20});
  EXPECT_DOUBLE_EQ(sum(big + big).item<double>(), 2.0 * (1 << 20));
}

// gather, scatter_add and cumsum with the numbers torch 1.13 gave for the same calls, on every device.
TEST(CoreOps, GatherScatterAddAndCumsumFollowPyTorch) {
  std::vector<Device> devices = accelerators();
  devices.insert(devices.begin(), kCPU);
  for (const Device& d : devices) {
    const TensorOptions on{.device = d};
    const Tensor a = arange(0, 12, 1, {.device = d, .dtype = DType::Float32}).reshape({3, 4});
    const auto index = [&](std::vector<std::int64_t> v, Shape s) { return from_vector<std::int64_t>(v, s, on); };
    EXPECT_EQ(gather(a, 1, index({0, 3, 2, 2, 1, 0}, {3, 2})).to_vector<float>(),
              (std::vector<float>{0, 3, 6, 6, 9, 8})) << d.str();
    EXPECT_EQ(gather(a, 0, index({2, 0, 1, 0, 0, 2}, {2, 3})).to_vector<float>(),
              (std::vector<float>{8, 1, 6, 0, 1, 10})) << d.str();
    EXPECT_EQ(gather(a, 0, zeros({4, 1}, {.device = d, .dtype = DType::Int64})).shape(), (Shape{4, 1}));  // longer along dim
    const Tensor src = arange(1, 11, 1, {.device = d, .dtype = DType::Float32}).reshape({2, 5});
    EXPECT_EQ(scatter_add(zeros({3, 5}, on), 0, index({0, 1, 2, 0, 0, 2, 0, 0, 1, 2}, {2, 5}), src).to_vector<float>(),
              (std::vector<float>{1, 7, 8, 4, 5, 0, 2, 0, 9, 0, 6, 0, 3, 0, 10})) << d.str();
    // an index smaller than self and src: only its corner is read and written
    const Tensor src2 = arange(1, 13, 1, {.device = d, .dtype = DType::Float32}).reshape({3, 4});
    EXPECT_EQ(scatter_add(ones({3, 4}, on), 1, index({3, 3, 0, 1}, {2, 2}), src2).to_vector<float>(),
              (std::vector<float>{1, 1, 1, 4, 6, 7, 1, 1, 1, 1, 1, 1})) << d.str();
    const Tensor ints = from_vector<std::int64_t>({1, 2, 3, 4, 5, 6}, {2, 3}, on);
    EXPECT_EQ(cumsum(ints, 1).to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 3, 6, 4, 9, 15})) << d.str();
    EXPECT_EQ(cumsum(ints, 0).to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 2, 3, 5, 7, 9})) << d.str();
    const Tensor bytes = from_vector<std::uint8_t>({200, 100}, {2}, on);
    EXPECT_EQ(cumsum(bytes, 0).dtype(), DType::Int64);  // integers sum as int64: 300, not 44
    EXPECT_EQ(cumsum(bytes, 0).to_vector<std::int64_t>(), (std::vector<std::int64_t>{200, 300})) << d.str();
    EXPECT_EQ(cumsum(from_vector<bool>({true, false, true}, {3}, on), 0).to_vector<std::int64_t>(),
              (std::vector<std::int64_t>{1, 1, 2})) << d.str();
    EXPECT_EQ(cumsum(scalar_tensor(3.0, on), 0).item<float>(), 3.0f);
    EXPECT_EQ(gather(scalar_tensor(5.0, on), 0, scalar_tensor(0, {.device = d, .dtype = DType::Int64})).item<float>(), 5.0f);
    // int64 sums wrap as two's complement on every device (no signed overflow)
    const std::int64_t big = std::numeric_limits<std::int64_t>::max();
    EXPECT_EQ(cumsum(from_vector<std::int64_t>({big, 1}, {2}, on), 0).to_vector<std::int64_t>()[1],
              std::numeric_limits<std::int64_t>::min()) << d.str();
    // PyTorch's refusals
    EXPECT_THROW({  // index 4 of size 4: refused at once, or by the kernel (cuda) at the next sync
      gather(a, 1, index({0, 4}, {1, 2}));
      synchronize(d);
    }, InvalidArgument) << d.str();
  }
  const Tensor a = ones({3, 4});
  try {
    gather(a, 1, from_vector<std::int64_t>({0, 4}, {1, 2}));
    ADD_FAILURE() << "index 4 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("gather: index 4 is out of bounds for dimension with size 4"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(gather(a, 1, from_vector<std::int64_t>({0, 1})), ShapeMismatch);             // 1-d index, 2-d input
  EXPECT_THROW(gather(a, 1, zeros({4, 1}, {.dtype = DType::Int64})), ShapeMismatch);        // 4 rows > 3
  EXPECT_THROW(gather(a, 1, zeros({1, 1})), DTypeMismatch);                                 // float index
  EXPECT_THROW(gather(a, 2, zeros({1, 1}, {.dtype = DType::Int64})), InvalidArgument);      // no dim 2
  const Tensor idx = zeros({3, 5}, {.dtype = DType::Int64});
  EXPECT_THROW(scatter_add(zeros({3, 5}), 0, idx, ones({2, 5})), ShapeMismatch);            // index larger than src
  EXPECT_THROW(scatter_add(zeros({3, 5}), 0, idx, ones({3, 5}, {.dtype = DType::Float64})), DTypeMismatch);
  EXPECT_THROW(scatter_add(zeros({3, 5}), 0, from_vector<std::int64_t>({3, 0, 0, 0, 0}, {1, 5}), ones({1, 5})),
               InvalidArgument);
  EXPECT_THROW(scatter_add(zeros({2}, {.dtype = DType::Bool}), 0, zeros({1}, {.dtype = DType::Int64}),
                           zeros({1}, {.dtype = DType::Bool})), DTypeMismatch);
  // scatter_add leaves self as it was
  const Tensor self = zeros({2});
  scatter_add(self, 0, zeros({1}, {.dtype = DType::Int64}), ones({1}));
  EXPECT_EQ(self.to_vector<float>(), (std::vector<float>{0, 0}));
  // gradients: PyTorch's for the same calls
  Tensor x = arange(0, 12, 1, {.dtype = DType::Float32}).reshape({3, 4}).requires_grad_(true);
  sum(mul(gather(x, 1, from_vector<std::int64_t>({0, 0, 3, 1, 2, 2}, {3, 2})),
          from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}))).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{3, 0, 0, 0, 0, 4, 0, 3, 0, 0, 11, 0}));
  Tensor z = arange(0, 4, 1, {.dtype = DType::Float32}).requires_grad_(true);
  sum(mul(cumsum(z, 0), from_vector<float>({1, 2, 3, 4}))).backward();
  EXPECT_EQ(z.grad().to_vector<float>(), (std::vector<float>{10, 9, 7, 4}));
}

// masked_select and nonzero: torch 1.13's values, -0.0 and NaN copied as they are, one recorded read of the size.
TEST(CoreOps, MaskedSelectAndNonzeroFollowPyTorch) {
  std::vector<Device> devices = accelerators();
  devices.insert(devices.begin(), kCPU);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Device& d : devices) {
    const TensorOptions on{.device = d};
    const Tensor a = from_vector<float>({1, -0.0f, 3, 4, 5, nan}, {2, 3}, on);
    const Tensor picked = masked_select(a, from_vector<bool>({true, true, false, false, true, true}, {2, 3}, on));
    const std::vector<float> v = picked.to_vector<float>();
    ASSERT_EQ(v.size(), 4u) << d.str();
    EXPECT_EQ(v[0], 1.0f);
    EXPECT_TRUE(v[1] == 0.0f && std::signbit(v[1])) << "-0.0 kept on " << d.str();
    EXPECT_EQ(v[2], 5.0f);
    EXPECT_TRUE(std::isnan(v[3])) << d.str();
    EXPECT_EQ(picked.device(), d);
    // the mask broadcast over the rows
    const std::vector<float> rows = masked_select(a, from_vector<bool>({true, false, true}, {3}, on)).to_vector<float>();
    ASSERT_EQ(rows.size(), 4u);
    EXPECT_EQ(rows[2], 4.0f);
    EXPECT_EQ(nonzero(from_vector<std::int64_t>({0, 2, 0, 3, 0, 4}, {2, 3}, on)).to_vector<std::int64_t>(),
              (std::vector<std::int64_t>{0, 1, 1, 0, 1, 2})) << d.str();
    EXPECT_EQ(nonzero(from_vector<float>({0, nan, 1}, {3}, on)).to_vector<std::int64_t>(),
              (std::vector<std::int64_t>{1, 2})) << d.str();
    EXPECT_EQ(nonzero(zeros({2, 3}, on)).shape(), (Shape{0, 2}));
    EXPECT_EQ(nonzero(scalar_tensor(5, on)).shape(), (Shape{1, 0}));
    EXPECT_EQ(nonzero(scalar_tensor(0, on)).shape(), (Shape{0, 0}));
    // differentiable: the gradient goes back to the picked elements
    Tensor x = from_vector<float>({1, 2, 3}, {3}, on).requires_grad_(true);
    sum(mul(masked_select(x, from_vector<bool>({true, false, true}, {3}, on)), from_vector<float>({5, 7}, {2}, on)))
        .backward();
    EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{5, 0, 7})) << d.str();
  }
  EXPECT_THROW(masked_select(ones({3}), ones({3})), DTypeMismatch);  // a float mask
  EXPECT_THROW(masked_select(ones({3}), from_vector<bool>({true, false})), ShapeMismatch);
  // off the cpu the size is one recorded device->host read, named for the op
  for (const Device& d : accelerators()) {
    const Tensor values = ones({4}, {.device = d});
    const Tensor mask = gt(values, 0.0);
    synchronize(d);
    const std::size_t before = Ledger::global().transfers().size();
    masked_select(values, mask);
    const std::vector<TransferRecord> after = Ledger::global().transfers();
    ASSERT_EQ(after.size(), before + 1) << d.str();
    EXPECT_EQ(after.back().direction, Direction::DeviceToHost);
    EXPECT_EQ(after.back().label, "masked_select (result size)");
  }
}

// prod with torch 1.13's values and gradients, zeros in the slices included (no 0/0).
TEST(CoreOps, ProdFollowsPyTorch) {
  std::vector<Device> devices = accelerators();
  devices.insert(devices.begin(), kCPU);
  for (const Device& d : devices) {
    Tensor a = from_vector<float>({1, 2, 3, 4, 0, 6, 0, 0, 2}, {3, 3}, {.device = d}).requires_grad_(true);
    const Tensor p = prod(a, {1});
    EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{6, 0, 0})) << d.str();
    sum(mul(p, from_vector<float>({1, 10, 100}, {3}, {.device = d}))).backward();
    EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{6, 3, 2, 0, 240, 0, 0, 0, 0})) << d.str();
    Tensor b = from_vector<float>({2, 3, 4, 5}, {2, 2}, {.device = d}).requires_grad_(true);
    const Tensor all = prod(b);
    EXPECT_EQ(all.item<float>(), 120.0f);
    all.backward();
    EXPECT_EQ(b.grad().to_vector<float>(), (std::vector<float>{60, 40, 30, 24})) << d.str();
    EXPECT_EQ(prod(from_vector<std::uint8_t>({200, 200}, {2}, {.device = d})).item<std::int64_t>(), 40000);  // int64
    const std::int64_t big = std::int64_t{1} << 40;
    EXPECT_EQ(prod(from_vector<std::int64_t>({big, big}, {2}, {.device = d})).item<std::int64_t>(), 0);  // wraps
    EXPECT_EQ(prod(zeros({0}, {.device = d})).item<float>(), 1.0f);
    EXPECT_EQ(prod(from_vector<bool>({true, true}, {2}, {.device = d})).dtype(), DType::Int64);
    EXPECT_EQ(prod(ones({2, 3, 4}, {.device = d}), {0, 2}, true).shape(), (Shape{1, 3, 1}));
  }
}

// sort (stable), argsort and topk with torch 1.13's answers (sort(stable=True)), NaN, inf and -0.0 included.
TEST(CoreOps, SortArgsortAndTopkFollowPyTorch) {
  std::vector<Device> devices = accelerators();
  devices.insert(devices.begin(), kCPU);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  using I = std::vector<std::int64_t>;
  // values as text, so NaN compares equal and -0.0 differs from 0.0
  const auto text = [](const Tensor& t) {
    std::string out;
    for (float v : t.to_vector<float>()) out += (std::signbit(v) && v == 0 ? "-0" : fmt_value(v)) + " ";
    return out;
  };
  for (const Device& d : devices) {
    const Tensor a = from_vector<float>({3, nan, 1, 3, -0.0f, 0, 2, 2, 2, -1, 5, inf}, {2, 6}, {.device = d});
    auto [up, up_at] = sort(a, 1);
    EXPECT_EQ(text(up), "-0 0 1 3 3 nan -1 2 2 2 5 inf ") << d.str();
    EXPECT_EQ(up_at.to_vector<std::int64_t>(), (I{4, 5, 2, 0, 3, 1, 3, 0, 1, 2, 4, 5})) << d.str();
    auto [down, down_at] = sort(a, 1, true);
    EXPECT_EQ(text(down), "nan 3 3 1 -0 0 inf 5 2 2 2 -1 ") << d.str();
    EXPECT_EQ(down_at.to_vector<std::int64_t>(), (I{1, 0, 3, 2, 4, 5, 5, 4, 0, 1, 2, 3})) << d.str();
    auto [cols, cols_at] = sort(a, 0);
    EXPECT_EQ(text(cols), "2 2 1 -1 -0 0 3 nan 2 3 5 inf ") << d.str();
    EXPECT_EQ(cols_at.to_vector<std::int64_t>(), (I{1, 1, 0, 1, 0, 0, 0, 0, 1, 0, 1, 1})) << d.str();
    EXPECT_EQ(argsort(from_vector<bool>({true, false, true, false}, {4}, {.device = d})).to_vector<std::int64_t>(),
              (I{1, 3, 0, 2})) << d.str();
    // topk: torch's values; of equal values the earlier comes first (torch leaves their order open)
    auto [top, top_at] = topk(a, 3, 1);
    EXPECT_EQ(text(top), "nan 3 3 inf 5 2 ") << d.str();
    EXPECT_EQ(top_at.to_vector<std::int64_t>(), (I{1, 0, 3, 5, 4, 0})) << d.str();
    auto [low, low_at] = topk(a, 2, 1, false);
    EXPECT_EQ(low_at.to_vector<std::int64_t>(), (I{4, 5, 3, 0})) << d.str();
    EXPECT_EQ(topk(a, 0, 1).first.shape(), (Shape{2, 0}));
    EXPECT_EQ(sort(zeros({3, 0}, {.device = d}), 1).second.shape(), (Shape{3, 0}));
    EXPECT_EQ(topk(scalar_tensor(3.0, {.device = d}), 1).first.item<float>(), 3.0f);
    // the values' gradient goes back to where each value came from
    Tensor x = from_vector<float>({3, 1, 2}, {3}, {.device = d}).requires_grad_(true);
    sum(mul(topk(x, 2).first, from_vector<float>({10, 20}, {2}, {.device = d}))).backward();
    EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{10, 0, 20})) << d.str();
  }
  EXPECT_THROW(topk(ones({2, 6}), 7, 1), InvalidArgument);
  EXPECT_THROW(topk(ones({2, 6}), -1, 1), InvalidArgument);
  EXPECT_THROW(sort(ones({2}), 1), InvalidArgument);
}

TEST(CoreOps, ShapeAndDtypeErrors) {
  EXPECT_THROW(ones({2, 3}) + ones({4}), ShapeMismatch);
  EXPECT_THROW(matmul(ones({2, 3}), ones({2, 3})), ShapeMismatch);
  EXPECT_THROW(matmul(ones({2, 3}), ones({3, 2}, {.dtype = DType::Float64})), DTypeMismatch);
  EXPECT_THROW(matmul(ones({2, 2}, {.dtype = DType::Int64}), ones({2, 2}, {.dtype = DType::Int64})), DTypeMismatch);
  EXPECT_THROW(index_select(ones({3}), 0, from_vector<std::int64_t>({3})), InvalidArgument);
  EXPECT_THROW(index_select(ones({3}), 0, ones({1})), DTypeMismatch);
  EXPECT_THROW(sum(ones({2}), {1}), InvalidArgument);
  EXPECT_THROW(cat({ones({2, 3}), ones({2, 4})}, 0), ShapeMismatch);
  EXPECT_THROW(mean(ones({2}, {.dtype = DType::Int64})), InvalidArgument);
  try {
    matmul(ones({2, 3}), ones({2, 3}));
  } catch (const ShapeMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("(2x3 and 2x3)"), std::string::npos) << e.what();
  }
}

// In-place add_ with another dtype follows PyTorch: an integer or narrower float operand is converted to self's
// dtype (it was once read as raw bytes: 1.f + int64 10 gave 1), a floating result into an integer self is refused.
TEST(CoreOps, InPlaceAddConvertsTheOperandOrRefusesTheCast) {
  for (const Device& device : available_devices()) {
    if (device.index != 0) continue;
    Tensor a = from_vector<float>({1.f, 2.f, 3.f}).to(device);
    a.add_(from_vector<std::int64_t>({10, 20, 30}).to(device));
    EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{11.f, 22.f, 33.f})) << device.str();
    a.add_(from_vector<double>({0.5, 0.5, 0.5}).to(device), 2.0);
    EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{12.f, 23.f, 34.f})) << device.str();
    a.add_(from_vector<std::int64_t>({1}).to(device));  // broadcast after the conversion
    EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{13.f, 24.f, 35.f})) << device.str();
    Tensor i = from_vector<std::int64_t>({1, 2}).to(device);
    try {
      i.add_(from_vector<float>({0.5f, 0.5f}).to(device));
      ADD_FAILURE() << "int64 add_ float32 was accepted on " << device.str();
    } catch (const DTypeMismatch& e) {
      EXPECT_NE(std::string(e.what()).find("can't be cast to the desired output type int64"), std::string::npos) << e.what();
    }
    EXPECT_EQ(i.to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 2}));  // untouched
  }
}

// Floating to integer truncates through int64 on every device (PyTorch: -1.5 -> uint8 255); a normal draw with
// mean > std (once an undefined conversion of a negative range) gives the same numbers on every device.
TEST(CoreOps, FloatToIntegerConversionsAndNormalDrawsAreDefinedEverywhere) {
  for (const Device& device : available_devices()) {
    if (device.index != 0) continue;
    const Tensor x = from_vector<float>({-1.5f, 2.7f, 255.9f, -0.2f}).to(device);
    EXPECT_EQ(x.to(DType::UInt8).to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{255, 2, 255, 0})) << device.str();
    EXPECT_EQ(x.to(DType::Int32).to_vector<std::int32_t>(), (std::vector<std::int32_t>{-1, 2, 255, 0})) << device.str();
    manual_seed(7);
    const std::vector<float> drawn = normal({1000}, 5.0, 0.5, {.device = device}).to_vector<float>();
    double mean = 0;
    for (float v : drawn) mean += v / 1000.0;
    EXPECT_NEAR(mean, 5.0, 0.1) << device.str();
    manual_seed(7);
    EXPECT_EQ(drawn, normal({1000}, 5.0, 0.5).to_vector<float>()) << device.str() << " differs from cpu";
  }
}

// int64 arithmetic is exact beyond 2^53 (where a double rounds to even): on the cpu the integer ops once went
// through double, so 2^53 + 1 came back as 2^53. Two's complement wrap on overflow, as in PyTorch.
TEST(CoreOps, Int64ArithmeticIsExactBeyondTwoToThe53) {
  constexpr std::int64_t big = (std::int64_t{1} << 53) + 1, top = std::numeric_limits<std::int64_t>::max();
  for (const Device& device : available_devices()) {
    if (device.index != 0) continue;
    const Tensor a = from_vector<std::int64_t>({big, big, -big, top}).to(device);
    const Tensor b = from_vector<std::int64_t>({0, 2, 1, 1}).to(device);
    auto got = [](const Tensor& t) { return t.to_vector<std::int64_t>(); };
    using V = std::vector<std::int64_t>;
    EXPECT_EQ(got(add(a, b)), (V{big, big + 2, -big + 1, std::numeric_limits<std::int64_t>::min()})) << device.str();
    EXPECT_EQ(got(sub(a, b)), (V{big, big - 2, -big - 1, top - 1})) << device.str();
    EXPECT_EQ(got(mul(a, b)), (V{0, 2 * big, -big, top})) << device.str();
    EXPECT_EQ(got(maximum(a, b)), (V{big, big, 1, top})) << device.str();
    EXPECT_EQ(got(minimum(a, b)), (V{0, 2, -big, 1})) << device.str();
    EXPECT_EQ(got(neg(a)), (V{-big, -big, big, -top})) << device.str();
    EXPECT_EQ(got(abs(a)), (V{big, big, big, top})) << device.str();
    EXPECT_EQ(got(add(a, 1.0)), (V{big + 1, big + 1, -big + 1, std::numeric_limits<std::int64_t>::min()}))
        << device.str();
    EXPECT_EQ(sum(a.narrow(0, 0, 3)).item<std::int64_t>(), big) << device.str();
    EXPECT_EQ(got(sum(a.narrow(0, 0, 2).reshape({2, 1}), {0})), (V{2 * big})) << device.str();
  }
}

// matmul of two 1-d tensors is their dot product, 0-d (PyTorch: [1, 2, 3] @ [4, 5, 6] = tensor(32.)), with the
// gradients b and a; it once threw "squeeze: dimension out of range". Lengths that differ: PyTorch's message.
TEST(CoreOps, MatmulOfTwoVectorsIsTheZeroDimDotProduct) {
  for (const Device& device : available_devices()) {
    if (device.index != 0) continue;
    Tensor v = from_vector<float>({1, 2, 3}, {.device = device, .requires_grad = true});
    Tensor w = from_vector<float>({4, 5, 6}, {.device = device, .requires_grad = true});
    Tensor y = matmul(v, w);
    EXPECT_EQ(y.shape(), Shape{}) << device.str();
    EXPECT_FLOAT_EQ(y.item<float>(), 32.f) << device.str();
    y.backward();
    EXPECT_EQ(v.grad().to_vector<float>(), (std::vector<float>{4, 5, 6})) << device.str();
    EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{1, 2, 3})) << device.str();
    EXPECT_DOUBLE_EQ(matmul(ones({0}, {.device = device, .dtype = DType::Float64}),
                            ones({0}, {.device = device, .dtype = DType::Float64})).item<double>(), 0.0);
  }
  try {
    matmul(ones({3}), ones({4}));
    ADD_FAILURE() << "matmul of lengths 3 and 4 was accepted";
  } catch (const ShapeMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("inconsistent tensor size, expected tensor [3] and src [4] to have the same "
                                         "number of elements, but got 3 and 4 elements respectively"),
              std::string::npos) << e.what();
  }
}

// bmm hands transposed, row-strided and expanded operands to the GEMM as they lie (no copy): the same products as
// of their contiguous copies, forward and backward, on every device.
TEST(CoreOps, BmmOfStridedViewsEqualsBmmOfContiguousCopies) {
  for (const Device& device : available_devices()) {
    if (device.index != 0) continue;
    const Tensor a = randn({3, 5, 4}, {.device = device}), b = randn({3, 4, 6}, {.device = device});
    const Tensor wide = randn({3, 5, 9}, {.device = device}), pairs = randn({3, 2, 4, 6}, {.device = device});
    const Tensor one = randn({1, 4, 6}, {.device = device});
    const std::vector<std::pair<Tensor, Tensor>> cases{
        {a.transpose(1, 2).contiguous().transpose(1, 2), b},  // A stored transposed
        {a, b.transpose(1, 2).contiguous().transpose(1, 2)},  // B stored transposed
        {wide.narrow(2, 3, 4), b},                            // rows 9 apart, 4 used
        {a, pairs.select(1, 1)},                              // matrices 2 * 24 apart
        {a, one.expand({3, 4, 6})},                           // one matrix for every batch entry (stride 0)
        {a.narrow(0, 1, 1), b.narrow(0, 2, 1)},               // a batch of one
    };
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const auto& [x, y] = cases[i];
      EXPECT_TRUE(testing::all_close(bmm(x, y), bmm(x.contiguous(), y.contiguous()), 1e-5, 1e-5))
          << device.str() << " case " << i;
    }
    // backward multiplies by the transposes of the saved operands: the gradients of a view and of a copy agree
    const Tensor p = randn({3, 5, 4}, {.device = device, .requires_grad = true});
    const Tensor q = randn({3, 6, 4}, {.device = device, .requires_grad = true});
    sum(square(bmm(p, q.transpose(1, 2)))).backward();
    const Tensor pc = p.detach().requires_grad_(), qc = q.detach().transpose(1, 2).contiguous().requires_grad_();
    sum(square(bmm(pc, qc))).backward();
    EXPECT_TRUE(testing::all_close(p.grad(), pc.grad(), 1e-4, 1e-5)) << device.str();
    EXPECT_TRUE(testing::all_close(q.grad(), qc.grad().transpose(1, 2), 1e-4, 1e-5)) << device.str();
  }
}

// where takes a bool condition only, as PyTorch ("where expected condition to be a boolean tensor, but got a tensor
// with dtype Float"); a float condition was once read as non-zero = true.
TEST(CoreOps, WhereRefusesANonBoolCondition) {
  const Tensor a = from_vector<float>({1, 1, 1}), b = from_vector<float>({2, 2, 2});
  for (const DType dtype : {DType::Float32, DType::Float64, DType::Int32, DType::Int64, DType::UInt8}) {
    try {
      where(from_vector<float>({1, 0, 2}).to(dtype), a, b);
      ADD_FAILURE() << "where accepted a " << dtype_name(dtype) << " condition";
    } catch (const DTypeMismatch& e) {
      EXPECT_EQ(std::string(e.what()), std::string("where expected condition to be a boolean tensor, but got a tensor "
                                                   "with dtype ") + std::string(dtype_name(dtype)));
    }
  }
  EXPECT_EQ(where(from_vector<bool>({true, false, true}), a, b).to_vector<float>(), (std::vector<float>{1, 2, 1}));
}

// softmax and log_softmax along the last dim are the backend's one kernel each way (Backend::softmax_forward);
// along another dim they are composed from the elementwise and reduce kernels. The same rows both ways, as the last
// dim of (5, n) and as dim 0 of its transpose, agree forward and backward on every device: rows shorter than a warp
// and longer than a cuda block (256 threads), a strided input, and the edge rows (all -inf, +inf, NaN, large).
TEST(CoreOps, SoftmaxAlongTheLastDimAgreesWithTheComposedOp) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<Device> devices = accelerators();
  devices.insert(devices.begin(), kCPU);
  for (const Device& device : devices) {
    for (const bool log : {false, true}) {
      for (const std::int64_t n : {1, 7, 64, 300, 1000}) {
        SCOPED_TRACE(device.str() + (log ? " log_softmax" : " softmax") + ", rows of " + std::to_string(n));
        manual_seed(static_cast<std::uint64_t>(n));
        Tensor x = mul(randn({5, n}, {.device = device}), 4.0);
        if (n >= 4) {  // the edge rows: all -inf; one +inf; one NaN; large equal values with a -inf
          x.select(0, 1).fill_(-inf);
          x.select(0, 2).narrow(0, 3, 1).fill_(inf);
          x.select(0, 3).narrow(0, 2, 1).fill_(nan);
          x.select(0, 4).fill_(1000.0);
          x.select(0, 4).narrow(0, 1, 1).fill_(-inf);
        }
        const Tensor g = randn({5, n}, {.device = device});
        const Tensor fused_in = x.detach().requires_grad_(true);
        const Tensor composed_in = x.detach().t().contiguous().requires_grad_(true);
        const Tensor fused = log ? log_softmax(fused_in, -1) : softmax(fused_in, -1);
        const Tensor composed = (log ? log_softmax(composed_in, 0) : softmax(composed_in, 0)).t();
        EXPECT_TRUE(all_close(fused.cpu(), composed.cpu(), 1e-6, 1e-7));
        fused.backward(g);
        composed.backward(g);
        EXPECT_TRUE(all_close(fused_in.grad().cpu(), composed_in.grad().t().cpu(), 1e-5, 1e-6));
        // A strided input (the transpose's rows) gives the contiguous one's values.
        const Tensor strided = x.t().contiguous().t();
        EXPECT_TRUE(all_close((log ? log_softmax(strided, -1) : softmax(strided, -1)).cpu(), fused.cpu(), 0, 0));
      }
    }
  }
  // The edge rows' values, as PyTorch: NaN throughout for all -inf and beside +inf, 0.5 each for equal large ones.
  const std::vector<float> soft =
      softmax(from_vector<float>({-inf, -inf, 1, inf, 1000, 1000}, {3, 2}), -1).to_vector<float>();
  EXPECT_TRUE(std::isnan(soft[0]) && std::isnan(soft[1]) && std::isnan(soft[2]) && std::isnan(soft[3]));
  EXPECT_EQ(soft[4], 0.5F);
  EXPECT_EQ(soft[5], 0.5F);
}

// where's value in each layout its cpu loop tells apart (both sides contiguous, either one a scalar, anything
// else), on runs longer than a vector with a tail; its gradient reaches only the sides that want one.
TEST(CoreOps, WhereTakesTheRightSideInEveryLayout) {
  manual_seed(5);
  const Tensor x = randn({3, 70}), y = randn({3, 70});
  const Tensor c = gt(randn({3, 70}), 0.0);
  const Tensor row = gt(randn({70}), 0.0);  // broadcast over the rows
  const auto cv = c.to_vector<bool>(), rv = row.to_vector<bool>();
  const auto xv = x.to_vector<float>(), yv = y.to_vector<float>();
  const Tensor two = scalar_tensor(2.0), minus = scalar_tensor(-1.0);
  const auto expect = [&](const Tensor& got, const std::function<float(std::size_t)>& want, const char* what) {
    const auto g = got.contiguous().to_vector<float>();
    ASSERT_EQ(g.size(), xv.size()) << what;
    for (std::size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], want(i)) << what << ", element " << i;
  };
  expect(where(c, x, y), [&](std::size_t i) { return cv[i] ? xv[i] : yv[i]; }, "both contiguous");
  expect(where(c, two, y), [&](std::size_t i) { return cv[i] ? 2.0F : yv[i]; }, "a scalar first");
  expect(where(c, x, minus), [&](std::size_t i) { return cv[i] ? xv[i] : -1.0F; }, "a scalar second");
  expect(where(row, x, y), [&](std::size_t i) { return rv[i % 70] ? xv[i] : yv[i]; }, "a condition per column");
  expect(where(c.t().contiguous().t(), x.t().contiguous().t(), y),
         [&](std::size_t i) { return cv[i] ? xv[i] : yv[i]; }, "transposed operands");
  expect(masked_fill(x, row, 3.0), [&](std::size_t i) { return rv[i % 70] ? 3.0F : xv[i]; }, "masked_fill");

  const Tensor a = x.detach().requires_grad_(true), b = y.detach().requires_grad_(true);
  sum(where(c, a, y)).backward();  // only `a` wants a gradient: 1 where c, else 0
  expect(a.grad(), [&](std::size_t i) { return cv[i] ? 1.0F : 0.0F; }, "the gradient of the first side");
  sum(masked_fill(b, c, 0.0)).backward();
  expect(b.grad(), [&](std::size_t i) { return cv[i] ? 0.0F : 1.0F; }, "the gradient through masked_fill");
}

// pow's gradients at base 0 are masked as PyTorch's: d/dbase is 0 where the exponent is 0 (not 0 * 0^-1 = NaN),
// d/dexponent is 0 where base == 0 and exponent >= 0 (not 0 * log 0 = NaN). Reference values from PyTorch 1.13.
TEST(CoreOps, PowGradientsAtBaseZeroAreMaskedAsPyTorch) {
  const float inf = std::numeric_limits<float>::infinity();
  auto expect_grad = [](const Tensor& t, const std::vector<float>& want, const std::string& what) {
    const std::vector<float> got = t.grad().to_vector<float>();
    ASSERT_EQ(got.size(), want.size()) << what;
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (std::isnan(want[i])) EXPECT_TRUE(std::isnan(got[i])) << what << " [" << i << "]: " << got[i];
      else if (std::isinf(want[i])) EXPECT_EQ(got[i], want[i]) << what << " [" << i << "]";
      else EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << what << " [" << i << "]";
    }
  };
  for (const Device& device : available_devices()) {
    if (device.index != 0) continue;
    const TensorOptions leaf{.device = device, .requires_grad = true};
    Tensor x = from_vector<float>({0, 1, 2}, leaf);
    sum(pow(x, 0.0)).backward();
    expect_grad(x, {0, 0, 0}, "pow(x, 0.0) on " + device.str());
    Tensor b = from_vector<float>({0, 0, 2, -1, 0, 0, 3}, leaf);
    Tensor e = from_vector<float>({2, 0, 3, 0.5, -1, 0.5, 0}, leaf);
    sum(pow(b, e)).backward();
    expect_grad(b, {0, 0, 12, NAN, -inf, inf, 0}, "d/dbase on " + device.str());
    expect_grad(e, {0, 0, 5.5451775f, NAN, -inf, 0, 1.0986123f}, "d/dexponent on " + device.str());
    Tensor b0 = from_vector<float>({0}, Shape{}, leaf);  // a 0-d base broadcast over the exponents
    Tensor e3 = from_vector<float>({0, 1, 2}, leaf);
    sum(pow(b0, e3)).backward();
    expect_grad(b0, {1}, "0-d base on " + device.str());
    expect_grad(e3, {0, 0, 0}, "exponents of a 0-d base on " + device.str());
  }
}

// Invariant 4: every op with two or more tensor operands checks devices before dispatch.
TEST(CoreOps, EveryMultiOperandOpChecksDevices) {
  const Device sim = Device::parse("sim:0");
  Tensor h = ones({2, 2});
  Tensor d = ones({2, 2}, {.device = sim});
  Tensor idx = from_vector<std::int64_t>({0});
  using F = std::function<void()>;
  const std::vector<std::pair<std::string, F>> calls = {
      {"add", [&] { add(d, h); }},
      {"sub", [&] { sub(d, h); }},
      {"mul", [&] { mul(d, h); }},
      {"div", [&] { div(d, h); }},
      {"pow", [&] { pow(d, h); }},
      {"maximum", [&] { maximum(d, h); }},
      {"minimum", [&] { minimum(d, h); }},
      {"eq", [&] { eq(d, h); }},
      {"ne", [&] { ne(d, h); }},
      {"lt", [&] { lt(d, h); }},
      {"le", [&] { le(d, h); }},
      {"gt", [&] { gt(d, h); }},
      {"ge", [&] { ge(d, h); }},
      {"where", [&] { where(gt(d, 0.0), d, h); }},
      {"matmul", [&] { matmul(d, h); }},
      {"bmm", [&] { bmm(d.unsqueeze(0), h.unsqueeze(0)); }},
      {"index_select", [&] { index_select(d, 0, idx); }},
      {"cat", [&] { cat({d, h}); }},
      {"stack", [&] { stack({d, h}); }},
      {"add_", [&] { Tensor c = d.clone(); c.add_(h); }},
  };
  for (const auto& [name, call] : calls) {
    try {
      call();
      ADD_FAILURE() << name << " did not throw";
    } catch (const DeviceMismatch& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("Expected all tensors to be on the same device, but found at least two devices, sim:0 and cpu! (in "),
                std::string::npos)
          << name << ": " << message;
      EXPECT_NE(message.find("Hint:"), std::string::npos) << name;
      EXPECT_NE(message.find(".to(x.device())"), std::string::npos) << name;
    }
  }
}

// multinomial draws each index in proportion to its weight (weights need not sum to 1), never a zero-weight one,
// with and without replacement; the same seed draws the same indices on every device; nothing is read back.
TEST(CoreOps, MultinomialDrawsInProportionAndAlikeOnEveryDevice) {
  const std::vector<float> weights = {0.3f, 0.6f, 0.0f, 2.1f};  // probabilities 0.1, 0.2, 0, 0.7
  const std::vector<double> expected = {0.1, 0.2, 0.0, 0.7};
  const auto frequencies = [](const std::vector<std::int64_t>& draws, std::size_t stride, std::size_t column) {
    std::vector<double> f(4, 0.0);
    std::size_t count = 0;
    for (std::size_t i = column; i < draws.size(); i += stride, ++count) f[static_cast<std::size_t>(draws[i])] += 1;
    for (double& v : f) v /= static_cast<double>(count);
    return f;
  };
  std::vector<Device> devices = accelerators();
  devices.insert(devices.begin(), kCPU);
  std::vector<std::int64_t> with_first, without_first;
  for (const Device device : devices) {
    const Tensor p = from_vector(weights, {4}).to(device);
    Ledger::global().clear();
    manual_seed(1);
    const Tensor with = multinomial(p, 20000, true);
    const Tensor without = multinomial(p.unsqueeze(0).expand({4000, 4}), 3, false);
    EXPECT_EQ(Ledger::global().totals().syncs, 0) << device.str();
    ASSERT_EQ(with.shape(), (Shape{20000}));
    ASSERT_EQ(without.shape(), (Shape{4000, 3}));
    EXPECT_EQ(with.dtype(), DType::Int64);
    const auto w = with.to_vector<std::int64_t>(), wo = without.to_vector<std::int64_t>();
    const auto f = frequencies(w, 1, 0), first = frequencies(wo, 3, 0);
    for (std::size_t i = 0; i < 4; ++i) {
      EXPECT_NEAR(f[i], expected[i], 0.015) << "with replacement, index " << i << " on " << device.str();
      EXPECT_NEAR(first[i], expected[i], 0.03) << "without, first draw, index " << i << " on " << device.str();
    }
    EXPECT_EQ(f[2], 0.0);
    for (std::size_t row = 0; row < 4000; ++row) {  // three distinct indices of the three with weight: never 2
      const std::int64_t a = wo[row * 3], b = wo[row * 3 + 1], c = wo[row * 3 + 2];
      EXPECT_TRUE(a != b && b != c && a != c && a != 2 && b != 2 && c != 2) << "row " << row;
    }
    if (with_first.empty()) {
      with_first = w;
      without_first = wo;
    } else {
      EXPECT_EQ(w, with_first) << device.str() << " drew other indices than the cpu";
      EXPECT_EQ(wo, without_first) << device.str() << " drew other indices than the cpu";
    }
  }
  // Rows of their own; one-hot rows always give their index.
  const Tensor rows = from_vector<float>({1, 0, 0, 0, 0, 0, 0, 5}, {2, 4});
  EXPECT_EQ(multinomial(rows, 3, true).to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 0, 0, 3, 3, 3}));
  EXPECT_THROW(multinomial(from_vector(weights, {4}), 5, false), InvalidArgument);
  EXPECT_THROW(multinomial(from_vector<std::int64_t>({1, 2}, {2}), 1, true), DTypeMismatch);
  EXPECT_THROW(multinomial(zeros({2, 2, 2}), 1, true), ShapeMismatch);
  EXPECT_THROW(multinomial(from_vector(weights, {4}), 0, true), InvalidArgument);
}

}  // namespace
}  // namespace ferry
