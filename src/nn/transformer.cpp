// transformer.cpp — the encoder and decoder layers, their stacks and nn::Transformer: PyTorch's (1.13, the reference
// path, not its fused inference fast path) sequence of modules, each checked against PyTorch in a fixture.
#include "ferry/nn/transformer.h"

#include <limits>

#include "ferry/factories.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/init.h"
#include "ferry/ops.h"

namespace ferry::nn {
namespace {

void check_layer_options(const char* who, const TransformerEncoderLayerOptions& layer) {
  FERRY_CHECK(layer.activation == "relu" || layer.activation == "gelu", InvalidArgument, who,
              ": activation should be relu or gelu, not ", ferry::detail::printable(layer.activation));
  FERRY_CHECK(layer.dim_feedforward > 0, InvalidArgument, who, ": dim_feedforward must be positive, got ",
              layer.dim_feedforward);
}

// linear2(dropout(act(linear1(x)))): the feed-forward block of both layers, before its last dropout.
Tensor feed_forward_block(const TransformerEncoderLayerOptions& options, Linear& linear1, Dropout& dropout,
                          Linear& linear2, const Tensor& x) {
  const Tensor hidden = options.activation == "gelu" ? functional::gelu(linear1(x)) : relu(linear1(x));
  return linear2(dropout(hidden));
}

std::shared_ptr<MultiheadAttention> attention(std::int64_t d_model, std::int64_t nhead,
                                              const TransformerEncoderLayerOptions& layer, const TensorOptions& on) {
  return std::make_shared<MultiheadAttention>(
      d_model, nhead, MultiheadAttentionOptions{.batch_first = layer.batch_first, .dropout = layer.dropout}, on);
}

}  // namespace

TransformerEncoderLayer::TransformerEncoderLayer(std::int64_t d_model, std::int64_t nhead,
                                                 const TransformerEncoderLayerOptions& layer,
                                                 const TensorOptions& tensor_options)
    : options(layer) {
  check_layer_options("TransformerEncoderLayer", layer);
  const TensorOptions on{.device = tensor_options.device, .dtype = tensor_options.dtype};
  self_attn = register_module("self_attn", attention(d_model, nhead, layer, on));
  linear1 = register_module("linear1", std::make_shared<Linear>(d_model, layer.dim_feedforward, true, on));
  dropout = register_module("dropout", std::make_shared<Dropout>(layer.dropout));
  linear2 = register_module("linear2", std::make_shared<Linear>(layer.dim_feedforward, d_model, true, on));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(Shape{d_model}, layer.layer_norm_eps, true, on));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(Shape{d_model}, layer.layer_norm_eps, true, on));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(layer.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(layer.dropout));
}

Tensor TransformerEncoderLayer::self_attention(const Tensor& x, const EncoderMasks& masks) {
  AttendOptions how;
  how.attn_mask = masks.mask;
  how.key_padding_mask = masks.src_key_padding_mask;
  how.is_causal = masks.is_causal;
  how.need_weights = false;
  return (*dropout1)(self_attn->attend(x, x, x, how).output);
}

Tensor TransformerEncoderLayer::feed_forward(const Tensor& x) {
  return (*dropout2)(feed_forward_block(options, *linear1, *dropout, *linear2, x));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const EncoderMasks& masks) {
  Tensor x = src;
  if (options.norm_first) {
    x = add(x, self_attention((*norm1)(x), masks));
    return add(x, feed_forward((*norm2)(x)));
  }
  x = (*norm1)(add(x, self_attention(x, masks)));
  return (*norm2)(add(x, feed_forward(x)));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src) { return forward(src, EncoderMasks{}); }

TransformerEncoder::TransformerEncoder(std::int64_t d_model, std::int64_t nhead, std::int64_t num_layers,
                                       const TransformerEncoderLayerOptions& layer, bool final_norm,
                                       const TensorOptions& tensor_options) {
  FERRY_CHECK(num_layers > 0, InvalidArgument, "TransformerEncoder: num_layers must be positive, got ", num_layers);
  layers = register_module("layers", std::make_shared<ModuleList>());
  for (std::int64_t i = 0; i < num_layers; ++i) {
    layers->push_back(std::make_shared<TransformerEncoderLayer>(d_model, nhead, layer, tensor_options));
  }
  if (final_norm) {
    norm = register_module("norm", std::make_shared<LayerNorm>(Shape{d_model}, layer.layer_norm_eps, true,
                                                               TensorOptions{.device = tensor_options.device,
                                                                             .dtype = tensor_options.dtype}));
  }
}

Tensor TransformerEncoder::forward(const Tensor& src, const EncoderMasks& masks) {
  Tensor x = src;
  for (const auto& child : layers->children()) x = static_cast<TransformerEncoderLayer&>(*child).forward(x, masks);
  return norm ? (*norm)(x) : x;
}

Tensor TransformerEncoder::forward(const Tensor& src) { return forward(src, EncoderMasks{}); }

TransformerDecoderLayer::TransformerDecoderLayer(std::int64_t d_model, std::int64_t nhead,
                                                 const TransformerDecoderLayerOptions& layer,
                                                 const TensorOptions& tensor_options)
    : options(layer) {
  check_layer_options("TransformerDecoderLayer", layer);
  const TensorOptions on{.device = tensor_options.device, .dtype = tensor_options.dtype};
  self_attn = register_module("self_attn", attention(d_model, nhead, layer, on));
  multihead_attn = register_module("multihead_attn", attention(d_model, nhead, layer, on));
  linear1 = register_module("linear1", std::make_shared<Linear>(d_model, layer.dim_feedforward, true, on));
  dropout = register_module("dropout", std::make_shared<Dropout>(layer.dropout));
  linear2 = register_module("linear2", std::make_shared<Linear>(layer.dim_feedforward, d_model, true, on));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(Shape{d_model}, layer.layer_norm_eps, true, on));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(Shape{d_model}, layer.layer_norm_eps, true, on));
  norm3 = register_module("norm3", std::make_shared<LayerNorm>(Shape{d_model}, layer.layer_norm_eps, true, on));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(layer.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(layer.dropout));
  dropout3 = register_module("dropout3", std::make_shared<Dropout>(layer.dropout));
}

Tensor TransformerDecoderLayer::self_attention(const Tensor& x, const DecoderMasks& masks) {
  AttendOptions how;
  how.attn_mask = masks.tgt_mask;
  how.key_padding_mask = masks.tgt_key_padding_mask;
  how.is_causal = masks.tgt_is_causal;
  how.need_weights = false;
  return (*dropout1)(self_attn->attend(x, x, x, how).output);
}

Tensor TransformerDecoderLayer::cross_attention(const Tensor& x, const Tensor& memory, const DecoderMasks& masks) {
  AttendOptions how;
  how.attn_mask = masks.memory_mask;
  how.key_padding_mask = masks.memory_key_padding_mask;
  how.need_weights = false;
  return (*dropout2)(multihead_attn->attend(x, memory, memory, how).output);
}

Tensor TransformerDecoderLayer::feed_forward(const Tensor& x) {
  return (*dropout3)(feed_forward_block(options, *linear1, *dropout, *linear2, x));
}

Tensor TransformerDecoderLayer::forward(const Tensor& tgt, const Tensor& memory, const DecoderMasks& masks) {
  FERRY_CHECK(memory.defined(), InvalidArgument, "TransformerDecoderLayer: the memory (the encoder's output) is "
              "undefined");
  Tensor x = tgt;
  if (options.norm_first) {
    x = add(x, self_attention((*norm1)(x), masks));
    x = add(x, cross_attention((*norm2)(x), memory, masks));
    return add(x, feed_forward((*norm3)(x)));
  }
  x = (*norm1)(add(x, self_attention(x, masks)));
  x = (*norm2)(add(x, cross_attention(x, memory, masks)));
  return (*norm3)(add(x, feed_forward(x)));
}

Tensor TransformerDecoderLayer::forward(const Tensor&) {
  throw InvalidArgument(
      "TransformerDecoderLayer needs the encoder's output as well: call forward(tgt, memory[, masks])");
}

TransformerDecoder::TransformerDecoder(std::int64_t d_model, std::int64_t nhead, std::int64_t num_layers,
                                       const TransformerDecoderLayerOptions& layer, bool final_norm,
                                       const TensorOptions& tensor_options) {
  FERRY_CHECK(num_layers > 0, InvalidArgument, "TransformerDecoder: num_layers must be positive, got ", num_layers);
  layers = register_module("layers", std::make_shared<ModuleList>());
  for (std::int64_t i = 0; i < num_layers; ++i) {
    layers->push_back(std::make_shared<TransformerDecoderLayer>(d_model, nhead, layer, tensor_options));
  }
  if (final_norm) {
    norm = register_module("norm", std::make_shared<LayerNorm>(Shape{d_model}, layer.layer_norm_eps, true,
                                                               TensorOptions{.device = tensor_options.device,
                                                                             .dtype = tensor_options.dtype}));
  }
}

Tensor TransformerDecoder::forward(const Tensor& tgt, const Tensor& memory, const DecoderMasks& masks) {
  Tensor x = tgt;
  for (const auto& child : layers->children()) {
    x = static_cast<TransformerDecoderLayer&>(*child).forward(x, memory, masks);
  }
  return norm ? (*norm)(x) : x;
}

Tensor TransformerDecoder::forward(const Tensor&) {
  throw InvalidArgument("TransformerDecoder needs the encoder's output as well: call forward(tgt, memory[, masks])");
}

Transformer::Transformer(const TransformerOptions& transformer, const TensorOptions& tensor_options)
    : options(transformer) {
  encoder = register_module("encoder", std::make_shared<TransformerEncoder>(
                                           transformer.d_model, transformer.nhead, transformer.num_encoder_layers,
                                           transformer.layer, true, tensor_options));
  decoder = register_module("decoder", std::make_shared<TransformerDecoder>(
                                           transformer.d_model, transformer.nhead, transformer.num_decoder_layers,
                                           transformer.layer, true, tensor_options));
  for (Tensor& p : parameters()) {
    if (p.dim() > 1) init::xavier_uniform_(p);
  }
}

Tensor Transformer::forward(const Tensor& src, const Tensor& tgt, const TransformerMasks& masks) {
  FERRY_CHECK(src.defined() && tgt.defined(), InvalidArgument, "Transformer: src and tgt must both be defined");
  FERRY_CHECK(src.dim() == tgt.dim() && (src.dim() == 2 || src.dim() == 3), InvalidArgument,
              "Transformer: src and tgt should both be (length, batch, d_model) (batch first: (batch, length, "
              "d_model)) or both unbatched (length, d_model); got src ", shape_str(src.shape()), " and tgt ", shape_str(tgt.shape()));
  const int batch_dim = options.layer.batch_first ? 0 : 1;
  FERRY_CHECK(src.dim() == 2 || src.size(batch_dim) == tgt.size(batch_dim), InvalidArgument,
              "Transformer: src and tgt must hold the same batch, got ", src.size(batch_dim), " and ",
              tgt.size(batch_dim), " (src ", shape_str(src.shape()), ", tgt ", shape_str(tgt.shape()),
              options.layer.batch_first ? ", batch first)" : ", sequence first)");
  FERRY_CHECK(src.size(-1) == options.d_model && tgt.size(-1) == options.d_model, InvalidArgument,
              "Transformer: the last dimension of src and tgt must be d_model = ", options.d_model, ", got src ",
              shape_str(src.shape()), " and tgt ", shape_str(tgt.shape()));
  const Tensor memory = encoder->forward(src, EncoderMasks{.mask = masks.src_mask,
                                                           .src_key_padding_mask = masks.src_key_padding_mask,
                                                           .is_causal = masks.src_is_causal});
  return decoder->forward(tgt, memory,
                          DecoderMasks{.tgt_mask = masks.tgt_mask,
                                       .memory_mask = masks.memory_mask,
                                       .tgt_key_padding_mask = masks.tgt_key_padding_mask,
                                       .memory_key_padding_mask = masks.memory_key_padding_mask,
                                       .tgt_is_causal = masks.tgt_is_causal});
}

Tensor Transformer::forward(const Tensor&) {
  throw InvalidArgument("Transformer needs a source and a target: call forward(src, tgt[, masks])");
}

Tensor generate_square_subsequent_mask(std::int64_t size, Device device) {
  FERRY_CHECK(size >= 0, InvalidArgument, "generate_square_subsequent_mask: size must be non-negative, got ", size);
  return triu(full({size, size}, -std::numeric_limits<double>::infinity(), {.device = device}), 1);
}

}  // namespace ferry::nn
