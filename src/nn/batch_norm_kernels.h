// batch_norm_kernels.h — the per-channel passes BatchNorm is made of, over a contiguous input viewed as
// (N, C, inner): statistics, the affine apply, the backward's two sums and its apply. Each has a fused
// host version (cpu and sim: one OpenMP pass over host memory) and a composed version (tensor ops, any
// device). Not part of the public API; functional.cpp picks the version.
#pragma once

#include <cstdint>

#include "ferry/tensor.h"

namespace ferry::nn::detail {

struct ChannelView {
  std::int64_t batch = 0, channels = 0, inner = 0;  // (N, C, inner)
  std::int64_t count() const { return batch * inner; }  // elements per channel
};

// True when `device` computes BatchNorm with the fused host kernels (cpu and sim, unless switched off).
bool use_fused_host_kernels(Device device);

// mean (C) and biased variance (C) of x per channel, in x's dtype.
void channel_statistics(const Tensor& x, const ChannelView& view, Tensor& mean, Tensor& variance);
// out = x * scale[c] + shift[c]; scale and shift (C).
Tensor channel_affine(const Tensor& x, const ChannelView& view, const Tensor& scale, const Tensor& shift);
// sum_dy[c] = sum(dy), sum_dy_xmu[c] = sum(dy * (x - mean[c])).
void channel_backward_sums(const Tensor& dy, const Tensor& x, const Tensor& mean, const ChannelView& view,
                           Tensor& sum_dy, Tensor& sum_dy_xmu);
// out = dy * k[c] + x * a[c] + b[c].
Tensor channel_affine2(const Tensor& dy, const Tensor& x, const ChannelView& view, const Tensor& k, const Tensor& a,
                       const Tensor& b);

}  // namespace ferry::nn::detail
