// test_collectives.cpp — ferry's collectives across real ranks: run under mpirun -np N (ctest runs N = 2, 3, 4;
// tests/CMakeLists.txt). Every all-reduce algorithm the mpi backend picks by size and rank count (recursive
// doubling, MPI's own, the ring), every dtype, Sum and Avg, on cpu tensors and on the sim device's staged ones;
// every element checked on every rank, and the replicas compared bit for bit; a group that ends with collectives
// nobody waited for. Also what ranks that disagree get:
// tensors of different sizes (an error, not a corrupted heap), different models under DDP (refused), and DDP's
// parameters that no rank used (their .grad left alone); 16-bit sums and DDP's compressed gradients. Not here:
// one rank (tests/test_dist.cpp), training (tests/cli/test_ddp.sh).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "ferry/autograd.h"
#include "ferry/dist/ddp.h"
#include "ferry/dist/process_group.h"
#include "ferry/factories.h"
#include "ferry/ledger.h"
#include "ferry/nn/linear.h"
#include "ferry/ops.h"
#include "ferry/random.h"

#include "../test_helpers.h"

namespace ferry {
namespace {

dist::ProcessGroup* g_cpu = nullptr;  // the job's groups, made once in main()
dist::ProcessGroup* g_sim = nullptr;

// Element counts on both sides of the algorithm choices: 64 KiB of float32 is 16384 elements (below: doubling
// for 2 and 4 ranks, MPI's own for 3; from it: the ring), the ring's 1 MiB pieces, and counts that no rank
// count divides.
const std::vector<std::int64_t> kCounts = {1, 7, 1000, 1024, 16383, 16384, 16385, 300001, 1 << 20};

// Rank r's element i: r + 1 + (i mod 7). The sum over N ranks, N (N + 1) / 2 + N (i mod 7), is exact in
// every dtype (at most 34 for N = 4: uint8 too).
Tensor pattern(std::int64_t count, DType dtype, int rank, Device device) {
  std::vector<double> values(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) values[static_cast<std::size_t>(i)] = rank + 1 + static_cast<double>(i % 7);
  return from_vector(values, {.dtype = DType::Float64}).to(dtype).to(device);
}
double expected_sum(std::int64_t i, int n) { return n * (n + 1) / 2.0 + n * static_cast<double>(i % 7); }

// Values whose float sums round: sin(0.37 i + r) x 1000 (replicas must agree bit for bit all the same).
Tensor awkward(std::int64_t count, int rank) {
  std::vector<float> values(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    values[static_cast<std::size_t>(i)] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + rank) * 1000.0);
  }
  return from_vector(values);
}

// Elements where `t` differs from the expected sum, counted on this rank.
std::int64_t wrong_sums(const Tensor& t, int n, double divide_by = 1) {
  const std::vector<double> got = t.to(kCPU).to(DType::Float64).to_vector<double>();
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double want = expected_sum(static_cast<std::int64_t>(i), n) / divide_by;
    if (std::abs(got[i] - want) > 1e-6 * std::abs(want)) ++wrong;
  }
  return wrong;
}

TEST(Collectives, AllReduceSumIsExactForEveryCountAndDtype) {
  dist::ProcessGroup& g = *g_cpu;
  for (DType dtype : {DType::Float32, DType::Float64, DType::Int32, DType::Int64, DType::UInt8}) {
    for (std::int64_t count : kCounts) {
      Tensor t = pattern(count, dtype, g.rank(), kCPU);
      g.all_reduce(t, dist::ReduceOp::Sum);
      EXPECT_EQ(wrong_sums(t, g.world_size()), 0)
          << count << " elements of " << dtype_name(dtype) << " on rank " << g.rank() << " of " << g.world_size();
    }
  }
}

// The algorithm, as the ledger records it: by size (64 KiB) and by whether N is a power of two.
TEST(Collectives, TheLedgerNamesTheAlgorithmEachSizeTook) {
  dist::ProcessGroup& g = *g_cpu;
  const bool power_of_two = (g.world_size() & (g.world_size() - 1)) == 0;
  for (std::int64_t count : {std::int64_t{1000}, std::int64_t{16383}, std::int64_t{16384}, std::int64_t{300001}}) {
    Tensor t = pattern(count, DType::Float32, g.rank(), kCPU);
    g.all_reduce(t, dist::ReduceOp::Sum, "which algorithm");
    const std::vector<CollectiveRecord> records = Ledger::global().collectives();
    ASSERT_FALSE(records.empty());
    const CollectiveRecord& last = records.back();
    EXPECT_EQ(last.label, "which algorithm");
    EXPECT_EQ(last.bytes, 4 * count);
    const char* expected = count * 4 >= 64 * 1024 ? "ring" : power_of_two ? "recursive doubling" : "MPI_Iallreduce";
    EXPECT_EQ(last.algorithm, expected) << count << " float32 over " << g.world_size() << " ranks";
  }
}

TEST(Collectives, AllReduceAvgDividesTheSumByTheWorldSize) {
  dist::ProcessGroup& g = *g_cpu;
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (std::int64_t count : kCounts) {
      Tensor t = pattern(count, dtype, g.rank(), kCPU);
      g.all_reduce(t, dist::ReduceOp::Avg);
      EXPECT_EQ(wrong_sums(t, g.world_size(), g.world_size()), 0)
          << count << " elements of " << dtype_name(dtype) << " on rank " << g.rank();
    }
  }
}

// Every rank must hold the same bits afterwards, or data-parallel replicas drift apart.
TEST(Collectives, EveryRankHoldsTheSameBitsAfterAnAllReduce) {
  dist::ProcessGroup& g = *g_cpu;
  for (std::int64_t count : {std::int64_t{1000}, std::int64_t{16383}, std::int64_t{300001}}) {
    Tensor t = awkward(count, g.rank());
    g.all_reduce(t, dist::ReduceOp::Avg);
    Tensor everyone = zeros({g.world_size() * count});
    g.all_gather(everyone, t);
    const float* all = everyone.data<float>();
    for (int r = 1; r < g.world_size(); ++r) {
      EXPECT_EQ(std::memcmp(all, all + r * count, static_cast<std::size_t>(count) * sizeof(float)), 0)
          << count << " elements: rank " << r << " differs from rank 0";
    }
  }
}

// Device tensors cross to host memory and back (the sim device stands in for cuda here).
TEST(Collectives, StagedDeviceTensorsAreReducedToo) {
  dist::ProcessGroup& g = *g_sim;
  for (std::int64_t count : {std::int64_t{7}, std::int64_t{16383}, std::int64_t{300001}}) {
    Tensor t = pattern(count, DType::Float32, g.rank(), g.device());
    g.all_reduce(t, dist::ReduceOp::Sum);
    EXPECT_EQ(t.device(), g.device());
    EXPECT_EQ(wrong_sums(t, g.world_size()), 0) << count << " elements on " << g.device().str();
  }
}

// Several all-reduces of different algorithms in flight at once, waited for in reverse order (DDP's buckets
// do this): each completes with its own sum, none takes another's messages.
TEST(Collectives, AllReducesInFlightTogetherEachGetTheirOwnSum) {
  dist::ProcessGroup& g = *g_cpu;
  std::vector<Tensor> tensors;
  std::vector<dist::Work> works;
  for (std::int64_t count : {std::int64_t{100}, std::int64_t{300001}, std::int64_t{5}, std::int64_t{16384},
                             std::int64_t{2000}}) {
    tensors.push_back(pattern(count, DType::Float32, g.rank(), kCPU));
    works.push_back(g.all_reduce_async(tensors.back(), dist::ReduceOp::Sum));
  }
  for (std::size_t i = works.size(); i-- > 0;) {
    works[i].wait();
    EXPECT_EQ(wrong_sums(tensors[i], g.world_size()), 0) << "all-reduce " << i << " of " << tensors[i].numel();
  }
}

// A group that ends with collectives nobody waited for lets them finish first (MPI still writes their buffers;
// ProgressEngine::drain): the tensors hold their sums after the group is gone, and the ledger has each collective.
TEST(Collectives, AGroupThatEndsFinishesTheCollectivesNobodyWaitedFor) {
  std::vector<Tensor> tensors;
  Ledger& ledger = Ledger::global();
  const std::int64_t before = ledger.totals().collectives;
  {
    std::unique_ptr<dist::ProcessGroup> g = dist::init_process_group({.device = kCPU, .timeout_s = 60});
    for (std::int64_t count : {std::int64_t{7}, std::int64_t{300001}, std::int64_t{16384}}) {
      tensors.push_back(pattern(count, DType::Float32, g->rank(), kCPU));
      (void)g->all_reduce_async(tensors.back(), dist::ReduceOp::Sum, "left in flight");
    }
  }  // the group ends here, its three all-reduces not waited for
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(wrong_sums(tensors[i], g_cpu->world_size()), 0) << "all-reduce " << i << " of " << tensors[i].numel();
  }
  EXPECT_EQ(ledger.totals().collectives - before, 3);
  g_cpu->barrier();  // the ranks leave together
}

TEST(Collectives, BroadcastAllGatherReduceScatterAndBarrier) {
  dist::ProcessGroup& g = *g_cpu;
  const int n = g.world_size(), root = n - 1;
  Tensor b = full({1000}, g.rank() == root ? 42.0 : -1.0);
  g.broadcast(b, root);
  EXPECT_EQ(sum(b).item<double>(), 42000.0);

  Tensor mine = full({5}, static_cast<double>(g.rank()));
  Tensor gathered = zeros({5 * n});
  g.all_gather(gathered, mine);
  const std::vector<float> all = gathered.to_vector<float>();
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < 5; ++i) EXPECT_EQ(all[static_cast<std::size_t>(5 * r + i)], static_cast<float>(r));
  }

  Tensor slices = arange(0, 3.0 * n, 1, {.dtype = DType::Float32});  // every rank the same: slice r sums to N x its values
  Tensor out = zeros({3});
  g.reduce_scatter(out, slices, dist::ReduceOp::Sum);
  const std::vector<float> got = out.to_vector<float>();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(got[static_cast<std::size_t>(i)], static_cast<float>(n * (3 * g.rank() + i)));
  g.barrier();
}

// The 16-bit storage types move as 2-byte elements, on cpu and through sim's staging.
TEST(Collectives, HalfTensorsAreBroadcastAndGathered) {
  for (dist::ProcessGroup* group : {g_cpu, g_sim}) {
    dist::ProcessGroup& g = *group;
    const Device device = group == g_cpu ? kCPU : Device::parse("sim:0");
    SCOPED_TRACE(device.str());
    const int n = g.world_size(), root = 0;
    const Tensor values = div(arange(0, 100, 1, {.dtype = DType::Float32}), 3.0);
    for (const DType dtype : {DType::Float16, DType::BFloat16}) {
      Tensor b = (g.rank() == root ? values : zeros({100})).to(dtype).to(device);
      g.broadcast(b, root);
      EXPECT_TRUE(testing::all_close(b.to(kCPU), values.to(dtype), 0, 0));
      Tensor mine = full({4}, g.rank() + 0.5, {.device = device, .dtype = dtype});
      Tensor gathered = zeros({4 * n}, {.device = device, .dtype = dtype});
      g.all_gather(gathered, mine);
      const std::vector<float> all = gathered.to_vector<float>();
      for (int i = 0; i < 4 * n; ++i) EXPECT_EQ(all[static_cast<std::size_t>(i)], static_cast<float>(i / 4) + 0.5f);
    }
  }
  g_cpu->barrier();
}

// float16 and bfloat16 sums through every algorithm (64 KiB is 32768 of them), on cpu and staged from sim: the
// pattern's sums are small integers, exact in both; Avg is that sum divided in float32 and rounded once more;
// reduce_scatter sums with the same op.
TEST(Collectives, HalfTensorsAreSummedOnEveryAlgorithmPath) {
  for (dist::ProcessGroup* group : {g_cpu, g_sim}) {
    dist::ProcessGroup& g = *group;
    const Device device = group == g_cpu ? kCPU : Device::parse("sim:0");
    const int n = g.world_size();
    for (const DType dtype : {DType::Float16, DType::BFloat16}) {
      const double half_ulp = dtype == DType::BFloat16 ? 1.0 / 256 : 1.0 / 2048;  // relative
      for (std::int64_t count : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{32767}, std::int64_t{32768},
                                 std::int64_t{300001}, std::int64_t{1} << 20}) {
        SCOPED_TRACE(::testing::Message() << count << " " << dtype_name(dtype) << " on " << device.str() << ", rank "
                                        << g.rank() << " of " << n);
        Tensor t = pattern(count, dtype, g.rank(), device);
        g.all_reduce(t, dist::ReduceOp::Sum);
        EXPECT_EQ(t.dtype(), dtype);
        EXPECT_EQ(wrong_sums(t, n), 0);
        Tensor a = pattern(count, dtype, g.rank(), device);
        g.all_reduce(a, dist::ReduceOp::Avg);
        const std::vector<double> got = a.to(kCPU).to(DType::Float64).to_vector<double>();
        std::int64_t wrong = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
          const double want = expected_sum(static_cast<std::int64_t>(i), n) / n;
          if (std::abs(got[i] - want) > half_ulp * std::abs(want)) ++wrong;
        }
        EXPECT_EQ(wrong, 0);
      }
      Tensor slices = arange(0, 3.0 * n, 1, {.dtype = DType::Float32}).to(dtype).to(device);
      Tensor out = zeros({3}, {.device = device, .dtype = dtype});
      g.reduce_scatter(out, slices, dist::ReduceOp::Sum);
      const std::vector<float> got = out.to_vector<float>();
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(got[static_cast<std::size_t>(i)], static_cast<float>(n * (3 * g.rank() + i)));
      }
    }
  }
  g_cpu->barrier();
}

// Values whose 16-bit sums round: every addition is done in float32 and rounded back, so on 2 ranks each element is
// exactly dtype(float(a) + float(b)), and on N ranks within N - 1 roundings of the exact sum; every rank holds the
// same bits (the ring's all-gather, doubling's partners adding the same two values).
TEST(Collectives, HalfSumsRoundOnceAnAdditionAndEveryRankAgrees) {
  dist::ProcessGroup& g = *g_cpu;
  const int n = g.world_size();
  for (const DType dtype : {DType::Float16, DType::BFloat16}) {
    const double half_ulp = dtype == DType::BFloat16 ? 1.0 / 256 : 1.0 / 2048;
    for (std::int64_t count : {std::int64_t{1000}, std::int64_t{300001}}) {
      SCOPED_TRACE(::testing::Message() << count << " " << dtype_name(dtype) << " on rank " << g.rank() << " of " << n);
      const Tensor mine = div(awkward(count, g.rank()), 100.0).to(dtype);  // within float16's range summed
      Tensor inputs = zeros({n * count}, {.dtype = dtype});
      g.all_gather(inputs, mine);
      Tensor t = mine.clone();
      g.all_reduce(t, dist::ReduceOp::Sum);
      Tensor everyone = zeros({n * count}, {.dtype = dtype});
      g.all_gather(everyone, t);
      const auto* bits = static_cast<const std::uint16_t*>(everyone.data_ptr());
      for (int r = 1; r < n; ++r) {
        EXPECT_EQ(std::memcmp(bits, bits + r * count, static_cast<std::size_t>(count) * 2), 0) << "rank " << r;
      }
      const std::vector<float> x = inputs.to_vector<float>();
      const std::vector<float> got = t.to_vector<float>();
      // On 2 ranks, one addition and one rounding: dtype(float(a) + float(b)) itself.
      std::vector<float> pairs(static_cast<std::size_t>(count));
      for (std::size_t i = 0; n == 2 && i < pairs.size(); ++i) pairs[i] = x[i] + x[static_cast<std::size_t>(count) + i];
      const std::vector<float> rounded = from_vector(pairs).to(dtype).to_vector<float>();
      std::int64_t wrong = 0;
      for (std::int64_t i = 0; i < count; ++i) {
        const auto at = static_cast<std::size_t>(i);
        double exact = 0, magnitude = 0;
        for (int r = 0; r < n; ++r) {
          exact += x[static_cast<std::size_t>(r * count) + at];
          magnitude += std::abs(x[static_cast<std::size_t>(r * count) + at]);
        }
        if (n == 2 ? got[at] != rounded[at] : std::abs(got[at] - exact) > (n - 1) * half_ulp * magnitude) ++wrong;
      }
      EXPECT_EQ(wrong, 0);
    }
  }
}

// --- ranks that disagree ----------------------------------------------------------------------------------

// An all-reduce whose tensor has another element count on each rank: every rank stops with ShapeMismatch naming
// the bytes sent and expected, instead of reading past its buffers (Open MPI writes a too-long message on past a
// receive's end). Each case runs on a group of its own: after the error that group cannot be used again.
void expect_size_mismatch_is_reported(std::int64_t base, std::int64_t step, const char* algorithm) {
  auto g = dist::init_process_group({.device = kCPU, .timeout_s = 30});
  const std::int64_t count = base + step * g->rank();  // a different count on every rank
  Tensor t = pattern(count, DType::Float32, g->rank(), kCPU);
  try {
    g->all_reduce(t, dist::ReduceOp::Sum, "mismatched");
    ADD_FAILURE() << algorithm << ": an all-reduce of " << count << " elements on rank " << g->rank()
                  << " completed although every rank's count differs";
  } catch (const ShapeMismatch& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("all_reduce (mismatched"), std::string::npos) << what;
    EXPECT_NE(what.find("bytes where"), std::string::npos) << what;
    EXPECT_NE(what.find("do the ranks' tensors have the same shape and dtype?"), std::string::npos) << what;
  }
}

TEST(RanksThatDisagree, ARingAllReduceOfDifferentSizesThrowsOnEveryRank) {
  expect_size_mismatch_is_reported(40000, 3000, "ring");  // >= 64 KiB of float32 on every rank
}

TEST(RanksThatDisagree, ARecursiveDoublingAllReduceOfDifferentSizesThrowsOnEveryRank) {
  if ((g_cpu->world_size() & (g_cpu->world_size() - 1)) != 0) GTEST_SKIP() << "MPI's own all-reduce for this N";
  expect_size_mismatch_is_reported(1000, 100, "recursive doubling");
}

// A module whose forward uses `first`, and `second` only when `use_second` (it is set per rank below).
struct TwoLayers : nn::Module {
  std::shared_ptr<nn::Linear> first, second, never;
  bool use_second = false;
  TwoLayers() {
    first = register_module("first", std::make_shared<nn::Linear>(3, 3));
    second = register_module("second", std::make_shared<nn::Linear>(3, 3));
    never = register_module("never", std::make_shared<nn::Linear>(3, 3));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = (*first)(x);
    return use_second ? (*second)(y) : y;
  }
  std::string type_name() const override { return "TwoLayers"; }
};

// Rank 0 builds Linear(6, 4), the others Linear(4, 6): the same number of weights, another shape. The DDP
// constructor refuses on every rank before anything is broadcast, naming the parameter and the ranks.
TEST(RanksThatDisagree, DdpRefusesRanksThatBuiltDifferentModels) {
  auto g = dist::init_process_group({.device = kCPU, .timeout_s = 30});
  manual_seed(1);
  nn::Linear linear(g->rank() == 0 ? 6 : 4, g->rank() == 0 ? 4 : 6);
  try {
    dist::DistributedDataParallel ddp(linear, *g);
    ADD_FAILURE() << "DDP accepted weight " << shape_str(linear.weight.shape()) << " on rank " << g->rank();
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("parameter 'weight' (shape [4, 6], float32) on rank 0"), std::string::npos) << what;
    EXPECT_NE(what.find("differs on rank(s) 1"), std::string::npos) << what;
  }
  // The group is still whole: nothing was in flight when the ranks stopped.
  Tensor t = pattern(5, DType::Float32, g->rank(), kCPU);
  g->all_reduce(t);
  EXPECT_EQ(wrong_sums(t, g->world_size()), 0);
}

TEST(RanksThatDisagree, DdpRefusesADifferentNumberOfParameters) {
  auto g = dist::init_process_group({.device = kCPU, .timeout_s = 30});
  nn::Linear linear(4, 4, /*bias=*/g->rank() != g->world_size() - 1);
  EXPECT_THROW(dist::DistributedDataParallel(linear, *g), InvalidArgument);
}

// A parameter that no rank's backward reached keeps .grad undefined, as in one process (so SGD's weight decay and
// momentum leave it alone); one used on rank 0 only gets the average over the ranks, on every rank.
TEST(RanksThatDisagree, DdpLeavesTheGradientOfParametersNoRankUsedUndefined) {
  auto g = dist::init_process_group({.device = kCPU, .timeout_s = 30});
  manual_seed(3);
  TwoLayers model;
  model.use_second = g->rank() == 0;
  dist::DistributedDataParallel ddp(model, *g, {.bucket_bytes = 64});  // several buckets
  const Tensor x = full({2, 3}, 1.0 + g->rank());
  sum(ddp(x)).backward();
  ddp.finish_gradient_sync();
  EXPECT_FALSE(model.never->weight.grad().defined()) << "rank " << g->rank();
  EXPECT_FALSE(model.never->bias.grad().defined()) << "rank " << g->rank();
  ASSERT_TRUE(model.first->weight.grad().defined());
  ASSERT_TRUE(model.second->bias.grad().defined()) << "used on rank 0: the average reaches every rank";
  // d sum(second(y)) / d second.bias = 2 (rows) on rank 0, nothing elsewhere: the average is 2 / N.
  const std::vector<float> bias_grad = model.second->bias.grad().to_vector<float>();
  for (float v : bias_grad) EXPECT_FLOAT_EQ(v, 2.0f / static_cast<float>(g->world_size()));
  // A second step, with .grad cleared to undefined as zero_grad(true) does: the same again.
  for (const Tensor& p : model.parameters()) p.set_grad(Tensor());
  sum(ddp(x)).backward();
  ddp.finish_gradient_sync();
  EXPECT_FALSE(model.never->weight.grad().defined());
  EXPECT_TRUE(model.second->weight.grad().defined());
  ddp.check_replicas();
}

// Gradient accumulation under no_sync(): each rank runs two micro-batches, the first inside no_sync(), then one
// synced step. Every rank ends with the average over the ranks of its two summed micro-batch gradients, computed
// here again without DDP from every rank's data (all of it seeded), and only one all-reduce per bucket ran. The
// `second` layer is used only by rank 0's first micro-batch (inside no_sync): its accumulated gradient must still
// reach the all-reduce, not be counted as zero.
TEST(DistributedDataParallel, NoSyncAccumulatesLocallyAndTheNextStepAveragesTheSums) {
  auto g = dist::init_process_group({.device = kCPU, .timeout_s = 30});
  const int n = g->world_size();
  const auto micro_batch = [](int rank, int k) {
    manual_seed(static_cast<std::uint64_t>(100 + 10 * rank + k));
    return randn({4, 3});
  };
  const auto build = [] {
    manual_seed(5);
    return std::make_shared<TwoLayers>();
  };
  auto model = build();
  dist::DistributedDataParallel ddp(*model, *g, {.bucket_bytes = 64});
  const std::int64_t reduced_before = ddp.stats().buckets_reduced;
  {
    auto accumulate = ddp.no_sync();
    EXPECT_TRUE(ddp.in_no_sync());
    model->use_second = g->rank() == 0;
    sum(square(ddp(micro_batch(g->rank(), 0)))).backward();
    EXPECT_THROW(ddp.finish_gradient_sync(), InvalidArgument);
  }
  EXPECT_EQ(ddp.stats().buckets_reduced, reduced_before) << "no all-reduce inside no_sync()";
  model->use_second = false;
  sum(square(ddp(micro_batch(g->rank(), 1)))).backward();
  EXPECT_THROW({ auto again = ddp.no_sync(); }, InvalidArgument);  // this step's buckets are filling
  ddp.finish_gradient_sync();
  EXPECT_EQ(ddp.stats().buckets_reduced - reduced_before, static_cast<std::int64_t>(ddp.plan().buckets.size()));
  // The same without DDP: every rank's two micro-batches, summed per rank, averaged over the ranks.
  auto reference = build();
  std::vector<Tensor> expected;
  for (int r = 0; r < n; ++r) {
    for (const Tensor& p : reference->parameters()) p.set_grad(Tensor());
    reference->use_second = r == 0;
    sum(square((*reference)(micro_batch(r, 0)))).backward();
    reference->use_second = false;
    sum(square((*reference)(micro_batch(r, 1)))).backward();
    const auto params = reference->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Tensor grad = params[i].grad().defined() ? params[i].grad().clone() : zeros(params[i].shape());
      if (r == 0) expected.push_back(grad);
      else expected[i] = add(expected[i], grad);
    }
  }
  const auto params = model->parameters();
  const auto names = model->named_parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (names[i].first.rfind("never", 0) == 0) {
      EXPECT_FALSE(params[i].grad().defined()) << names[i].first;
      continue;
    }
    ASSERT_TRUE(params[i].grad().defined()) << names[i].first << " on rank " << g->rank();
    const std::vector<float> got = params[i].grad().to_vector<float>();
    const std::vector<float> want = div(expected[i], static_cast<double>(n)).to_vector<float>();
    for (std::size_t j = 0; j < got.size(); ++j) {
      EXPECT_NEAR(got[j], want[j], 1e-5 * (1 + std::abs(want[j]))) << names[i].first << "[" << j << "] on rank "
                                                                     << g->rank();
    }
  }
  ddp.check_replicas();
}

// Gradients compressed to bfloat16 or float16 on the wire (DDPOptions::allreduce_dtype, PyTorch's compress hooks):
// half the bytes; each rank's gradient divided by N and rounded, the rounded values summed with a rounding per
// addition, the result widened back. On 2 ranks that is exactly dtype(dtype(g0 / 2) + dtype(g1 / 2)); on N, within
// N roundings of the float32 average. Replicas stay identical. Ranks that ask for different dtypes are refused.
TEST(DistributedDataParallel, CompressedGradientsHalveTheBytesAndRoundTheAverage) {
  auto g = dist::init_process_group({.device = kCPU, .timeout_s = 30});
  const int n = g->world_size();
  const auto batch = [](int rank) {
    manual_seed(static_cast<std::uint64_t>(200 + rank));
    return randn({8, 5});
  };
  for (const DType dtype : {DType::BFloat16, DType::Float16}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " on rank " << g->rank() << " of " << n);
    const double half_ulp = dtype == DType::BFloat16 ? 1.0 / 256 : 1.0 / 2048;
    manual_seed(9);
    nn::Linear model(5, 7);
    dist::DistributedDataParallel ddp(model, *g, {.bucket_bytes = 64, .allreduce_dtype = dtype});
    EXPECT_EQ(ddp.allreduce_dtype(), dtype);
    EXPECT_EQ(ddp.stats().gradient_bytes, 2 * (5 * 7 + 7)) << "2 bytes a gradient on the wire";
    sum(square(ddp(batch(g->rank())))).backward();
    ddp.finish_gradient_sync();
    // Every rank's own float32 gradients, computed again without DDP.
    manual_seed(9);
    nn::Linear reference(5, 7);
    std::vector<std::vector<Tensor>> per_rank;
    for (int r = 0; r < n; ++r) {
      for (const Tensor& p : reference.parameters()) p.set_grad(Tensor());
      sum(square(reference(batch(r)))).backward();
      per_rank.emplace_back();
      for (const Tensor& p : reference.parameters()) per_rank.back().push_back(p.grad().clone());
    }
    const auto params = model.parameters();
    for (std::size_t k = 0; k < params.size(); ++k) {
      const std::vector<float> got = params[k].grad().to_vector<float>();
      std::vector<std::vector<float>> g_r;
      for (int r = 0; r < n; ++r) g_r.push_back(per_rank[static_cast<std::size_t>(r)][k].to_vector<float>());
      std::vector<float> exact_pair(got.size());
      if (n == 2) {  // dtype(dtype(g0 / 2) + dtype(g1 / 2)), widened
        const std::vector<float> h0 = mul(per_rank[0][k], 0.5).to(dtype).to_vector<float>();
        const std::vector<float> h1 = mul(per_rank[1][k], 0.5).to(dtype).to_vector<float>();
        for (std::size_t i = 0; i < got.size(); ++i) exact_pair[i] = h0[i] + h1[i];
        exact_pair = from_vector(exact_pair).to(dtype).to_vector<float>();
      }
      std::int64_t wrong = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        double mean = 0, magnitude = 0;
        for (int r = 0; r < n; ++r) {
          mean += g_r[static_cast<std::size_t>(r)][i] / n;
          magnitude += std::abs(g_r[static_cast<std::size_t>(r)][i]) / n;
        }
        if (n == 2 ? got[i] != exact_pair[i] : std::abs(got[i] - mean) > 2 * n * half_ulp * magnitude) ++wrong;
      }
      EXPECT_EQ(wrong, 0) << "parameter " << k;
    }
    EXPECT_NO_THROW(ddp.check_replicas());
  }
  // Rank 0 compresses, the others do not: refused on every rank before any gradient moves.
  nn::Linear model(5, 7);
  const std::optional<DType> asked = g->rank() == 0 ? std::optional<DType>(DType::BFloat16) : std::nullopt;
  try {
    dist::DistributedDataParallel ddp(model, *g, {.allreduce_dtype = asked});
    ADD_FAILURE() << "DDP accepted bfloat16 on rank 0 and float32 elsewhere";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("allreduce_dtype is bfloat16 on rank 0 but float32 on rank 1"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto cpu = ferry::dist::init_process_group({.device = ferry::kCPU, .timeout_s = 60});
  auto sim = ferry::dist::init_process_group({.backend = ferry::dist::CommBackend::MPI,
                                              .device = ferry::Device(ferry::DeviceType::Sim, 0), .timeout_s = 60});
  if (cpu->world_size() < 2) {
    std::fprintf(stderr, "test_collectives: run it under mpirun -np N with N >= 2 (world size is 1)\n");
    return 1;
  }
  ferry::g_cpu = cpu.get();
  ferry::g_sim = sim.get();
  if (cpu->rank() != 0) {  // one report: rank 0's (a failure on another rank still fails the job's exit status)
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int status = RUN_ALL_TESTS();
  sim.reset();
  cpu.reset();
  ferry::dist::finalize();
  return status;
}
