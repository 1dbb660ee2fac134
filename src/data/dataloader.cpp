// dataloader.cpp — shuffled batches gathered on the host (per-step, prefetch) or on the device from a
// resident copy (resident). Every copy goes through Tensor::to, so the ledger sees each one.
#include "ferry/dataloader.h"

#include "../core/internal.h"
#include "../core/philox.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/ops.h"

namespace ferry {

std::string_view placement_name(Placement placement) {
  switch (placement) {
    case Placement::Resident: return "resident";
    case Placement::Prefetch: return "prefetch";
    case Placement::PerStep: return "per-step";
  }
  return "?";
}

Placement parse_placement(std::string_view text) {
  if (text == "resident") return Placement::Resident;
  if (text == "prefetch") return Placement::Prefetch;
  if (text == "per-step") return Placement::PerStep;
  throw InvalidArgument(detail::concat("Unknown placement '", text, "': expected resident, prefetch or per-step"));
}

namespace {
// The loader's crossings, labelled for the ledger, the trace and a step budget's error ("batch images", ...);
// on the loader's own device, the tensor itself (invariant 3: already there = alias, no copy).
Tensor move_to(const Tensor& t, Device device, bool non_blocking, const char* label) {
  return t.device() == device ? t : detail::transfer(t, device, non_blocking, label);
}
}  // namespace

DataLoader::DataLoader(const Dataset& dataset, const DataLoaderOptions& options)
    : dataset_(dataset), options_(options) {
  FERRY_CHECK(options.batch_size > 0, InvalidArgument, "Batch size must be positive, got ", options.batch_size);
  FERRY_CHECK(dataset.size() > 0, InvalidArgument, "The dataset is empty");
  FERRY_CHECK(dataset.images.dim() >= 1 && dataset.labels.dim() == 1 &&
                  dataset.labels.size(0) == dataset.images.size(0),
              ShapeMismatch, "The dataset's images ", shape_str(dataset.images.shape()), " and labels ",
              shape_str(dataset.labels.shape()), " do not pair up: expected one label per image, labels (N)");
  FERRY_CHECK(dataset.labels.dtype() == DType::Int64, DTypeMismatch,
              "The dataset's labels must be int64 class indices, got ", dtype_name(dataset.labels.dtype()));
  FERRY_CHECK(dataset.images.device().is_cpu() && dataset.labels.device().is_cpu(), InvalidArgument,
              "DataLoader expects the dataset on the host; the placement decides what moves");
  if (options_.placement == Placement::Resident && !options_.device.is_cpu()) {
    // Exercise 3.2: one crossing each, then none.
    device_dataset_.images = move_to(dataset_.images, options_.device, false, "dataset images (resident)");
    device_dataset_.labels = move_to(dataset_.labels, options_.device, false, "dataset labels (resident)");
  }
}

std::int64_t DataLoader::batches_per_epoch() const {
  const std::int64_t n = dataset_.size(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

std::int64_t DataLoader::resident_bytes() const {
  return device_dataset_.images.defined()
             ? static_cast<std::int64_t>(device_dataset_.images.nbytes() + device_dataset_.labels.nbytes())
             : 0;
}

std::int64_t DataLoader::batch_length(std::int64_t batch_index) const {
  return std::min(options_.batch_size, dataset_.size() - batch_index * options_.batch_size);
}

void DataLoader::start_epoch(std::int64_t epoch, std::int64_t first_batch) {
  FERRY_CHECK(first_batch >= 0 && first_batch <= batches_per_epoch(), InvalidArgument,
              "DataLoader::start_epoch: first batch ", first_batch, " is outside the epoch's ", batches_per_epoch(),
              " batches");
  const std::int64_t n = dataset_.size();
  order_ = arange(0, static_cast<double>(n), 1, {.dtype = DType::Int64});
  if (options_.shuffle) {
    // Fisher-Yates with counter-based draws keyed by (seed, epoch): independent of the global
    // generator, so resuming at any epoch reproduces the same order.
    auto* p = order_.data<std::int64_t>();
    const std::uint64_t key = options_.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(epoch);
    for (std::int64_t i = n - 1; i > 0; --i) {
      const auto j = static_cast<std::int64_t>(
          detail::philox_below(key, 0, static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(i + 1)));
      std::swap(p[i], p[j]);
    }
  }
  if (device_dataset_.images.defined()) device_order_ = move_to(order_, options_.device, false, "epoch order");
  next_batch_ = first_batch;
  has_prefetched_ = false;
}

Batch DataLoader::gather(std::int64_t batch_index, bool non_blocking, const Tensor& images_into,
                         const Tensor& labels_into) {
  const std::int64_t start = batch_index * options_.batch_size, length = batch_length(batch_index);
  Batch batch;
  batch.index = batch_index;
  if (device_dataset_.images.defined()) {  // resident: gather on the device, nothing crosses
    const Tensor indices = device_order_.narrow(0, start, length);
    if (images_into.defined()) {  // index_select_out checks their shape and dtype
      batch.images = images_into;
      batch.labels = labels_into;
      index_select_out(batch.images, device_dataset_.images, 0, indices);
      index_select_out(batch.labels, device_dataset_.labels, 0, indices);
    } else {
      batch.images = index_select(device_dataset_.images, 0, indices);
      batch.labels = index_select(device_dataset_.labels, 0, indices);
    }
    return batch;
  }
  const Tensor indices = order_.narrow(0, start, length);
  Tensor images = index_select(dataset_.images, 0, indices);
  Tensor labels = index_select(dataset_.labels, 0, indices);
  if (non_blocking && is_available(DeviceType::CUDA) && options_.device.is_cuda()) {
    images = images.pin_memory();
    labels = labels.pin_memory();
  }
  batch.images = move_to(images, options_.device, non_blocking, "batch images");
  batch.labels = move_to(labels, options_.device, non_blocking, "batch labels");
  return batch;
}

bool DataLoader::next(Batch& batch) {
  FERRY_CHECK(order_.defined(), InvalidArgument, "DataLoader::next() before start_epoch()");
  if (next_batch_ >= batches_per_epoch()) return false;
  if (options_.placement != Placement::Prefetch || options_.device.is_cpu()) {
    batch = gather(next_batch_++, false);
    return true;
  }
  // Prefetch: hand out the batch already in flight, and send the next one on its way before the
  // caller computes on this one (the copy stream overlaps the compute stream).
  batch = has_prefetched_ ? prefetched_ : gather(next_batch_, true);
  ++next_batch_;
  has_prefetched_ = next_batch_ < batches_per_epoch();
  if (has_prefetched_) prefetched_ = gather(next_batch_, true);
  return true;
}

bool DataLoader::next_into(Batch& batch, const Tensor& images, const Tensor& labels) {
  FERRY_CHECK(order_.defined(), InvalidArgument, "DataLoader::next_into() before start_epoch()");
  if (next_batch_ >= batches_per_epoch()) return false;
  const std::int64_t length = batch_length(next_batch_);
  const bool into = device_dataset_.images.defined() && images.defined() && labels.defined() &&
                    images.device() == options_.device && labels.device() == options_.device &&
                    images.dim() > 0 && images.size(0) == length && labels.dim() == 1 && labels.size(0) == length;
  if (!into) return next(batch);
  batch = gather(next_batch_++, false, images, labels);
  return true;
}

}  // namespace ferry
