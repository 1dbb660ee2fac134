// ferry/nn/functional.h — the layers as functions: each checks devices, shapes and dtypes, runs on any
// device through the backend, and records ONE autograd node whose backward is written out by hand.
// Not here: parameters and state (the Module classes in the other nn headers), losses (ferry/nn/loss.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ferry/nn/loss.h"
#include "ferry/tensor.h"

namespace ferry::nn {

// A (height, width) pair; one number means both, as in PyTorch (`padding=1`, `stride={2, 1}`).
struct Size2 {
  std::int64_t h = 0, w = 0;
  Size2(std::int64_t both = 0) : h(both), w(both) {}  // NOLINT: implicit on purpose, like PyTorch's ints
  Size2(std::int64_t height, std::int64_t width) : h(height), w(width) {}
  friend bool operator==(const Size2&, const Size2&) = default;
};

}  // namespace ferry::nn

namespace ferry::nn::functional {

// An activation a layer applies to its own output (fused): the values of the layer followed by relu(), from one
// autograd node, with no second tensor. Linear adds its bias and applies the ReLU in one pass after the GEMM
// (one kernel fewer than bias, GEMM and ReLU); BatchNorm applies the ReLU in place on its output.
enum class Activation : std::uint8_t { None, ReLU };

// (*, in) x weight (out, in) + bias (out) -> (*, out). One GEMM forward; backward: two GEMMs and a sum,
// each only when its input requires grad.
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
              Activation activation = Activation::None);

// input (N, C, H, W), weight (O, C / groups, kh, kw), bias (O) or undefined -> (N, O, oh, ow). im2col + GEMM in
// chunks of samples (the columns of a chunk are built by one im2col call and multiplied by one batched
// GEMM); backward recomputes the columns instead of keeping them. groups > 1 (C and O divisible by it): output
// channels [g O/G, (g+1) O/G) see only input channels [g C/G, (g+1) C/G) (groups = C: depthwise), computed as one
// convolution per group, joined by cat.
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(), Size2 stride = 1,
              Size2 padding = 0, Size2 dilation = 1, std::int64_t groups = 1);
// input (N, C, L) or (C, L), weight (O, C / groups, k), bias (O) -> (N, O, ol): conv2d on a height of 1.
Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(), std::int64_t stride = 1,
              std::int64_t padding = 0, std::int64_t dilation = 1, std::int64_t groups = 1);
// The transposed convolution (PyTorch's conv_transpose2d, "deconvolution"): the adjoint of conv2d, which
// upsamples by `stride`. input (N, C_in, H, W) or (C_in, H, W), weight (C_in, C_out / groups, kh, kw), bias (C_out)
// -> (N, C_out, oh, ow), oh = (H - 1) * stride - 2 * padding + dilation * (kh - 1) + output_padding + 1 (ow
// alike). output_padding (below the stride or the dilation) picks among the sizes a strided conv2d maps onto H.
// Runs as conv2d's input gradient (cuDNN on cuda; im2col + GEMM + col2im elsewhere). Note the argument order,
// PyTorch's: output_padding and groups come before dilation.
Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(), Size2 stride = 1,
                        Size2 padding = 0, Size2 output_padding = 0, std::int64_t groups = 1, Size2 dilation = 1);
// input (N, C_in, L) or (C_in, L), weight (C_in, C_out / groups, k), bias (C_out) -> (N, C_out, ol):
// conv_transpose2d on a height of 1.
Tensor conv_transpose1d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
                        std::int64_t stride = 1, std::int64_t padding = 0, std::int64_t output_padding = 0,
                        std::int64_t groups = 1, std::int64_t dilation = 1);

// input (N, C, *). training: normalise with the batch's statistics and, when running_mean/var are
// defined, update them in place: running = (1 - momentum) * running + momentum * batch, with the
// unbiased batch variance; momentum nullopt = cumulative average (needs num_batches_tracked, already
// incremented by the caller). Not training: normalise with the running statistics. weight/bias (C) may
// be undefined (affine=False).
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, std::optional<double> momentum = 0.1, double eps = 1e-5,
                  const Tensor& num_batches_tracked = Tensor(), Activation activation = Activation::None);

// max_pool2d(relu(batch_norm(input, ...)), 2, 2) for an input (N, C, H, W) -> (N, C, H/2, W/2): in training on
// the cpu and sim, one host layer that never stores the full-size activation between the three (the CNN block's
// tail; nn::Sequential uses it); elsewhere, and with set_library_layers(false), the three layers composed.
Tensor batch_norm_relu_max_pool2d(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                                  const Tensor& weight, const Tensor& bias, bool training,
                                  std::optional<double> momentum = 0.1, double eps = 1e-5,
                                  const Tensor& num_batches_tracked = Tensor());

// input (N, C, H, W) -> (N, C, oh, ow); stride 0 = the kernel size; padding <= kernel / 2. Max pooling
// pads with -inf (padding never wins); average pooling counts the padding (PyTorch's defaults).
Tensor max_pool2d(const Tensor& input, Size2 kernel_size, Size2 stride = 0, Size2 padding = 0);
Tensor avg_pool2d(const Tensor& input, Size2 kernel_size, Size2 stride = 0, Size2 padding = 0);
// torch's adaptive_avg_pool2d: input (N, C, H, W) or (C, H, W) -> output_size (oh, ow) in the last two dims; output
// [i, j] averages rows floor(i H / oh) .. ceil((i + 1) H / oh) - 1 and the same for columns (windows may overlap
// when oh does not divide H). Global pooling (1, 1) is a mean, sizes that divide are avg_pool2d, the rest the mean
// over row windows, then column windows, each gathered on the device with index_select (an inf stays in its own
// windows); autograd differentiates each.
Tensor adaptive_avg_pool2d(const Tensor& input, Size2 output_size);
// torch's adaptive_max_pool2d (without return_indices): the same windows, their maximum. Sizes that divide are
// max_pool2d; the rest take the maximum over row windows, then over column windows (a max is separable), each
// gathered on the device with index_select. The gradient goes to one maximum per window (torch's, but for ties).
Tensor adaptive_max_pool2d(const Tensor& input, Size2 output_size);
// Nearest-neighbour upsampling by whole factors: input (N, C, H, W) -> (N, C, H sh, W sw), each value repeated in an
// sh x sw block (torch's interpolate(mode="nearest") with integer scale factors). A broadcast view copied once; the
// gradient of each input element is the sum over its block.
Tensor upsample_nearest2d(const Tensor& input, Size2 scale_factor);
// Bilinear resize of input (N, C, H, W) to output_size (PyTorch's F.interpolate(mode="bilinear"), no antialias):
// output pixel (i, j) mixes the 2 x 2 input pixels around its source point y = (i + 0.5) H / oh - 0.5, clamped at
// 0 (x alike), or, with align_corners, y = i (H - 1) / (oh - 1): the corner pixels land on the corners. Runs as two
// passes, rows then columns, each gathering the two neighbours on the device and mixing them, and differentiates
// through them.
Tensor upsample_bilinear2d(const Tensor& input, Size2 output_size, bool align_corners = false);
// PyTorch's F.unfold: the sliding (kh, kw) blocks of input (N, C, H, W) or (C, H, W) as columns (N, C kh kw, L),
// L = oh * ow blocks counted as conv2d counts its outputs, each column one block (rows in (c, i, j) order). fold
// is its adjoint: columns (N, C kh kw, L) summed back into an image (N, C, output_size), overlaps added (so
// fold(unfold(x)) is x times how many blocks cover each pixel). The backend's im2col / col2im, each the other's
// gradient. unfold + matmul + fold is a convolution written by hand.
Tensor unfold(const Tensor& input, Size2 kernel_size, Size2 dilation = 1, Size2 padding = 0, Size2 stride = 1);
Tensor fold(const Tensor& input, Size2 output_size, Size2 kernel_size, Size2 dilation = 1, Size2 padding = 0,
            Size2 stride = 1);
// PyTorch's F.pad: `pad` holds (left, right) pairs for the last dim, then the one before it, and so on (so {1, 1, 2,
// 0} pads W by 1 on each side and H by 2 on top). mode "constant" fills with `value` (a negative size cuts elements
// off); "reflect" mirrors without the edge (each size below the dim's); "replicate" repeats the edge; "circular"
// wraps around (each size at most the dim's). Composed of narrow, expand, index_select and cat on the input's
// device; autograd differentiates it.
Tensor pad(const Tensor& input, const std::vector<std::int64_t>& pad, const std::string& mode = "constant",
           double value = 0);

Tensor relu(const Tensor& input);
// softmax, log_softmax and logsumexp are tensor ops (ferry/ops.h); here too, as in torch::nn::functional.
Tensor softmax(const Tensor& input, int dim);
Tensor log_softmax(const Tensor& input, int dim);
// Zeroes each element with probability p and scales the rest by 1/(1-p), drawing from ferry's
// counter-based generator on the input's device (so cpu and every accelerator drop the same elements).
// Not training (or p = 0): the input itself.
Tensor dropout(const Tensor& input, double p = 0.5, bool training = true);
// Channel dropout: each whole channel (feature map) is zeroed with probability p, the rest scaled by 1/(1-p), one
// draw per (sample, channel). dropout2d: (N, C, H, W); dropout1d: (N, C, L) or unbatched (C, L). (PyTorch reads a
// 3-d input to dropout2d as (N, C, L): ferry refuses it, naming dropout1d and unsqueeze(0) for (C, H, W).)
Tensor dropout2d(const Tensor& input, double p = 0.5, bool training = true);
Tensor dropout1d(const Tensor& input, double p = 0.5, bool training = true);

// The activations of transformers and modern MLPs, composed from tensor ops (any device, autograd through the
// ops), with PyTorch's formulas:
//   gelu: x/2 (1 + erf(x / sqrt 2)); approximate = "tanh": x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   silu: x sigmoid(x);  leaky_relu: x where x > 0, else negative_slope x;  sigmoid, tanh: the tensor ops
//   softplus: log(1 + e^(beta x)) / beta, a smooth relu; x itself where beta x > threshold (no overflow)
Tensor gelu(const Tensor& input, const std::string& approximate = "none");
Tensor silu(const Tensor& input);
Tensor leaky_relu(const Tensor& input, double negative_slope = 0.01);
Tensor softplus(const Tensor& input, double beta = 1, double threshold = 20);

// (x - mean) / sqrt(var + eps) * weight + bias over the last normalized_shape.size() dims of x, which must be
// normalized_shape (the mean and the biased variance of each row over those dims, as PyTorch's layer_norm).
// weight and bias: normalized_shape, or undefined (no affine). Composed from tensor ops, on any device.
Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// torch's group_norm: input (N, C, *) with its C channels in num_groups groups; each (sample, group) normalized over
// its channels and positions together (biased variance), then * weight[c] + bias[c] (each (C) or undefined).
Tensor group_norm(const Tensor& input, std::int64_t num_groups, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

// Attention: softmax(query key^T * scale + mask) value over the last two dims, batched over the others (they
// broadcast): query (..., L, E), key (..., S, E), value (..., S, Ev) -> (..., L, Ev). attn_mask broadcasts to
// (..., L, S): bool is true where attention IS allowed (PyTorch 2's scaled_dot_product_attention; the opposite of
// MultiheadAttention's), float is added. is_causal: query i sees keys 0..i (the top-left triangle when L != S), not
// with attn_mask. scale: 1/sqrt(E) unless given. dropout_p: on the weights (training only: pass 0 in eval). A row
// that may see no key gives NaN, as in PyTorch.
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0, bool is_causal = false,
                                    std::optional<double> scale = std::nullopt);

// Rows of `weight` (num_embeddings, dim) picked by `indices` (int64, any shape): indices.shape + (dim). An index
// outside [0, num_embeddings) is an error (on a GPU at the next sync). padding_idx (if given; negative counts from
// the end): its row gets no gradient, as PyTorch's.
Tensor embedding(const Tensor& indices, const Tensor& weight, std::optional<std::int64_t> padding_idx = std::nullopt);

// The fused host kernels that cpu and sim (both host memory) use for BatchNorm and large convolutions outside a
// graph capture; other devices compose the same maths from tensor ops. Tests switch them off to check the composed
// path against them.
void set_fused_host_kernels(bool enabled);
bool fused_host_kernels();

// Library layers: convolution and training-mode BatchNorm through the device's vendor library (cuDNN
// on cuda, oneDNN's convolutions on cpu and sim) when the backend has one for the shape, BatchNorm (+ ReLU) through
// ferry's fused kernels (BatchNorm + ReLU on cuda, both on cpu and sim), the LSTM and GRU steps, LayerNorm and
// GELU as one backend call each way, and clip_grad_norm_'s norms and scale as one call each over all the gradients
// (every device); on by default. Off, every device composes them from ferry's
// kernels (im2col + GEMM, per-channel passes): tests compare the two. FERRY_LIBRARY_LAYERS=0 sets it off for a
// whole run; FERRY_CUDNN=0 turns only cuDNN off, FERRY_ONEDNN=0 only oneDNN. Both are switches (1/true/yes/on or 0/false/no/off, any case): another value
// is an InvalidArgument, thrown by the first call that reads it (ferry's command line reads it before a command runs).
void set_library_layers(bool enabled);
bool library_layers();

// Whether nn::Sequential runs a Linear or BatchNorm followed by a ReLU as one fused layer (Activation::ReLU);
// on by default. The state_dict and the values are the same either way (up to the last bit: the bias is added
// after the GEMM instead of before it); tests switch it off to compare, and FERRY_FUSED_ACTIVATIONS=0 for a run (a
// switch, read as FERRY_LIBRARY_LAYERS is).
void set_fused_activations(bool enabled);
bool fused_activations();

// Whether float32 convolutions on the cpu and sim run through oneDNN (PyTorch's torch.backends.mkldnn.enabled), where
// this build has it: its kernels follow the CPU (AVX-512 where there is one) in oneDNN's blocked layouts, with each
// call reordering from and to NCHW. On by default; off, they run as im2col + OpenBLAS GEMMs, as float64 always does.
// It is these devices' library layer (set_library_layers off turns it off too), so a graph captured on sim records
// its calls.
// FERRY_ONEDNN=0 for a run (a switch, read as FERRY_LIBRARY_LAYERS is). onednn_version(): "oneDNN 2.6.3
// (avx512_core kernels)", or "" in a build without it.
void set_onednn(bool enabled);
bool onednn();
std::string onednn_version();

}  // namespace ferry::nn::functional
