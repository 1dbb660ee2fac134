// ferry/nn/transformer.h — TransformerEncoderLayer and TransformerEncoder, PyTorch's (1.13): self-attention and a
// feed-forward block, each with a residual connection and a LayerNorm (after, or with norm_first before), and the
// same parameter names (self_attn.in_proj_weight, linear1.weight, norm1.bias, ...; layers.0. ... in the encoder).
// Composed of MultiheadAttention, Linear, LayerNorm and Dropout; any device, differentiated by autograd.
#pragma once

#include <memory>
#include <string>

#include "ferry/nn/activation.h"
#include "ferry/nn/attention.h"
#include "ferry/nn/layernorm.h"
#include "ferry/nn/linear.h"
#include "ferry/nn/module.h"
#include "ferry/nn/module_list.h"

namespace ferry::nn {

struct TransformerEncoderLayerOptions {
  std::int64_t dim_feedforward = 2048;
  double dropout = 0.1;             // after the attention, inside and after the feed-forward block; train() only
  std::string activation = "relu";  // or "gelu": between linear1 and linear2
  double layer_norm_eps = 1e-5;
  bool batch_first = false;  // (N, S, E) instead of PyTorch's default (S, N, E)
  bool norm_first = false;   // pre-norm (GPT-2's): x + sa(norm1(x)), then x + ff(norm2(x))
};

// What forward() takes besides the sequence; the masks as MultiheadAttention's (AttendOptions).
struct EncoderMasks {
  Tensor mask{};                  // (S, S) or (N * nhead, S, S): bool true = may NOT attend, or float added
  Tensor src_key_padding_mask{};  // (N, S) or (S): true = padding, ignored as a key
  bool is_causal = false;         // position i attends to 0..i only (instead of a mask)
};

class TransformerEncoderLayer : public Module {
 public:
  // self_attn MultiheadAttention(d_model, nhead, dropout, batch_first), linear1 (d_model -> dim_feedforward),
  // linear2 (back), norm1 and norm2 LayerNorm(d_model), each initialised as PyTorch initialises it.
  TransformerEncoderLayer(std::int64_t d_model, std::int64_t nhead, const TransformerEncoderLayerOptions& layer = {},
                          const TensorOptions& options = {});

  Tensor forward(const Tensor& src) override;  // (S, N, E) or (N, S, E) with batch_first, or (S, E): the same shape
  Tensor forward(const Tensor& src, const EncoderMasks& masks);
  std::string type_name() const override { return "TransformerEncoderLayer"; }

  TransformerEncoderLayerOptions options;
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;
  std::shared_ptr<LayerNorm> norm1, norm2;

 private:
  Tensor self_attention(const Tensor& x, const EncoderMasks& masks);  // dropout1(self_attn(x, x, x))
  Tensor feed_forward(const Tensor& x);                               // dropout2(linear2(dropout(act(linear1(x)))))
};

// num_layers TransformerEncoderLayers of the same options (each drawn afresh: PyTorch deep-copies one layer, so
// its layers start equal; the names and shapes are the same), then an optional final LayerNorm ("norm").
class TransformerEncoder : public Module {
 public:
  TransformerEncoder(std::int64_t d_model, std::int64_t nhead, std::int64_t num_layers,
                     const TransformerEncoderLayerOptions& layer = {}, bool final_norm = false,
                     const TensorOptions& options = {});

  Tensor forward(const Tensor& src) override;
  Tensor forward(const Tensor& src, const EncoderMasks& masks);
  std::string type_name() const override { return "TransformerEncoder"; }

  std::shared_ptr<ModuleList> layers;  // "layers.0.", "layers.1.", ...
  std::shared_ptr<LayerNorm> norm;     // null without final_norm
};

// PyTorch's Transformer.generate_square_subsequent_mask: (size, size) float32, 0 on and below the diagonal and -inf
// above it (position i may attend to 0..i), on `device`.
Tensor generate_square_subsequent_mask(std::int64_t size, Device device = kCPU);

}  // namespace ferry::nn
