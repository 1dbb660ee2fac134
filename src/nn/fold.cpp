// fold.cpp — functional::unfold and functional::fold (PyTorch's F.unfold / F.fold): the sliding blocks of an image
// as columns, and back, summing overlaps. They are the backend's im2col and col2im, which convolution runs on, with
// the batch taken as extra channels (one call for the whole batch); each is the other's gradient.
#include "../core/internal.h"
#include "checks.h"
#include "conv_grads.h"
#include "ferry/autograd.h"
#include "ferry/factories.h"
#include "ferry/nn/functional.h"

namespace ferry::nn {

namespace functional {

namespace {
// The im2col of `images` (N*C, H, W) planes with a kernel, stride, padding and dilation: conv2d's shape with one
// sample of N*C channels. Throws ShapeMismatch when no block fits.
Backend::Conv2dShape block_shape(const char* op, std::int64_t planes, std::int64_t height, std::int64_t width,
                                 Size2 kernel, Size2 dilation, Size2 padding, Size2 stride) {
  FERRY_CHECK(kernel.h > 0 && kernel.w > 0 && dilation.h > 0 && dilation.w > 0 && padding.h >= 0 && padding.w >= 0 &&
                  stride.h > 0 && stride.w > 0,
              InvalidArgument, op, ": expected kernel_size, dilation and stride > 0 and padding >= 0, got kernel (",
              kernel.h, ", ", kernel.w, "), dilation (", dilation.h, ", ", dilation.w, "), padding (", padding.h, ", ",
              padding.w, "), stride (", stride.h, ", ", stride.w, ")");
  const Backend::Conv2dShape s = conv2d_shape(1, planes, height, width, 1, kernel, stride, padding, dilation);
  FERRY_CHECK(s.out_h() >= 1 && s.out_w() >= 1, ShapeMismatch, op, ": no (", kernel.h, ", ", kernel.w,
              ") block with dilation (", dilation.h, ", ", dilation.w, ") fits in a (", height, ", ", width,
              ") image padded by (", padding.h, ", ", padding.w, ")");
  return s;
}

using ferry::detail::compute_stream;
using ferry::detail::kernel_view;

// columns (N, C kh kw, L) of images (N, C, H, W), both contiguous.
void im2col(const Tensor& columns, const Tensor& images, const Backend::Conv2dShape& s) {
  backend(images.device()).im2col(kernel_view(columns.view({-1, columns.size(2)})),
                                  kernel_view(images.view({s.in_channels, s.height, s.width})), s,
                                  compute_stream(images.device()));
}
// images (N, C, H, W) = the columns folded back, overlaps summed; both contiguous, images overwritten.
void col2im(const Tensor& images, const Tensor& columns, const Backend::Conv2dShape& s) {
  backend(images.device()).col2im(kernel_view(images.view({s.in_channels, s.height, s.width})),
                                  kernel_view(columns.view({-1, columns.size(2)})), s, compute_stream(images.device()));
}
}  // namespace

Tensor unfold(const Tensor& input, Size2 kernel_size, Size2 dilation, Size2 padding, Size2 stride) {
  check_floating("unfold", input);
  FERRY_CHECK(input.dim() == 3 || input.dim() == 4, ShapeMismatch, "unfold: expected a 3-d (C, H, W) or 4-d (N, C, "
              "H, W) input, got shape ", shape_str(input.shape()));
  if (input.dim() == 3) return unfold(input.unsqueeze(0), kernel_size, dilation, padding, stride).squeeze(0);
  const std::int64_t N = input.size(0), C = input.size(1);
  const Backend::Conv2dShape s =
      block_shape("unfold", N * C, input.size(2), input.size(3), kernel_size, dilation, padding, stride);
  const Tensor x = input.detach().contiguous();
  Tensor out = empty({N, C * kernel_size.h * kernel_size.w, s.out_h() * s.out_w()},
                     {.device = x.device(), .dtype = x.dtype()});
  if (out.numel() > 0) im2col(out, x, s);
  if (autograd::needs_grad({&input})) {
    autograd::record("unfold", {input}, out, [s, shape = x.shape()](const Tensor& grad) {
      Tensor gx = empty(shape, {.device = grad.device(), .dtype = grad.dtype()});
      if (gx.numel() > 0) col2im(gx, grad.contiguous(), s);
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

Tensor fold(const Tensor& input, Size2 output_size, Size2 kernel_size, Size2 dilation, Size2 padding, Size2 stride) {
  check_floating("fold", input);
  FERRY_CHECK(input.dim() == 2 || input.dim() == 3, ShapeMismatch, "fold: expected a 2-d (C kh kw, L) or 3-d (N, C "
              "kh kw, L) input, got shape ", shape_str(input.shape()));
  if (input.dim() == 2) {
    return fold(input.unsqueeze(0), output_size, kernel_size, dilation, padding, stride).squeeze(0);
  }
  const std::int64_t N = input.size(0), K = kernel_size.h * kernel_size.w;
  FERRY_CHECK(K > 0 && input.size(1) % K == 0, ShapeMismatch, "fold: expected size(1) of the input ",
              shape_str(input.shape()), " to be divisible by the product of kernel_size (", kernel_size.h, " x ",
              kernel_size.w, ")");
  FERRY_CHECK(output_size.h > 0 && output_size.w > 0, InvalidArgument, "fold: expected a positive output_size, got (",
              output_size.h, ", ", output_size.w, ")");
  const std::int64_t C = input.size(1) / K;
  const Backend::Conv2dShape s =
      block_shape("fold", N * C, output_size.h, output_size.w, kernel_size, dilation, padding, stride);
  FERRY_CHECK(input.size(2) == s.out_h() * s.out_w(), ShapeMismatch, "fold: expected ", s.out_h(), " x ", s.out_w(),
              " = ", s.out_h() * s.out_w(), " blocks for output_size (", output_size.h, ", ", output_size.w,
              "), got ", input.size(2), " (input ", shape_str(input.shape()), ")");
  const Tensor columns = input.detach().contiguous();
  Tensor out = empty({N, C, output_size.h, output_size.w}, {.device = columns.device(), .dtype = columns.dtype()});
  if (out.numel() > 0) col2im(out, columns, s);
  if (autograd::needs_grad({&input})) {
    autograd::record("fold", {input}, out, [s, shape = columns.shape()](const Tensor& grad) {
      Tensor gc = empty(shape, {.device = grad.device(), .dtype = grad.dtype()});
      if (gc.numel() > 0) im2col(gc, grad.contiguous(), s);
      return std::vector<Tensor>{gc};
    });
  }
  return out;
}

}  // namespace functional

}  // namespace ferry::nn
