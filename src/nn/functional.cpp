// functional.cpp — the nn layers as functions over any device: linear and conv2d (GEMMs through the
// backend; conv via im2col/col2im, or the device's library: cuDNN), batch_norm (per-channel passes, or
// cuDNN in training), pooling, dropout. Each records one autograd node with a
// hand-written backward. Not here: the losses (loss.cpp), BatchNorm's per-channel passes (batch_norm_kernels.cpp).
#include "checks.h"
#include "ferry/nn/functional.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cmath>

#include "../core/environment.h"
#include "../core/internal.h"
#include "../cpu/onednn_conv.h"
#include "../cpu/onednn_info.h"
#include "batch_norm_kernels.h"
#include "conv_grads.h"
#include "host_conv.h"
#include "ferry/autograd.h"
#include "ferry/backend.h"
#include "ferry/factories.h"
#include "ferry/ops.h"

namespace ferry::nn::functional {

using autograd::needs_grad;
using autograd::record;
using Grads = std::vector<Tensor>;

namespace {

KernelTensor kernel(const Tensor& t) { return ferry::detail::kernel_view(t); }
KernelTensor kernel_or_null(const Tensor& t) { return ferry::detail::kernel_view_or_null(t); }  // undefined: null
Stream stream_of(Device device) { return ferry::detail::compute_stream(device); }


void check_same_dtype(const char* op, const Tensor& input, std::initializer_list<std::pair<const Tensor*, const char*>> others) {
  for (const auto& [t, what] : others) {
    if (!t->defined()) continue;
    FERRY_CHECK(t->dtype() == input.dtype(), DTypeMismatch, op, ": expected ", what, " to have the input's dtype ",
                dtype_name(input.dtype()), ", got ", dtype_name(t->dtype()));
  }
}

// Row-major C = alpha op(A) op(B) + beta C, `batch` times with element strides between the matrices.
struct Gemm {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  const Tensor* a = nullptr;
  std::int64_t a_offset = 0, lda = 0, stride_a = 0;
  const Tensor* b = nullptr;
  std::int64_t b_offset = 0, ldb = 0, stride_b = 0;
  const Tensor* c = nullptr;
  std::int64_t c_offset = 0, ldc = 0, stride_c = 0;
  std::int64_t batch = 1;
  float beta = 0;
};

void run_gemm(const Gemm& g) {
  const Tensor& c = *g.c;
  const std::size_t es = c.element_size();
  Backend::GemmArgs args;
  args.trans_a = g.trans_a;
  args.trans_b = g.trans_b;
  args.m = g.m;
  args.n = g.n;
  args.k = g.k;
  args.alpha = 1;
  args.beta = g.beta;
  args.a = static_cast<const char*>(g.a->data_ptr()) + g.a_offset * static_cast<std::int64_t>(es);
  args.lda = g.lda;
  args.stride_a = g.stride_a;
  args.b = static_cast<const char*>(g.b->data_ptr()) + g.b_offset * static_cast<std::int64_t>(es);
  args.ldb = g.ldb;
  args.stride_b = g.stride_b;
  args.c = static_cast<char*>(c.data_ptr()) + g.c_offset * static_cast<std::int64_t>(es);
  args.ldc = g.ldc;
  args.stride_c = g.stride_c;
  args.batch = g.batch;
  args.dtype = c.dtype();
  backend(c.device()).gemm(args, stream_of(c.device()));
}

// out (shape) = broadcast of `vector` (C) along dim 1 of `shape` (N, C, rest...) — for bias init.
// grad * (out > 0): the gradient through a ReLU whose output is `out` (contiguous, as many elements), shaped as
// `grad`. When the gradient autograd hands the node is held by nothing else (no other tensor or view shares its
// memory), it is masked in place: the incoming and the masked gradient then never live side by side, which
// keeps a fused layer's backward peak at the unfused one's.
Tensor relu_backward(const Tensor& grad, const Tensor& out) {
  const Tensor mask = out.view(grad.shape());
  const bool alone = grad.is_contiguous() && grad.impl_ptr().use_count() == 1 && grad.impl()->storage.use_count() == 1;
  const Tensor g = alone ? grad : empty(grad.shape(), {.device = grad.device(), .dtype = grad.dtype()});
  backend(grad.device()).binary(BinaryOp::ReluBackward, kernel(g), kernel(grad), kernel(mask),
                                stream_of(grad.device()));
  return g;
}

// relu(t) in place on a tensor the caller has just made (no autograd: the caller's node covers it).
void relu_in_place(const Tensor& t) {
  if (t.numel() > 0) backend(t.device()).unary(UnaryOp::Relu, kernel(t), kernel(t), stream_of(t.device()));
}

void fill_with_channel_vector(const Tensor& out, const Tensor& vector) {
  Shape per_channel(out.dim(), 1);
  per_channel[1] = vector.numel();
  backend(out.device()).unary(UnaryOp::Copy, kernel(out),
                              ferry::detail::kernel_broadcast(vector.reshape(per_channel), out.shape()),
                              stream_of(out.device()));
}

// Sum of a contiguous tensor over (outer, reduce, inner) -> (outer, inner), through the backend.
Tensor reduce_sum(const Tensor& in, std::int64_t outer, std::int64_t reduce, std::int64_t inner) {
  Tensor out = empty(inner == 1 ? Shape{outer} : Shape{outer, inner}, {.device = in.device(), .dtype = in.dtype()});
  backend(in.device()).reduce(ReduceOp::Sum, kernel(out), kernel(in), outer, reduce, inner, stream_of(in.device()));
  return out;
}

}  // namespace

// --- linear -------------------------------------------------------------------------------------

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias, Activation activation) {
  check_same_device("linear", {&input, &weight, &bias});
  check_floating("linear", input, "input");
  check_same_dtype("linear", input, {{&weight, "weight"}, {&bias, "bias"}});
  FERRY_CHECK(weight.dim() == 2, ShapeMismatch, "linear: expected weight (out_features, in_features), got shape ",
              shape_str(weight.shape()));
  const std::int64_t out_features = weight.size(0), in_features = weight.size(1);
  FERRY_CHECK(input.dim() >= 1 && input.size(-1) == in_features, ShapeMismatch,
              "mat1 and mat2 shapes cannot be multiplied (", input.dim() >= 1 ? input.numel() / std::max<std::int64_t>(input.size(-1), 1) : 0,
              "x", input.dim() >= 1 ? input.size(-1) : 0, " and ", in_features, "x", out_features,
              ") (in linear: input ", shape_str(input.shape()), ", weight ", shape_str(weight.shape()), ")");
  FERRY_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == out_features), ShapeMismatch,
              "linear: expected bias (", out_features, "), got shape ", shape_str(bias.shape()));

  std::int64_t rows = 1;  // the leading dims' product (not numel / in_features: in_features may be 0)
  for (int d = 0; d + 1 < input.dim(); ++d) rows *= input.size(d);
  const Tensor x = input.detach().contiguous().reshape({rows, in_features});  // (rows, in)
  const Tensor w = weight.detach().contiguous();                               // (out, in)
  Tensor out = empty({rows, out_features}, {.device = input.device(), .dtype = input.dtype()});  // (rows, out)
  const bool relu = activation == Activation::ReLU;
  // With a fused ReLU the bias is added after the GEMM, in the ReLU's pass; else before it (GEMM with beta = 1).
  const bool bias_after = relu && bias.defined() && in_features > 0;
  if (bias.defined() && out.numel() > 0 && !bias_after) fill_with_channel_vector(out, bias.detach());
  if (out.numel() > 0) {
    if (in_features == 0) {
      if (!bias.defined()) out.fill_(0);
    } else {
      run_gemm({.trans_a = false, .trans_b = true, .m = rows, .n = out_features, .k = in_features,
                .a = &x, .lda = in_features, .b = &w, .ldb = in_features, .c = &out, .ldc = out_features,
                .beta = bias.defined() && !bias_after ? 1.0f : 0.0f});
    }
    if (bias_after) {  // out = relu(out + bias), in place
      const KernelTensor rows_of_bias =  // (rows, out), stride 0 over the rows
          ferry::detail::kernel_broadcast(bias.detach().reshape({1, out_features}), out.shape());
      backend(out.device()).binary(BinaryOp::AddRelu, kernel(out), kernel(out), rows_of_bias, stream_of(out.device()));
    } else if (relu) {
      backend(out.device()).unary(UnaryOp::Relu, kernel(out), kernel(out), stream_of(out.device()));
    }
  }
  const Tensor relu_out = relu ? out.detach() : Tensor();  // (rows, out): the backward's mask
  Shape out_shape = input.shape();
  out_shape.back() = out_features;
  out = out.view(out_shape);

  if (needs_grad({&input, &weight, &bias})) {
    const bool want_x = input.requires_grad(), want_w = weight.requires_grad(), want_b = bias.requires_grad();
    record(relu ? "linear_relu" : "linear", {input, weight, bias}, out,
           [x, w, rows, in_features, out_features, want_x, want_w, want_b, in_shape = input.shape(),
            relu_out](const Tensor& grad) {
             // (rows, out); through the fused ReLU first (before anything else holds `grad`)
             const Tensor through = relu_out.defined() ? relu_backward(grad, relu_out) : grad;
             const Tensor g = through.contiguous().reshape({rows, out_features});
             Tensor gx, gw, gb;
             if (want_x) {  // (rows, in) = g (rows, out) @ w (out, in)
               gx = empty({rows, in_features}, {.device = g.device(), .dtype = g.dtype()});
               if (out_features == 0) gx.fill_(0);
               else if (gx.numel() > 0)
                 run_gemm({.m = rows, .n = in_features, .k = out_features, .a = &g, .lda = out_features, .b = &w,
                           .ldb = in_features, .c = &gx, .ldc = in_features});
               gx = gx.view(in_shape);
             }
             if (want_w) {  // (out, in) = g^T (out, rows) @ x (rows, in)
               gw = empty({out_features, in_features}, {.device = g.device(), .dtype = g.dtype()});
               if (rows == 0) gw.fill_(0);
               else if (gw.numel() > 0)
                 run_gemm({.trans_a = true, .m = out_features, .n = in_features, .k = rows, .a = &g,
                           .lda = out_features, .b = &x, .ldb = in_features, .c = &gw, .ldc = in_features});
             }
             if (want_b) gb = reduce_sum(g, 1, rows, out_features).view({out_features});
             return Grads{gx, gw, gb};
           }, autograd::Saved::InputsAndOutput, /*inputs_read=*/2);  // not the bias
  }
  return out;
}

// --- conv2d -------------------------------------------------------------------------------------

namespace {
constexpr std::int64_t kColumnsChunkBytes = std::int64_t{4} << 20;  // im2col buffer per chunk of samples

std::int64_t samples_per_chunk(const Backend::Conv2dShape& s, std::size_t element_size) {
  const std::int64_t per_sample = s.in_channels * s.kernel_h * s.kernel_w * s.out_h() * s.out_w() *
                                  static_cast<std::int64_t>(element_size);
  return std::clamp<std::int64_t>(kColumnsChunkBytes / std::max<std::int64_t>(per_sample, 1), 1, std::max<std::int64_t>(s.batch, 1));
}

bool is_pointwise(const Backend::Conv2dShape& s) {
  return s.kernel_h == 1 && s.kernel_w == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 && s.pad_w == 0;
}

// The columns (b*K, L) of samples [first, first + b) of x (N, C, H, W): one im2col call that treats the
// chunk as one image of b*C channels (its rows are the samples' (K, L) blocks, stacked).
void chunk_columns(const Tensor& columns, const Tensor& x, const Backend::Conv2dShape& s, std::int64_t first,
                   std::int64_t b) {
  Backend::Conv2dShape cs = s;
  cs.batch = 1;
  cs.in_channels = b * s.in_channels;
  const Tensor image = x.narrow(0, first, b).view({b * s.in_channels, s.height, s.width});
  const std::int64_t rows = b * s.in_channels * s.kernel_h * s.kernel_w;
  const Tensor cols = columns.narrow(0, 0, rows);
  backend(x.device()).im2col(kernel(cols), kernel(image), cs, stream_of(x.device()));
}
}  // namespace

void conv2d_grads(const Tensor& g, const Tensor& x, const Tensor& w, const Backend::Conv2dShape& s, bool library,
                  Tensor* grad_input, Tensor* grad_weight, const Tensor& kept_columns) {
  const std::int64_t N = s.batch, C = s.in_channels, O = s.out_channels;
  const std::int64_t K = C * s.kernel_h * s.kernel_w, L = s.out_h() * s.out_w();
  const TensorOptions like{.device = g.device(), .dtype = g.dtype()};
  if (grad_weight) *grad_weight = empty({O, C, s.kernel_h, s.kernel_w}, like);  // (O, K); the first GEMM has beta 0
  if (grad_input) *grad_input = empty({N, C, s.height, s.width}, like);
  if (N == 0 || K == 0 || L == 0 || O == 0) {  // an empty batch or image: nothing adds to any gradient
    if (grad_input) grad_input->fill_(0);
    if (grad_weight) grad_weight->fill_(0);
    return;
  }
  if (library) {  // cuDNN on cuda, oneDNN on cpu and sim: one call per gradient
    Backend& be = backend(g.device());
    try {
      if (grad_weight) be.conv2d_backward_weight(kernel(*grad_weight), kernel(g), kernel(x), s, stream_of(g.device()));
      if (grad_input) be.conv2d_backward_input(kernel(*grad_input), kernel(g), kernel(w), s, stream_of(g.device()));
      return;
    } catch (const BackendError&) {  // refused before it ran (as in forward): composed below
      if (be.conv2d_library(s, g.dtype(), g.device().index)) throw;
    }
  }
  if (detail::use_host_conv(g.device(), s)) {
    detail::host_conv2d_backward(g, x, w, s, grad_input, grad_weight, kept_columns);
    return;
  }
  if (is_pointwise(s)) {
    if (grad_weight) {  // gw (O, C) += g[n] (O, L) @ x[n]^T (L, C), sample by sample (in order: any device)
      for (std::int64_t n = 0; n < N; ++n)
        run_gemm({.trans_b = true, .m = O, .n = K, .k = L, .a = &g, .a_offset = n * O * L, .lda = L, .b = &x,
                  .b_offset = n * C * L, .ldb = L, .c = grad_weight, .ldc = K, .beta = n ? 1.0f : 0.0f});
    }
    if (grad_input) {  // gx[n] (C, L) = w^T (C, O) @ g[n] (O, L)
      run_gemm({.trans_a = true, .m = K, .n = L, .k = O, .a = &w, .lda = K, .b = &g, .ldb = L, .stride_b = O * L,
                .c = grad_input, .ldc = L, .stride_c = C * L, .batch = N});
    }
    return;
  }
  const std::int64_t chunk = samples_per_chunk(s, g.element_size());
  const Tensor columns = empty({chunk * K, L}, like);  // (chunk * K, L), reused
  for (std::int64_t first = 0; first < N; first += chunk) {
    const std::int64_t b = std::min(chunk, N - first);
    if (grad_weight) {
      chunk_columns(columns, x, s, first, b);
      for (std::int64_t j = 0; j < b; ++j) {  // gw (O, K) += g[n] (O, L) @ columns[n]^T (L, K)
        const std::int64_t n = first + j;
        run_gemm({.trans_b = true, .m = O, .n = K, .k = L, .a = &g, .a_offset = n * O * L, .lda = L, .b = &columns,
                  .b_offset = j * K * L, .ldb = L, .c = grad_weight, .ldc = K, .beta = n ? 1.0f : 0.0f});
      }
    }
    if (grad_input) {  // columns[n] (K, L) = w^T (K, O) @ g[n] (O, L); then col2im into gx[n]
      run_gemm({.trans_a = true, .m = K, .n = L, .k = O, .a = &w, .lda = K, .b = &g, .b_offset = first * O * L,
                .ldb = L, .stride_b = O * L, .c = &columns, .ldc = L, .stride_c = K * L, .batch = b});
      Backend::Conv2dShape cs = s;
      cs.batch = 1;
      cs.in_channels = b * C;
      const Tensor image = grad_input->narrow(0, first, b).view({b * C, s.height, s.width});
      backend(g.device()).col2im(kernel(image), kernel(columns.narrow(0, 0, b * K)), cs, stream_of(g.device()));
    }
  }
}

Tensor conv2d(const Tensor& input_in, const Tensor& weight, const Tensor& bias, Size2 stride, Size2 padding,
              Size2 dilation, std::int64_t groups) {
  check_same_device("conv2d", {&input_in, &weight, &bias});
  check_floating("conv2d", input_in, "input");
  check_same_dtype("conv2d", input_in, {{&weight, "weight"}, {&bias, "bias"}});
  FERRY_CHECK(input_in.dim() == 3 || input_in.dim() == 4, ShapeMismatch,
              "conv2d: expected a 3-d (C, H, W) or 4-d (N, C, H, W) input, got shape ", shape_str(input_in.shape()));
  if (input_in.dim() == 3) {
    return conv2d(input_in.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0);
  }
  const Tensor& input = input_in;
  if (groups != 1) {
    FERRY_CHECK(weight.dim() == 4, ShapeMismatch, "conv2d: expected weight (out_channels, in_channels / groups, kh, "
                "kw), got shape ", shape_str(weight.shape()));
    FERRY_CHECK(groups >= 1 && weight.size(0) % groups == 0, InvalidArgument, "conv2d: groups=", groups,
                " must be positive and divide the weight's ", weight.size(0), " output channels");
    const std::int64_t in_per_group = weight.size(1), out_per_group = weight.size(0) / groups;
    FERRY_CHECK(input.size(1) == in_per_group * groups, ShapeMismatch, "conv2d: expected input ",
                shape_str(input.shape()), " to have ", in_per_group * groups, " channels (weight ",
                shape_str(weight.shape()), ", groups=", groups, "), but got ", input.size(1), " channels instead");
    std::vector<Tensor> outputs;
    for (std::int64_t g = 0; g < groups; ++g) {
      outputs.push_back(conv2d(input.narrow(1, g * in_per_group, in_per_group),
                               weight.narrow(0, g * out_per_group, out_per_group),
                               bias.defined() ? bias.narrow(0, g * out_per_group, out_per_group) : Tensor(), stride,
                               padding, dilation, 1));
    }
    return cat(outputs, 1);
  }
  FERRY_CHECK(weight.dim() == 4, ShapeMismatch, "conv2d: expected weight (out_channels, in_channels, kh, kw), got shape ",
              shape_str(weight.shape()));
  FERRY_CHECK(weight.size(1) == input.size(1), ShapeMismatch, "conv2d: expected input ", shape_str(input.shape()),
              " to have ", weight.size(1), " channels (weight ", shape_str(weight.shape()), "), but got ",
              input.size(1), " channels instead");
  FERRY_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), ShapeMismatch,
              "conv2d: expected bias (", weight.size(0), "), got shape ", shape_str(bias.shape()));
  FERRY_CHECK(stride.h >= 1 && stride.w >= 1 && padding.h >= 0 && padding.w >= 0 && dilation.h >= 1 && dilation.w >= 1,
              InvalidArgument, "conv2d: expected stride >= 1, padding >= 0, dilation >= 1, got stride (", stride.h, ", ",
              stride.w, "), padding (", padding.h, ", ", padding.w, "), dilation (", dilation.h, ", ", dilation.w, ")");

  const Backend::Conv2dShape s = conv2d_shape(input.size(0), input.size(1), input.size(2), input.size(3),
                                              weight.size(0), Size2(weight.size(2), weight.size(3)), stride, padding,
                                              dilation);
  const std::int64_t out_h = s.out_h(), out_w = s.out_w();
  FERRY_CHECK(out_h >= 1 && out_w >= 1, ShapeMismatch, "conv2d: calculated output size (", out_h, " x ", out_w,
              ") is too small for input ", shape_str(input.shape()), " and kernel (", s.kernel_h, " x ", s.kernel_w,
              ") with padding (", s.pad_h, ", ", s.pad_w, ") and dilation (", s.dilation_h, ", ", s.dilation_w, ")");

  const std::int64_t N = s.batch, C = s.in_channels, O = s.out_channels;
  const std::int64_t K = C * s.kernel_h * s.kernel_w, L = out_h * out_w;
  const Tensor x = input.detach().contiguous();   // (N, C, H, W)
  const Tensor w = weight.detach().contiguous();  // (O, C, kh, kw) = (O, K)
  const TensorOptions like{.device = x.device(), .dtype = x.dtype()};
  Tensor out = empty({N, O, out_h, out_w}, like);  // (N, O, oh, ow) = (N, O, L)
  // One library call where the device has one for the shape: oneDNN on the cpu and sim (float32, a build with
  // it), cuDNN on cuda. Else, on host memory, the host path (samples over threads, im2col + GEMM each); else
  // im2col + GEMM through the backend.
  bool library = K > 0 && out.numel() > 0 && library_layers() &&
                 backend(x.device()).conv2d_library(s, x.dtype(), x.device().index);
  const bool host = !library && K > 0 && detail::use_host_conv(x.device(), s);
  if (bias.defined() && !host && !library && out.numel() > 0) fill_with_channel_vector(out, bias.detach());
  const float beta = bias.defined() ? 1.0f : 0.0f;
  const bool pointwise = is_pointwise(s);
  const std::int64_t chunk = samples_per_chunk(s, x.element_size());

  // Training on the host path keeps each sample's columns for the weight gradient (N * K * L elements, e.g.
  // 29 MB for the fmnist CNN's second conv at batch 128) instead of running im2col again in backward; up to
  // kMaxKeptColumnsBytes per layer (a 224x224 layer would keep gigabytes: it recomputes instead).
  constexpr std::int64_t kMaxKeptColumnsBytes = std::int64_t{256} << 20;
  Tensor kept_columns;
  if (host && !pointwise && out.numel() > 0 && weight.requires_grad() && needs_grad({&input, &weight, &bias}) &&
      N * K * L * static_cast<std::int64_t>(x.element_size()) <= kMaxKeptColumnsBytes)
    kept_columns = empty({N, K * L}, like);
  if (out.numel() > 0 && K > 0) {
    if (library) {  // out (N, O, oh, ow) = conv(x, w) + bias
      const Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
      try {
        backend(x.device()).conv2d_forward(kernel(out), kernel(x), kernel(w), kernel_or_null(b), s,
                                           stream_of(x.device()));
      } catch (const BackendError&) {
        // The library refused the call before running it and now says so for this shape: composed below, in
        // this direction and in backward. Any other failure is the caller's to see.
        if (backend(x.device()).conv2d_library(s, x.dtype(), x.device().index)) throw;
        library = false;
        if (bias.defined()) fill_with_channel_vector(out, bias.detach());
      }
    } else if (host) {
      detail::host_conv2d_forward(x, w, bias.defined() ? bias.detach().contiguous() : Tensor(), out, s, kept_columns);
    }
    if (host || library) {
      // done above
    } else if (pointwise) {  // the columns are the image itself: out[n] (O, L) = w (O, C) @ x[n] (C, L)
      run_gemm({.m = O, .n = L, .k = K, .a = &w, .lda = K, .b = &x, .ldb = L, .stride_b = C * L, .c = &out,
                .ldc = L, .stride_c = O * L, .batch = N, .beta = beta});
    } else {
      const Tensor columns = empty({chunk * K, L}, like);  // (chunk * K, L)
      for (std::int64_t first = 0; first < N; first += chunk) {
        const std::int64_t b = std::min(chunk, N - first);
        chunk_columns(columns, x, s, first, b);
        // out[n] (O, L) = w (O, K) @ columns[n] (K, L), for the b samples of the chunk
        run_gemm({.m = O, .n = L, .k = K, .a = &w, .lda = K, .b = &columns, .ldb = L, .stride_b = K * L,
                  .c = &out, .c_offset = first * O * L, .ldc = L, .stride_c = O * L, .batch = b, .beta = beta});
      }
    }
  } else if (out.numel() > 0 && !bias.defined()) {
    out.fill_(0);
  }

  if (needs_grad({&input, &weight, &bias})) {
    const bool want_x = input.requires_grad(), want_w = weight.requires_grad(), want_b = bias.requires_grad();
    record("conv2d", {input, weight, bias}, out,
           [x, w, s, L, library, want_x, want_w, want_b, kept_columns](const Tensor& grad) {
             const Tensor g = grad.contiguous();  // (N, O, oh, ow) = (N, O, L)
             const std::int64_t N = s.batch, O = s.out_channels;
             Tensor gx, gw, gb;
             if (want_b) gb = reduce_sum(reduce_sum(g, N * O, L, 1), 1, N, O).view({O});
             conv2d_grads(g, x, w, s, library, want_x ? &gx : nullptr, want_w ? &gw : nullptr, kept_columns);
             return Grads{gx, gw, gb};
           }, autograd::Saved::Inputs, /*inputs_read=*/2);  // not the bias
  }
  return out;
}

// --- batch_norm ---------------------------------------------------------------------------------

namespace {
// FERRY_LIBRARY_LAYERS=0 composes convolution and BatchNorm from ferry's kernels for a whole run (a switch,
// ../core/environment.h; read on first use, so that a value it refuses is an error a caller can catch).
std::atomic<bool>& library_layers_flag() {
  static std::atomic<bool> enabled{ferry::detail::environment_switch("FERRY_LIBRARY_LAYERS", true)};
  return enabled;
}

// Training-mode BatchNorm as one library call forward and one backward (cuDNN on cuda), or, with a ReLU
// (shape.relu), as ferry's fused BatchNorm + ReLU kernels (cuda and sim). x is the contiguous input (N, C, *);
// running statistics (when defined) are updated in place with `factor`.
Tensor batch_norm_library(const Tensor& input, const Tensor& x, const Backend::BatchNormShape& shape,
                          const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                          const Tensor& bias, double factor) {
  const TensorOptions like{.device = x.device(), .dtype = x.dtype()};
  const std::int64_t C = shape.channels;
  const Tensor w = weight.defined() ? weight.detach().contiguous() : ones({C}, like);   // (C)
  const Tensor b = bias.defined() ? bias.detach().contiguous() : zeros({C}, like);      // (C)
  Tensor out = empty(x.shape(), like);                                                  // (N, C, *)
  Tensor save_mean = empty({C}, like), save_invstd = empty({C}, like);                  // (C)
  backend(x.device()).batch_norm_forward(kernel(out), kernel(x), kernel(w), kernel(b), kernel_or_null(running_mean),
                                         kernel_or_null(running_var), kernel(save_mean), kernel(save_invstd), shape,
                                         factor, stream_of(x.device()));
  const Tensor relu_out = shape.relu ? out.detach() : Tensor();  // (N, C, *): the backward's ReLU mask
  out = out.reshape(input.shape());
  if (needs_grad({&input, &weight, &bias})) {
    const bool want_x = input.requires_grad(), want_w = weight.requires_grad(), want_b = bias.requires_grad();
    record(shape.relu ? "batch_norm_relu" : "batch_norm", {input, weight, bias}, out,
           [x, w, save_mean, save_invstd, shape, want_x, want_w, want_b, relu_out](const Tensor& grad) {
             const Tensor g = grad.contiguous().reshape(x.shape());
             const TensorOptions like{.device = g.device(), .dtype = g.dtype()};
             Tensor gx = empty(x.shape(), like), gw = empty({shape.channels}, like), gb = empty({shape.channels}, like);
             backend(g.device()).batch_norm_backward(kernel(gx), kernel(gw), kernel(gb), kernel(g), kernel(x),
                                                     kernel_or_null(relu_out), kernel(w), kernel(save_mean),
                                                     kernel(save_invstd), shape, stream_of(g.device()));
             return Grads{want_x ? gx : Tensor(), want_w ? gw : Tensor(), want_b ? gb : Tensor()};
           }, autograd::Saved::InputsAndOutput, /*inputs_read=*/2);  // not the bias
  }
  return out;
}
}  // namespace

namespace {
// FERRY_FUSED_ACTIVATIONS=0 switches the fusion off for a whole run (to measure what it buys); a switch, read on
// first use, as FERRY_LIBRARY_LAYERS is.
std::atomic<bool>& fused_activations_flag() {
  static std::atomic<bool> enabled{ferry::detail::environment_switch("FERRY_FUSED_ACTIVATIONS", true)};
  return enabled;
}
}  // namespace
void set_fused_activations(bool enabled) { fused_activations_flag() = enabled; }
bool fused_activations() { return fused_activations_flag(); }

void set_library_layers(bool enabled) { library_layers_flag() = enabled; }
bool library_layers() { return library_layers_flag(); }

void set_onednn(bool enabled) { cpu::set_onednn_enabled(enabled); }
bool onednn() { return cpu::onednn_enabled(); }
std::string onednn_version() { return cpu::onednn_description(); }

namespace {
// batch_norm's argument checks (shared with batch_norm_relu_max_pool2d); returns the input as (N, C, inner).
detail::ChannelView checked_batch_norm_view(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                                            const Tensor& weight, const Tensor& bias, bool training,
                                            const Tensor& num_batches_tracked) {
  check_same_device("batch_norm", {&input, &running_mean, &running_var, &weight, &bias, &num_batches_tracked});
  check_floating("batch_norm", input, "input");
  check_same_dtype("batch_norm", input, {{&weight, "weight"}, {&bias, "bias"}});
  FERRY_CHECK(input.dim() >= 2, ShapeMismatch, "batch_norm: expected an input (N, C, *) of at least 2 dims, got shape ",
              shape_str(input.shape()));
  detail::ChannelView view;
  view.batch = input.size(0);
  view.channels = input.size(1);
  view.inner = 1;
  for (int d = 2; d < input.dim(); ++d) view.inner *= input.size(d);
  for (const auto& [t, what] : {std::pair{&running_mean, "running_mean"}, std::pair{&running_var, "running_var"},
                                std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    FERRY_CHECK(!t->defined() || (t->dim() == 1 && t->size(0) == view.channels), ShapeMismatch, "batch_norm: expected ",
                what, " of shape (", view.channels, "), got ", shape_str(t->shape()));
  }
  FERRY_CHECK(running_mean.defined() == running_var.defined(), InvalidArgument,
              "batch_norm: running_mean and running_var must both be given or both be undefined");
  FERRY_CHECK(training || running_mean.defined(), InvalidArgument,
              "batch_norm: evaluation mode needs running_mean and running_var (track_running_stats=False "
              "normalises with batch statistics always)");
  FERRY_CHECK(!training || view.count() > 1 || input.numel() == 0, InvalidArgument,
              "Expected more than 1 value per channel when training, got input size ", shape_str(input.shape()));
  return view;
}

// The running statistics' update factor: momentum, or 1/batches for the cumulative average.
double running_update_factor(std::optional<double> momentum, const Tensor& num_batches_tracked) {
  if (momentum) return *momentum;
  FERRY_CHECK(num_batches_tracked.defined(), InvalidArgument,
              "batch_norm: momentum=None (cumulative average) needs num_batches_tracked");
  return 1.0 / num_batches_tracked.item<double>();  // a host sync, as in PyTorch
}
}  // namespace

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, std::optional<double> momentum, double eps,
                  const Tensor& num_batches_tracked, Activation activation) {
  const bool relu = activation == Activation::ReLU;
  const detail::ChannelView view =
      checked_batch_norm_view(input, running_mean, running_var, weight, bias, training, num_batches_tracked);
  const std::int64_t count = view.count();
  if (input.numel() == 0) {
    // An empty batch, as PyTorch: an empty output still joined to the input, weight and bias (their gradients are
    // zeros); the running statistics stay as they were.
    Tensor out = mul(input, 1.0);
    if (weight.defined()) out = mul(out, weight.narrow(0, 0, std::min<std::int64_t>(1, weight.size(0))));
    if (bias.defined()) out = add(out, bias.narrow(0, 0, std::min<std::int64_t>(1, bias.size(0))));
    return relu ? ferry::relu(out) : out;
  }

  const Tensor x = input.detach().contiguous();
  auto update_factor = [&] { return running_update_factor(momentum, num_batches_tracked); };
  const Backend::BatchNormShape library_shape{.batch = view.batch, .channels = view.channels, .inner = view.inner,
                                              .eps = eps, .relu = relu};
  const auto library_dtype_ok = [&](const Tensor& t) {
    return !t.defined() || (t.dtype() == x.dtype() && t.is_contiguous());
  };
  if (training && library_layers() && library_dtype_ok(running_mean) && library_dtype_ok(running_var) &&
      backend(x.device()).batch_norm_library(library_shape, x.dtype(), x.device().index)) {
    const double factor = running_mean.defined() ? update_factor() : 0.0;
    try {
      return batch_norm_library(input, x, library_shape, running_mean, running_var, weight, bias, factor);
    } catch (const BackendError&) {
      // The library refused the call before running it and now says so for this shape (cuDNN without its
      // sub-libraries, say): composed below. Any other failure is the caller's to see.
      if (backend(x.device()).batch_norm_library(library_shape, x.dtype(), x.device().index)) throw;
    }
  }
  Tensor mean, invstd;  // (C), the input's dtype
  {
    autograd::NoGradGuard no_grad;
    if (training) {
      Tensor variance;
      detail::channel_statistics(x, view, mean, variance);
      invstd = rsqrt(add(variance, eps));
      if (running_mean.defined()) {
        const double factor = update_factor();
        const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
        Tensor rm = running_mean, rv = running_var;
        rm.mul_(1 - factor).add_(mean.to(rm.dtype()), factor);
        rv.mul_(1 - factor).add_(variance.to(rv.dtype()), factor * unbias);
      }
    } else {
      mean = running_mean.detach().to(x.dtype());
      invstd = rsqrt(add(running_var.detach().to(x.dtype()), eps));
    }
  }
  Tensor scale, shift;  // (C): y = x * scale + shift
  {
    autograd::NoGradGuard no_grad;
    scale = weight.defined() ? mul(weight.detach(), invstd) : invstd;
    shift = neg(mul(mean, scale));
    if (bias.defined()) shift = add(shift, bias.detach());
  }
  Tensor out = detail::channel_affine(x, view, scale, shift);
  if (relu) relu_in_place(out);
  const Tensor relu_out = relu ? out.detach() : Tensor();
  out = out.reshape(input.shape());

  if (needs_grad({&input, &weight, &bias})) {
    const bool want_x = input.requires_grad(), want_w = weight.requires_grad(), want_b = bias.requires_grad();
    record(relu ? "batch_norm_relu" : "batch_norm", {input, weight, bias}, out,
           [x, view, mean, invstd, scale, training, want_x, want_w, want_b, relu_out](const Tensor& grad) {
             const Tensor g = (relu_out.defined() ? relu_backward(grad, relu_out) : grad).contiguous();
             Tensor gx, gw, gb, sum_dy, sum_dy_xmu;
             if (want_w || want_b || (want_x && training)) {
               detail::channel_backward_sums(g, x, mean, view, sum_dy, sum_dy_xmu);
             }
             if (want_w) gw = mul(sum_dy_xmu, invstd);  // sum(dy * xhat)
             if (want_b) gb = sum_dy;
             if (want_x) {
               // dx = k dy + a x + b, k = weight * invstd; in training a = -k invstd^2 sum(dy (x - mean)) / M and
               // b = -a mean - k sum(dy) / M (the batch statistics depend on x); in eval a = b = 0.
               const Tensor& k = scale;
               if (training) {
                 const double m = static_cast<double>(view.count());
                 const Tensor a = neg(div(mul(mul(k, square(invstd)), sum_dy_xmu), m));
                 const Tensor b = sub(neg(mul(a, mean)), div(mul(k, sum_dy), m));
                 gx = detail::channel_affine2(g, x, view, k, a, b).reshape(x.shape());
               } else {
                 gx = detail::channel_affine(g, view, k, zeros_like(k)).reshape(x.shape());
               }
             }
             return Grads{gx, gw, gb};
           }, autograd::Saved::InputsAndOutput, /*inputs_read=*/2);  // not the bias
  }
  return out;
}

Tensor batch_norm_relu_max_pool2d(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                                  const Tensor& weight, const Tensor& bias, bool training, std::optional<double> momentum,
                                  double eps, const Tensor& num_batches_tracked) {
  const auto same_dtype_contiguous = [&](const Tensor& t) {
    return !t.defined() || (t.dtype() == input.dtype() && t.is_contiguous());
  };
  Backend::BnReluPoolShape shape;
  if (input.dim() == 4) shape = {.batch = input.size(0), .channels = input.size(1), .height = input.size(2),
                                 .width = input.size(3), .eps = eps};
  // One library call each way where the device has the layer (cpu and sim: host loops); else composed.
  const bool fused = training && library_layers() && input.dim() == 4 && input.numel() > 0 &&
                     same_dtype_contiguous(running_mean) && same_dtype_contiguous(running_var) &&
                     same_dtype_contiguous(weight) && same_dtype_contiguous(bias) &&
                     backend(input.device()).batch_norm_relu_max_pool_library(shape, input.dtype(),
                                                                               input.device().index);
  if (!fused) {
    return max_pool2d(batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps,
                                 num_batches_tracked, Activation::ReLU),
                      2, 2);
  }
  checked_batch_norm_view(input, running_mean, running_var, weight, bias, training, num_batches_tracked);
  const double factor = running_mean.defined() ? running_update_factor(momentum, num_batches_tracked) : 0.0;
  const Tensor x = input.detach().contiguous();  // (N, C, H, W)
  const std::int64_t N = x.size(0), C = x.size(1), oh = x.size(2) / 2, ow = x.size(3) / 2;
  const TensorOptions like{.device = x.device(), .dtype = x.dtype()};
  const Tensor w = weight.defined() ? weight.detach() : Tensor(), b = bias.defined() ? bias.detach() : Tensor();
  Tensor out = empty({N, C, oh, ow}, like);
  const Tensor argmax = empty({N, C, oh, ow}, {.device = x.device(), .dtype = DType::Int64});
  const Tensor save_mean = empty({C}, like), save_invstd = empty({C}, like);
  backend(x.device()).batch_norm_relu_max_pool_forward(kernel(out), kernel(argmax), kernel(x), kernel_or_null(w),
                                                       kernel_or_null(b), kernel_or_null(running_mean),
                                                       kernel_or_null(running_var), kernel(save_mean),
                                                       kernel(save_invstd), shape, factor, stream_of(x.device()));
  if (needs_grad({&input, &weight, &bias})) {
    const bool want_x = input.requires_grad(), want_w = weight.requires_grad(), want_b = bias.requires_grad();
    record("batch_norm_relu_max_pool2d", {input, weight, bias}, out,
           [x, w, pooled = out.detach(), argmax, save_mean, save_invstd, shape, want_x, want_w, want_b](
               const Tensor& grad) {
             const TensorOptions like{.device = x.device(), .dtype = x.dtype()};
             Tensor gx = empty(x.shape(), like), gw = empty({x.size(1)}, like), gb = empty({x.size(1)}, like);
             const Tensor g = grad.contiguous();
             backend(x.device()).batch_norm_relu_max_pool_backward(
                 kernel(gx), kernel(gw), kernel(gb), kernel(g), kernel(pooled), kernel(argmax), kernel(x),
                 kernel_or_null(w), kernel(save_mean), kernel(save_invstd), shape, stream_of(x.device()));
             return Grads{want_x ? gx : Tensor(), want_w ? gw : Tensor(), want_b ? gb : Tensor()};
           }, autograd::Saved::InputsAndOutput, /*inputs_read=*/2);  // not the bias
  }
  return out;
}

// --- pooling ------------------------------------------------------------------------------------

namespace {
struct PoolPlan {
  Backend::Pool2dShape shape;
  Shape out_shape;
};

PoolPlan plan_pool(const char* op, const Tensor& input, Size2 kernel_size, Size2 stride, Size2 padding) {
  check_floating(op, input, "input");
  FERRY_CHECK(input.dim() == 4, ShapeMismatch, op, ": expected a 4-d (N, C, H, W) input, got shape ",
              shape_str(input.shape()));
  if (stride == Size2(0)) stride = kernel_size;
  FERRY_CHECK(kernel_size.h >= 1 && kernel_size.w >= 1 && stride.h >= 1 && stride.w >= 1, InvalidArgument, op,
              ": expected kernel size and stride >= 1, got kernel (", kernel_size.h, ", ", kernel_size.w,
              "), stride (", stride.h, ", ", stride.w, ")");
  FERRY_CHECK(padding.h >= 0 && padding.w >= 0 && 2 * padding.h <= kernel_size.h && 2 * padding.w <= kernel_size.w,
              InvalidArgument, op, ": pad should be at most half of kernel size, but got pad (", padding.h, ", ",
              padding.w, ") and kernel size (", kernel_size.h, ", ", kernel_size.w, ")");
  PoolPlan plan;
  Backend::Pool2dShape& s = plan.shape;
  s.planes = input.size(0) * input.size(1);
  s.height = input.size(2);
  s.width = input.size(3);
  s.kernel_h = kernel_size.h;
  s.kernel_w = kernel_size.w;
  s.stride_h = stride.h;
  s.stride_w = stride.w;
  s.pad_h = padding.h;
  s.pad_w = padding.w;
  FERRY_CHECK(s.height + 2 * s.pad_h >= s.kernel_h && s.width + 2 * s.pad_w >= s.kernel_w, ShapeMismatch, op,
              ": output size is too small for input ", shape_str(input.shape()), " and kernel (", s.kernel_h, ", ",
              s.kernel_w, ") with padding (", s.pad_h, ", ", s.pad_w, ")");
  plan.out_shape = {input.size(0), input.size(1), s.out_h(), s.out_w()};
  return plan;
}
}  // namespace

Tensor max_pool2d(const Tensor& input, Size2 kernel_size, Size2 stride, Size2 padding) {
  const PoolPlan plan = plan_pool("max_pool2d", input, kernel_size, stride, padding);
  const Tensor x = input.detach().contiguous();
  Tensor out = empty(plan.out_shape, {.device = x.device(), .dtype = x.dtype()});
  Tensor argmax = empty(plan.out_shape, {.device = x.device(), .dtype = DType::Int64});
  if (out.numel() > 0) {
    backend(x.device()).max_pool2d(kernel(out), kernel(argmax), kernel(x), plan.shape, stream_of(x.device()));
  }
  if (needs_grad({&input})) {
    record("max_pool2d", {input}, out, [argmax, s = plan.shape, in_shape = input.shape()](const Tensor& grad) {
      const Tensor g = grad.contiguous();
      Tensor gx = empty(in_shape, {.device = g.device(), .dtype = g.dtype()});
      if (g.numel() == 0) return Grads{gx.fill_(0)};
      backend(g.device()).max_pool2d_backward(kernel(gx), kernel(g), kernel(argmax), s, stream_of(g.device()));
      return Grads{gx};
    });
  }
  return out;
}

Tensor avg_pool2d(const Tensor& input, Size2 kernel_size, Size2 stride, Size2 padding) {
  const PoolPlan plan = plan_pool("avg_pool2d", input, kernel_size, stride, padding);
  const Tensor x = input.detach().contiguous();
  Tensor out = empty(plan.out_shape, {.device = x.device(), .dtype = x.dtype()});
  if (out.numel() > 0) backend(x.device()).avg_pool2d(kernel(out), kernel(x), plan.shape, stream_of(x.device()));
  if (needs_grad({&input})) {
    record("avg_pool2d", {input}, out, [s = plan.shape, in_shape = input.shape()](const Tensor& grad) {
      const Tensor g = grad.contiguous();
      Tensor gx = empty(in_shape, {.device = g.device(), .dtype = g.dtype()});
      if (g.numel() == 0) return Grads{gx.fill_(0)};
      backend(g.device()).avg_pool2d_backward(kernel(gx), kernel(g), s, stream_of(g.device()));
      return Grads{gx};
    });
  }
  return out;
}

Tensor upsample_nearest2d(const Tensor& input, Size2 scale_factor) {
  FERRY_CHECK(input.dim() == 4, ShapeMismatch, "upsample_nearest2d: expected a 4-d (N, C, H, W) input, got ",
              shape_str(input.shape()));
  FERRY_CHECK(scale_factor.h >= 1 && scale_factor.w >= 1, InvalidArgument, "upsample_nearest2d: scale factors must be "
              "whole numbers >= 1, got (", scale_factor.h, ", ", scale_factor.w, ")");
  const std::int64_t n = input.size(0), c = input.size(1), h = input.size(2), w = input.size(3);
  return input.reshape({n, c, h, 1, w, 1})
      .expand({n, c, h, scale_factor.h, w, scale_factor.w})
      .reshape({n, c, h * scale_factor.h, w * scale_factor.w});
}

namespace {
// The checks adaptive_avg_pool2d and adaptive_max_pool2d share: a floating (C, H, W) or (N, C, H, W) input with rows
// and columns, and a positive output size.
void check_adaptive_pool(const char* op, const Tensor& input, Size2 output_size) {
  FERRY_CHECK(input.dim() == 3 || input.dim() == 4, ShapeMismatch, op, ": expected a 3-d (C, H, W) or 4-d (N, C, H, "
              "W) input, got ", shape_str(input.shape()));
  check_floating(op, input);
  FERRY_CHECK(output_size.h >= 1 && output_size.w >= 1, InvalidArgument, op, ": output_size must be positive, got (",
              output_size.h, ", ", output_size.w, ")");
  FERRY_CHECK(input.size(-2) > 0 && input.size(-1) > 0, ShapeMismatch, op, ": the input ", shape_str(input.shape()),
              " has no rows or columns to pool");
}

// The adaptive windows of x along `dim` (size n_in -> n_out): window i covers [start, end), start = floor(i n_in /
// n_out), end = ceil((i + 1) n_in / n_out) (float64 quotients of integers below 2^24: exact where whole). Its rows
// are gathered on the device as (n_out, k) in place of dim, k the longest window's length, a shorter window
// repeating its last row; `own` ((n_out, k), then 1 for each dim after `dim`) tells a window's own rows from the
// repeats, `length` ((n_out), then the same 1s) counts them.
struct AdaptiveWindows {
  Tensor rows, own, length;
};
AdaptiveWindows adaptive_windows(const Tensor& x, int dim, std::int64_t n_out) {
  const std::int64_t n_in = x.size(dim);
  std::int64_t k = 0;
  for (std::int64_t i = 0; i < n_out; ++i) k = std::max(k, ((i + 1) * n_in + n_out - 1) / n_out - i * n_in / n_out);
  const ArangeOptions f64{.device = x.device(), .dtype = DType::Float64};
  const double in = static_cast<double>(n_in), out = static_cast<double>(n_out);
  const Tensor i = arange(0, out, 1, f64).unsqueeze(1);  // (n_out, 1)
  const Tensor start = floor(div(mul(i, in), out)), end = ceil(div(mul(add(i, 1.0), in), out));
  const Tensor wanted = add(start, arange(0, static_cast<double>(k), 1, f64).unsqueeze(0));  // (n_out, k)
  const Tensor rows = minimum(wanted, sub(end, 1.0));
  Shape windows = x.shape();  // x's shape with dim split into (n_out, k)
  windows[dim] = n_out;
  windows.insert(windows.begin() + dim + 1, k);
  Shape own_shape{n_out, k}, length_shape{n_out};
  for (int d = dim + 1; d < x.dim(); ++d) {
    own_shape.push_back(1);
    length_shape.push_back(1);
  }
  return {index_select(x, dim, rows.to(DType::Int64).reshape({n_out * k})).reshape(windows),
          lt(wanted, end).reshape(own_shape), sub(end, start).to(x.dtype()).reshape(length_shape)};
}
}  // namespace

namespace {
// x linearly interpolated along `dim` (size n_in -> n_out), PyTorch's weights: output i mixes the two inputs around
// its source point s = (i + 0.5) n_in / n_out - 0.5, clamped at 0 (or, with align_corners, i (n_in - 1) / (n_out -
// 1)): (1 - frac) on floor(s) and frac on floor(s) + 1 (the last input again at the edge), frac = s - floor(s). The
// two neighbours are gathered on the device (index_select), so an input reaches only the outputs beside it (a
// product with each input and a 0 weight, as a matmul would take, makes one inf NaN across its whole row).
Tensor interpolate_along(const Tensor& x, int dim, std::int64_t n_out, bool align_corners) {
  const std::int64_t n_in = x.size(dim);
  const ArangeOptions f64{.device = x.device(), .dtype = DType::Float64};
  const Tensor i = arange(0, static_cast<double>(n_out), 1, f64);  // (n_out)
  const double in = static_cast<double>(n_in), out = static_cast<double>(n_out);
  const Tensor source = align_corners ? mul(i, n_out > 1 ? (in - 1) / (out - 1) : 0.0)
                                      : clamp(sub(mul(add(i, 0.5), in / out), 0.5), 0.0);
  const Tensor first = floor(source);
  const Tensor second = clamp(add(first, 1.0), std::nullopt, in - 1);
  Shape weight_shape{n_out};  // (n_out), then 1 for each dim after `dim`
  for (int d = dim + 1; d < x.dim(); ++d) weight_shape.push_back(1);
  const Tensor frac = sub(source, first).to(x.dtype()).reshape(weight_shape);
  const Tensor a = index_select(x, dim, first.to(DType::Int64)), b = index_select(x, dim, second.to(DType::Int64));
  return add(mul(a, rsub(frac, 1.0)), mul(b, frac));
}
}  // namespace

Tensor upsample_bilinear2d(const Tensor& input, Size2 output_size, bool align_corners) {
  FERRY_CHECK(input.dim() == 4, ShapeMismatch, "upsample_bilinear2d: expected a 4-d (N, C, H, W) input, got ",
              shape_str(input.shape()));
  check_floating("upsample_bilinear2d", input);
  FERRY_CHECK(output_size.h >= 1 && output_size.w >= 1, InvalidArgument, "upsample_bilinear2d: output_size must be "
              "positive, got (", output_size.h, ", ", output_size.w, ")");
  const std::int64_t height = input.size(2), width = input.size(3);
  FERRY_CHECK(height > 0 && width > 0, ShapeMismatch, "upsample_bilinear2d: the input ", shape_str(input.shape()),
              " has no rows or columns to interpolate");
  return interpolate_along(interpolate_along(input, 2, output_size.h, align_corners), 3, output_size.w, align_corners);
}

Tensor adaptive_avg_pool2d(const Tensor& input, Size2 output_size) {
  check_adaptive_pool("adaptive_avg_pool2d", input, output_size);
  const std::int64_t height = input.size(-2), width = input.size(-1);
  if (input.dim() == 3) return adaptive_avg_pool2d(input.unsqueeze(0), output_size).squeeze(0);
  if (output_size.h == 1 && output_size.w == 1) return mean(input, {2, 3}, true);  // global pooling
  if (height % output_size.h == 0 && width % output_size.w == 0) {
    return avg_pool2d(input, Size2(height / output_size.h, width / output_size.w));  // equal, disjoint windows
  }
  // The mean over row windows, then over column windows, each a gather, a select and a sum: no product of an
  // input with a 0 weight, which would make an inf anywhere in a row or column NaN there (0 * inf).
  const auto window_mean = [](const Tensor& x, int dim, std::int64_t n_out) {
    const AdaptiveWindows w = adaptive_windows(x, dim, n_out);
    const Tensor zero = zeros({}, {.device = x.device(), .dtype = x.dtype()});
    return div(sum(where(w.own, w.rows, zero), {dim + 1}), w.length);
  };
  return window_mean(window_mean(input, 2, output_size.h), 3, output_size.w);
}

namespace {
// The maximum of x over each adaptive window along `dim`; a window's repeats of its last row leave its maximum, and
// the row that gets the gradient, unchanged.
Tensor window_max(const Tensor& x, int dim, std::int64_t n_out) {
  return max(adaptive_windows(x, dim, n_out).rows, dim + 1).first;
}
}  // namespace

Tensor adaptive_max_pool2d(const Tensor& input, Size2 output_size) {
  check_adaptive_pool("adaptive_max_pool2d", input, output_size);
  const std::int64_t height = input.size(-2), width = input.size(-1);
  if (input.dim() == 3) return adaptive_max_pool2d(input.unsqueeze(0), output_size).squeeze(0);
  if (height % output_size.h == 0 && width % output_size.w == 0) {
    return max_pool2d(input, Size2(height / output_size.h, width / output_size.w));  // equal, disjoint windows
  }
  return window_max(window_max(input, 2, output_size.h), 3, output_size.w);
}

Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias, std::int64_t stride, std::int64_t padding,
              std::int64_t dilation, std::int64_t groups) {
  FERRY_CHECK(input.dim() == 2 || input.dim() == 3, ShapeMismatch,
              "conv1d: expected a 2-d (C, L) or 3-d (N, C, L) input, got shape ", shape_str(input.shape()));
  FERRY_CHECK(weight.dim() == 3, ShapeMismatch, "conv1d: expected weight (out_channels, in_channels / groups, k), "
              "got shape ", shape_str(weight.shape()));
  const int height = input.dim() - 1;  // the new dim of size 1, before L
  return conv2d(input.unsqueeze(height), weight.unsqueeze(2), bias, Size2(1, stride), Size2(0, padding),
                Size2(1, dilation), groups)
      .squeeze(height);
}

// --- activations --------------------------------------------------------------------------------

Tensor relu(const Tensor& input) { return ferry::relu(input); }
Tensor softmax(const Tensor& input, int dim) { return ferry::softmax(input, dim); }
Tensor log_softmax(const Tensor& input, int dim) { return ferry::log_softmax(input, dim); }

Tensor dropout(const Tensor& input, double p, bool training) {
  check_dropout_probability(p);
  if (!training || p == 0) return input;
  check_floating("dropout", input, "input");
  Tensor keep_scaled;  // 0 or 1/(1-p), the input's shape
  {
    autograd::NoGradGuard no_grad;
    if (p == 1) {
      keep_scaled = zeros(input.shape(), {.device = input.device(), .dtype = input.dtype()});
    } else {
      const Tensor draws = rand(input.shape(), {.device = input.device(), .dtype = input.dtype()});
      keep_scaled = mul(ge(draws, p).to(input.dtype()), 1.0 / (1.0 - p));
    }
  }
  return mul(input, keep_scaled);
}

namespace {
// One draw per (sample, channel) of a (N, C, ...) input: a (N, C, 1, ...) mask of 0 and 1/(1-p), broadcast.
Tensor feature_dropout(const Tensor& input, double p, bool training) {
  check_dropout_probability(p);
  if (!training || p == 0) return input;
  check_floating("dropout", input);
  Shape mask_shape(input.shape().size(), 1);
  mask_shape[0] = input.size(0);
  mask_shape[1] = input.size(1);
  Tensor keep_scaled;
  {
    autograd::NoGradGuard no_grad;
    const TensorOptions on{.device = input.device(), .dtype = input.dtype()};
    keep_scaled = p == 1 ? zeros(mask_shape, on) : mul(ge(rand(mask_shape, on), p).to(input.dtype()), 1.0 / (1.0 - p));
  }
  return mul(input, keep_scaled);
}
}  // namespace

Tensor dropout2d(const Tensor& input, double p, bool training) {
  FERRY_CHECK(input.dim() == 4, ShapeMismatch, "dropout2d: expected a (N, C, H, W) input, got ",
              shape_str(input.shape()),
              input.dim() == 3 ? " (for (N, C, L) use dropout1d; for one unbatched (C, H, W) image, unsqueeze(0))" : "");
  return feature_dropout(input, p, training);
}

Tensor dropout1d(const Tensor& input, double p, bool training) {
  FERRY_CHECK(input.dim() == 2 || input.dim() == 3, ShapeMismatch,
              "dropout1d: expected a (N, C, L) or unbatched (C, L) input, got ", shape_str(input.shape()));
  if (input.dim() == 2) return feature_dropout(input.unsqueeze(0), p, training).squeeze(0);
  return feature_dropout(input, p, training);
}

}  // namespace ferry::nn::functional
