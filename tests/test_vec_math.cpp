// The cpu backend's float exp, erf, tanh and sigmoid (src/cpu/vec_math.h: branch-free, vectorised) against the exact
// value in double, on every 1009th float bit pattern (4.3 million values, every exponent and both signs),
// through the ops themselves, so the kernel's vectorised loop is what is checked.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ferry/ferry.h"

namespace ferry {
namespace {

// Every 1009th float bit pattern, NaNs and infinities included.
std::vector<float> sampled_floats() {
  std::vector<float> xs;
  for (std::uint64_t bits = 0; bits < (1ull << 32); bits += 1009) xs.push_back(std::bit_cast<float>(std::uint32_t(bits)));
  return xs;
}

// |got - exact| in units of the last place of the float nearest `exact` (subnormals: the smallest step).
double ulps(float got, double exact) {
  if (std::isnan(exact)) return std::isnan(got) ? 0 : 1e9;
  if (std::isinf(exact) || std::abs(exact) > std::numeric_limits<float>::max())
    return got == static_cast<float>(exact) ? 0 : 1e9;
  const float nearest = std::abs(static_cast<float>(exact));
  double ulp = static_cast<double>(std::nextafter(nearest, std::numeric_limits<float>::infinity())) - nearest;
  ulp = std::max(ulp, static_cast<double>(std::numeric_limits<float>::denorm_min()));
  return std::abs(static_cast<double>(got) - exact) / ulp;
}

struct Worst {
  double ulps = 0;
  float at = 0;
};

template <typename Op, typename Exact>
Worst worst_error(Op op, Exact exact, float lowest = -std::numeric_limits<float>::infinity()) {
  std::vector<float> xs = sampled_floats();
  std::erase_if(xs, [&](float x) { return x < lowest; });
  const std::vector<float> got = op(from_vector(xs)).template to_vector<float>();
  Worst w;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double e = ulps(got[i], exact(static_cast<double>(xs[i])));
    if (e > w.ulps) w = {e, xs[i]};
  }
  return w;
}

TEST(VecMath, ExpWithinOneUlpOfExact) {
  const Worst w = worst_error([](const Tensor& t) { return exp(t); }, [](double x) { return std::exp(x); });
  EXPECT_LE(w.ulps, 1.0) << "at x = " << w.at;
}

TEST(VecMath, ErfWithinTwoAndAHalfUlpsOfExact) {
  const Worst w = worst_error([](const Tensor& t) { return erf(t); }, [](double x) { return std::erf(x); });
  EXPECT_LE(w.ulps, 2.5) << "at x = " << w.at;
}

TEST(VecMath, TanhWithinTwoUlpsOfExact) {
  const Worst w = worst_error([](const Tensor& t) { return tanh(t); }, [](double x) { return std::tanh(x); });
  EXPECT_LE(w.ulps, 2.0) << "at x = " << w.at;
}

// Below -88.7, e^-x overflows and sigmoid gives 0 where the exact value is a subnormal (as glibc's expf did).
TEST(VecMath, SigmoidWithinThreeUlpsOfExact) {
  const Worst w = worst_error([](const Tensor& t) { return sigmoid(t); },
                              [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, -88.7f);
  EXPECT_LE(w.ulps, 3.0) << "at x = " << w.at;
}

TEST(VecMath, SpecialValuesAsTheStandardLibrary) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> xs{0.0f, -0.0f, inf, -inf, nan, 88.72f, 88.73f, -87.5f, -103.0f, -104.0f, -200.0f,
                              1e-40f, -1e-40f, 3.9f, 4.0f, -5.0f, 1e30f};
  const auto e = exp(from_vector(xs)).to_vector<float>();
  const auto r = erf(from_vector(xs)).to_vector<float>();
  const auto th = tanh(from_vector(xs)).to_vector<float>();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i];
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(e[i]) && std::isnan(r[i]) && std::isnan(th[i]));
      continue;
    }
    EXPECT_LE(ulps(e[i], std::exp(static_cast<double>(x))), 1.0) << "exp(" << x << ") = " << e[i];
    EXPECT_LE(ulps(r[i], std::erf(static_cast<double>(x))), 2.5) << "erf(" << x << ") = " << r[i];
    EXPECT_EQ(std::signbit(r[i]), std::signbit(x)) << "erf keeps the sign of " << x;  // erf(-0) = -0
    EXPECT_LE(ulps(th[i], std::tanh(static_cast<double>(x))), 2.0) << "tanh(" << x << ") = " << th[i];
    EXPECT_EQ(std::signbit(th[i]), std::signbit(x)) << "tanh keeps the sign of " << x;  // tanh(-0) = -0
  }
  EXPECT_EQ(th[2], 1.0f);
  EXPECT_EQ(th[3], -1.0f);
  EXPECT_EQ(th[16], 1.0f);  // tanh(1e30)
  EXPECT_EQ(e[0], 1.0f);
  EXPECT_EQ(e[2], inf);
  EXPECT_EQ(e[3], 0.0f);
  EXPECT_EQ(e[6], inf);  // e^88.73 > FLT_MAX
  EXPECT_GT(e[8], 0.0f);  // e^-103 is a subnormal, not flushed
  EXPECT_EQ(r[2], 1.0f);
  EXPECT_EQ(r[3], -1.0f);
}

// A strided view walks the element-by-element loop, a contiguous tensor the vectorised one: the same bits.
TEST(VecMath, StridedAndContiguousGiveTheSameBits) {
  const Tensor x = randn({64, 48}) * 4.0;
  const Tensor xt = x.transpose(0, 1);
  for (const auto& op : {+[](const Tensor& t) { return exp(t); }, +[](const Tensor& t) { return erf(t); },
                         +[](const Tensor& t) { return tanh(t); }, +[](const Tensor& t) { return sigmoid(t); }}) {
    const auto strided = op(xt).contiguous().to_vector<float>();
    const auto contiguous = op(xt.contiguous()).to_vector<float>();
    EXPECT_EQ(strided, contiguous);
  }
}

}  // namespace
}  // namespace ferry
