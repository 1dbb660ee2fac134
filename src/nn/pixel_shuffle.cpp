// pixel_shuffle.cpp — pixel_shuffle / pixel_unshuffle as reshape, permute, reshape (the permuted view is copied
// once by the last reshape); their gradients are the same rearrangement backwards, through autograd's view ops.
#include "ferry/nn/pixel_shuffle.h"

#include <numeric>
#include <vector>

#include "ferry/error.h"

namespace ferry::nn::functional {
namespace {

void check_factor(const char* op, const char* what, std::int64_t factor) {
  FERRY_CHECK(factor > 0, InvalidArgument, op, ": ", what, " must be positive, got ", factor);
}

// The permutation that leaves the `leading` (batch) dims in place and then orders the last five
// dims as `tail` (indices 0..4 relative to the first of them).
std::vector<int> keep_leading_then(int leading, std::initializer_list<int> tail) {
  std::vector<int> order(static_cast<std::size_t>(leading));
  std::iota(order.begin(), order.end(), 0);
  for (int t : tail) order.push_back(leading + t);
  return order;
}

}  // namespace

Tensor pixel_shuffle(const Tensor& input, std::int64_t r) {
  check_factor("pixel_shuffle", "upscale_factor", r);
  FERRY_CHECK(input.dim() >= 3, ShapeMismatch, "pixel_shuffle: expected an input of at least 3 dims (*, C, H, W), got ",
              shape_str(input.shape()));
  const std::int64_t channels = input.size(-3), h = input.size(-2), w = input.size(-1);
  FERRY_CHECK(channels % (r * r) == 0, ShapeMismatch, "pixel_shuffle: the channels (", channels,
              ") must divide by upscale_factor^2 = ", r * r, "; input ", shape_str(input.shape()));
  const int leading = input.dim() - 3;
  Shape split(input.shape().begin(), input.shape().begin() + leading);
  Shape out = split;
  split.insert(split.end(), {channels / (r * r), r, r, h, w});  // (*, C, i, j, H, W)
  out.insert(out.end(), {channels / (r * r), h * r, w * r});
  return input.reshape(split).permute(keep_leading_then(leading, {0, 3, 1, 4, 2})).reshape(out);  // (*, C, H, i, W, j)
}

Tensor pixel_unshuffle(const Tensor& input, std::int64_t r) {
  check_factor("pixel_unshuffle", "downscale_factor", r);
  FERRY_CHECK(input.dim() >= 3, ShapeMismatch,
              "pixel_unshuffle: expected an input of at least 3 dims (*, C, H, W), got ", shape_str(input.shape()));
  const std::int64_t channels = input.size(-3), h = input.size(-2), w = input.size(-1);
  FERRY_CHECK(h % r == 0 && w % r == 0, ShapeMismatch, "pixel_unshuffle: the height (", h, ") and width (", w,
              ") must divide by downscale_factor = ", r, "; input ", shape_str(input.shape()));
  const int leading = input.dim() - 3;
  Shape split(input.shape().begin(), input.shape().begin() + leading);
  Shape out = split;
  split.insert(split.end(), {channels, h / r, r, w / r, r});  // (*, C, H, i, W, j)
  out.insert(out.end(), {channels * r * r, h / r, w / r});
  return input.reshape(split).permute(keep_leading_then(leading, {0, 2, 4, 1, 3})).reshape(out);  // (*, C, i, j, H, W)
}

}  // namespace ferry::nn::functional

namespace ferry::nn {

PixelShuffle::PixelShuffle(std::int64_t upscale_factor) : upscale_factor(upscale_factor) {
  FERRY_CHECK(upscale_factor > 0, InvalidArgument, "PixelShuffle: upscale_factor must be positive, got ",
              upscale_factor);
}

PixelUnshuffle::PixelUnshuffle(std::int64_t downscale_factor) : downscale_factor(downscale_factor) {
  FERRY_CHECK(downscale_factor > 0, InvalidArgument, "PixelUnshuffle: downscale_factor must be positive, got ",
              downscale_factor);
}

}  // namespace ferry::nn
