// ferry/nn/attention.h — MultiheadAttention with PyTorch's parameters, names, masks and results
// (nn.MultiheadAttention, 1.13), composed from tensor ops: on any device, differentiated by autograd. Not here: the
// attention of one set of heads (functional::scaled_dot_product_attention in ferry/nn/functional.h), the
// projections' maths (functional::linear).
#pragma once

#include <memory>

#include "ferry/nn/linear.h"
#include "ferry/nn/module.h"

namespace ferry::nn {

struct MultiheadAttentionOptions {
  bool bias = true;          // in_proj_bias and out_proj.bias
  bool batch_first = false;  // PyTorch's default: (L, N, E); true: (N, L, E)
  double dropout = 0;        // on the attention weights, in train() only
};

// What attend() takes besides query, key and value. Masks follow nn.MultiheadAttention: a bool mask is true where
// attention is NOT allowed; a float mask is added to the scores (-inf forbids).
struct AttendOptions {
  Tensor key_padding_mask;      // (N, S) or (S): keys to ignore (padding)
  Tensor attn_mask;             // (L, S) or (N * num_heads, L, S)
  bool is_causal = false;       // query i sees keys 0..i only (L == S; not together with attn_mask)
  bool need_weights = true;     // also return the attention weights
  bool average_attn_weights = true;  // weights (N, L, S) averaged over heads; false: (N, num_heads, L, S)
};

struct AttentionResult {
  Tensor output;   // (L, N, E), or (N, L, E) with batch_first; unbatched inputs (L, E) give (L, E)
  Tensor weights;  // see AttendOptions::average_attn_weights; undefined without need_weights
};

class MultiheadAttention : public Module {
 public:
  // in_proj_weight (3E, E) ~ xavier_uniform; in_proj_bias (3E) = 0; out_proj Linear(E, E) with its bias 0, as
  // PyTorch. embed_dim must divide by num_heads (head_dim = E / num_heads).
  MultiheadAttention(std::int64_t embed_dim, std::int64_t num_heads, const MultiheadAttentionOptions& attention = {},
                     const TensorOptions& options = {});

  AttentionResult attend(const Tensor& query, const Tensor& key, const Tensor& value, const AttendOptions& how = {});
  // Self-attention, for Sequential: attend(input, input, input).output without the weights.
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "MultiheadAttention"; }
  std::string extra_repr() const override;

  std::int64_t embed_dim, num_heads, head_dim;
  MultiheadAttentionOptions attention;
  Tensor in_proj_weight;  // (3E, E): the query, key and value projections, stacked
  Tensor in_proj_bias;    // (3E), undefined without bias
  std::shared_ptr<Linear> out_proj;
};

}  // namespace ferry::nn
