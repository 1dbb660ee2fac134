// ferry/half.h — the two 16-bit floating types, Float16 (IEEE 754 binary16, PyTorch's torch.half) and BFloat16
// (float32's top 16 bits, torch.bfloat16), as values: their bits, and exact conversions to and from float.
// In ferry they are storage types: tensors hold them, convert them, move them across the link and write them to
// checkpoints at 2 bytes an element; arithmetic runs in float32 (x.to(DType::Float32)). Not here: the DType
// enum (dtype.h) or the conversion kernels (every backend calls these functions).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FERRY_HALF_HOST_DEVICE __host__ __device__
#else
#define FERRY_HALF_HOST_DEVICE
#endif

namespace ferry {
namespace detail {

FERRY_HALF_HOST_DEVICE inline std::uint32_t float_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

FERRY_HALF_HOST_DEVICE inline float float_from_bits(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

// float -> binary16, rounded to nearest, ties to even (what PyTorch and the hardware's cvt do): 65520 and above
// become infinity, values under 2^-25 become (signed) zero, those between 2^-25 and 2^-14 subnormals. NaN stays a
// quiet NaN with its sign (0x7e00 | sign, as c10::Half writes it).
FERRY_HALF_HOST_DEVICE inline std::uint16_t float_to_half_bits(float value) {
  const std::uint32_t x = float_bits(value);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (magnitude >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65536 (and inf): inf
  if (magnitude < 0x38800000u) {  // below 2^-14, half's smallest normal: a subnormal of unit 2^-24, or zero
    if (magnitude <= 0x33000000u) return sign;  // <= 2^-25, half the smallest subnormal: the tie goes to 0 (even)
    const std::uint32_t exponent = magnitude >> 23;                      // 102..112
    const std::uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;  // 24 bits with the leading 1
    const std::uint32_t shift = 126u - exponent;                         // value = mantissa >> shift units, 14..24
    std::uint32_t result = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (result & 1u))) ++result;  // may carry into the smallest normal
    return static_cast<std::uint16_t>(sign | result);
  }
  // Normal: rebias the exponent (127 -> 15) and keep 10 of the 23 mantissa bits, rounding on the 13 dropped; a
  // carry out of the mantissa moves the exponent up (65504 .. 65520 rounds to 65504, 65520 itself to inf).
  std::uint32_t result = (magnitude >> 13) - (112u << 10);
  const std::uint32_t rest = magnitude & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (result & 1u))) ++result;
  return static_cast<std::uint16_t>(sign | result);
}

// binary16 -> float: exact (every binary16 value is a float). A NaN keeps its sign and payload and comes out
// quiet, as the hardware's conversion (F16C, the GPU's cvt) and PyTorch's give it.
FERRY_HALF_HOST_DEVICE inline float half_bits_to_float(std::uint16_t half) {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  std::uint32_t exponent = (half >> 10) & 0x1fu;
  std::uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1fu) {  // inf, or NaN (made quiet)
    return float_from_bits(sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x400000u : 0u));
  }
  if (exponent == 0) {
    if (mantissa == 0) return float_from_bits(sign);  // +-0
    exponent = 113;  // a subnormal, mantissa * 2^-24: shift until the leading 1 reaches bit 10
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    return float_from_bits(sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13));
  }
  return float_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// float -> bfloat16, rounded to nearest, ties to even, on the 16 dropped bits (values past bfloat16's largest
// finite, 3.39e38, become infinity). NaN becomes 0x7fc0, c10::BFloat16's one quiet NaN.
FERRY_HALF_HOST_DEVICE inline std::uint16_t float_to_bfloat16_bits(float value) {
  const std::uint32_t x = float_bits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

FERRY_HALF_HOST_DEVICE inline float bfloat16_bits_to_float(std::uint16_t bits) {
  return float_from_bits(static_cast<std::uint32_t>(bits) << 16);
}

}  // namespace detail

// One binary16 value: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits. Range +-65504, smallest normal
// 2^-14 (6.1e-5), 11 significant bits (3.3 decimal digits).
struct Float16 {
  std::uint16_t bits;  // the raw pattern, as it lies in memory and in a safetensors "F16" tensor

  Float16() = default;
  FERRY_HALF_HOST_DEVICE explicit Float16(float value) : bits(detail::float_to_half_bits(value)) {}
  FERRY_HALF_HOST_DEVICE explicit operator float() const { return detail::half_bits_to_float(bits); }
  FERRY_HALF_HOST_DEVICE static Float16 from_bits(std::uint16_t raw) {
    Float16 h;
    h.bits = raw;
    return h;
  }
};

// One bfloat16 value: float32's sign, its 8 exponent bits (float32's range, to 3.39e38) and 7 mantissa bits
// (8 significant bits, 2.4 decimal digits).
struct BFloat16 {
  std::uint16_t bits;  // the raw pattern ("BF16" in safetensors)

  BFloat16() = default;
  FERRY_HALF_HOST_DEVICE explicit BFloat16(float value) : bits(detail::float_to_bfloat16_bits(value)) {}
  FERRY_HALF_HOST_DEVICE explicit operator float() const { return detail::bfloat16_bits_to_float(bits); }
  FERRY_HALF_HOST_DEVICE static BFloat16 from_bits(std::uint16_t raw) {
    BFloat16 h;
    h.bits = raw;
    return h;
  }
};

static_assert(sizeof(Float16) == 2 && sizeof(BFloat16) == 2, "16-bit types hold their bits and nothing else");

}  // namespace ferry

#undef FERRY_HALF_HOST_DEVICE
