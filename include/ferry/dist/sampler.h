// ferry/dist/sampler.h — DistributedSampler: which samples of each global batch a rank trains on (B/N
// each, Exercises 4.2 and 5.2), and which part of a dataset it evaluates. Not here: shuffling (DataLoader).
#pragma once

#include <cstdint>

#include "ferry/dataloader.h"
#include "ferry/dataset.h"

namespace ferry::dist {

// Every rank reads the same shuffled global batch (same seed) and keeps its own contiguous slice:
// rank r takes samples [r B/N, (r+1) B/N). The update then equals one process's on the whole batch.
class DistributedSampler {
 public:
  // Throws InvalidArgument naming B, N and the nearest valid batch sizes when N does not divide B
  // (Exercise 5.2's constraint; the message is cost::per_gpu_batch's), or when rank is out of range.
  DistributedSampler(std::int64_t global_batch, int world_size, int rank);

  std::int64_t global_batch() const { return global_batch_; }  // B, samples
  std::int64_t local_batch() const { return local_batch_; }    // B / N, samples
  int world_size() const { return world_size_; }
  int rank() const { return rank_; }

  struct Slice {
    std::int64_t begin = 0;  // first sample of the global batch this rank takes
    std::int64_t count = 0;  // samples it takes (0: the batch is skipped by every rank)
    // Factor for this rank's mean loss so that the average over ranks is the mean over the whole
    // batch: count x N / length. 1 for full batches; differs only for a short last batch.
    double loss_weight = 1;
  };
  // This rank's slice of a global batch of `length` samples (the last batch of an epoch may be short:
  // its length is split as evenly as possible; shorter than N samples, every rank skips it).
  Slice slice(std::int64_t length) const;
  // The batch narrowed to this rank's slice (views, no copy); false when every rank skips it.
  bool take(const Batch& global, Batch& local, double* loss_weight = nullptr) const;

  // Rank r's contiguous share of `n` samples for evaluation: the first n % N ranks get one more.
  static std::pair<std::int64_t, std::int64_t> shard(std::int64_t n, int world_size, int rank);  // (begin, count)
  static Dataset shard(const Dataset& dataset, int world_size, int rank);  // views, no copy

 private:
  std::int64_t global_batch_, local_batch_;
  int world_size_, rank_;
};

}  // namespace ferry::dist
