// attention.cpp — scaled_dot_product_attention and MultiheadAttention (ferry/nn/attention.h), composed from tensor
// ops (matmul, masked_fill, softmax, dropout), so they run on every device and autograd differentiates them; the
// order of operations is PyTorch 1.13's (the query divided by sqrt(head_dim) before the product, the weights
// returned after dropout, averaged over heads).
#include <cmath>
#include <limits>

#include "checks.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/nn/attention.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/init.h"
#include "ferry/ops.h"

namespace ferry::nn {

namespace {

constexpr double kMinusInfinity = -std::numeric_limits<double>::infinity();

// (L, S) bool on `device`: true where key j comes after query i (what a causal mask forbids).
Tensor causal_forbidden(std::int64_t queries, std::int64_t keys, Device device) {
  const Tensor rows = arange(0, static_cast<double>(queries), 1, {.device = device, .dtype = DType::Int64});
  const Tensor cols = arange(0, static_cast<double>(keys), 1, {.device = device, .dtype = DType::Int64});
  return gt(cols.unsqueeze(0), rows.unsqueeze(1));
}


// softmax(scores + additive, masked -inf where forbidden), then dropout: the attention weights.
Tensor attention_weights(Tensor scores, const Tensor& additive, const Tensor& forbidden, double dropout_p,
                         bool training) {
  if (additive.defined()) scores = add(scores, additive);
  if (forbidden.defined()) scores = masked_fill(scores, forbidden, kMinusInfinity);
  Tensor weights = softmax(scores, -1);
  if (dropout_p > 0 && training) weights = functional::dropout(weights, dropout_p, true);
  return weights;
}

}  // namespace

namespace functional {

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale) {
  const char* op = "scaled_dot_product_attention";
  for (const auto& [t, what] : {std::pair{&query, "query"}, std::pair{&key, "key"}, std::pair{&value, "value"}}) {
    check_floating(op, *t, what);
    FERRY_CHECK(t->dim() >= 2, ShapeMismatch, op, ": ", what, " needs (..., length, features), got ",
                shape_str(t->shape()));
  }
  FERRY_CHECK(query.size(-1) == key.size(-1) && key.size(-2) == value.size(-2), ShapeMismatch, op,
              ": expected query (..., L, E), key (..., S, E), value (..., S, Ev); got ", shape_str(query.shape()), ", ",
              shape_str(key.shape()), ", ", shape_str(value.shape()));
  FERRY_CHECK(!(is_causal && attn_mask.defined()), InvalidArgument, op,
              ": is_causal makes its own mask; pass either it or attn_mask");
  FERRY_CHECK(dropout_p >= 0 && dropout_p < 1, InvalidArgument, op, ": dropout_p must be in [0, 1), got ", dropout_p);
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(query.size(-1))));
  const Tensor scores = mul(matmul(query, key.transpose(-2, -1)), s);
  Tensor additive, forbidden;
  if (is_causal) forbidden = causal_forbidden(query.size(-2), key.size(-2), query.device());
  if (attn_mask.defined()) {
    if (attn_mask.dtype() == DType::Bool) forbidden = logical_not(attn_mask);  // true here means "may attend"
    else additive = attn_mask;
  }
  return matmul(attention_weights(scores, additive, forbidden, dropout_p, true), value);
}

}  // namespace functional

MultiheadAttention::MultiheadAttention(std::int64_t embed_dim, std::int64_t num_heads,
                                       const MultiheadAttentionOptions& attention, const TensorOptions& options)
    : embed_dim(embed_dim), num_heads(num_heads), head_dim(num_heads > 0 ? embed_dim / num_heads : 0),
      attention(attention) {
  FERRY_CHECK(embed_dim >= 1 && num_heads >= 1 && embed_dim % num_heads == 0, InvalidArgument,
              "MultiheadAttention: embed_dim must be divisible by num_heads, got ", embed_dim, " and ", num_heads);
  FERRY_CHECK(attention.dropout >= 0 && attention.dropout < 1, InvalidArgument,
              "MultiheadAttention: dropout must be in [0, 1), got ", attention.dropout);
  const TensorOptions like{.device = options.device, .dtype = options.dtype};
  in_proj_weight = register_parameter("in_proj_weight", empty({3 * embed_dim, embed_dim}, like));
  init::xavier_uniform_(in_proj_weight);
  if (attention.bias) in_proj_bias = register_parameter("in_proj_bias", zeros({3 * embed_dim}, like));
  out_proj = register_module("out_proj", std::make_shared<Linear>(embed_dim, embed_dim, attention.bias, like));
  if (attention.bias) init::zeros_(out_proj->bias);
}

AttentionResult MultiheadAttention::attend(const Tensor& query, const Tensor& key, const Tensor& value,
                                           const AttendOptions& how) {
  const char* op = "MultiheadAttention";
  const bool batched = query.dim() == 3;
  for (const auto& [t, what] : {std::pair{&query, "query"}, std::pair{&key, "key"}, std::pair{&value, "value"}}) {
    FERRY_CHECK(t->dim() == query.dim() && (t->dim() == 2 || t->dim() == 3) && t->size(-1) == embed_dim,
                ShapeMismatch, op, ": expected query, key and value all (L, N, E), (N, L, E) with batch_first, or "
                "unbatched (L, E), with E = embed_dim = ", embed_dim, "; ", what, " is ", shape_str(t->shape()));
  }
  // Batch first inside: (N, L, E).
  const auto batch_first = [&](const Tensor& t) {
    return !batched ? t.unsqueeze(0) : attention.batch_first ? t : t.transpose(0, 1);
  };
  const Tensor q = batch_first(query), k = batch_first(key), v = batch_first(value);
  const std::int64_t n = q.size(0), l = q.size(1), s = k.size(1), e = embed_dim, h = num_heads, d = head_dim;
  FERRY_CHECK(k.size(0) == n && v.size(0) == n && v.size(1) == s, ShapeMismatch, op,
              ": key and value must have the query's batch and each other's length; got query ",
              shape_str(query.shape()), ", key ", shape_str(key.shape()), ", value ", shape_str(value.shape()));
  const auto project = [&](const Tensor& x, std::int64_t which, std::int64_t length) {  // (N, len, E) -> (N, H, len, D)
    const Tensor w = in_proj_weight.narrow(0, which * e, e);
    const Tensor b = in_proj_bias.defined() ? in_proj_bias.narrow(0, which * e, e) : Tensor();
    return functional::linear(x, w, b).reshape({n, length, h, d}).transpose(1, 2);
  };
  const Tensor qh = project(q, 0, l), kh = project(k, 1, s), vh = project(v, 2, s);

  // The masks, as (N, H, L, S)-broadcastable "forbidden" (bool) and "additive" (float) parts.
  Tensor forbidden, additive;
  const auto forbid = [&](const Tensor& more) { forbidden = forbidden.defined() ? logical_or(forbidden, more) : more; };
  const auto add_to = [&](const Tensor& more) { additive = additive.defined() ? add(additive, more) : more; };
  FERRY_CHECK(!(how.is_causal && how.attn_mask.defined()), InvalidArgument, op,
              ": is_causal makes its own mask; pass either it or attn_mask");
  if (how.is_causal) forbid(causal_forbidden(l, s, q.device()));
  if (how.attn_mask.defined()) {
    const Tensor& m = how.attn_mask;
    const bool per_head = m.dim() == 3;
    FERRY_CHECK((m.dim() == 2 && m.size(0) == l && m.size(1) == s) ||
                    (per_head && m.size(0) == n * h && m.size(1) == l && m.size(2) == s),
                ShapeMismatch, op, ": attn_mask must be (L, S) = (", l, ", ", s, ") or (N * num_heads, L, S) = (",
                n * h, ", ", l, ", ", s, "), got ", shape_str(m.shape()));
    const Tensor shaped = per_head ? m.reshape({n, h, l, s}) : m;
    if (m.dtype() == DType::Bool) forbid(shaped);
    else add_to(shaped);
  }
  if (how.key_padding_mask.defined()) {
    const Tensor& m = how.key_padding_mask;
    FERRY_CHECK((batched && m.dim() == 2 && m.size(0) == n && m.size(1) == s) ||
                    (!batched && m.dim() == 1 && m.size(0) == s),
                ShapeMismatch, op, ": key_padding_mask must be (N, S) = (", n, ", ", s, "), or (S) unbatched; got ",
                shape_str(m.shape()));
    const Tensor shaped = m.reshape({n, 1, 1, s});
    if (m.dtype() == DType::Bool) forbid(shaped);
    else add_to(shaped);
  }

  const Tensor scores = matmul(div(qh, std::sqrt(static_cast<double>(d))), kh.transpose(-2, -1));  // (N, H, L, S)
  const Tensor weights = attention_weights(scores, additive, forbidden, attention.dropout, is_training());
  const Tensor heads = matmul(weights, vh);  // (N, H, L, D)
  Tensor out = (*out_proj)(heads.transpose(1, 2).reshape({n, l, e}));  // (N, L, E)
  AttentionResult result;
  result.output = !batched ? out.squeeze(0) : attention.batch_first ? out : out.transpose(0, 1);
  if (how.need_weights) {
    Tensor w = how.average_attn_weights ? mean(weights, {1}) : weights;
    result.weights = batched ? w : w.squeeze(0);
  }
  return result;
}

Tensor MultiheadAttention::forward(const Tensor& input) {
  AttendOptions how;
  how.need_weights = false;
  return attend(input, input, input, how).output;
}

std::string MultiheadAttention::extra_repr() const {
  return ferry::detail::concat("embed_dim=", embed_dim, ", num_heads=", num_heads,
                               ", batch_first=", attention.batch_first ? "True" : "False");
}

}  // namespace ferry::nn
