// ferry/nn/transformer.h — PyTorch's (1.13) transformer layers: TransformerEncoderLayer (self-attention, then a
// feed-forward block), TransformerDecoderLayer (self-attention, attention over the encoder's output "memory", then
// the feed-forward block), each block with a residual connection and a LayerNorm (after it, or with norm_first
// before it); their stacks TransformerEncoder / TransformerDecoder; and the whole encoder-decoder nn::Transformer.
// The same parameter names (self_attn.in_proj_weight, multihead_attn.out_proj.weight, linear1.weight, norm3.bias,
// layers.0. ..., encoder.norm.weight), so PyTorch's state_dicts load strictly. Composed of MultiheadAttention,
// Linear, LayerNorm and Dropout; any device, differentiated by autograd.
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

// A decoder layer takes the same options as an encoder layer (PyTorch's constructors have the same arguments).
using TransformerDecoderLayerOptions = TransformerEncoderLayerOptions;

// What a decoder's forward() takes besides the target and the memory; the masks as MultiheadAttention's.
struct DecoderMasks {
  Tensor tgt_mask{};                 // (T, T) or (N * nhead, T, T): the target's self-attention
  Tensor memory_mask{};              // (T, S) or (N * nhead, T, S): target positions over memory positions
  Tensor tgt_key_padding_mask{};     // (N, T) or (T): true = a padded target position, ignored as a key
  Tensor memory_key_padding_mask{};  // (N, S) or (S): true = a padded source position, ignored as a key
  bool tgt_is_causal = false;        // target position i attends to target positions 0..i (instead of tgt_mask)
};

class TransformerDecoderLayer : public Module {
 public:
  // self_attn and multihead_attn MultiheadAttention(d_model, nhead, dropout, batch_first), linear1, linear2, and
  // norm1..norm3 LayerNorm(d_model), each initialised as PyTorch initialises it.
  TransformerDecoderLayer(std::int64_t d_model, std::int64_t nhead, const TransformerDecoderLayerOptions& layer = {},
                          const TensorOptions& options = {});

  // tgt (T, N, E) or (N, T, E) with batch_first, or unbatched (T, E); memory (S, N, E) / (N, S, E) / (S, E), the
  // encoder's output -> tgt's shape. Post-norm: x = norm1(x + sa(x)); x = norm2(x + mha(x, memory));
  // x = norm3(x + ff(x)); pre-norm (norm_first) adds each block of the normed x to x instead.
  Tensor forward(const Tensor& tgt, const Tensor& memory, const DecoderMasks& masks = {});
  // A decoder needs the memory: this throws InvalidArgument saying so (use forward(tgt, memory)).
  Tensor forward(const Tensor& tgt) override;
  std::string type_name() const override { return "TransformerDecoderLayer"; }

  TransformerDecoderLayerOptions options;
  std::shared_ptr<MultiheadAttention> self_attn, multihead_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2, dropout3;
  std::shared_ptr<LayerNorm> norm1, norm2, norm3;

 private:
  Tensor self_attention(const Tensor& x, const DecoderMasks& masks);  // dropout1(self_attn(x, x, x))
  Tensor cross_attention(const Tensor& x, const Tensor& memory,
                         const DecoderMasks& masks);  // dropout2(multihead_attn(x, memory, memory))
  Tensor feed_forward(const Tensor& x);               // dropout3(linear2(dropout(act(linear1(x)))))
};

// num_layers TransformerDecoderLayers (each drawn afresh, as the encoder's), each given the same memory and masks,
// then an optional final LayerNorm ("norm").
class TransformerDecoder : public Module {
 public:
  TransformerDecoder(std::int64_t d_model, std::int64_t nhead, std::int64_t num_layers,
                     const TransformerDecoderLayerOptions& layer = {}, bool final_norm = false,
                     const TensorOptions& options = {});

  Tensor forward(const Tensor& tgt, const Tensor& memory, const DecoderMasks& masks = {});
  Tensor forward(const Tensor& tgt) override;  // throws, as TransformerDecoderLayer's
  std::string type_name() const override { return "TransformerDecoder"; }

  std::shared_ptr<ModuleList> layers;  // "layers.0.", "layers.1.", ...
  std::shared_ptr<LayerNorm> norm;     // null without final_norm
};

// nn.Transformer's arguments (PyTorch's defaults: the base model of "Attention Is All You Need").
struct TransformerOptions {
  std::int64_t d_model = 512;
  std::int64_t nhead = 8;
  std::int64_t num_encoder_layers = 6;
  std::int64_t num_decoder_layers = 6;
  TransformerEncoderLayerOptions layer{};  // dim_feedforward, dropout, activation, eps, batch_first, norm_first
};

// Every mask of a whole encoder-decoder pass: the encoder's (src_*), the decoder's (tgt_*, memory_*).
struct TransformerMasks {
  Tensor src_mask{};                 // (S, S) or (N * nhead, S, S)
  Tensor tgt_mask{};                 // (T, T) or (N * nhead, T, T)
  Tensor memory_mask{};              // (T, S) or (N * nhead, T, S)
  Tensor src_key_padding_mask{};     // (N, S) or (S)
  Tensor tgt_key_padding_mask{};     // (N, T) or (T)
  Tensor memory_key_padding_mask{};  // (N, S) or (S): usually src_key_padding_mask again
  bool src_is_causal = false;
  bool tgt_is_causal = false;  // the usual decoder: position i sees the target up to i
};

// PyTorch's nn.Transformer: encoder = TransformerEncoder(num_encoder_layers, final norm), decoder =
// TransformerDecoder(num_decoder_layers, final norm); every parameter of more than one dimension is then drawn
// again by xavier_uniform_, as PyTorch's _reset_parameters does.
class Transformer : public Module {
 public:
  explicit Transformer(const TransformerOptions& transformer = {}, const TensorOptions& options = {});

  // src (S, N, E), tgt (T, N, E) (batch first: (N, S, E), (N, T, E); unbatched: (S, E), (T, E)) -> tgt's shape:
  // decoder(tgt, encoder(src)). src and tgt must agree on the batch and on E = d_model (InvalidArgument).
  Tensor forward(const Tensor& src, const Tensor& tgt, const TransformerMasks& masks = {});
  Tensor forward(const Tensor& src) override;  // throws: a Transformer needs src and tgt
  std::string type_name() const override { return "Transformer"; }

  TransformerOptions options;
  std::shared_ptr<TransformerEncoder> encoder;
  std::shared_ptr<TransformerDecoder> decoder;
};

// PyTorch's Transformer.generate_square_subsequent_mask: (size, size) float32, 0 on and below the diagonal and -inf
// above it (position i may attend to 0..i), on `device`.
Tensor generate_square_subsequent_mask(std::int64_t size, Device device = kCPU);

}  // namespace ferry::nn
