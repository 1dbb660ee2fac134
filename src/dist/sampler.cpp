// sampler.cpp — each rank's slice of a global batch (B/N samples; N must divide B, Exercise 5.2) and its
// share of a dataset for evaluation. Not here: the shuffled order every rank shares (DataLoader).
#include "ferry/dist/sampler.h"

#include "ferry/cost_model.h"
#include "ferry/error.h"

namespace ferry::dist {

DistributedSampler::DistributedSampler(std::int64_t global_batch, int world_size, int rank)
    : global_batch_(global_batch), local_batch_(cost::per_gpu_batch(global_batch, world_size)),
      world_size_(world_size), rank_(rank) {
  FERRY_CHECK(rank >= 0 && rank < world_size, InvalidArgument, "DistributedSampler: rank ", rank,
              " is outside 0..", world_size - 1);
}

DistributedSampler::Slice DistributedSampler::slice(std::int64_t length) const {
  FERRY_CHECK(length >= 0 && length <= global_batch_, InvalidArgument, "DistributedSampler: a global batch of ",
              length, " samples, expected 0..", global_batch_);
  Slice s;
  if (length < world_size_) return s;  // some rank would get nothing: every rank skips it
  if (length == global_batch_) {
    s.begin = rank_ * local_batch_;
    s.count = local_batch_;
    return s;
  }
  // A short last batch: as even as possible (the first length % N ranks take one more), each rank's mean
  // loss weighted by count x N / length so that the average over ranks is the batch mean.
  const auto [begin, count] = shard(length, world_size_, rank_);
  s.begin = begin;
  s.count = count;
  s.loss_weight = static_cast<double>(count) * world_size_ / static_cast<double>(length);
  return s;
}

bool DistributedSampler::take(const Batch& global, Batch& local, double* loss_weight) const {
  const Slice s = slice(global.labels.numel());
  if (s.count == 0) return false;
  local.images = global.images.narrow(0, s.begin, s.count);
  local.labels = global.labels.narrow(0, s.begin, s.count);
  local.index = global.index;
  if (loss_weight) *loss_weight = s.loss_weight;
  return true;
}

std::pair<std::int64_t, std::int64_t> DistributedSampler::shard(std::int64_t n, int world_size, int rank) {
  FERRY_CHECK(world_size > 0 && rank >= 0 && rank < world_size, InvalidArgument, "shard(): rank ", rank,
              " of world size ", world_size);
  const std::int64_t base = n / world_size, extra = n % world_size;
  const std::int64_t begin = rank * base + std::min<std::int64_t>(rank, extra);
  return {begin, base + (rank < extra ? 1 : 0)};
}

Dataset DistributedSampler::shard(const Dataset& dataset, int world_size, int rank) {
  const auto [begin, count] = shard(dataset.size(), world_size, rank);
  return {dataset.images.narrow(0, begin, count), dataset.labels.narrow(0, begin, count)};
}

}  // namespace ferry::dist
