// ferry/nn/pixel_shuffle.h — PixelShuffle and PixelUnshuffle (PyTorch's, Shi et al. 2016): rearranging r x r
// blocks of channels into space and back, the sub-pixel convolution's upsampling. A reshape, a permute and a
// reshape on the input's device (autograd through the views); no arithmetic, so every device gives the cpu's bits.
#pragma once

#include <cstdint>
#include <string>

#include "ferry/nn/module.h"
#include "ferry/tensor.h"

namespace ferry::nn::functional {

// (*, C r^2, H, W) -> (*, C, H r, W r): out[..., c, h r + i, w r + j] = in[..., c r^2 + i r + j, h, w].
Tensor pixel_shuffle(const Tensor& input, std::int64_t upscale_factor);
// The inverse: (*, C, H r, W r) -> (*, C r^2, H, W).
Tensor pixel_unshuffle(const Tensor& input, std::int64_t downscale_factor);

}  // namespace ferry::nn::functional

namespace ferry::nn {

class PixelShuffle : public Module {
 public:
  explicit PixelShuffle(std::int64_t upscale_factor);
  Tensor forward(const Tensor& input) override { return functional::pixel_shuffle(input, upscale_factor); }
  std::string type_name() const override { return "PixelShuffle"; }
  std::string extra_repr() const override { return "upscale_factor=" + std::to_string(upscale_factor); }

  std::int64_t upscale_factor;
};

class PixelUnshuffle : public Module {
 public:
  explicit PixelUnshuffle(std::int64_t downscale_factor);
  Tensor forward(const Tensor& input) override { return functional::pixel_unshuffle(input, downscale_factor); }
  std::string type_name() const override { return "PixelUnshuffle"; }
  std::string extra_repr() const override { return "downscale_factor=" + std::to_string(downscale_factor); }

  std::int64_t downscale_factor;
};

}  // namespace ferry::nn
