// test_core_autograd.cpp — every differentiable core op's backward against central finite
// differences in float64, plus the engine's rules (accumulation, no_grad, detach, errors).
#include <functional>

#include "ferry/nn/functional.h"
#include "test_helpers.h"

namespace ferry {
namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// d(sum(f(x) * w))/dx by autograd vs central differences, for every input; w random so every
// output element matters.
void gradcheck(const std::string& name, const Fn& f, std::vector<Tensor> inputs, Device device = kCPU) {
  for (auto& t : inputs) t = t.to(DType::Float64).to(device).detach().requires_grad_(true);
  manual_seed(99);
  Tensor out = f(inputs);
  Tensor weight = randn(out.shape(), {.device = device, .dtype = DType::Float64});
  sum(mul(out, weight)).backward();
  const double eps = 1e-6;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(inputs[i].grad().defined()) << name << ": no grad for input " << i;
    const std::vector<double> analytic = inputs[i].grad().to_vector<double>();
    std::vector<double> base = inputs[i].to_vector<double>();
    for (std::size_t j = 0; j < base.size(); ++j) {
      auto eval = [&](double delta) {
        std::vector<Tensor> shifted;
        for (std::size_t k = 0; k < inputs.size(); ++k) {
          std::vector<double> v = inputs[k].to_vector<double>();
          if (k == i) v[j] += delta;
          shifted.push_back(from_vector<double>(v, inputs[k].shape(), {.device = device}));
        }
        autograd::NoGradGuard no_grad;
        return sum(mul(f(shifted), weight)).item<double>();
      };
      const double numeric = (eval(eps) - eval(-eps)) / (2 * eps);
      EXPECT_NEAR(analytic[j], numeric, 1e-5 * std::max(1.0, std::abs(numeric)))
          << name << ": input " << i << " element " << j << " on " << device.str();
    }
  }
}

Tensor r(Shape s) { return randn(s, {.dtype = DType::Float64}); }
Tensor pos(Shape s) { return add(abs(r(s)), 0.5); }

TEST(Autograd, EveryOpMatchesFiniteDifferences) {
  manual_seed(3);
  using V = const std::vector<Tensor>&;
  struct Case { std::string name; Fn f; std::vector<Tensor> inputs; };
  const std::vector<Case> cases = {
      {"add_broadcast", [](V x) { return add(x[0], x[1], 0.5); }, {r({3, 4}), r({4})}},
      {"sub_broadcast", [](V x) { return sub(x[0], x[1]); }, {r({3, 1}), r({1, 4})}},
      {"mul", [](V x) { return x[0] * x[1]; }, {r({3, 4}), r({3, 4})}},
      {"div", [](V x) { return x[0] / x[1]; }, {r({5}), pos({5})}},
      {"pow", [](V x) { return pow(x[0], x[1]); }, {pos({4}), r({4})}},
      {"maximum", [](V x) { return maximum(x[0], x[1]); }, {r({6}), r({6})}},
      {"minimum", [](V x) { return minimum(x[0], x[1]); }, {r({6}), r({6})}},
      {"scalars", [](V x) { return (2.0 - x[0]) * 3.0 / 2.0 + 1.0; }, {r({4})}},
      {"rdiv", [](V x) { return 1.0 / x[0]; }, {pos({4})}},
      {"pow_scalar", [](V x) { return pow(x[0], 3.0); }, {r({4})}},
      {"neg", [](V x) { return -x[0]; }, {r({4})}},
      {"exp", [](V x) { return exp(x[0]); }, {r({4})}},
      {"log", [](V x) { return log(x[0]); }, {pos({4})}},
      {"sqrt", [](V x) { return sqrt(x[0]); }, {pos({4})}},
      {"rsqrt", [](V x) { return rsqrt(x[0]); }, {pos({4})}},
      {"abs", [](V x) { return abs(x[0]); }, {r({4})}},
      {"relu", [](V x) { return relu(x[0]); }, {r({8})}},
      {"sigmoid", [](V x) { return sigmoid(x[0]); }, {r({4})}},
      {"tanh", [](V x) { return tanh(x[0]); }, {r({4})}},
      {"erf", [](V x) { return erf(x[0]); }, {r({4})}},
      {"square", [](V x) { return square(x[0]); }, {r({4})}},
      {"sin", [](V x) { return sin(x[0]); }, {r({4})}},
      {"cos", [](V x) { return cos(x[0]); }, {r({4})}},
      {"log1p", [](V x) { return log1p(x[0]); }, {pos({4})}},
      {"expm1", [](V x) { return expm1(x[0]); }, {r({4})}},
      {"tril", [](V x) { return tril(x[0], -1); }, {r({3, 4})}},
      {"triu", [](V x) { return triu(x[0].transpose(0, 1), 1); }, {r({4, 2, 3})}},
      {"where", [](V x) { return where(gt(x[0], 0.0), x[0], x[1]); }, {r({5}), r({5})}},
      {"sum_dims", [](V x) { return sum(x[0], {0, 2}); }, {r({2, 3, 4})}},
      {"sum_keep", [](V x) { return sum(x[0], {1}, true); }, {r({2, 3})}},
      {"mean", [](V x) { return mean(x[0], {1}); }, {r({3, 4})}},
      {"var", [](V x) { return var(x[0], {0}); }, {r({4, 3})}},
      {"max_all", [](V x) { return max(x[0]); }, {r({5})}},
      {"max_dim", [](V x) { return max(x[0], 1).first; }, {r({3, 4})}},
      {"min_dim", [](V x) { return min(x[0], 0, true).first; }, {r({3, 4})}},
      {"amax", [](V x) { return amax(x[0], {0, 2}); }, {r({2, 3, 4})}},
      {"amin", [](V x) { return amin(x[0], {1}, true); }, {r({3, 4})}},
      {"index_add", [](V x) { return index_add(x[0], 1, from_vector<std::int64_t>({2, 0, 2}), x[1], 0.5); },
       {r({2, 3}), r({2, 3})}},
      {"matmul", [](V x) { return matmul(x[0], x[1]); }, {r({3, 4}), r({4, 2})}},
      {"matmul_t", [](V x) { return matmul(x[0].t(), x[1]); }, {r({4, 3}), r({4, 2})}},
      {"matmul_vec", [](V x) { return matmul(x[0], x[1]); }, {r({3, 4}), r({4})}},
      {"matmul_batched", [](V x) { return matmul(x[0], x[1]); }, {r({2, 3, 4}), r({4, 2})}},
      {"matmul_broadcast", [](V x) { return matmul(x[0], x[1]); }, {r({2, 1, 3, 4}), r({3, 4, 2})}},
      {"bmm", [](V x) { return bmm(x[0], x[1]); }, {r({2, 3, 4}), r({2, 4, 2})}},
      {"index_select", [](V x) { return index_select(x[0], 0, from_vector<std::int64_t>({2, 0, 2})); }, {r({3, 2})}},
      {"cat", [](V x) { return cat({x[0], x[1]}, 1); }, {r({2, 3}), r({2, 2})}},
      {"stack", [](V x) { return stack({x[0], x[1]}); }, {r({3}), r({3})}},
      {"views", [](V x) { return x[0].t().reshape({-1}).narrow(0, 1, 4).unsqueeze(0).expand({2, 4}); }, {r({3, 2})}},
      {"select_permute", [](V x) { return x[0].permute({2, 0, 1}).select(1, 1).flatten(); }, {r({2, 3, 2})}},
      {"clone_contiguous", [](V x) { return x[0].t().contiguous().clone(); }, {r({2, 3})}},
      {"strided_view", [](V x) { return x[0].t().view({2, 2, 3}); }, {r({3, 4})}},
      {"clamp", [](V x) { return clamp(x[0], -0.3, 0.4); }, {r({8})}},
      {"masked_fill", [](V x) { return masked_fill(x[0], gt(x[0].detach(), 0.3), 2.0); }, {r({3, 4})}},
      {"std", [](V x) { return std(x[0], {1}); }, {r({3, 4})}},
      {"norm", [](V x) { return norm(x[0], {0}, true); }, {r({3, 4})}},
      {"repeat", [](V x) { return repeat(x[0], {3, 2}); }, {r({2})}},
      {"flip", [](V x) { return flip(x[0], {1}); }, {r({2, 3})}},
      {"chunk", [](V x) { return chunk(x[0], 2, 1)[1]; }, {r({2, 5})}},
      {"dot_outer", [](V x) { return outer(x[0], x[1]) * dot(x[0], x[1]); }, {r({3}), r({3})}},
      {"gather", [](V x) { return gather(x[0], 1, from_vector<std::int64_t>({0, 0, 2, 1}, {2, 2})); }, {r({3, 3})}},
      {"scatter_add", [](V x) { return scatter_add(x[0], 0, from_vector<std::int64_t>({1, 1, 0}, {1, 3}), x[1]); },
       {r({2, 3}), r({2, 4})}},
      {"cumsum", [](V x) { return cumsum(x[0].t(), 1); }, {r({3, 4})}},
      {"prod", [](V x) { return prod(x[0], {1}); }, {r({3, 4})}},
      {"prod_with_zeros", [](V x) { return prod(x[0], {1}); },  // a row with one zero, a row with two
       {from_vector<double>({0, 1.5, -2, 0.7, 0, 0}, {2, 3})}},
  };
  for (const Case& c : cases) gradcheck(c.name, c.f, c.inputs);
}

TEST(Autograd, SameGradientsOnSim) {
  manual_seed(5);
  gradcheck("mlp_on_sim", [](const std::vector<Tensor>& x) { return relu(matmul(x[0], x[1]) + x[2]); },
            {r({4, 3}), r({3, 2}), r({2})}, Device::parse("sim:0"));
}

TEST(Autograd, EngineRules) {
  Tensor w = ones({3}).requires_grad_();
  EXPECT_TRUE(w.is_leaf());
  Tensor loss = sum(w * 2.0);
  EXPECT_FALSE(loss.is_leaf());
  loss.backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2, 2, 2}));
  sum(w * 3.0).backward();  // accumulates
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{5, 5, 5}));
  try {
    loss.backward();  // graph already freed
    ADD_FAILURE() << "a second backward through a freed graph ran";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
  {
    autograd::NoGradGuard no_grad;
    EXPECT_FALSE((w * 2.0).requires_grad());
  }
  EXPECT_FALSE(w.detach().requires_grad());
  EXPECT_EQ(w.detach().storage(), w.storage());
  EXPECT_THROW((w * 2.0).backward(), InvalidArgument);  // not a scalar, no gradient given
  Tensor v = w * 2.0;
  v.backward(ones({3}));
  EXPECT_THROW(ones({3}).backward(), InvalidArgument);  // nothing requires grad
  EXPECT_THROW(ones({2}, {.dtype = DType::Int64}).requires_grad_(), InvalidArgument);
}

TEST(Autograd, ReusedInputAccumulatesWithoutAliasing) {
  Tensor a = ones({2}).requires_grad_();
  Tensor b = ones({2}).requires_grad_();
  sum(a + b).backward();  // add passes one gradient to both inputs
  a.grad().add_(ones({2}));
  EXPECT_EQ(b.grad().to_vector<float>(), (std::vector<float>{1, 1}));
  Tensor c = ones({2}).requires_grad_();
  sum(c * c + c).backward();
  EXPECT_EQ(c.grad().to_vector<float>(), (std::vector<float>{3, 3}));
}

// Slices of a non-leaf (narrow, select, chunk) add their gradients into one buffer of the input's shape, in place:
// the sum must equal the one made slice by slice, and must never write into a gradient another input also holds
// (add's backward gives one tensor to both of its inputs), whichever of the two reaches the input first.
TEST(Autograd, SliceGradientsAddUpWithoutAliasing) {
  for (const bool slices_first : {true, false}) {
    Tensor x1 = from_vector<float>({1, 2, 3, 4}).requires_grad_();
    Tensor x2 = from_vector<float>({5, 6, 7, 8}).requires_grad_();
    const Tensor y1 = x1 * 1.0, y2 = x2 * 1.0;  // non-leaves
    const Tensor both = (y1 + y2) * from_vector<float>({1, 10, 100, 1000});
    const Tensor sliced = y1.narrow(0, 1, 2) * 3.0 + y1.select(0, 3) + chunk(y1, 2, 0)[0] * 5.0;  // (2)
    const Tensor loss = slices_first ? sum(sliced) + sum(both) : sum(both) + sum(sliced);
    loss.backward();
    // d/dx1: both (1, 10, 100, 1000), narrow [1, 3) x3, select 3 (x1 each of the 2), chunk [0, 2) x5
    EXPECT_EQ(x1.grad().to_vector<float>(), (std::vector<float>{1 + 5, 10 + 3 + 5, 100 + 3, 1000 + 2}));
    EXPECT_EQ(x2.grad().to_vector<float>(), (std::vector<float>{1, 10, 100, 1000})) << slices_first;
  }
  // A hook on the sliced view sees its own gradient; retain_graph runs the slices twice.
  Tensor x = from_vector<float>({1, 2, 3}).requires_grad_();
  const Tensor y = x * 2.0;
  Tensor view = y.narrow(0, 1, 2);
  std::vector<float> seen;
  view.register_hook([&](const Tensor& g) {
    seen = g.to_vector<float>();
    return Tensor();
  });
  const Tensor loss = sum(view * from_vector<float>({3, 4})) + sum(y.select(0, 0));
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_EQ(seen, (std::vector<float>{3, 4}));
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{2, 6, 8}));
  loss.backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{4, 12, 16}));
}

TEST(Autograd, AnomalyModeNamesTheOp) {
  autograd::set_detect_anomaly(true);
  Tensor x = from_vector<float>({-1.f}).requires_grad_();
  try {
    log(x);
    ADD_FAILURE() << "no anomaly reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'log'"), std::string::npos) << e.what();
  }
  autograd::set_detect_anomaly(false);
}

// Gradients come back in each input's dtype through cat and stack, and a backward seed of another dtype is cast to
// the output's, as PyTorch does.
TEST(Autograd, MixedDtypesKeepEachInputsDtype) {
  Tensor a = from_vector<float>({1, 2}).requires_grad_();
  Tensor b = from_vector<double>({3}).requires_grad_();
  const Tensor joined = cat({a, b});
  sum(mul(joined, joined)).backward();
  EXPECT_EQ(a.grad().dtype(), DType::Float32);
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{2, 4}));
  EXPECT_EQ(b.grad().dtype(), DType::Float64);
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{6}));
  Tensor x = from_vector<float>({1, 2}).requires_grad_();
  mul(x, 2.0).backward(from_vector<double>({1, 10}));
  EXPECT_EQ(x.grad().dtype(), DType::Float32);
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{2, 20}));
}

// A tensor that backward needs, written in place after the forward pass (through itself, a view or a detach()
// alias, under NoGradGuard or not requiring grad at all), stops backward with PyTorch's message instead of giving
// a gradient computed from the new values. Writes that backward does not read (add's operands) are fine.
TEST(Autograd, BackwardRefusesSavedTensorsWrittenInPlace) {
  const auto expect_refused = [](const std::function<void()>& run, const std::string& what) {
    try {
      run();
      ADD_FAILURE() << what << ": backward ran on a saved tensor written in place";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("modified by an inplace operation"), std::string::npos) << e.what();
    }
  };
  expect_refused([] {
    Tensor x = from_vector<float>({1, 2}).requires_grad_(), w = from_vector<float>({3, 4});
    Tensor y = mul(x, w);
    w.fill_(100);
    sum(y).backward();
  }, "a multiplier filled");
  expect_refused([] {
    Tensor x = from_vector<float>({1, 2}).requires_grad_();
    Tensor z = mul(x, x);
    x.detach().fill_(5);
    sum(z).backward();
  }, "a detach() alias");
  expect_refused([] {
    Tensor x = from_vector<float>({1, 2}).requires_grad_(), w = from_vector<float>({3, 4});
    Tensor y = mul(x, w);
    w.narrow(0, 0, 1).fill_(0);
    sum(y).backward();
  }, "a view of a multiplier");
  expect_refused([] {
    Tensor x = from_vector<float>({1, 2}).requires_grad_();
    Tensor e = exp(x);
    {
      autograd::NoGradGuard no_grad;
      e.mul_(10);
    }
    sum(e).backward();
  }, "exp's output");
  Tensor x = from_vector<float>({1, 2}).requires_grad_(), b = from_vector<float>({3, 4});
  Tensor y = add(x, b);
  b.fill_(100);  // add's backward reads neither operand
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{1, 1}));
}

TEST(Autograd, RetainGraphAllowsASecondBackward) {
  Tensor x = from_vector<float>({1, 2}).requires_grad_();
  Tensor loss = sum(mul(exp(x), x));  // d/dx = e^x (1 + x)
  loss.backward(Tensor(), /*retain_graph=*/true);
  const std::vector<double> once = testing::values(x.grad());
  loss.backward();  // the graph was kept; this one frees it
  const std::vector<double> twice = testing::values(x.grad());
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-5);
  EXPECT_NEAR(once[1], std::exp(2.0) * 3, 1e-4);
  EXPECT_THROW(loss.backward(), InvalidArgument);
}

TEST(Autograd, RetainGradKeepsANonLeafsGradient) {
  Tensor x = from_vector<float>({1, 2, 3}).requires_grad_();
  Tensor y = mul(x, 2.0);  // (3)
  EXPECT_FALSE(y.retains_grad());
  y.retain_grad();
  EXPECT_TRUE(y.retains_grad());
  Tensor z = mul(y, y);
  z.retain_grad();
  sum(z).backward(Tensor(), true);
  EXPECT_EQ(testing::values(z.grad()), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(testing::values(y.grad()), (std::vector<double>{4, 8, 12}));  // 2y
  EXPECT_EQ(testing::values(x.grad()), (std::vector<double>{8, 16, 24}));
  sum(z).backward();  // accumulates, as a leaf's .grad does
  EXPECT_EQ(testing::values(y.grad()), (std::vector<double>{8, 16, 24}));
  Tensor w = mul(x, 3.0);  // not retained: no .grad
  sum(w).backward();
  EXPECT_FALSE(w.grad().defined());
  x.retain_grad();  // a leaf: nothing to do
  EXPECT_FALSE(x.retains_grad());
  EXPECT_THROW(ones({2}).retain_grad(), InvalidArgument);
}

TEST(Autograd, TensorHooksReadOrReplaceTheGradient) {
  Tensor x = from_vector<float>({1, 2}).requires_grad_();
  std::vector<std::vector<double>> seen;
  const unsigned reader = x.register_hook([&](const Tensor& g) { seen.push_back(testing::values(g)); });
  const unsigned doubler = x.register_hook([](const Tensor& g) { return mul(g, 2.0); });
  // x used twice: the hooks see the summed gradient once, before it reaches .grad.
  sum(add(mul(x, 3.0), mul(x, 4.0))).backward();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], (std::vector<double>{7, 7}));
  EXPECT_EQ(testing::values(x.grad()), (std::vector<double>{14, 14}));
  x.remove_hook(doubler);
  EXPECT_THROW(x.remove_hook(doubler), InvalidArgument);
  x.set_grad(Tensor());
  sum(x).backward();
  EXPECT_EQ(testing::values(x.grad()), (std::vector<double>{1, 1}));
  EXPECT_EQ(seen.size(), 2u);
  x.remove_hook(reader);

  // On a non-leaf the replaced gradient is what flows on to the ops before it.
  Tensor a = from_vector<float>({1, 2}).requires_grad_();
  Tensor b = mul(a, a);
  b.register_hook([](const Tensor& g) { return mul(g, 10.0); });
  b.retain_grad();  // sees the gradient after the hooks
  sum(b).backward();
  EXPECT_EQ(testing::values(b.grad()), (std::vector<double>{10, 10}));
  EXPECT_EQ(testing::values(a.grad()), (std::vector<double>{20, 40}));

  Tensor c = ones({2}).requires_grad_();
  c.register_hook([](const Tensor&) { return ones({3}); });
  EXPECT_THROW(sum(c).backward(), ShapeMismatch);
  Tensor d = ones({2}).requires_grad_();
  d.register_hook([](const Tensor&) { return ones({2}, {.dtype = DType::Float64}); });
  EXPECT_THROW(sum(d).backward(), DTypeMismatch);
  EXPECT_THROW(ones({2}).register_hook([](const Tensor&) {}), InvalidArgument);
}

// A leaf's gradient reaches .grad (and its hooks) when the last op that used it has passed its gradient back, not
// at the end of backward: DDP starts bucket all-reduces from there.
TEST(Autograd, ALeafIsFinishedWhenItsLastUseHasRun) {
  Tensor w1 = ones({2}).requires_grad_(), w2 = ones({2}).requires_grad_();
  std::vector<std::string> events;
  autograd::register_post_accumulate_grad_hook(w2, [&](const Tensor&) { events.push_back("w2"); });
  autograd::register_post_accumulate_grad_hook(w1, [&](const Tensor&) { events.push_back("w1"); });
  Tensor h = mul(exp(mul(w1, 2.0)), w2);  // w2 used last in the forward pass: its gradient is ready first
  Tensor out = sum(mul(h, w1));           // w1 used again at the end
  out.backward();
  EXPECT_EQ(events, (std::vector<std::string>{"w2", "w1"}));
  const double e2 = std::exp(2.0);
  EXPECT_NEAR(testing::values(w1.grad())[0], e2 + 2 * e2, 1e-4);  // d/dw1 of w1 e^{2 w1} w2
}

// Writing a layer's bias after the forward pass is allowed (its backward never reads it); the weight is not.
TEST(Autograd, LayersSaveWhatTheirBackwardReads) {
  Tensor x = randn({4, 3}), w = randn({2, 3}).requires_grad_(), b = zeros({2}).requires_grad_();
  Tensor y = nn::functional::linear(x, w, b);
  {
    autograd::NoGradGuard no_grad;
    b.fill_(5);
  }
  sum(y).backward();
  EXPECT_EQ(testing::values(b.grad()), (std::vector<double>{4, 4}));
  Tensor y2 = nn::functional::linear(x, w, b);
  {
    autograd::NoGradGuard no_grad;
    w.fill_(0);
  }
  EXPECT_THROW(sum(y2).backward(), InvalidArgument);
  Tensor img = randn({1, 1, 4, 4}), k = randn({2, 1, 3, 3}).requires_grad_(), kb = zeros({2}).requires_grad_();
  Tensor conv = nn::functional::conv2d(img, k, kb);
  {
    autograd::NoGradGuard no_grad;
    kb.fill_(1);
  }
  sum(conv).backward();
  EXPECT_EQ(testing::values(kb.grad()), (std::vector<double>{4, 4}));
}

// A view of a tracked tensor made under NoGradGuard may be written under NoGradGuard (an optimizer's way), not with
// grad mode on, where the change would bypass autograd (PyTorch refuses it too).
TEST(Autograd, AViewMadeWithoutGradCannotBeWrittenWithGrad) {
  Tensor x = from_vector<float>({1, 2, 3}).requires_grad_();
  Tensor v;
  {
    autograd::NoGradGuard no_grad;
    v = x.narrow(0, 0, 2);
    v.fill_(5);  // allowed: still without grad
  }
  EXPECT_THROW(v.fill_(7), InvalidArgument);
  EXPECT_THROW(v.reshape({2}).fill_(7), InvalidArgument);  // a view of that view too
  EXPECT_EQ(x.detach().to_vector<float>(), (std::vector<float>{5, 5, 3}));
}

// Only a leaf's requires_grad can be switched off: on an op's output it would cut the graph without a word.
TEST(Autograd, RequiresGradOfANonLeafCannotBeSwitchedOff) {
  Tensor x = from_vector<float>({1, 2}).requires_grad_();
  Tensor y = mul(x, x);
  EXPECT_THROW(y.requires_grad_(false), InvalidArgument);
  EXPECT_NO_THROW(x.requires_grad_(false));
}

// A long graph dropped without backward is freed by a loop, not a recursion as deep as the graph.
TEST(Autograd, ADeepGraphDroppedWithoutBackwardIsFreed) {
  Tensor x = ones({1}).requires_grad_();
  {
    Tensor y = x;
    for (int i = 0; i < 200000; ++i) y = add(y, 1e-9);
  }
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = mul(y, 1.0);
  sum(y).backward();  // backward of a deep graph too
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{1}));
}

// Anomaly mode reads each output back: inside a graph capture (which allows no sync) it checks nothing, so a step
// still captures.
TEST(Autograd, AnomalyModeLeavesAGraphCaptureAlone) {
  const Device sim{DeviceType::Sim, 0};
  autograd::set_detect_anomaly(true);
  Tensor w = ones({4}, {.device = sim}).requires_grad_();
  Tensor out;
  Graph graph(sim);
  EXPECT_NO_THROW(graph.capture([&] { out = sum(mul(w, 2.0)); }));
  autograd::set_detect_anomaly(false);
  graph.replay();
  EXPECT_EQ(out.item<float>(), 8.0F);
}

}  // namespace
}  // namespace ferry
