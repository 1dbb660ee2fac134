// mask_select.cpp — selection by a mask, whose result size depends on the data: masked_select and nonzero.
// The size is read back to the host once (one device->host copy and a sync, recorded in the ledger with the op's
// name, as every crossing is), as PyTorch must too; everything else stays on the device: the true positions come
// from a running sum of the mask (cumsum) scattered into a list (scatter_add), and the values are picked with
// index_select, so they are copied bit for bit (-0.0 and NaN payloads kept) and autograd differentiates the pick.
#include "ferry/autograd.h"
#include "ferry/factories.h"
#include "ferry/ops.h"
#include "internal.h"

namespace ferry {

namespace {

// The flat (row-major) positions of the nonzero elements of `flat` (1-d), ascending, as int64 on its device.
// Reads their count to the host: the one sync, labelled `label`.
Tensor true_positions(const Tensor& flat, const char* label) {
  autograd::NoGradGuard no_grad;
  const Tensor truth = ne(flat, 0.0);  // NaN counts as true, as PyTorch's nonzero
  const Tensor count_on_device = sum(truth);
  const std::int64_t count = detail::host_copy(count_on_device, label).item<std::int64_t>();
  // the k-th true element goes to slot k; the false ones to a spare slot (count), cut off after
  const TensorOptions int64{.device = flat.device(), .dtype = DType::Int64};
  const Tensor rank = sub(cumsum(truth, 0), full({}, 1, int64));
  const Tensor slot = where(truth, rank, full({}, static_cast<double>(count), int64));
  const Tensor positions =
      arange(0, static_cast<double>(flat.numel()), 1, {.device = flat.device(), .dtype = DType::Int64});
  return scatter_add(zeros({count + 1}, int64), 0, slot, positions).narrow(0, 0, count);
}

}  // namespace

Tensor masked_select(const Tensor& a, const Tensor& mask) {
  check_same_device("masked_select", {&a, &mask});
  FERRY_CHECK(mask.dtype() == DType::Bool, DTypeMismatch, "masked_select: expected BoolTensor for mask, got ",
              dtype_name(mask.dtype()));
  const Shape shape = broadcast_shapes("masked_select", a.shape(), mask.shape());
  const Tensor flat_mask = mask.expand(shape).reshape({-1});
  const Tensor picked = true_positions(flat_mask, "masked_select (result size)");
  return index_select(a.expand(shape).reshape({-1}), 0, picked);
}

Tensor nonzero(const Tensor& a) {
  autograd::NoGradGuard no_grad;
  const Tensor flat = a.detach().reshape({-1});
  const Tensor picked = true_positions(flat, "nonzero (result size)");
  // Column d of the result: each picked element's coordinate along d, read from a grid of coordinates.
  std::vector<Tensor> columns;
  const TensorOptions int64{.device = a.device(), .dtype = DType::Int64};
  for (int d = 0; d < a.dim(); ++d) {
    Shape along(static_cast<std::size_t>(a.dim()), 1);
    along[static_cast<std::size_t>(d)] = a.size(d);
    const Tensor grid = arange(0, static_cast<double>(a.size(d)), 1, {.device = a.device(), .dtype = DType::Int64})
                            .reshape(along)
                            .expand(a.shape())
                            .reshape({-1});
    columns.push_back(index_select(grid, 0, picked));
  }
  if (columns.empty()) return zeros({picked.numel(), 0}, int64);  // a 0-d tensor: one row per true, no columns
  return stack(columns, 1);
}

}  // namespace ferry
