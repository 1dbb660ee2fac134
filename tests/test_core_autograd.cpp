// test_core_autograd.cpp — every differentiable core op's backward against central finite
// differences in float64, plus the engine's rules (accumulation, no_grad, detach, errors).
#include <functional>

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
      {"square", [](V x) { return square(x[0]); }, {r({4})}},
      {"where", [](V x) { return where(gt(x[0], 0.0), x[0], x[1]); }, {r({5}), r({5})}},
      {"sum_dims", [](V x) { return sum(x[0], {0, 2}); }, {r({2, 3, 4})}},
      {"sum_keep", [](V x) { return sum(x[0], {1}, true); }, {r({2, 3})}},
      {"mean", [](V x) { return mean(x[0], {1}); }, {r({3, 4})}},
      {"var", [](V x) { return var(x[0], {0}); }, {r({4, 3})}},
      {"max_all", [](V x) { return max(x[0]); }, {r({5})}},
      {"max_dim", [](V x) { return max(x[0], 1).first; }, {r({3, 4})}},
      {"min_dim", [](V x) { return min(x[0], 0, true).first; }, {r({3, 4})}},
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
  EXPECT_THROW(loss.backward(), InvalidArgument);  // graph already freed
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
