// test_half.cpp — the 16-bit storage types, Float16 and BFloat16: their conversions against PyTorch's (a
// fixture) and against independent references (the compiler's _Float16, exact arithmetic in double), then tensors
// of them on every device: conversions, copies, fills, moves, printing, safetensors, and the clear refusal of ops
// that would compute in them.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <limits>
#include <string>
#include <vector>

#include "ferry/checkpoint.h"
#include "ferry/nn/linear.h"
#include "ferry/safetensors.h"
#include "test_helpers.h"

namespace ferry {
namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
float float_of(std::uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// bfloat16 by exact arithmetic: the two bfloat16 values around x (x's top 16 bits, and one unit further from
// zero), whichever is nearer in double; a tie to the one with an even last bit.
std::uint16_t reference_bfloat16(float x) {
  if (std::isnan(x)) return 0x7fc0;
  const std::uint32_t b = bits_of(x);
  const std::uint32_t below = b & 0xffff0000u, above = below + 0x10000u;
  const double lo = float_of(below);
  // Past bfloat16's largest finite (0x7f7f), the next step up is 2^128 in magnitude: IEEE rounds there to infinity.
  const double hi = (above & 0x7fffffffu) == 0x7f800000u ? std::copysign(0x1p128, static_cast<double>(x))
                                                         : static_cast<double>(float_of(above));
  const double d_lo = std::abs(static_cast<double>(x) - lo), d_hi = std::abs(hi - static_cast<double>(x));
  if ((below & 0x7fffffffu) == 0x7f800000u) return static_cast<std::uint16_t>(below >> 16);  // +-inf itself
  if (d_lo < d_hi || (d_lo == d_hi && ((below >> 16) & 1u) == 0)) return static_cast<std::uint16_t>(below >> 16);
  return static_cast<std::uint16_t>(above >> 16);
}

#if defined(__FLT16_MANT_DIG__)
std::uint16_t compiler_half(float x) {
  const _Float16 h = static_cast<_Float16>(x);
  std::uint16_t b;
  std::memcpy(&b, &h, sizeof b);
  return b;
}
float compiler_float(std::uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, sizeof h);
  return static_cast<float>(h);
}
#endif

TEST(Half, EveryFloat16PatternConvertsToFloatExactlyAndBack) {
  for (std::uint32_t p = 0; p <= 0xffffu; ++p) {
    const auto bits = static_cast<std::uint16_t>(p);
    const float x = static_cast<float>(Float16::from_bits(bits));
    const bool nan = (bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu) != 0;
    ASSERT_EQ(std::isnan(x), nan) << std::hex << p;
#if defined(__FLT16_MANT_DIG__)
    ASSERT_EQ(bits_of(x), bits_of(compiler_float(bits))) << std::hex << p;  // NaNs too: quiet, payload kept
#endif
    if (nan) {
      EXPECT_EQ(Float16(x).bits, (bits & 0x8000u) | 0x7e00u) << std::hex << p;  // a quiet NaN, sign kept
      continue;
    }
    ASSERT_EQ(Float16(x).bits, bits) << std::hex << p;
  }
}

// Tensors take the vectorised conversions on the cpu (eight lanes at once, then a scalar tail): every pattern,
// NaNs with payloads too, gives the scalar conversion's bits on every device.
TEST(Half, TensorConversionsGiveTheScalarBitsForEveryPattern) {
  std::vector<Float16> patterns(65536);
  std::vector<float> floats;
  for (std::uint32_t p = 0; p <= 0xffffu; ++p) patterns[p] = Float16::from_bits(static_cast<std::uint16_t>(p));
  for (std::uint64_t b = 0; b <= 0xffffffffu; b += 65521) floats.push_back(float_of(static_cast<std::uint32_t>(b)));
  for (const std::uint32_t nan : {0x7fc00000u, 0x7fc02000u, 0xffc12345u, 0x7f800001u, 0x7fbfffffu})
    floats.push_back(float_of(nan));
  for (const Device& device : available_devices()) {
    if (device.index != 0) continue;
    SCOPED_TRACE(device.str());
    const std::vector<float> wide = from_vector(patterns, {.device = device}).to(DType::Float32).to_vector<float>();
    for (std::uint32_t p = 0; p <= 0xffffu; ++p)
      ASSERT_EQ(bits_of(wide[p]), bits_of(static_cast<float>(patterns[p]))) << std::hex << p;
    // from element 3: a start that is not a multiple of eight lanes, so both loops run
    const Tensor source = from_vector(floats, {.device = device}).narrow(0, 3, static_cast<std::int64_t>(floats.size()) - 3);
    const std::vector<Float16> narrow = source.to(DType::Float16).to_vector<Float16>();
    for (std::size_t i = 0; i < narrow.size(); ++i)
      ASSERT_EQ(narrow[i].bits, Float16(floats[i + 3]).bits) << floats[i + 3] << " (0x" << std::hex << bits_of(floats[i + 3]) << ")";
  }
}

TEST(Half, FloatToFloat16RoundsAsTheCompilersFloat16) {
#if defined(__FLT16_MANT_DIG__)
  // Every 251st float32 pattern (17 million, every exponent and sign), then the neighbourhoods of the boundaries.
  std::uint64_t checked = 0;
  const auto check = [&](std::uint32_t b) {
    const float x = float_of(b);
    if (std::isnan(x)) return;
    ASSERT_EQ(Float16(x).bits, compiler_half(x)) << x << " (0x" << std::hex << b << ")";
    ++checked;
  };
  for (std::uint64_t b = 0; b <= 0xffffffffu; b += 251) check(static_cast<std::uint32_t>(b));
  for (const float edge : {65504.0f, 65520.0f, 65536.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 1.0f})
    for (int d = -300; d <= 300; ++d) {
      check(bits_of(edge) + static_cast<std::uint32_t>(d));
      check((bits_of(edge) + static_cast<std::uint32_t>(d)) | 0x80000000u);
    }
  EXPECT_GT(checked, 16'000'000u);
#else
  GTEST_SKIP() << "this compiler has no _Float16 to compare with";
#endif
}

TEST(Half, FloatToBFloat16RoundsToNearestEven) {
  for (std::uint64_t b = 0; b <= 0xffffffffu; b += 257) {
    const float x = float_of(static_cast<std::uint32_t>(b));
    ASSERT_EQ(BFloat16(x).bits, reference_bfloat16(x)) << x << " (0x" << std::hex << b << ")";
  }
  EXPECT_EQ(BFloat16(1.0f + 0x1p-8f).bits, 0x3f80u);            // a tie, to the even 1.0
  EXPECT_EQ(BFloat16(1.0f + 3 * 0x1p-8f).bits, 0x3f82u);        // a tie, to the even 1.015625
  EXPECT_EQ(BFloat16(std::numeric_limits<float>::max()).bits, 0x7f80u);  // past bfloat16's largest: inf
  EXPECT_EQ(static_cast<float>(BFloat16::from_bits(0x3eab)), 0.333984375f);
}

// PyTorch 1.13's own conversions of 26,000 float32 values: edges, ties of both types, and a spread over float32's
// exponents (tools/make_fixtures.py half_case).
TEST(Half, ConversionsMatchPyTorch) {
  std::map<std::string, std::string> metadata;
  const nn::NamedTensors file = read_tensors(FERRY_SOURCE_DIR "/tests/fixtures/nn/half_conversions.safetensors", &metadata);
  ASSERT_EQ(file.size(), 3u);
  const Tensor& values = file[0].second;
  const Tensor& halves = file[1].second;
  const Tensor& bfloats = file[2].second;
  ASSERT_EQ(halves.dtype(), DType::Float16);
  ASSERT_EQ(bfloats.dtype(), DType::BFloat16);
  const std::vector<float> x = values.to_vector<float>();
  const std::vector<Float16> torch_half = halves.to_vector<Float16>();
  const std::vector<BFloat16> torch_bfloat = bfloats.to_vector<BFloat16>();
  ASSERT_GT(x.size(), 20000u);
  for (const Device& device : available_devices()) {
    if (device.index != 0) continue;
    SCOPED_TRACE(device.str());
    const Tensor on = values.to(device);
    const std::vector<Float16> ours_half = on.to(DType::Float16).to_vector<Float16>();
    const std::vector<BFloat16> ours_bfloat = on.to(DType::BFloat16).to_vector<BFloat16>();
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(ours_half[i].bits, torch_half[i].bits) << "float16 of " << x[i] << " (value " << i << ")";
      ASSERT_EQ(ours_bfloat[i].bits, torch_bfloat[i].bits) << "bfloat16 of " << x[i] << " (value " << i << ")";
    }
    // and back: exact, as PyTorch's .float()
    const std::vector<float> back = halves.to(device).to(DType::Float32).to_vector<float>();
    for (std::size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(bits_of(back[i]), bits_of(static_cast<float>(torch_half[i]))) << i;
  }
}

TEST(Half, DTypeNamesSizesAndPromotion) {
  EXPECT_EQ(element_size(DType::Float16), 2u);
  EXPECT_EQ(element_size(DType::BFloat16), 2u);
  EXPECT_EQ(parse_dtype("half"), DType::Float16);
  EXPECT_EQ(parse_dtype("float16"), DType::Float16);
  EXPECT_EQ(parse_dtype("bf16"), DType::BFloat16);
  EXPECT_EQ(dtype_name(DType::BFloat16), "bfloat16");
  EXPECT_TRUE(is_floating(DType::Float16));
  EXPECT_TRUE(is_storage_only(DType::BFloat16));
  EXPECT_FALSE(is_storage_only(DType::Float32));
  // PyTorch's torch.promote_types
  EXPECT_EQ(promote_types(DType::Float16, DType::BFloat16), DType::Float32);
  EXPECT_EQ(promote_types(DType::BFloat16, DType::Float32), DType::Float32);
  EXPECT_EQ(promote_types(DType::Float16, DType::Int64), DType::Float16);
  EXPECT_EQ(promote_types(DType::Bool, DType::BFloat16), DType::BFloat16);
  EXPECT_EQ(promote_types(DType::Float64, DType::Float16), DType::Float64);
}

// Every device gives the cpu's bits: conversions from and to every dtype, strided views, fills, random draws.
TEST(Half, TensorsOfThemOnEveryDevice) {
  manual_seed(7);
  const Tensor x = mul(randn({37, 19}), 300.0);  // some beyond float16's range
  for (const DType storage : {DType::Float16, DType::BFloat16}) {
    SCOPED_TRACE(dtype_name(storage));
    const Tensor ref = x.to(storage);
    EXPECT_EQ(ref.nbytes(), 37u * 19u * 2u);
    const Tensor ref_t = x.t().to(storage);
    const Tensor ref_i = x.to(DType::Int64).to(storage);
    const Tensor ref_back_i = ref.to(DType::Int32);
    const Tensor ref_back_b = ref.to(DType::Bool);
    const Tensor ref_d = x.to(DType::Float64).to(storage);
    for (const Device& device : testing::accelerators()) {
      SCOPED_TRACE(device.str());
      const Tensor on = x.to(device);
      EXPECT_TRUE(testing::all_close(on.to(storage).cpu(), ref, 0, 0));
      EXPECT_TRUE(testing::all_close(on.t().to(storage).cpu(), ref_t, 0, 0));           // strided input
      EXPECT_TRUE(testing::all_close(on.to(storage).t().contiguous().cpu(), ref_t, 0, 0));  // strided half copy
      EXPECT_TRUE(testing::all_close(on.to(DType::Int64).to(storage).cpu(), ref_i, 0, 0));
      EXPECT_TRUE(testing::all_close(on.to(storage).to(DType::Int32).cpu(), ref_back_i, 0, 0));
      EXPECT_TRUE(testing::all_close(on.to(storage).to(DType::Bool).cpu(), ref_back_b, 0, 0));
      EXPECT_TRUE(testing::all_close(on.to(DType::Float64).to(storage).cpu(), ref_d, 0, 0));
      EXPECT_TRUE(testing::all_close(ref.to(device).cpu(), ref, 0, 0));  // moved both ways as 2-byte elements
      EXPECT_TRUE(testing::all_close(full({5, 3}, 1.0 / 3.0, {.device = device, .dtype = storage}).cpu(),
                                     full({5, 3}, 1.0 / 3.0, {.dtype = storage}), 0, 0));
    }
    // The values themselves: float32 -> storage rounds once, storage -> float32 is exact.
    const std::vector<float> xs = x.to_vector<float>();
    const std::vector<float> back = ref.to(DType::Float32).to_vector<float>();
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const float expected = storage == DType::Float16 ? static_cast<float>(Float16(xs[i]))
                                                       : static_cast<float>(BFloat16(xs[i]));
      ASSERT_EQ(bits_of(back[i]), bits_of(expected)) << xs[i];
    }
    EXPECT_EQ(full({}, 0.1, {.dtype = storage}).item<float>(),
              storage == DType::Float16 ? static_cast<float>(Float16(0.1f)) : static_cast<float>(BFloat16(0.1f)));
    EXPECT_EQ(zeros({4}, {.dtype = storage}).to_vector<float>(), std::vector<float>(4, 0.0f));
  }
}

TEST(Half, RandomDrawsAreTheFloat32DrawsRounded) {
  for (const Device& device : available_devices()) {
    if (device.index != 0) continue;
    SCOPED_TRACE(device.str());
    manual_seed(3);
    const Tensor wide = randn({1000}, {.device = device});
    manual_seed(3);
    const Tensor narrow = randn({1000}, {.device = device, .dtype = DType::BFloat16});
    EXPECT_TRUE(testing::all_close(narrow.cpu(), wide.to(DType::BFloat16).cpu(), 0, 0));
  }
}

TEST(Half, FromAndToVectorsOfTheValueTypes) {
  const std::vector<Float16> h = {Float16(1.5f), Float16(-2.0f), Float16(65504.0f)};
  const Tensor t = from_vector(h, {3});
  EXPECT_EQ(t.dtype(), DType::Float16);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1.5f, -2.0f, 65504.0f}));
  const std::vector<BFloat16> b = t.to_vector<BFloat16>();  // through float: exact here
  EXPECT_EQ(b[0].bits, BFloat16(1.5f).bits);
  EXPECT_EQ(b[2].bits, BFloat16(65504.0f).bits);  // 65504 has 11 significant bits: bfloat16 rounds it to 65536
  EXPECT_EQ(static_cast<float>(b[2]), 65536.0f);
}

TEST(Half, PrintsAsPyTorchDoes) {
  // PyTorch: tensor([0.3333, 1.0000, 2.5000], dtype=torch.float16); ferry names dtypes without "torch."
  EXPECT_EQ(from_vector<float>({1.0f / 3.0f, 1.0f, 2.5f}).to(DType::Float16).str(),
            "tensor([0.3333, 1.0000, 2.5000], dtype=float16)");
  EXPECT_EQ(from_vector<float>({1.0f, 2.0f}).to(DType::BFloat16).str(), "tensor([1., 2.], dtype=bfloat16)");
}

TEST(Half, OpsAskForAConversionFirst) {
  const Tensor a = ones({2, 2}, {.dtype = DType::BFloat16});
  const auto refuses = [](const std::function<void()>& op, const std::string& dtype) {
    try {
      op();
      ADD_FAILURE() << "no error";
    } catch (const DTypeMismatch& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(dtype + " is a storage type"), std::string::npos) << message;
      EXPECT_NE(message.find("x.to(DType::Float32)"), std::string::npos) << message;
    }
  };
  refuses([&] { (void)matmul(a, a); }, "bfloat16");
  refuses([&] { (void)add(a, a); }, "bfloat16");
  refuses([&] { (void)exp(a.to(DType::Float16)); }, "float16");
  refuses([&] { (void)sum(a); }, "bfloat16");
  // A storage tensor with a float32 one promotes to float32, as PyTorch: the storage operand is converted first.
  const Tensor mixed = add(a, ones({2, 2}));
  EXPECT_EQ(mixed.dtype(), DType::Float32);
  EXPECT_EQ(mixed.to_vector<float>(), std::vector<float>(4, 2.0f));
}

TEST(Half, AModuleConvertedToThemSavesAndRunsAgainInFloat32) {
  manual_seed(5);
  nn::Linear layer(6, 3);
  const Tensor x = randn({4, 6});
  const Tensor weight = layer.weight.detach().clone();
  layer.to(DType::BFloat16);
  EXPECT_EQ(layer.weight.dtype(), DType::BFloat16);
  EXPECT_EQ(layer.parameter_count(), 21);
  try {
    (void)layer(x.to(DType::BFloat16));
    ADD_FAILURE() << "a bfloat16 Linear ran";
  } catch (const DTypeMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16 is a storage type"), std::string::npos) << e.what();
  }
  layer.to(DType::Float32);
  EXPECT_TRUE(testing::all_close(layer.weight, weight.to(DType::BFloat16).to(DType::Float32), 0, 0));
  EXPECT_EQ(layer(x).dtype(), DType::Float32);
}

TEST(Half, SafetensorsHoldThemAtTwoBytesAnElement) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "ferry_test_half";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "weights.safetensors").string();
  manual_seed(11);
  const Tensor w = randn({4, 5});
  write_tensors(path, {{"w.half", w.to(DType::Float16)}, {"w.bf16", w.to(DType::BFloat16)}, {"w", w}},
                {{"format", "pt"}});
  const SafetensorsFile raw = read_safetensors(path);
  ASSERT_EQ(raw.entries.size(), 3u);
  EXPECT_EQ(safetensors_dtype_name(raw.entries[0].dtype), "F16");
  EXPECT_EQ(safetensors_dtype_name(raw.entries[1].dtype), "BF16");
  EXPECT_EQ(raw.entries[0].bytes.size(), 40u);
  const nn::NamedTensors back = read_tensors(path);
  EXPECT_TRUE(testing::all_close(back[0].second, w.to(DType::Float16), 0, 0));
  EXPECT_TRUE(testing::all_close(back[1].second, w.to(DType::BFloat16), 0, 0));
  // A model's float32 parameter loads a bfloat16 checkpoint by conversion, as PyTorch's load_state_dict does.
  Tensor target = zeros({4, 5});
  target.copy_(back[1].second);
  EXPECT_TRUE(testing::all_close(target, w.to(DType::BFloat16).to(DType::Float32), 0, 0));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ferry
