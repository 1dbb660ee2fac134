// ddp.cpp — DDP: rank 0's state broadcast at the start; an autograd hook copies each gradient into its bucket and
// starts a full bucket's all-reduce at once, overlapping the rest of backward. Not here: the collectives.
#include "ferry/dist/ddp.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <unordered_set>

#include "../core/internal.h"
#include "ferry/autograd.h"
#include "ferry/factories.h"
#include "ferry/ops.h"

namespace ferry::dist {

BucketPlan plan_buckets(const std::vector<Tensor>& parameters, std::int64_t bucket_bytes) {
  FERRY_CHECK(bucket_bytes > 0, InvalidArgument, "The gradient bucket size must be > 0 bytes, got ", bucket_bytes);
  BucketPlan plan;
  std::vector<std::size_t> current;
  std::int64_t current_bytes = 0;
  auto close = [&] {
    if (current.empty()) return;
    plan.buckets.push_back(std::move(current));
    plan.bytes.push_back(current_bytes);
    current.clear();
    current_bytes = 0;
  };
  for (std::size_t i = parameters.size(); i-- > 0;) {  // last layer first: backward's order
    const Tensor& p = parameters[i];
    const auto bytes = static_cast<std::int64_t>(p.nbytes());
    if (!current.empty()) {
      const Tensor& first = parameters[current.front()];
      if (current_bytes + bytes > bucket_bytes || first.dtype() != p.dtype() || first.device() != p.device()) close();
    }
    current.push_back(i);
    current_bytes += bytes;
  }
  close();
  return plan;
}

namespace {

// Rank 0's values of `tensors` on every rank: one broadcast per dtype, the tensors packed end to end.
void broadcast_coalesced(ProcessGroup& group, const std::vector<Tensor>& tensors, const std::string& label) {
  autograd::NoGradGuard no_grad;
  std::vector<DType> dtypes;
  for (const Tensor& t : tensors) {
    if (std::find(dtypes.begin(), dtypes.end(), t.dtype()) == dtypes.end()) dtypes.push_back(t.dtype());
  }
  for (DType dtype : dtypes) {
    std::vector<Tensor> members, flat_views;
    for (const Tensor& t : tensors) {
      if (t.dtype() != dtype || t.numel() == 0) continue;
      members.push_back(t);
      flat_views.push_back(t.detach().reshape({t.numel()}));
    }
    if (members.empty()) continue;
    Tensor packed = cat(flat_views, 0);  // on the group's device
    group.broadcast(packed, 0, label);
    if (group.rank() == 0) continue;
    std::int64_t offset = 0;
    for (const Tensor& t : members) {
      t.detach().copy_(packed.narrow(0, offset, t.numel()).view(t.shape()));
      offset += t.numel();
    }
  }
}

std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t hash = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

}  // namespace

struct DistributedDataParallel::Bucket {
  std::vector<std::size_t> parameters;  // indices into parameters_
  Tensor flat;                          // (elements) the bucket's gradients end to end, on the device
  std::size_t pending = 0;              // parameters whose gradient has not arrived this step
  bool launched = false;
  Work work;
};

DistributedDataParallel::DistributedDataParallel(nn::Module& module, ProcessGroup& group, const DDPOptions& options)
    : module_(module), group_(group), options_(options) {
  std::unordered_set<const TensorImpl*> seen;
  for (const auto& [name, p] : module.named_parameters()) {
    if (!p.requires_grad() || !seen.insert(p.impl()).second) continue;
    FERRY_CHECK(p.device() == group.device(), DeviceMismatch, "DistributedDataParallel: parameter '", name,
                "' is on ", p.device().str(), " but the process group communicates ", group.device().str(),
                " tensors; call module.to(", group.device().str(), ") first");
    parameters_.push_back(p);
    names_.push_back(name);
  }
  plan_ = plan_buckets(parameters_, options.bucket_bytes);
  ready_.assign(parameters_.size(), 0);
  bucket_of_.resize(parameters_.size());
  offset_of_.resize(parameters_.size());
  for (std::size_t b = 0; b < plan_.buckets.size(); ++b) {
    auto bucket = std::make_unique<Bucket>();
    bucket->parameters = plan_.buckets[b];
    std::int64_t elements = 0;
    for (std::size_t i : bucket->parameters) {
      bucket_of_[i] = b;
      offset_of_[i] = elements;
      elements += parameters_[i].numel();
    }
    bucket->flat = zeros({elements}, {.device = group.device(), .dtype = parameters_[bucket->parameters[0]].dtype()});
    bucket->pending = bucket->parameters.size();
    stats_.gradient_bytes += static_cast<std::int64_t>(bucket->flat.nbytes());
    buckets_.push_back(std::move(bucket));
  }

  // Every replica starts as rank 0's.
  std::vector<Tensor> state = parameters_;
  for (const Tensor& buffer : module.buffers()) state.push_back(buffer);
  if (group.world_size() > 1) broadcast_coalesced(group, state, "initial parameters and buffers");

  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    hooks_.push_back(
        autograd::register_post_accumulate_grad_hook(parameters_[i], [this, i](const Tensor&) { on_gradient(i); }));
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  for (std::uint64_t handle : hooks_) autograd::remove_post_accumulate_grad_hook(handle);
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  if (options_.broadcast_buffers) broadcast_buffers();
  return module_(input);
}

void DistributedDataParallel::broadcast_buffers() {
  if (group_.world_size() == 1) return;
  const std::vector<Tensor> buffers = module_.buffers();
  if (!buffers.empty()) broadcast_coalesced(group_, buffers, "buffers");
}

void DistributedDataParallel::on_gradient(std::size_t i) {
  Bucket& bucket = *buckets_[bucket_of_[i]];
  FERRY_CHECK(!bucket.launched, InvalidArgument, "DistributedDataParallel: parameter '", names_[i],
              "' received a gradient after its bucket's all-reduce had started. Either a parameter is used twice ",
              "in the forward pass (not supported), or finish_gradient_sync() was not called after the last backward");
  const Tensor& p = parameters_[i];
  const Tensor grad = p.grad();
  bucket.flat.narrow(0, offset_of_[i], p.numel()).copy_(grad.reshape({p.numel()}));
  // A second gradient into the same leaf before the launch just refreshes the copy: count it once.
  if (!ready_[i]) {
    ready_[i] = 1;
    bucket.pending -= 1;
  }
  if (bucket.pending == 0) {
    const std::size_t before = next_launch_;
    launch_ready_buckets();
    stats_.buckets_started_in_backward += static_cast<std::int64_t>(next_launch_ - before);
  }
  // MPI moves bytes only while polled: each gradient that arrives pushes the buckets in flight along.
  if (next_launch_ > 0) buckets_[next_launch_ - 1]->work.poll();
}

void DistributedDataParallel::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->pending == 0) launch(next_launch_++);
}

void DistributedDataParallel::launch(std::size_t b) {
  Bucket& bucket = *buckets_[b];
  bucket.launched = true;
  bucket.work = group_.all_reduce_async(bucket.flat, ReduceOp::Avg, fmt::format("gradient bucket {}", b));
  stats_.buckets_reduced += 1;
}

void DistributedDataParallel::finish_gradient_sync() {
  autograd::NoGradGuard no_grad;
  // Parameters backward did not reach count as zeros, so every rank reduces every bucket.
  for (std::size_t b = next_launch_; b < buckets_.size(); ++b) {
    Bucket& bucket = *buckets_[b];
    for (std::size_t i : bucket.parameters) {
      if (ready_[i]) continue;
      bucket.flat.narrow(0, offset_of_[i], parameters_[i].numel()).zero_();
      ready_[i] = 1;
    }
    bucket.pending = 0;
  }
  launch_ready_buckets();
  for (auto& bucket : buckets_) bucket->work.wait();
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const Tensor& p = parameters_[i];
    const Tensor averaged = buckets_[bucket_of_[i]]->flat.narrow(0, offset_of_[i], p.numel()).view(p.shape());
    if (Tensor grad = p.grad(); grad.defined()) grad.copy_(averaged);
    else p.set_grad(averaged.clone());
  }
  for (auto& bucket : buckets_) {
    bucket->launched = false;
    bucket->pending = bucket->parameters.size();
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  next_launch_ = 0;
  stats_.syncs += 1;
}

std::uint64_t DistributedDataParallel::check_replicas() {
  autograd::NoGradGuard no_grad;
  const std::size_t count = parameters_.size();
  std::vector<std::int64_t> hashes(count);
  std::uint64_t total = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < count; ++i) {
    Tensor value = parameters_[i].detach().contiguous();
    if (!value.device().is_cpu()) value = ferry::detail::transfer(value, kCPU, false, "check_replicas()");
    const std::uint64_t hash = fnv1a(value.data_ptr(), value.nbytes());
    hashes[i] = static_cast<std::int64_t>(hash);
    total = fnv1a(&hash, sizeof(hash), total);
  }
  if (group_.world_size() == 1 || count == 0) return total;
  const auto n = static_cast<std::int64_t>(count);
  const Tensor mine = from_vector(hashes, {n}).to(group_.device());
  const Tensor all = empty({group_.world_size() * n}, {.device = group_.device(), .dtype = DType::Int64});
  group_.all_gather(all, mine, "check_replicas hashes");
  const std::vector<std::int64_t> gathered = all.cpu().to_vector<std::int64_t>();
  for (std::size_t i = 0; i < count; ++i) {
    std::vector<int> differing;
    for (int r = 1; r < group_.world_size(); ++r) {
      if (gathered[static_cast<std::size_t>(r) * count + i] != gathered[i]) differing.push_back(r);
    }
    if (!differing.empty()) {
      throw ReplicaMismatch(fmt::format(
          "Replicas differ: parameter '{}' (shape {}) on rank(s) {} does not match rank 0's (checked on rank {} of {}). "
          "Every rank must start from rank 0's state and apply the same averaged gradients.",
          names_[i], shape_str(parameters_[i].shape()), fmt::join(differing, ", "), group_.rank(),
          group_.world_size()));
    }
  }
  return total;
}

}  // namespace ferry::dist
