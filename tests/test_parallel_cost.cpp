// test_parallel_cost.cpp — when the host's loops split over OpenMP's threads (src/cpu/parallel_cost.h).
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "../src/cpu/parallel_cost.h"
#include "../src/cpu/strided.h"
#include "ferry/backend.h"
#include "ferry/error.h"

namespace {

using ferry::cpu::kSleepingThreadsScale;
using ferry::cpu::parallel_work_scale_for;

TEST(ParallelCost, LoopsNeedSixteenTimesTheWorkWhereOpenmpThreadsSleep) {
  EXPECT_EQ(kSleepingThreadsScale, 16);
  EXPECT_EQ(parallel_work_scale_for(nullptr, nullptr), 1);  // libgomp's default: its threads spin a while
  EXPECT_EQ(parallel_work_scale_for("", nullptr), 1);
  EXPECT_EQ(parallel_work_scale_for("active", nullptr), 1);
  EXPECT_EQ(parallel_work_scale_for("passive", nullptr), 16);
  EXPECT_EQ(parallel_work_scale_for("PASSIVE", nullptr), 16);  // OpenMP reads the policy in any case
  EXPECT_EQ(parallel_work_scale_for("Passive", ""), 16);       // an empty FERRY_PARALLEL_SCALE is unset
  EXPECT_EQ(parallel_work_scale_for("passively", nullptr), 1);
}

TEST(ParallelCost, FerryParallelScaleSetsTheFactorUnderEitherPolicy) {
  EXPECT_EQ(parallel_work_scale_for("passive", "1"), 1);  // what scripts/test.sh sets
  EXPECT_EQ(parallel_work_scale_for(nullptr, "64"), 64);
  EXPECT_EQ(parallel_work_scale_for("active", "4096"), 4096);
}

TEST(ParallelCost, ABadFactorIsRefusedNamingTheVariableAndTheRange) {
  for (const char* bad : {"0", "4097", "-1", "16x", " 16", "1.5", "sixteen", "99999999999999999999"}) {
    try {
      (void)parallel_work_scale_for("passive", bad);
      ADD_FAILURE() << "FERRY_PARALLEL_SCALE='" << bad << "' was accepted";
    } catch (const ferry::InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("FERRY_PARALLEL_SCALE='") + bad + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("from 1 to 4096"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

TEST(ParallelCost, TheProcessReadsItsOwnEnvironment) {
  EXPECT_EQ(ferry::host_parallel_work_scale(),
            parallel_work_scale_for(std::getenv("OMP_WAIT_POLICY"), std::getenv("FERRY_PARALLEL_SCALE")));
  // What ferry devices adds to the cpu's libraries: nothing at 1, the reason otherwise.
  const std::string said = ferry::cpu::describe_parallel_work_scale();
  if (ferry::host_parallel_work_scale() == 1) EXPECT_EQ(said, "");
  else EXPECT_NE(said.find("x the usual work stay on one thread"), std::string::npos) << said;
}

// The most threads any call of a loop body saw, for a loop of `work` elements run by parallel_for and by strided_for.
struct ThreadsSeen {
  int parallel_for = 0;
  int strided_for = 0;
};
ThreadsSeen threads_seen(std::int64_t work) {
  std::atomic<int> seen_parallel{0}, seen_strided{0};
  const auto note = [](std::atomic<int>& seen) {
    const int n = omp_get_num_threads();
    int was = seen.load();
    while (n > was && !seen.compare_exchange_weak(was, n)) {
    }
  };
  ferry::cpu::parallel_for(work / 1024, 1024, [&](std::int64_t) { note(seen_parallel); });
  ferry::cpu::StridedShape<1> shape;
  shape.ndim = 1;
  shape.shape[0] = work;
  shape.strides[0][0] = 1;
  ferry::cpu::strided_for(shape, [&](std::int64_t, const auto&, const auto&) { note(seen_strided); });
  return {seen_parallel.load(), seen_strided.load()};
}

TEST(ParallelCost, TheFactorDecidesWhichLoopsSplit) {
  if (omp_get_max_threads() < 2) GTEST_SKIP() << "one OpenMP thread: no loop splits";
  const std::int64_t before = ferry::host_parallel_work_scale();
  const std::int64_t work = 4 * 32768;  // elements: twice strided.h's grain at the factor 1
  ferry::set_host_parallel_work_scale(1);
  const ThreadsSeen spinning = threads_seen(work);
  ferry::set_host_parallel_work_scale(16);
  const ThreadsSeen sleeping = threads_seen(work), sleeping_large = threads_seen(16 * work);
  ferry::set_host_parallel_work_scale(before);
  EXPECT_GE(spinning.parallel_for, 2);
  EXPECT_GE(spinning.strided_for, 2);
  EXPECT_EQ(sleeping.parallel_for, 1);  // the same loops stay on one thread at 16x
  EXPECT_EQ(sleeping.strided_for, 1);
  EXPECT_GE(sleeping_large.parallel_for, 2);  // and 16x the work splits again
  EXPECT_GE(sleeping_large.strided_for, 2);
  EXPECT_THROW(ferry::set_host_parallel_work_scale(0), ferry::InvalidArgument);
  EXPECT_THROW(ferry::set_host_parallel_work_scale(4097), ferry::InvalidArgument);
  EXPECT_EQ(ferry::host_parallel_work_scale(), before);
}

}  // namespace
