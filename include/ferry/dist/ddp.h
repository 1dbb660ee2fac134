// ferry/dist/ddp.h — DistributedDataParallel: one replica per rank; gradients bucketed, all-reduced (avg) while
// backward runs, one identical step everywhere. Not here: collectives (process_group.h), slicing (sampler.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/dist/process_group.h"
#include "ferry/nn/module.h"

namespace ferry::dist {

inline constexpr std::int64_t kDefaultBucketBytes = 25 * 1024 * 1024;  // bytes: PyTorch's bucket_cap_mb = 25

// Replicas differ: check_replicas() found a parameter whose bytes are not the same on every rank.
class ReplicaMismatch : public Error {
  using Error::Error;
};

// Which parameters share a gradient bucket. Parameters are taken in reverse (backward produces the last
// layer's gradients first) and packed greedily: a bucket closes when the next parameter would take it
// past `bucket_bytes`; a parameter larger than that gets a bucket to itself; parameters of different
// dtype or device never share one. Buckets are all-reduced in this order on every rank.
struct BucketPlan {
  std::vector<std::vector<std::size_t>> buckets;  // parameter indices (into the list given) per bucket
  std::vector<std::int64_t> bytes;                // bytes per bucket
};
BucketPlan plan_buckets(const std::vector<Tensor>& parameters, std::int64_t bucket_bytes);

struct DDPOptions {
  std::int64_t bucket_bytes = kDefaultBucketBytes;  // bytes, > 0
  // Send rank 0's buffers (BatchNorm running statistics) to every rank before each forward, as PyTorch.
  bool broadcast_buffers = true;
  // The dtype the gradients cross the wire in. Unset, or the gradients' own: as computed. BFloat16 or Float16: each
  // bucket is scaled by 1/N, rounded to 16 bits, summed in 16 bits (float32 arithmetic, rounded after each
  // addition) and widened back: every all-reduce moves half the bytes, and each averaged gradient carries the
  // rounding (bfloat16: 8 significant bits, float32's range; float16: 11 bits, overflow past 65504). PyTorch's
  // bf16_compress_hook / fp16_compress_hook. The same on every rank (DDP checks it with the model).
  std::optional<DType> allreduce_dtype = std::nullopt;
};

class DistributedDataParallel {
 public:
  // Checks that every rank built the same model (the same parameters and buffers, in order, with the same
  // names, shapes and dtypes; else InvalidArgument on every rank naming the first that differs and the ranks),
  // broadcasts rank 0's parameters and buffers (every rank starts from the same replica) and hooks every
  // parameter: when backward has filled a bucket, its all-reduce starts. `module` and `group` must
  // outlive this object; the module must already be on group.device().
  DistributedDataParallel(nn::Module& module, ProcessGroup& group, const DDPOptions& options = {});
  ~DistributedDataParallel();  // removes the hooks
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Rank 0's buffers first (when broadcast_buffers), then module(input).
  Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }

  // Call between loss.backward() and optimizer.step(): starts the buckets backward did not fill
  // (a parameter without a gradient counts as zeros), waits for every bucket (group timeout), and
  // writes the averaged gradients into each parameter's .grad. A parameter that no rank's backward
  // reached keeps its .grad as it was (undefined after zero_grad(true)), as in one process; one used
  // on some ranks only gets the average (Σ/N, the others counting zeros). One extra small all-reduce
  // (an int32 per parameter) says which. Then every replica holds the same.
  void finish_gradient_sync();

  // Gradient accumulation without communication, as PyTorch's no_sync(): while the returned guard lives, backward
  // leaves each gradient in .grad (summed over the backward calls, as in one process) and starts no all-reduce.
  // The next backward after it, then finish_gradient_sync(), average the sums over the ranks: k micro-batches per
  // step cost one all-reduce of the gradients, not k. Refused between a synced backward and its
  // finish_gradient_sync() (that step's buckets are filling), and finish_gradient_sync() is refused inside it.
  //   { auto accumulate = ddp.no_sync(); loss(micro_batch_1).backward(); }
  //   loss(micro_batch_2).backward(); ddp.finish_gradient_sync(); optimizer.step();
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }
  bool in_no_sync() const { return no_sync_; }

  // Sends rank 0's buffers to every rank (before evaluating, or saving on rank 0).
  void broadcast_buffers();
  // Hashes every parameter (FNV-1a over its dtype, shape and bytes, read back to the host), gathers every rank's hashes
  // and compares: throws ReplicaMismatch naming the first parameter and the ranks that differ. Returns
  // the hash of this rank's parameters (the same on every rank when it returns).
  std::uint64_t check_replicas();

  nn::Module& module() { return module_; }
  ProcessGroup& group() { return group_; }
  const BucketPlan& plan() const { return plan_; }
  const DDPOptions& options() const { return options_; }
  DType allreduce_dtype() const { return wire_dtype_; }  // what the buckets cross the wire in

  struct Stats {
    std::int64_t syncs = 0;                    // finish_gradient_sync calls
    std::int64_t buckets_reduced = 0;          // bucket all-reduces in all
    std::int64_t buckets_started_in_backward = 0;  // of which started by a hook, before backward ended
    std::int64_t gradient_bytes = 0;           // bytes all-reduced per sync (every bucket, in allreduce_dtype)
  };
  const Stats& stats() const { return stats_; }

 private:
  struct Bucket;
  void on_gradient(std::size_t parameter);
  void launch_ready_buckets();
  void launch(std::size_t bucket);

  nn::Module& module_;
  ProcessGroup& group_;
  DDPOptions options_;
  std::vector<Tensor> parameters_;
  std::vector<std::string> names_;
  BucketPlan plan_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<std::size_t> bucket_of_;  // parameter -> bucket
  std::vector<std::int64_t> offset_of_; // parameter -> element offset in its bucket
  std::vector<char> ready_;             // parameter -> its gradient is in its bucket this step
  std::vector<char> got_gradient_;      // parameter -> backward reached it on this rank this step
  std::vector<std::uint64_t> hooks_;
  std::size_t next_launch_ = 0;         // buckets start in plan order on every rank
  bool no_sync_ = false;                // inside no_sync(): gradients stay in .grad
  DType wire_dtype_ = DType::Float32;   // the buckets' dtype on the wire
  Stats stats_;
};

}  // namespace ferry::dist
