// vec_math.h — exp, erf and tanh in float, written so that GCC vectorises a loop of them (`#pragma omp simd`):
// no branches, no calls, no tables; the special cases (NaN, overflow, underflow) fall out of the arithmetic or a
// select. glibc's expf and erff are scalar calls, one element at a time, and were most of the time of the
// elementwise ops in a transformer step (GELU's erf, softmax's exp) and, with tanhf, a fifth of an LSTM step.
// Accuracy against the exact value (every 1009th float in tests/test_vec_math.cpp; exp and erf also every float
// once, by hand): exp <= 1 ulp, erf <= 2.5 ulp (CUDA's erff: 2), tanh <= 2 ulp (1.29 at worst on the sample;
// CUDA's tanhf: 2), special values as std::'s. Compile with -fno-trapping-math, or GCC keeps the NaN selects as
// branches and vectorises nothing (the results are the same either way).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace ferry::cpu {

// e^x. x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, Cody and Waite); e^r by its Taylor series to r^7
// (the first term left out is r^8 / 8! <= 5e-9, below half an ulp); 2^n built in the exponent bits, in two
// halves so that n from -151 to 129 stays representable and a subnormal result is rounded once.
inline float exp_f32(float x) {
  float xc = x > -104.0f ? x : -104.0f;  // beyond [-104, 89] e^x is 0 or inf anyway; NaN becomes -104 here
  xc = xc < 89.0f ? xc : 89.0f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer (|x log2 e| < 2^22)
  const float n = std::fma(xc, 1.44269504088896341f, kRound) - kRound;
  float r = std::fma(-n, 0.693145751953125f, xc);   // ln2's high part: 16 bits, n * it is exact
  r = std::fma(-n, 1.42860682030941723212e-6f, r);  // ln2 - its high part
  float p = 1.0f / 5040.0f;
  p = std::fma(p, r, 1.0f / 720.0f);
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const std::int32_t k = static_cast<std::int32_t>(n);
  const std::int32_t half = k >> 1;  // floor(k / 2), then k - half: both in [-76, 65]
  const float s1 = std::bit_cast<float>((half + 127) << 23);
  const float s2 = std::bit_cast<float>((k - half + 127) << 23);
  const float e = p * s1 * s2;  // p * s1 is exact (a power of two, in range); one rounding, at the end
  return x != x ? x : e;        // NaN in, NaN out
}

// erf(x). For |x| < 0.875, x P(x^2) with P of degree 5 (relative error of the fit 9e-9); above, 1 - e^Q(u) with
// Q of degree 7 fitted to log erfc on [0.875, 4], u = that interval mapped to [-1, 1] (absolute error of the fit
// 1e-10). Beyond 4 the result rounds to +-1. Coefficients: least squares on Chebyshev nodes against mpmath.
inline float erf_f32(float x) {
  float a = std::fabs(x);
  a = a < 4.0f ? a : 4.0f;  // NaN becomes 4 here
  const float t = a * a;
  float p = -6.200172291e-04f;
  p = std::fma(p, t, 5.031600484e-03f);
  p = std::fma(p, t, -2.679108515e-02f);
  p = std::fma(p, t, 1.128244564e-01f);
  p = std::fma(p, t, -3.761254970e-01f);
  p = std::fma(p, t, 1.128379158e+00f);
  const float inner = a * p;
  const float u = std::fma(a, 2.0f / 3.125f, -4.875f / 3.125f);
  float q = -4.751324607e-04f;
  q = std::fma(q, u, 1.097195900e-03f);
  q = std::fma(q, u, -4.171293143e-03f);
  q = std::fma(q, u, 1.377977467e-02f);
  q = std::fma(q, u, -4.352742571e-02f);
  q = std::fma(q, u, -2.299330484e+00f);
  q = std::fma(q, u, -8.179412434e+00f);
  q = std::fma(q, u, -7.475957209e+00f);
  const float outer = 1.0f - exp_f32(q);
  const float e = std::copysign(a < 0.875f ? inner : outer, x);
  return x != x ? x : e;
}

// tanh(x), odd: computed for |x| and given x's sign. For |x| < 0.625, a + a^3 P(a^2) with P of degree 5 (relative
// error of the fit 1.7e-10; least squares on Chebyshev nodes against mpmath); above, 1 - 2 / (e^2|x| + 1), whose
// subtraction loses nothing there (the result is over 0.55). e^2|x| overflows to inf past 44.4 and the result is
// then 1, as it rounds to from 9.01 on. NaN passes through exp_f32.
inline float tanh_f32(float x) {
  const float a = std::fabs(x);
  const float u = a * a;
  float p = 0.002148984107228979f;
  p = std::fma(p, u, -0.008184661670043824f);
  p = std::fma(p, u, 0.021704000399880366f);
  p = std::fma(p, u, -0.05394745416959319f);
  p = std::fma(p, u, 0.13333212501732733f);
  p = std::fma(p, u, -0.3333333101037753f);
  const float near_zero = std::fma(a * u, p, a);  // a = 0 gives +0, and the sign below -0
  const float far = 1.0f - 2.0f / (exp_f32(2.0f * a) + 1.0f);
  return std::copysign(a < 0.625f ? near_zero : far, x);
}

// UnaryOp::Exp, Erf, Sigmoid and Tanh of a float or double, as the unary kernel, the recurrent cells, softmax and
// GELU compute them: float through the functions above, double through std::.
template <typename T>
T exp_of(T x) {
  if constexpr (std::is_same_v<T, float>) return exp_f32(x);
  else return std::exp(x);
}
template <typename T>
T erf_of(T x) {
  if constexpr (std::is_same_v<T, float>) return erf_f32(x);
  else return std::erf(x);
}
template <typename T>
T sigmoid_of(T x) {
  if constexpr (std::is_same_v<T, float>) return 1.0f / (1.0f + exp_f32(-x));
  else return T(1) / (T(1) + std::exp(-x));
}
template <typename T>
T tanh_of(T x) {
  if constexpr (std::is_same_v<T, float>) return tanh_f32(x);
  else return std::tanh(x);
}

}  // namespace ferry::cpu
