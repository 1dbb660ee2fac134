// ferry/nn/embedding.h — Embedding: a table of learned vectors looked up by integer index (token embeddings),
// PyTorch's parameter name, initialisation and padding_idx. Not here: the lookup (functional::embedding in
// ferry/nn/functional.h, an index_select whose backward adds the gradients into the picked rows).
#pragma once

#include <optional>

#include "ferry/nn/module.h"

namespace ferry::nn {

class Embedding : public Module {
 public:
  // weight (num_embeddings, embedding_dim) ~ N(0, 1), from ferry's generator on options.device; the row
  // padding_idx (negative: from the end) is zero and gets no gradient.
  Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim,
            std::optional<std::int64_t> padding_idx = std::nullopt, const TensorOptions& options = {});

  Tensor forward(const Tensor& indices) override;  // int64 (*) -> (*, embedding_dim)
  std::string type_name() const override { return "Embedding"; }
  std::string extra_repr() const override;

  std::int64_t num_embeddings, embedding_dim;
  std::optional<std::int64_t> padding_idx;  // in [0, num_embeddings) once made
  Tensor weight;                            // (num_embeddings, embedding_dim)
};

}  // namespace ferry::nn
