// transformer.cpp — TransformerEncoderLayer and TransformerEncoder: PyTorch's (1.13, the reference path, not its
// fused inference fast path) sequence of modules, each checked against PyTorch on its own and together in a fixture.
#include "ferry/nn/transformer.h"

#include <limits>

#include "ferry/factories.h"
#include "ferry/nn/functional.h"
#include "ferry/ops.h"

namespace ferry::nn {

TransformerEncoderLayer::TransformerEncoderLayer(std::int64_t d_model, std::int64_t nhead,
                                                 const TransformerEncoderLayerOptions& layer,
                                                 const TensorOptions& tensor_options)
    : options(layer) {
  FERRY_CHECK(layer.activation == "relu" || layer.activation == "gelu", InvalidArgument,
              "TransformerEncoderLayer: activation should be relu or gelu, not ",
              ferry::detail::printable(layer.activation));
  FERRY_CHECK(layer.dim_feedforward > 0, InvalidArgument,
              "TransformerEncoderLayer: dim_feedforward must be positive, got ", layer.dim_feedforward);
  const TensorOptions on{.device = tensor_options.device, .dtype = tensor_options.dtype};
  self_attn = register_module("self_attn", std::make_shared<MultiheadAttention>(
                                               d_model, nhead,
                                               MultiheadAttentionOptions{.batch_first = layer.batch_first,
                                                                         .dropout = layer.dropout},
                                               on));
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
  const Tensor hidden = options.activation == "gelu" ? functional::gelu((*linear1)(x)) : relu((*linear1)(x));
  return (*dropout2)((*linear2)((*dropout)(hidden)));
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

Tensor generate_square_subsequent_mask(std::int64_t size, Device device) {
  FERRY_CHECK(size >= 0, InvalidArgument, "generate_square_subsequent_mask: size must be non-negative, got ", size);
  return triu(full({size, size}, -std::numeric_limits<double>::infinity(), {.device = device}), 1);
}

}  // namespace ferry::nn
