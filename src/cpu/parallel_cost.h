// parallel_cost.h — when a host loop is worth splitting over OpenMP's threads.
//
// A parallel region's fixed cost depends on what the team's threads do between regions. Under libgomp's default (and
// OMP_WAIT_POLICY=active) they spin, and a region costs little: two threads already win on a GEMM that takes one core
// 17 us. Under OMP_WAIT_POLICY=passive they sleep, and each region first wakes them: 50-100 us on the 2-core CI machine
// (BENCHMARKS v0.44), where one core runs an LSTM step's 32 x 64 x 256 GEMM in 22 us. So the work thresholds of ferry's
// loops (strided.h's grain, the GEMM's minimum in host_kernels.cpp) are the spinning machine's, times
// host_parallel_work_scale() (ferry/backend.h): 1, or 16 where the threads sleep. FERRY_PARALLEL_SCALE=N (1 to 4096)
// sets the factor (scripts/test.sh sets 1, so that the tests split the same loops under either policy).
// Not here: how many threads (OpenMP's, OMP_NUM_THREADS), and OpenBLAS's own threads (blas_threads.h).
#pragma once

#include <cstdint>
#include <string>

namespace ferry::cpu {

inline constexpr std::int64_t kSleepingThreadsScale = 16;  // the factor where OpenMP's threads sleep between regions
inline constexpr std::int64_t kMaxParallelWorkScale = 4096;  // the largest factor FERRY_PARALLEL_SCALE may set

// The factor, from the two variables' values (nullptr when unset): FERRY_PARALLEL_SCALE when set, else
// kSleepingThreadsScale for OMP_WAIT_POLICY=passive (any case), else 1. Throws InvalidArgument for a
// FERRY_PARALLEL_SCALE that is not a whole number from 1 to 4096.
std::int64_t parallel_work_scale_for(const char* omp_wait_policy, const char* ferry_parallel_scale);

// What `ferry devices` and `ferry train` add to the cpu's libraries when the factor is not 1, e.g.
// "OpenMP threads sleep between loops (OMP_WAIT_POLICY=passive): loops below 16x the usual work stay on one
// thread"; empty when it is 1.
std::string describe_parallel_work_scale();

}  // namespace ferry::cpu
