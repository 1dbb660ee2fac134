// test_parallel_cost.cpp — when the host's loops split over OpenMP's threads (src/cpu/parallel_cost.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "../src/cpu/parallel_cost.h"
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

}  // namespace
