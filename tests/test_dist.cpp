// test_dist.cpp — the single-process parts of ferry::dist: batch slicing and the B/N error, bucket planning,
// the autograd post-accumulate hook, a world-size-1 process group and DDP. Not here: several ranks
// (tests/cli/test_ddp.sh runs mpirun -np 2 and -np 4: parity, failures, the bench).
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "ferry/autograd.h"
#include "ferry/dist/ddp.h"
#include "ferry/dist/process_group.h"
#include "ferry/dist/sampler.h"
#include "ferry/nn/activation.h"
#include "ferry/nn/linear.h"
#include "ferry/nn/loss.h"
#include "ferry/nn/sequential.h"
#include "ferry/optim.h"
#include "test_helpers.h"

namespace ferry {
namespace {

using dist::DistributedSampler;

// MPI starts once per process and ends once: at the end of the test program.
class MpiEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { dist::finalize(); }
};
const auto* const g_mpi_environment = ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

#define SKIP_WITHOUT_MPI() \
  if (!dist::mpi_built()) GTEST_SKIP() << "ferry was built without MPI (install libopenmpi-dev and rebuild)"

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// --- DistributedSampler -------------------------------------------------------------------------

TEST(DistributedSampler, EachRankTakesItsSliceOfTheGlobalBatch) {
  // Exercise 4.2: B = 256 over N = 4 -> 64 per rank.
  for (int rank = 0; rank < 4; ++rank) {
    DistributedSampler sampler(256, 4, rank);
    EXPECT_EQ(sampler.local_batch(), 64);
    const auto s = sampler.slice(256);
    EXPECT_EQ(s.begin, 64 * rank);
    EXPECT_EQ(s.count, 64);
    EXPECT_EQ(s.loss_weight, 1.0);
  }
  // Exercise 5.2: B = 512 over N = 4 -> 128.
  EXPECT_EQ(DistributedSampler(512, 4, 3).local_batch(), 128);
}

TEST(DistributedSampler, ShortLastBatchIsSplitEvenlyAndWeighted) {
  // 10 samples over 4 ranks: 3, 3, 2, 2; the weights make the average of the rank means the batch mean.
  double weighted = 0;
  std::int64_t covered = 0;
  for (int rank = 0; rank < 4; ++rank) {
    const auto s = DistributedSampler(256, 4, rank).slice(10);
    EXPECT_EQ(s.begin, covered);
    covered += s.count;
    EXPECT_NEAR(s.loss_weight, s.count * 4 / 10.0, 1e-12);
    weighted += s.loss_weight / 4;  // the average over ranks of weight x (mean of 1s) = 1
  }
  EXPECT_EQ(covered, 10);
  EXPECT_NEAR(weighted, 1.0, 1e-12);
  // Fewer samples than ranks: every rank skips the batch.
  EXPECT_EQ(DistributedSampler(256, 4, 0).slice(3).count, 0);
}

TEST(DistributedSampler, TakeNarrowsTheBatchWithoutCopying) {
  Batch global{arange(0, 8, 1, {.dtype = DType::Float32}).reshape({8, 1}), arange(0, 8, 1, {.dtype = DType::Int64}), 5};
  Batch local;
  double weight = 0;
  ASSERT_TRUE(DistributedSampler(8, 2, 1).take(global, local, &weight));
  EXPECT_EQ(local.labels.to_vector<std::int64_t>(), (std::vector<std::int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(local.images.storage(), global.images.storage());
  EXPECT_EQ(local.index, 5);
  EXPECT_EQ(weight, 1.0);
}

TEST(DistributedSampler, BatchNotDivisibleByRanksNamesBAndNAndTheNearestSizes) {
  const std::string text = message_of([] { DistributedSampler(250, 4, 0); });
  EXPECT_NE(text.find("B = 250"), std::string::npos) << text;
  EXPECT_NE(text.find("N = 4"), std::string::npos) << text;
  EXPECT_NE(text.find("248"), std::string::npos) << text;
  EXPECT_NE(text.find("252"), std::string::npos) << text;
  EXPECT_THROW(DistributedSampler(250, 4, 0), InvalidArgument);
  EXPECT_THROW(DistributedSampler(256, 4, 4), InvalidArgument);  // rank out of range
  EXPECT_THROW(DistributedSampler(256, 0, 0), InvalidArgument);
}

TEST(DistributedSampler, ShardsCoverADatasetOnce) {
  std::int64_t next = 0;
  for (int rank = 0; rank < 3; ++rank) {
    const auto [begin, count] = DistributedSampler::shard(10, 3, rank);
    EXPECT_EQ(begin, next);
    EXPECT_EQ(count, rank == 0 ? 4 : 3);
    next += count;
  }
  EXPECT_EQ(next, 10);
  Dataset d{zeros({10, 1, 2, 2}), arange(0, 10, 1, {.dtype = DType::Int64})};
  EXPECT_EQ(DistributedSampler::shard(d, 3, 2).labels.to_vector<std::int64_t>(), (std::vector<std::int64_t>{7, 8, 9}));
}

// --- bucket planning ------------------------------------------------------------------------------

TEST(DDPBuckets, LastParametersFirstClosedAtTheCap) {
  // float32 parameters of 400, 400, 4000, 40 bytes; cap 1000 bytes.
  std::vector<Tensor> params{zeros({100}), zeros({100}), zeros({1000}), zeros({10})};
  const dist::BucketPlan plan = dist::plan_buckets(params, 1000);
  ASSERT_EQ(plan.buckets.size(), 3u);
  EXPECT_EQ(plan.buckets[0], (std::vector<std::size_t>{3}));  // 40 + 4000 would pass the cap
  EXPECT_EQ(plan.buckets[1], (std::vector<std::size_t>{2}));  // larger than the cap: alone
  EXPECT_EQ(plan.buckets[2], (std::vector<std::size_t>{1, 0}));
  EXPECT_EQ(plan.bytes, (std::vector<std::int64_t>{40, 4000, 800}));
  // One big bucket holds everything; dtypes never mix.
  EXPECT_EQ(dist::plan_buckets(params, dist::kDefaultBucketBytes).buckets.size(), 1u);
  std::vector<Tensor> mixed{zeros({4}), zeros({4}, {.dtype = DType::Float64}), zeros({4})};
  EXPECT_EQ(dist::plan_buckets(mixed, 1 << 20).buckets.size(), 3u);
  EXPECT_THROW(dist::plan_buckets(params, 0), InvalidArgument);
}

// --- the autograd hook DDP rides on ------------------------------------------------------------------

TEST(AutogradHook, PostAccumulateHookSeesTheFinishedGradient) {
  Tensor w = ones({3}).requires_grad_();
  std::vector<std::vector<double>> seen;
  const auto handle = autograd::register_post_accumulate_grad_hook(
      w, [&](const Tensor& leaf) { seen.push_back(testing::values(leaf.grad())); });
  sum(mul(w, 2.0)).backward();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], (std::vector<double>{2, 2, 2}));
  // A leaf used twice: its two gradients are summed first, so one call, after the last use has passed its own.
  sum(add(mul(w, 2.0), mul(w, 3.0))).backward();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1], (std::vector<double>{7, 7, 7}));  // 2 (earlier backward) + 2 + 3
  autograd::remove_post_accumulate_grad_hook(handle);
  sum(w).backward();
  EXPECT_EQ(seen.size(), 2u);
  autograd::remove_post_accumulate_grad_hook(handle);  // twice: ignored
  Tensor not_leaf = mul(w, 2.0);
  EXPECT_THROW(autograd::register_post_accumulate_grad_hook(not_leaf, [](const Tensor&) {}), InvalidArgument);
  EXPECT_THROW(autograd::register_post_accumulate_grad_hook(zeros({2}), [](const Tensor&) {}), InvalidArgument);
}

// --- a process group of one rank ------------------------------------------------------------------------

TEST(ProcessGroup, NamesAndParsing) {
  EXPECT_EQ(dist::parse_comm_backend("nccl"), dist::CommBackend::NCCL);
  EXPECT_EQ(dist::comm_backend_name(dist::CommBackend::MPI), "mpi");
  EXPECT_THROW(dist::parse_comm_backend("gloo"), InvalidArgument);
  const dist::LaunchInfo info = dist::launch_info();
  EXPECT_GE(info.world_size, 1);
  EXPECT_LT(info.rank, info.world_size);
}

TEST(ProcessGroup, WorldSizeOneCollectivesOnCpu) {
  SKIP_WITHOUT_MPI();
  auto group = dist::init_process_group({.device = kCPU, .timeout_s = 30});
  ASSERT_EQ(group->world_size(), 1) << "run this test alone, not under mpirun";
  EXPECT_EQ(group->rank(), 0);
  EXPECT_EQ(group->backend(), dist::CommBackend::MPI);
  const auto before = Ledger::global().totals();

  Tensor x = arange(0, 6, 1, {.dtype = DType::Float32});  // small: MPI's own all-reduce
  group->all_reduce(x, dist::ReduceOp::Sum);
  EXPECT_EQ(testing::values(x), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  group->all_reduce(x, dist::ReduceOp::Avg);
  EXPECT_EQ(testing::values(x), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  Tensor big = ones({100000});  // 400 kB
  dist::Work work = group->all_reduce_async(big, dist::ReduceOp::Avg, "big");
  work.wait(5);
  EXPECT_TRUE(work.completed());
  EXPECT_TRUE(work.poll());
  EXPECT_EQ(sum(big).item<double>(), 100000);
  group->broadcast(x, 0);
  Tensor gathered = zeros({6});
  group->all_gather(gathered, x);
  EXPECT_EQ(testing::values(gathered), testing::values(x));
  Tensor scattered = zeros({6});
  group->reduce_scatter(scattered, x, dist::ReduceOp::Sum);
  EXPECT_EQ(testing::values(scattered), testing::values(x));
  group->barrier();
  dist::Work done;  // default: complete
  done.wait(0.001);

  // Every collective is in the ledger with its payload.
  const auto after = Ledger::global().totals();
  EXPECT_EQ(after.collectives - before.collectives, 7);
  EXPECT_EQ(after.collective_bytes - before.collective_bytes, 24 + 24 + 400000 + 24 + 24 + 24);
  const auto records = Ledger::global().collectives();
  const auto it = std::find_if(records.begin(), records.end(), [](const CollectiveRecord& r) { return r.label == "big"; });
  ASSERT_NE(it, records.end());
  EXPECT_EQ(it->op, "all_reduce");
  EXPECT_EQ(it->backend, "mpi");
  EXPECT_EQ(it->algorithm, "MPI_Iallreduce");  // one rank: nothing to exchange, MPI's own call
  EXPECT_EQ(it->bytes, 400000);
  EXPECT_GE(it->duration_ms, it->wait_ms);
}

TEST(ProcessGroup, ChecksArgumentsBeforeCommunicating) {
  SKIP_WITHOUT_MPI();
  auto group = dist::init_process_group({.device = kCPU});
  const Device sim{DeviceType::Sim, 0};
  EXPECT_THROW(group->all_reduce(zeros({4}, {.device = sim})), DeviceMismatch);
  EXPECT_THROW(group->all_reduce(zeros({4, 4}).t().contiguous().t()), InvalidArgument);  // not contiguous
  EXPECT_THROW(group->all_reduce(zeros({4}, {.dtype = DType::Int64}), dist::ReduceOp::Avg), InvalidArgument);
  EXPECT_THROW(group->all_reduce(zeros({4}, {.dtype = DType::Bool})), InvalidArgument);
  EXPECT_THROW(group->all_gather(zeros({5}), zeros({4})), ShapeMismatch);
  EXPECT_THROW(group->all_gather(zeros({4}, {.dtype = DType::Int64}), zeros({4})), DTypeMismatch);
  EXPECT_THROW(group->broadcast(zeros({4}), 1), InvalidArgument);
  EXPECT_THROW(group->set_timeout(0), InvalidArgument);
  EXPECT_THROW(dist::init_process_group({.backend = dist::CommBackend::NCCL, .device = kCPU}), InvalidArgument);
  const std::string text = message_of([&] { group->all_reduce(zeros({4}, {.device = sim})); });
  EXPECT_NE(text.find("sim:0"), std::string::npos) << text;
}

TEST(ProcessGroup, DeviceTensorsAreStagedThroughHostMemoryAndLedgered) {
  SKIP_WITHOUT_MPI();
  const Device sim{DeviceType::Sim, 0};
  auto group = dist::init_process_group({.backend = dist::CommBackend::MPI, .device = sim});
  Tensor x = arange(0, 32768, 1, {.device = sim, .dtype = DType::Float32});  // 128 kB
  const auto before = Ledger::global().totals();
  group->all_reduce(x, dist::ReduceOp::Avg);
  const auto after = Ledger::global().totals();
  EXPECT_EQ(x.device(), sim);
  const auto v = testing::values(x);
  EXPECT_EQ(v[1], 1);
  EXPECT_EQ(v[32767], 32767);
  // Down to host memory and back up: two crossings of 128 kB.
  EXPECT_EQ(after.bytes_device_to_host - before.bytes_device_to_host, 131072);
  EXPECT_EQ(after.bytes_host_to_device - before.bytes_host_to_device, 131072);
}

// --- DDP with one rank: the same training as without it ----------------------------------------------------

std::shared_ptr<nn::Sequential> small_mlp(std::uint64_t seed, Device device) {
  manual_seed(seed);
  auto model = std::make_shared<nn::Sequential>(nn::Linear(6, 16), nn::ReLU(), nn::Linear(16, 16), nn::ReLU(),
                                                 nn::Linear(16, 3));
  model->to(device);
  return model;
}

TEST(DistributedDataParallel, OneRankTrainsExactlyLikeNoDDP) {
  SKIP_WITHOUT_MPI();
  for (Device device : {kCPU, Device{DeviceType::Sim, 0}}) {
    auto group = dist::init_process_group({.device = device});
    auto plain = small_mlp(7, device), wrapped = small_mlp(7, device);
    optim::SGD plain_opt(plain->parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD ddp_opt(wrapped->parameters(), {.lr = 0.1, .momentum = 0.9});
    // 100-byte buckets: one per parameter or two, so several start while backward still runs.
    dist::DistributedDataParallel ddp(*wrapped, *group, {.bucket_bytes = 100});
    EXPECT_GT(ddp.plan().buckets.size(), 3u);
    manual_seed(11);
    Tensor x = randn({8, 6}).to(device);
    Tensor y = randint(0, 3, {8}).to(device);
    for (int step = 0; step < 3; ++step) {
      plain_opt.zero_grad();
      nn::cross_entropy((*plain)(x), y).backward();
      plain_opt.step();
      ddp_opt.zero_grad();
      nn::cross_entropy(ddp(x), y).backward();
      ddp.finish_gradient_sync();
      ddp_opt.step();
    }
    const auto a = plain->parameters(), b = wrapped->parameters();
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(testing::all_close(b[i], a[i], 0, 0)) << device.str() << " " << i;
    EXPECT_EQ(ddp.stats().syncs, 3);
    EXPECT_EQ(ddp.stats().buckets_reduced, 3 * static_cast<std::int64_t>(ddp.plan().buckets.size()));
    EXPECT_GT(ddp.stats().buckets_started_in_backward, 0);
    EXPECT_EQ(ddp.stats().gradient_bytes, 4 * wrapped->parameter_count());
    EXPECT_EQ(ddp.check_replicas(), ddp.check_replicas());
  }
}

TEST(DistributedDataParallel, ParametersWithoutGradientsKeepNoneAndMisuseIsNamed) {
  SKIP_WITHOUT_MPI();
  auto group = dist::init_process_group({.device = kCPU});
  auto model = small_mlp(3, kCPU);
  dist::DistributedDataParallel ddp(*model, *group);
  // No backward at all: no rank used any parameter, so none gets a gradient (as in one process, where the optimizer
  // then skips them all), on every rank alike.
  ddp.finish_gradient_sync();
  for (const Tensor& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
  // Two backwards without finish_gradient_sync(): the second names the parameter and the fix.
  Tensor x = randn({2, 6});
  sum((*model)(x)).backward();
  const std::string text = message_of([&] { sum((*model)(x)).backward(); });
  EXPECT_NE(text.find("finish_gradient_sync"), std::string::npos) << text;
  EXPECT_THROW(dist::DistributedDataParallel(*small_mlp(3, Device{DeviceType::Sim, 0}), *group), DeviceMismatch);
}

// Compressed gradients on one rank: divided by 1 and summed over one rank, so each is its float32 gradient rounded to
// the 16-bit type once (and widened back), on cpu and through sim's staging; 2 bytes a gradient cross the wire.
// A dtype that is neither 16-bit nor the gradients' own is refused, naming it.
TEST(DistributedDataParallel, CompressedGradientsOnOneRankAreTheGradientsRounded) {
  SKIP_WITHOUT_MPI();
  for (const Device device : {kCPU, Device{DeviceType::Sim, 0}}) {
    auto group = dist::init_process_group({.backend = dist::CommBackend::MPI, .device = device});
    for (const DType dtype : {DType::BFloat16, DType::Float16}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " on " << device.str());
      auto model = small_mlp(3, device);
      auto reference = small_mlp(3, device);  // the same seed: the same parameters
      dist::DistributedDataParallel ddp(*model, *group, {.allreduce_dtype = dtype});
      EXPECT_EQ(ddp.stats().gradient_bytes, 2 * model->parameter_count());
      const Tensor x = randn({4, 6}).to(device);
      sum(square((*model)(x))).backward();
      ddp.finish_gradient_sync();
      sum(square((*reference)(x))).backward();
      for (std::size_t i = 0; i < model->parameters().size(); ++i) {
        const Tensor rounded = reference->parameters()[i].grad().to(dtype).to(DType::Float32);
        EXPECT_TRUE(testing::all_close(model->parameters()[i].grad().cpu(), rounded.cpu(), 0, 0)) << "parameter " << i;
      }
    }
    auto model = small_mlp(3, device);
    const std::string text =
        message_of([&] { dist::DistributedDataParallel(*model, *group, {.allreduce_dtype = DType::Int32}); });
    EXPECT_NE(text.find("allreduce_dtype int32"), std::string::npos) << text;
    dist::DistributedDataParallel same(*model, *group, {.allreduce_dtype = DType::Float32});  // as they are
    EXPECT_EQ(same.stats().gradient_bytes, 4 * model->parameter_count());
  }
}

}  // namespace
}  // namespace ferry
