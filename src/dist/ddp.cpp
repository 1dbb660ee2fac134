// ddp.cpp — DDP: rank 0's state broadcast at the start; an autograd hook copies each gradient into its bucket and
// starts a full bucket's all-reduce at once, overlapping the rest of backward. Not here: the collectives.
#include "ferry/dist/ddp.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
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

// What must agree across ranks about one parameter or buffer: its name, shape and dtype (not its values).
std::string describe(const std::string& kind, const std::string& name, const Tensor& t) {
  return fmt::format("{} '{}' (shape {}, {})", kind, name, shape_str(t.shape()), dtype_name(t.dtype()));
}

std::uint64_t structure_hash(const Tensor& t, std::uint64_t hash = 0xcbf29ce484222325ull) {
  const auto dtype = static_cast<std::int64_t>(t.dtype());
  hash = fnv1a(&dtype, sizeof(dtype), hash);
  for (std::int64_t size : t.shape()) hash = fnv1a(&size, sizeof(size), hash);
  const auto dims = static_cast<std::int64_t>(t.shape().size());
  return fnv1a(&dims, sizeof(dims), hash);
}

// Every rank's values of `mine` (the same count on every rank), rank by rank: one all_gather.
std::vector<std::int64_t> gather(ProcessGroup& group, const std::vector<std::int64_t>& mine, const std::string& label) {
  const auto n = static_cast<std::int64_t>(mine.size());
  const Tensor local = from_vector(mine, {n}).to(group.device());
  const Tensor all = empty({group.world_size() * n}, {.device = group.device(), .dtype = DType::Int64});
  group.all_gather(all, local, label);
  return all.cpu().to_vector<std::int64_t>();
}

// Every rank must hold the same model: the same parameters and buffers, in the same order, with the same names,
// shapes and dtypes (PyTorch's _verify_param_shape_across_processes). Otherwise the broadcast and the buckets
// would move different byte counts on different ranks. One all_gather of 3 numbers when they agree; on a
// difference two more (hashes per entry, rank 0's description of the first that differs), then InvalidArgument
// on every rank.
void verify_same_model(ProcessGroup& group, const std::vector<std::pair<std::string, Tensor>>& entries,
                       std::int64_t parameters, DType wire_dtype) {
  std::vector<std::int64_t> hashes;
  std::uint64_t total = 0xcbf29ce484222325ull;
  for (const auto& [name, t] : entries) {
    const std::uint64_t h = structure_hash(t, fnv1a(name.data(), name.size()));
    hashes.push_back(static_cast<std::int64_t>(h));
    total = fnv1a(&h, sizeof(h), total);
  }
  const auto count = static_cast<std::int64_t>(entries.size());
  const int n = group.world_size();
  constexpr int kSummary = 4;  // parameters, buffers, hash of their structure, the gradients' dtype on the wire
  const std::vector<std::int64_t> summary = gather(
      group, {parameters, count - parameters, static_cast<std::int64_t>(total), static_cast<std::int64_t>(wire_dtype)},
      "DDP model check");
  bool same = true;
  std::int64_t common = count;  // entries every rank has
  for (int r = 0; r < n; ++r) {
    const std::int64_t* theirs = &summary[static_cast<std::size_t>(kSummary * r)];
    same = same && theirs[0] == summary[0] && theirs[1] == summary[1] && theirs[2] == summary[2];
    common = std::min(common, theirs[0] + theirs[1]);
  }
  for (int r = 1; same && r < n; ++r) {
    const std::int64_t theirs = summary[static_cast<std::size_t>(kSummary * r + 3)];
    FERRY_CHECK(theirs == summary[3], InvalidArgument, "DistributedDataParallel: allreduce_dtype is ",
                dtype_name(static_cast<DType>(summary[3])), " on rank 0 but ", dtype_name(static_cast<DType>(theirs)),
                " on rank ", r, " (of ", n, "); every rank must all-reduce its gradients in the same dtype");
  }
  if (same) return;
  // Every rank saw the same summary, so every rank takes this path and calls the same collectives.
  const std::vector<std::int64_t> mine(hashes.begin(), hashes.begin() + common);
  const std::vector<std::int64_t> all = common > 0 ? gather(group, mine, "DDP model check (per tensor)")
                                                   : std::vector<std::int64_t>{};
  for (std::int64_t i = 0; i < common; ++i) {
    std::vector<int> differing;
    for (int r = 1; r < n; ++r) {
      if (all[static_cast<std::size_t>(r * common + i)] != all[static_cast<std::size_t>(i)]) differing.push_back(r);
    }
    if (differing.empty()) continue;
    const auto& [name, t] = entries[static_cast<std::size_t>(i)];
    const std::string kind = i < parameters ? "parameter" : "buffer";
    const std::string here = describe(kind, name, t);
    // Rank 0's description, so that every rank can name both sides.
    constexpr std::int64_t kTextBytes = 512;
    std::vector<std::uint8_t> text(kTextBytes, 0);
    std::copy_n(here.begin(), std::min<std::size_t>(here.size(), kTextBytes - 1), text.begin());
    Tensor packed = from_vector(text, {kTextBytes}).to(group.device());
    group.broadcast(packed, 0, "DDP model check (rank 0's tensor)");
    const std::vector<std::uint8_t> root_text = packed.cpu().to_vector<std::uint8_t>();
    const std::string at_root(reinterpret_cast<const char*>(root_text.data()),
                              strnlen(reinterpret_cast<const char*>(root_text.data()), kTextBytes));
    throw InvalidArgument(fmt::format(
        "DistributedDataParallel: the ranks built different models. Entry {} of the parameters and buffers is {} on "
        "rank 0, but differs on rank(s) {}{}. Every rank must build the same model (same layers, sizes and dtypes, "
        "in the same order) before wrapping it.",
        i, at_root, fmt::join(differing, ", "),
        group.rank() == 0 ? std::string() : fmt::format(" (here, on rank {} of {}: {})", group.rank(), n, here)));
  }
  std::string counts;
  for (int r = 0; r < n; ++r) {
    counts += fmt::format("{}rank {}: {} parameters and {} buffers", r == 0 ? "" : "; ", r,
                          summary[static_cast<std::size_t>(kSummary * r)],
                          summary[static_cast<std::size_t>(kSummary * r + 1)]);
  }
  throw InvalidArgument(fmt::format(
      "DistributedDataParallel: the ranks built different models ({}). Every rank must build the same model before "
      "wrapping it.",
      counts));
}

}  // namespace

struct DistributedDataParallel::Bucket {
  std::vector<std::size_t> parameters;  // indices into parameters_
  Tensor flat;                          // (elements) the bucket's gradients end to end, on the device
  Tensor wire;                          // (elements) flat / N in allreduce_dtype, when that differs; else undefined
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
  // 16-bit compression, or the gradients as they are (allreduce_dtype unset, or every parameter's own dtype).
  const std::optional<DType> asked = options.allreduce_dtype;
  const bool compress = asked && (*asked == DType::BFloat16 || *asked == DType::Float16);
  wire_dtype_ = asked ? *asked : parameters_.empty() ? DType::Float32 : parameters_.front().dtype();
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const DType own = parameters_[i].dtype();
    FERRY_CHECK(compress ? is_floating(own) : !asked || own == *asked, InvalidArgument,
                "DistributedDataParallel: allreduce_dtype ", dtype_name(wire_dtype_), ": parameter '", names_[i],
                "' has ", dtype_name(own), " gradients, which are all-reduced as they are or compressed to bfloat16 or "
                "float16");
  }
  // Before anything moves: a different model on some rank would make the broadcast and the buckets mismatch.
  std::vector<Tensor> state = parameters_;
  const std::vector<std::pair<std::string, Tensor>> buffers = module.named_buffers();
  for (const auto& [name, buffer] : buffers) state.push_back(buffer);
  if (group.world_size() > 1) {
    std::vector<std::pair<std::string, Tensor>> entries;
    for (std::size_t i = 0; i < parameters_.size(); ++i) entries.emplace_back(names_[i], parameters_[i]);
    for (const auto& entry : buffers) entries.push_back(entry);
    verify_same_model(group, entries, static_cast<std::int64_t>(parameters_.size()), wire_dtype_);
  }
  plan_ = plan_buckets(parameters_, options.bucket_bytes);
  ready_.assign(parameters_.size(), 0);
  got_gradient_.assign(parameters_.size(), 0);
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
    if (compress && bucket->flat.dtype() != wire_dtype_) {
      bucket->wire = zeros({elements}, {.device = group.device(), .dtype = wire_dtype_});
    }
    bucket->pending = bucket->parameters.size();
    stats_.gradient_bytes += static_cast<std::int64_t>((bucket->wire.defined() ? bucket->wire : bucket->flat).nbytes());
    buckets_.push_back(std::move(bucket));
  }

  // Every replica starts as rank 0's.
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
  if (no_sync_) {  // accumulating: the gradient stays in .grad until a synced backward or finish_gradient_sync
    got_gradient_[i] = 1;
    return;
  }
  Bucket& bucket = *buckets_[bucket_of_[i]];
  FERRY_CHECK(!bucket.launched, InvalidArgument, "DistributedDataParallel: parameter '", names_[i],
              "' received a gradient after its bucket's all-reduce had started: backward() ran a second time ",
              "before finish_gradient_sync() (to accumulate gradients over several backward calls, run all but the ",
              "last inside ddp.no_sync()), or finish_gradient_sync() was not called after the last backward");
  const Tensor& p = parameters_[i];
  const Tensor grad = p.grad();
  got_gradient_[i] = 1;
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
  const std::string label = fmt::format("gradient bucket {}", b);
  if (bucket.wire.defined()) {
    // Divided before the rounding, as PyTorch's compress hooks: a float16 sum of N gradients then stays in range.
    if (group_.world_size() > 1) bucket.flat.mul_(1.0 / group_.world_size());
    bucket.wire.copy_(bucket.flat);
    bucket.work = group_.all_reduce_async(bucket.wire, ReduceOp::Sum, label);
  } else {
    bucket.work = group_.all_reduce_async(bucket.flat, ReduceOp::Avg, label);
  }
  stats_.buckets_reduced += 1;
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp) : ddp_(ddp) {
  FERRY_CHECK(!ddp.no_sync_, InvalidArgument, "DistributedDataParallel::no_sync(): already inside no_sync()");
  const bool filling = ddp.next_launch_ > 0 || std::find(ddp.ready_.begin(), ddp.ready_.end(), 1) != ddp.ready_.end();
  FERRY_CHECK(!filling, InvalidArgument, "DistributedDataParallel::no_sync(): a synced backward() has already put "
              "gradients in this step's buckets; call finish_gradient_sync() first, or enter no_sync() before the "
              "step's first backward()");
  ddp.no_sync_ = true;
}

DistributedDataParallel::NoSync::~NoSync() { ddp_.no_sync_ = false; }

void DistributedDataParallel::finish_gradient_sync() {
  FERRY_CHECK(!no_sync_, InvalidArgument, "DistributedDataParallel::finish_gradient_sync() inside no_sync(): the "
              "gradients would be averaged now; leave the no_sync() scope first (its gradients stay in .grad)");
  autograd::NoGradGuard no_grad;
  // Which parameters got a gradient on some rank: one small all-reduce (int32 per parameter, how many ranks), in
  // flight with the last buckets. A parameter no rank used keeps its .grad as it was (undefined after
  // zero_grad(true)), as in one process: an optimizer then skips it, instead of decaying it on a zero gradient.
  const auto count = static_cast<std::int64_t>(parameters_.size());
  Tensor used;
  Work used_work;
  if (group_.world_size() > 1 && count > 0) {
    std::vector<std::int32_t> flags(got_gradient_.begin(), got_gradient_.end());
    used = from_vector(flags, {count});
    if (!group_.device().is_cpu()) used = ferry::detail::transfer(used, group_.device(), false, "parameters used");
    used_work = group_.all_reduce_async(used, ReduceOp::Sum, "parameters used");
  }
  // Parameters the last backward did not reach count as zeros, so every rank reduces every bucket; or as what
  // they accumulated inside no_sync(), where an earlier backward reached them.
  for (std::size_t b = next_launch_; b < buckets_.size(); ++b) {
    Bucket& bucket = *buckets_[b];
    for (std::size_t i : bucket.parameters) {
      if (ready_[i]) continue;
      const Tensor& p = parameters_[i];
      Tensor slot = bucket.flat.narrow(0, offset_of_[i], p.numel());
      if (const Tensor grad = p.grad(); got_gradient_[i] && grad.defined()) slot.copy_(grad.reshape({p.numel()}));
      else slot.zero_();
      ready_[i] = 1;
    }
    bucket.pending = 0;
  }
  launch_ready_buckets();
  for (auto& bucket : buckets_) {
    bucket->work.wait();
    if (bucket->wire.defined()) bucket->flat.copy_(bucket->wire);  // widened back: exact
  }
  used_work.wait();
  std::vector<std::int32_t> ranks_used(got_gradient_.begin(), got_gradient_.end());
  if (used.defined()) {
    const Tensor host = used.device().is_cpu() ? used : ferry::detail::transfer(used, kCPU, false, "parameters used");
    ranks_used = host.to_vector<std::int32_t>();
  }
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    if (ranks_used[i] == 0) continue;  // no rank's backward reached it: .grad stays as it was
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
  std::fill(got_gradient_.begin(), got_gradient_.end(), 0);
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
    // The shape and dtype first: two replicas with the same bytes in another shape are not the same.
    const std::uint64_t hash = fnv1a(value.data_ptr(), value.nbytes(), structure_hash(value));
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
