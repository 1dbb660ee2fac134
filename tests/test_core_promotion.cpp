// test_core_promotion.cpp — the dtype an op chooses: PyTorch's result_type for two tensors (a 0-d operand beside a
// dimensioned one), ferry's rule for a tensor with a C++ scalar (ferry/ops.h), and arange's default dtype.
#include <limits>

#include "test_helpers.h"

namespace ferry {
namespace {

constexpr DType kAll[] = {DType::Bool, DType::UInt8, DType::Int32, DType::Int64, DType::Float32, DType::Float64};

// torch.result_type(dimensioned [3], 0-d) in PyTorch 1.13, rows the dimensioned dtype, columns the 0-d one (kAll's
// order): a 0-d operand counts only when its category (bool < integer < floating) is higher.
constexpr DType kWithZeroDim[6][6] = {
    {DType::Bool, DType::UInt8, DType::Int32, DType::Int64, DType::Float32, DType::Float64},
    {DType::UInt8, DType::UInt8, DType::UInt8, DType::UInt8, DType::Float32, DType::Float64},
    {DType::Int32, DType::Int32, DType::Int32, DType::Int32, DType::Float32, DType::Float64},
    {DType::Int64, DType::Int64, DType::Int64, DType::Int64, DType::Float32, DType::Float64},
    {DType::Float32, DType::Float32, DType::Float32, DType::Float32, DType::Float32, DType::Float32},
    {DType::Float64, DType::Float64, DType::Float64, DType::Float64, DType::Float64, DType::Float64},
};

// float32 [3] + 0-d float64 once gave float64 (and int32 [3] == 0-d 2.5 still compares in float64, not as int32 2).
TEST(CorePromotion, ZeroDimTensorsPromoteOnlyAcrossCategoriesAsPyTorch) {
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 6; ++j) {
      const Tensor dimensioned = ones({3}, {.dtype = kAll[i]}), zero_dim = ones({}, {.dtype = kAll[j]});
      const std::string what = std::string(dtype_name(kAll[i])) + " [3] with 0-d " + std::string(dtype_name(kAll[j]));
      EXPECT_EQ(promote_with_zero_dim(kAll[i], kAll[j]), kWithZeroDim[i][j]) << what;
      EXPECT_EQ(result_type(dimensioned, zero_dim), kWithZeroDim[i][j]) << what;
      EXPECT_EQ(result_type(zero_dim, dimensioned), kWithZeroDim[i][j]) << what;
      EXPECT_EQ(add(dimensioned, zero_dim).dtype(), kWithZeroDim[i][j]) << what;
      EXPECT_EQ(maximum(zero_dim, dimensioned).dtype(), kWithZeroDim[i][j]) << what;
      EXPECT_EQ(where(ones({3}, {.dtype = DType::Bool}), dimensioned, zero_dim).dtype(), kWithZeroDim[i][j]) << what;
      // Two dimensioned, or two 0-d, operands: plain promotion.
      EXPECT_EQ(result_type(dimensioned, ones({1}, {.dtype = kAll[j]})), promote_types(kAll[i], kAll[j])) << what;
      EXPECT_EQ(result_type(ones({}, {.dtype = kAll[i]}), zero_dim), promote_types(kAll[i], kAll[j])) << what;
    }
  }
  EXPECT_EQ(result_type(ones({0}), ones({}, {.dtype = DType::Float64})), DType::Float32);  // empty is dimensioned
  for (const Device& device : available_devices()) {
    if (device.index != 0) continue;
    const Tensor x = from_vector<float>({1, 2, 3}).to(device);
    const Tensor half = scalar_tensor(0.5, {.device = device, .dtype = DType::Float64});
    const Tensor sum_f32 = x + half;
    EXPECT_EQ(sum_f32.dtype(), DType::Float32) << device.str();
    EXPECT_EQ(sum_f32.to_vector<float>(), (std::vector<float>{1.5f, 2.5f, 3.5f})) << device.str();
    const Tensor i32 = from_vector<std::int32_t>({1, 2, 3}).to(device);
    const Tensor two_and_a_half = scalar_tensor(2.5, {.device = device, .dtype = DType::Float64});
    EXPECT_EQ(eq(i32, two_and_a_half).to_vector<bool>(), (std::vector<bool>{false, false, false})) << device.str();
    EXPECT_EQ((i32 * two_and_a_half).to_vector<double>(), (std::vector<double>{2.5, 5, 7.5})) << device.str();
  }
}

// Each input's gradient comes back in its own dtype (as PyTorch casts it), whichever dtype the op computed in.
TEST(CorePromotion, GradientsOfMixedDtypeOperandsTakeEachInputsDtype) {
  for (const Device& device : available_devices()) {
    if (device.index != 0) continue;
    Tensor a = from_vector<float>({1, 2, 3}, {.device = device, .requires_grad = true});
    Tensor s = from_vector<double>({2}, Shape{}, {.device = device, .requires_grad = true});
    Tensor d = from_vector<double>({1, 1, 1}, {.device = device, .requires_grad = true});
    sum(mul(a, s) + d + where(from_vector<bool>({true, false, true}).to(device), s, a)).backward();
    ASSERT_EQ(a.grad().dtype(), DType::Float32) << device.str();
    ASSERT_EQ(s.grad().dtype(), DType::Float64) << device.str();
    ASSERT_EQ(d.grad().dtype(), DType::Float64) << device.str();
    EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{2, 3, 2})) << device.str();
    EXPECT_DOUBLE_EQ(s.grad().item<double>(), 6 + 2) << device.str();  // sum(a) from mul, 2 from where
    EXPECT_EQ(d.grad().to_vector<double>(), (std::vector<double>{1, 1, 1})) << device.str();
  }
}

// Tensor op double: a whole-number scalar keeps an integer dtype only when that dtype holds it; otherwise float32,
// never a wrapped scalar (int32 + 2^31 once gave -2147483648). Bool tensors count as int64.
TEST(CorePromotion, ScalarsKeepIntegerDtypesOnlyWhenTheyFit) {
  const double inf = std::numeric_limits<double>::infinity();
  for (const Device& device : available_devices()) {
    if (device.index != 0) continue;
    const std::string on = " on " + device.str();
    const Tensor i32 = from_vector<std::int32_t>({0, 1}).to(device);
    const Tensor i64 = from_vector<std::int64_t>({0, 1}).to(device);
    const Tensor u8 = from_vector<std::uint8_t>({0, 5}).to(device);
    const Tensor b = from_vector<bool>({true, false}).to(device);
    auto expect = [&](const Tensor& t, DType dtype, const std::vector<double>& want, const std::string& what) {
      EXPECT_EQ(t.dtype(), dtype) << what << on << ": " << dtype_name(t.dtype());
      EXPECT_EQ(testing::values(t), want) << what << on;
    };
    expect(i32 + 2147483648.0, DType::Float32, {2147483648.0, 2147483648.0}, "int32 + 2^31");
    expect(i32 + 2147483647.0, DType::Int32, {2147483647.0, -2147483648.0}, "int32 + (2^31 - 1)");  // result wraps
    expect(i32 - 2147483649.0, DType::Float32, {-2147483648.0, -2147483648.0}, "int32 - (2^31 + 1)");
    expect(i32 * -3e9, DType::Float32, {0, -3e9}, "int32 * -3e9");
    expect(rsub(i32, 1e10), DType::Float32, {1e10, 1e10}, "1e10 - int32");
    expect(i64 + 9223372036854775808.0, DType::Float32, {9223372036854775808.0, 9223372036854775808.0}, "int64 + 2^63");
    expect(i64 + 1.0, DType::Int64, {1, 2}, "int64 + 1.0");
    expect(i64 + inf, DType::Float32, {inf, inf}, "int64 + inf");
    EXPECT_TRUE(std::isnan(testing::values(i32 + NAN)[0])) << on;
    expect(u8 - 1.0, DType::UInt8, {255, 4}, "uint8 - 1.0");  // the scalar as written fits: uint8 arithmetic
    expect(u8 + -1.0, DType::Float32, {-1, 4}, "uint8 + -1.0");
    expect(u8 + 256.0, DType::Float32, {256, 261}, "uint8 + 256.0");
    expect(u8 * 2.0, DType::UInt8, {0, 10}, "uint8 * 2.0");
    expect(rsub(u8, 300.0), DType::Float32, {300, 295}, "300.0 - uint8");
    expect(b * 3.0, DType::Int64, {3, 0}, "bool * 3.0");
    expect(b * 2.5, DType::Float32, {2.5, 0}, "bool * 2.5");
    expect(b + 0x1p64, DType::Float32, {0x1p64, 0x1p64}, "bool + 2^64");
    // Comparisons decide in the same dtype: a bool is not 2, a uint8 0 is not 256.
    EXPECT_EQ(eq(b, 2.0).to_vector<bool>(), (std::vector<bool>{false, false})) << on;
    EXPECT_EQ(eq(b, 1.0).to_vector<bool>(), (std::vector<bool>{true, false})) << on;
    EXPECT_EQ(eq(u8, 256.0).to_vector<bool>(), (std::vector<bool>{false, false})) << on;
    EXPECT_EQ(gt(u8, -1.0).to_vector<bool>(), (std::vector<bool>{true, true})) << on;
    EXPECT_EQ(lt(i64, 1e19).to_vector<bool>(), (std::vector<bool>{true, true})) << on;
  }
}

// arange's dtype is PyTorch's unless given: int64 for whole-number start, end and step (once float32, against the
// header's promise), float32 otherwise.
TEST(CorePromotion, ArangeIsInt64ForWholeNumbersUnlessADtypeIsGiven) {
  using I = std::vector<std::int64_t>;
  EXPECT_EQ(arange(5).dtype(), DType::Int64);
  EXPECT_EQ(arange(5).to_vector<std::int64_t>(), (I{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(0, 5, 2).to_vector<std::int64_t>(), (I{0, 2, 4}));
  EXPECT_EQ(arange(5, 0, -2).to_vector<std::int64_t>(), (I{5, 3, 1}));
  EXPECT_EQ(arange(-3.0, 0.0, 1.0).to_vector<std::int64_t>(), (I{-3, -2, -1}));
  EXPECT_EQ(arange(0, 1, 0.25).to_vector<float>(), (std::vector<float>{0, 0.25f, 0.5f, 0.75f}));
  EXPECT_EQ(arange(0.5, 3, 1).to_vector<float>(), (std::vector<float>{0.5f, 1.5f, 2.5f}));
  EXPECT_EQ(arange(0, 1e19, 2e18).dtype(), DType::Float32);  // whole, but beyond int64
  EXPECT_EQ(arange(0, 3, 1, {.dtype = DType::Float32}).to_vector<float>(), (std::vector<float>{0, 1, 2}));
  EXPECT_EQ(arange(3, {.dtype = DType::Float64}).to_vector<double>(), (std::vector<double>{0, 1, 2}));
  EXPECT_EQ(arange(0, 1, 0.5, {.dtype = DType::Int64}).dtype(), DType::Int64);
  for (const Device& device : testing::accelerators()) {
    const Tensor on_device = arange(0, 4, 1, {.device = device});
    EXPECT_EQ(on_device.device(), device);
    EXPECT_EQ(on_device.dtype(), DType::Int64) << device.str();
    EXPECT_EQ(on_device.cpu().to_vector<std::int64_t>(), (I{0, 1, 2, 3})) << device.str();
  }
}

}  // namespace
}  // namespace ferry
