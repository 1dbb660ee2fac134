// sort.cpp — sort, argsort and topk along one dim. The backend sorts the rows of a contiguous (rows, n) block
// (a stable argsort: ferry/backend.h), so the sorted dim is moved last first and the order moved back after; the
// values are then picked with gather, which copies them bit for bit and carries the gradient back to where each
// value came from.
#include "ferry/autograd.h"
#include "ferry/factories.h"
#include "ferry/ops.h"
#include "internal.h"

namespace ferry {

Tensor argsort(const Tensor& a, int dim, bool descending) {
  const int d = normalize_dim(dim, a.dim(), "argsort");
  const TensorOptions int64{.device = a.device(), .dtype = DType::Int64};
  if (a.dim() == 0) return zeros({}, int64);
  autograd::NoGradGuard no_grad;
  const int last = a.dim() - 1;
  const Tensor rows = a.detach().transpose(d, last).contiguous();  // (..., n): one row per position of the rest
  const std::int64_t n = rows.size(last), count = n == 0 ? 0 : rows.numel() / n;
  Tensor order = make_tensor(rows.shape(), int64);
  backend(a.device()).argsort(detail::kernel_view(order), detail::kernel_view(rows), count, n, descending,
                              detail::compute_stream(a.device()));
  return order.transpose(d, last).contiguous();
}

std::pair<Tensor, Tensor> sort(const Tensor& a, int dim, bool descending) {
  const Tensor order = argsort(a, dim, descending);
  return {a.dim() == 0 ? a.clone() : gather(a, dim, order), order};
}

std::pair<Tensor, Tensor> topk(const Tensor& a, std::int64_t k, int dim, bool largest) {
  const int d = normalize_dim(dim, a.dim(), "topk");
  const std::int64_t n = a.dim() == 0 ? 1 : a.size(d);
  FERRY_CHECK(k >= 0 && k <= n, InvalidArgument, "topk: selected index k out of range (k ", k, ", but dimension ", d,
              " has ", n, " elements)");
  if (a.dim() == 0) return {a.clone(), zeros({}, {.device = a.device(), .dtype = DType::Int64})};  // as PyTorch
  const Tensor order = argsort(a, d, largest).narrow(d, 0, k).contiguous();
  return {gather(a, d, order), order};
}

}  // namespace ferry
