// gather.cpp — indexing element by element along one dim and running sums: gather (torch.gather), scatter_add
// (torch.scatter_add), index_add (composed of scatter_add), cumsum (torch.cumsum), with their backwards. The
// kernels (ferry/backend.h) take contiguous (outer, n, inner) blocks; PyTorch's shape rules (the index may be
// smaller than the tensors in every dim but `dim`) and the views that cut the tensors down to those blocks are here.
#include <cmath>
#include <utility>

#include "ferry/autograd.h"
#include "ferry/factories.h"
#include "ferry/ops.h"
#include "internal.h"

namespace ferry {

namespace {

// (outer, inner): the elements before and after dim d of `shape`.
std::pair<std::int64_t, std::int64_t> around(const Shape& shape, int d) {
  std::int64_t outer = 1, inner = 1;
  for (int k = 0; k < d; ++k) outer *= shape[static_cast<std::size_t>(k)];
  for (std::size_t k = static_cast<std::size_t>(d) + 1; k < shape.size(); ++k) inner *= shape[k];
  return {outer, inner};
}

// `a` cut down (a view) to `sizes` in every dim but `keep` (keep = -1: in every dim).
Tensor narrow_to(const Tensor& a, const Shape& sizes, int keep) {
  Tensor out = a;
  for (int k = 0; k < a.dim(); ++k) {
    const std::int64_t size = sizes[static_cast<std::size_t>(k)];
    if (k != keep && size != a.size(k)) out = out.narrow(k, 0, size);
  }
  return out;
}

// PyTorch's rules for the index of gather and scatter_add: an integer tensor with self's number of dims, no larger
// than self in the dims other than d, and (scatter_add) no larger than src in any dim. Returns the index as
// contiguous int64.
Tensor checked_index(const char* op, const Tensor& self, int d, const Tensor& index, const Tensor* src) {
  FERRY_CHECK(index.dtype() == DType::Int64 || index.dtype() == DType::Int32, DTypeMismatch, op,
              "(): Expected dtype int64 for index, got ", dtype_name(index.dtype()));
  FERRY_CHECK(index.dim() == self.dim() || (index.dim() <= 1 && self.dim() <= 1), ShapeMismatch, op,
              "(): Index tensor must have the same number of dimensions as ", src ? "self" : "input", " tensor (index ",
              shape_str(index.shape()), ", ", src ? "self " : "input ", shape_str(self.shape()), ")");
  for (int k = 0; k < index.dim() && index.dim() == self.dim(); ++k) {
    FERRY_CHECK(k == d || index.size(k) <= self.size(k), ShapeMismatch, op, "(): Size does not match at dimension ", k,
                " expected index ", shape_str(index.shape()), " to be smaller than ", src ? "self " : "input ",
                shape_str(self.shape()), " apart from dimension ", d);
  }
  if (src) {
    FERRY_CHECK(src->dim() == index.dim() || (src->dim() <= 1 && index.dim() <= 1), ShapeMismatch, op,
                "(): Index tensor must have the same number of dimensions as src tensor (index ",
                shape_str(index.shape()), ", src ", shape_str(src->shape()), ")");
    for (int k = 0; k < index.dim() && src->dim() == index.dim(); ++k) {
      FERRY_CHECK(index.size(k) <= src->size(k), ShapeMismatch, op, "(): Size does not match at dimension ", k,
                  " expected index ", shape_str(index.shape()), " to be smaller than src ", shape_str(src->shape()));
    }
  }
  return index.to(DType::Int64).contiguous();
}

// At least 1-d: a 0-d tensor as the one-element vector PyTorch treats it as.
Tensor as_1d(const Tensor& t) { return t.dim() == 0 ? t.reshape({1}) : t; }

// out (idx's shape) = a's elements picked by idx along d. No autograd.
Tensor gather_values(const Tensor& a_in, int d, const Tensor& idx_in) {
  const Tensor a = as_1d(a_in), idx = as_1d(idx_in);
  const Tensor block = narrow_to(a, idx.shape(), d).contiguous();
  const auto [outer, inner] = around(idx.shape(), d);
  Tensor out = make_tensor(idx.shape(), {.device = a.device(), .dtype = a.dtype()});
  backend(a.device()).gather(detail::kernel_view(out), detail::kernel_view(block), detail::kernel_flat(idx), outer,
                             block.size(d), inner, detail::compute_stream(a.device()));
  return out.reshape(idx_in.shape());
}

// base (contiguous, not shared) += src's elements (the first idx.shape() of them) added along d at idx. No autograd.
void scatter_add_into(Tensor& base_in, int d, const Tensor& idx_in, const Tensor& src_in) {
  Tensor base = as_1d(base_in);
  const Tensor idx = as_1d(idx_in), src = as_1d(src_in);
  const Tensor block = narrow_to(src, idx.shape(), -1).to(base.dtype()).contiguous();
  const auto [outer, inner] = around(idx.shape(), d);
  Shape target_shape = idx.shape();
  target_shape[static_cast<std::size_t>(d)] = base.size(d);
  // Where the index covers base in every other dim, the kernel adds into base itself; else into a block of the
  // index's extent, added to that corner of base.
  const bool whole = target_shape == base.shape();
  Tensor target = whole ? base : zeros(target_shape, {.device = base.device(), .dtype = base.dtype()});
  backend(base.device()).scatter_add(detail::kernel_view(target), detail::kernel_view(block), detail::kernel_flat(idx),
                                     outer, base.size(d), inner, detail::compute_stream(base.device()));
  if (!whole) {
    Tensor corner = narrow_to(base, target_shape, d);
    corner.add_(target);
  }
}

}  // namespace

Tensor gather(const Tensor& a, int dim, const Tensor& index) {
  check_same_device("gather", {&a, &index});
  const int d = normalize_dim(dim, a.dim(), "gather");
  const Tensor idx = checked_index("gather", a, d, index, nullptr);
  Tensor out = gather_values(a.detach(), d, idx);
  if (autograd::needs_grad({&a})) {
    // d out / d a: each picked element's gradient added back where it was picked from (twice picked: twice added)
    autograd::record("gather", {a, index}, out, [shape = a.shape(), d, idx](const Tensor& g) {
      Tensor grad = zeros(shape, {.device = g.device(), .dtype = g.dtype()});
      scatter_add_into(grad, d, idx, g);
      return std::vector<Tensor>{grad, Tensor()};
    });
  }
  return out;
}

Tensor scatter_add(const Tensor& self, int dim, const Tensor& index, const Tensor& src) {
  check_same_device("scatter_add", {&self, &index, &src});
  const int d = normalize_dim(dim, self.dim(), "scatter_add");
  FERRY_CHECK(self.dtype() == src.dtype(), DTypeMismatch, "scatter_add(): Expected self.dtype to be equal to "
              "src.dtype (self ", dtype_name(self.dtype()), ", src ", dtype_name(src.dtype()), ")");
  FERRY_CHECK(self.dtype() != DType::Bool, DTypeMismatch, "scatter_add(): not implemented for 'Bool' (a sum of "
              "bools is not a bool; .to(DType::Int64) first)");
  const Tensor idx = checked_index("scatter_add", self, d, index, &src);
  Tensor out = self.detach().clone();  // contiguous, and self is left as it was
  scatter_add_into(out, d, idx, src.detach());
  if (autograd::needs_grad({&self, &src})) {
    autograd::record("scatter_add", {self, index, src}, out,
                     [d, idx, src_shape = src.shape(), src_needs = src.requires_grad()](const Tensor& g) {
      Tensor grad_src;
      if (src_needs) {  // what each source element was added into
        grad_src = gather_values(g, d, idx);
        if (grad_src.shape() != src_shape) {  // src beyond the index's extent added nowhere: gradient 0
          Tensor full = zeros(src_shape, {.device = g.device(), .dtype = g.dtype()});
          narrow_to(full, idx.shape(), -1).copy_(grad_src);
          grad_src = full;
        }
      }
      return std::vector<Tensor>{g, Tensor(), grad_src};
    });
  }
  return out;
}

Tensor index_add(const Tensor& self, int dim, const Tensor& index, const Tensor& source, double alpha) {
  check_same_device("index_add", {&self, &index, &source});
  FERRY_CHECK(self.dim() >= 1, InvalidArgument, "index_add(): self must have at least one dim, got a 0-d tensor");
  const int d = normalize_dim(dim, self.dim(), "index_add");
  FERRY_CHECK(is_floating(self.dtype()) || alpha == std::trunc(alpha), InvalidArgument, "index_add(): alpha ", alpha,
              " is not a whole number and self is ", dtype_name(self.dtype()), ": it would be truncated");
  FERRY_CHECK(index.dim() <= 1 && (index.dtype() == DType::Int64 || index.dtype() == DType::Int32), InvalidArgument,
              "index_add(): index must be a 1-d int64 (or int32) tensor, got ", dtype_name(index.dtype()), " of shape ",
              shape_str(index.shape()));
  FERRY_CHECK(source.dim() == self.dim(), ShapeMismatch, "index_add(): source ", shape_str(source.shape()),
              " and self ", shape_str(self.shape()), " must have the same number of dims");
  Shape want = self.shape();
  want[d] = index.numel();
  FERRY_CHECK(source.shape() == want, ShapeMismatch, "index_add(): source ", shape_str(source.shape()),
              " must be self's shape ", shape_str(self.shape()), " with ", index.numel(), " (the number of indices) "
              "in dim ", d, ": ", shape_str(want));
  Shape along(self.dim(), 1);
  along[d] = index.numel();
  const Tensor idx = index.to(DType::Int64).reshape(along).expand(source.shape()).contiguous();
  return scatter_add(self, d, idx, alpha == 1 ? source : mul(source, alpha));
}

Tensor cumsum(const Tensor& a, int dim) {
  const int d = normalize_dim(dim, a.dim(), "cumsum");
  // Integers and bools sum as int64, as PyTorch's cumsum (its default dtype for integral inputs).
  const DType dtype = is_floating(a.dtype()) ? a.dtype() : DType::Int64;
  const Tensor x = as_1d(a.detach()).to(dtype).contiguous();
  const auto [outer, inner] = around(x.shape(), d);
  Tensor out = make_tensor(x.shape(), {.device = x.device(), .dtype = dtype});
  backend(x.device()).cumsum(detail::kernel_view(out), detail::kernel_view(x), outer, x.size(d), inner,
                             detail::compute_stream(x.device()));
  out = out.reshape(a.shape());
  if (autograd::needs_grad({&a})) {
    // d out_j / d a_k = 1 for k <= j: the gradient is the running sum of g from the far end.
    autograd::record("cumsum", {a}, out, [d](const Tensor& g) {
      if (g.dim() == 0) return std::vector<Tensor>{g};
      return std::vector<Tensor>{flip(cumsum(flip(g, {d}), d), {d})};
    });
  }
  return out;
}

}  // namespace ferry
