// layernorm_embedding.cpp — the LayerNorm and Embedding layers: PyTorch's parameters and initialisation around
// functional::layer_norm and functional::embedding (composed_layers.cpp).
#include "ferry/autograd.h"
#include "ferry/factories.h"
#include "ferry/nn/embedding.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/init.h"
#include "ferry/nn/layernorm.h"
#include "ferry/ops.h"

namespace ferry::nn {

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, const TensorOptions& options)
    : normalized_shape(std::move(normalized_shape)), eps(eps) {
  FERRY_CHECK(!this->normalized_shape.empty(), InvalidArgument, "LayerNorm: normalized_shape is empty");
  for (const std::int64_t d : this->normalized_shape)
    FERRY_CHECK(d >= 1, InvalidArgument, "LayerNorm: normalized_shape ", shape_str(this->normalized_shape),
                " has a dim below 1");
  FERRY_CHECK(eps > 0, InvalidArgument, "LayerNorm: eps must be > 0, got ", eps);
  if (elementwise_affine) {
    const TensorOptions like{.device = options.device, .dtype = options.dtype};
    weight = register_parameter("weight", ones(this->normalized_shape, like));
    bias = register_parameter("bias", zeros(this->normalized_shape, like));
  }
}

Tensor LayerNorm::forward(const Tensor& input) {
  return functional::layer_norm(input, normalized_shape, weight, bias, eps);
}

std::string LayerNorm::extra_repr() const {
  std::string shape = "(";
  for (std::size_t i = 0; i < normalized_shape.size(); ++i)
    shape += ferry::detail::concat(i ? ", " : "", normalized_shape[i]);
  shape += normalized_shape.size() == 1 ? ",)" : ")";
  return ferry::detail::concat(shape, ", eps=", eps, ", elementwise_affine=", weight.defined() ? "True" : "False");
}

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, std::optional<std::int64_t> padding_idx,
                     const TensorOptions& options)
    : num_embeddings(num_embeddings), embedding_dim(embedding_dim) {
  FERRY_CHECK(num_embeddings >= 1 && embedding_dim >= 1, InvalidArgument,
              "Embedding: expected num_embeddings and embedding_dim >= 1, got ", num_embeddings, " and ",
              embedding_dim);
  if (padding_idx) {
    FERRY_CHECK(*padding_idx >= -num_embeddings && *padding_idx < num_embeddings, InvalidArgument,
                "Embedding: padding_idx must be within num_embeddings (", num_embeddings, "), got ", *padding_idx);
    this->padding_idx = *padding_idx < 0 ? *padding_idx + num_embeddings : *padding_idx;
  }
  weight = register_parameter("weight", empty({num_embeddings, embedding_dim},
                                              {.device = options.device, .dtype = options.dtype}));
  init::normal_(weight);
  if (this->padding_idx) {
    autograd::NoGradGuard no_grad;
    weight.select(0, *this->padding_idx).zero_();
  }
}

Tensor Embedding::forward(const Tensor& indices) { return functional::embedding(indices, weight, padding_idx); }

std::string Embedding::extra_repr() const {
  return ferry::detail::concat(num_embeddings, ", ", embedding_dim,
                               padding_idx ? ferry::detail::concat(", padding_idx=", *padding_idx) : std::string());
}

}  // namespace ferry::nn
