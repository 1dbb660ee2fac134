// ferry/dataloader.h — seeded shuffling and batching of a Dataset onto a device, with the three
// placements of the sheet's lesson: resident (copy once, Ex 3.2), prefetch (pinned, one batch ahead
// on the copy stream), per-step (the naive copy every step, Ex 3.1). Not here: the training loop.
#pragma once

#include <cstdint>
#include <string>

#include "ferry/dataset.h"
#include "ferry/device.h"
#include "ferry/tensor.h"

namespace ferry {

enum class Placement { Resident, Prefetch, PerStep };
std::string_view placement_name(Placement placement);  // "resident", "prefetch", "per-step"
Placement parse_placement(std::string_view text);       // throws InvalidArgument listing the choices

struct DataLoaderOptions {
  std::int64_t batch_size = 128;
  bool shuffle = true;
  bool drop_last = false;
  std::uint64_t seed = 0;  // the order of epoch e depends only on (seed, e)
  Placement placement = Placement::Resident;
  Device device = kCPU;
};

struct Batch {
  Tensor images;  // (B, C, H, W) on the loader's device
  Tensor labels;  // (B) int64 on the loader's device
  std::int64_t index = 0;  // batch number within the epoch
};

class DataLoader {
 public:
  DataLoader(const Dataset& dataset, const DataLoaderOptions& options);

  std::int64_t batches_per_epoch() const;
  std::int64_t size() const { return dataset_.size(); }
  const DataLoaderOptions& options() const { return options_; }
  // Bytes the loader keeps on the device (the resident dataset; 0 otherwise).
  std::int64_t resident_bytes() const;

  // Begin epoch `epoch` at batch `first_batch` (for resuming mid-epoch).
  void start_epoch(std::int64_t epoch, std::int64_t first_batch = 0);
  // The next batch of the epoch; false when the epoch is done.
  bool next(Batch& batch);
  // The same, gathered straight into `images` and `labels` (a step graph's inputs, ferry/step_graph.h) when the
  // dataset is resident on their device and the batch has their shape: batch.images and batch.labels are then
  // those tensors, and no copy follows. Otherwise (another placement, the shorter last batch) as next().
  bool next_into(Batch& batch, const Tensor& images, const Tensor& labels);

 private:
  // The batch's images and labels; a resident batch goes into images_into / labels_into when they are given.
  Batch gather(std::int64_t batch_index, bool non_blocking, const Tensor& images_into = {},
               const Tensor& labels_into = {});
  std::int64_t batch_length(std::int64_t batch_index) const;

  Dataset dataset_;          // on the host
  Dataset device_dataset_;   // resident placement: the whole dataset on the device
  DataLoaderOptions options_;
  Tensor order_;             // (N) int64 permutation of the epoch, on the host
  Tensor device_order_;      // resident: the same on the device (one crossing per epoch)
  std::int64_t next_batch_ = 0;
  Batch prefetched_;         // prefetch: the batch already on its way
  bool has_prefetched_ = false;
};

}  // namespace ferry
