// tests/test_cost_model.cpp — every numbered exercise of the sheet (seed/gpu-device-management-exercises.txt) as a test
// of ferry::cost, plus the input checks. Not here: unit parsing (test_units.cpp) or the `ferry plan` CLI (cli/test_plan.sh).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "ferry/cost_model.h"
#include "ferry/error.h"
#include "ferry/units.h"

namespace {

using ferry::DType;
namespace cost = ferry::cost;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// The message of the ferry::InvalidArgument that `f` throws; fails the test when it throws nothing
// or something else. Every message must be one line.
template <typename F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const ferry::InvalidArgument& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "expected ferry::InvalidArgument";
  return "";
}

// ---- the exercises -------------------------------------------------------------------------------

TEST(CostModelExercises, Ex2_1_TensorOf1000x1000Float32Is4MB) {
  EXPECT_EQ(cost::tensor_elements({1000, 1000}), 1'000'000);
  const std::int64_t bytes = cost::tensor_bytes({1000, 1000}, DType::Float32);
  EXPECT_EQ(bytes, 4'000'000);
  EXPECT_DOUBLE_EQ(static_cast<double>(bytes) / 1e6, 4.0);  // MB, 1 MB = 10^6 bytes
  EXPECT_EQ(ferry::format_bytes(static_cast<double>(bytes)), "4 MB");
}

TEST(CostModelExercises, Ex2_2_FourMBOver16GBPerSecondIsQuarterMillisecond) {
  const double seconds = cost::transfer_seconds(4e6, 16e9);
  EXPECT_DOUBLE_EQ(seconds, 2.5e-4);
  EXPECT_EQ(ferry::format_seconds(seconds), "0.25 ms");
  // The same, from the units as the sheet writes them.
  EXPECT_DOUBLE_EQ(cost::transfer_seconds(ferry::parse_bytes("4MB"), ferry::parse_bandwidth("16GB/s")), 2.5e-4);
}

TEST(CostModelExercises, Ex2_3_TheoreticalSpeedupIs250) {
  EXPECT_DOUBLE_EQ(cost::theoretical_speedup(1.5e9, 8000, 3e9, 16), 250.0);
  // The GHz cancel: any common unit gives the same S.
  EXPECT_DOUBLE_EQ(cost::theoretical_speedup(1.5, 8000, 3, 16), 250.0);
}

TEST(CostModelExercises, Ex3_1_TransfersLeave31Point25OfTheSpeedup) {
  const cost::GoldenRule rule = cost::golden_rule(250, 0.1, 0.7);
  EXPECT_DOUBLE_EQ(rule.speedup_real, 31.25);
  EXPECT_DOUBLE_EQ(rule.efficiency, 0.125);  // 1 / (1 + 7): transfers ate 87.5%
}

TEST(CostModelExercises, Ex3_2_ResidentDataKeepsTheFullSpeedupAndIs8xBetter) {
  const cost::GoldenRule resident = cost::golden_rule(250, 0.1, 0.0);
  EXPECT_DOUBLE_EQ(resident.speedup_real, 250.0);
  EXPECT_DOUBLE_EQ(resident.efficiency, 1.0);
  const cost::GoldenRule with_transfers = cost::golden_rule(250, 0.1, 0.7);
  EXPECT_DOUBLE_EQ(resident.speedup_real / with_transfers.speedup_real, 8.0);
}

TEST(CostModelExercises, Ex4_1_AllReduceOf25MFloat32Moves200MB) {
  const cost::AllReduceBytes moved = cost::allreduce_bytes(25'000'000, DType::Float32, 4);
  EXPECT_EQ(moved.bytes, 200'000'000);                    // 2 x P x 4, the sheet's estimate
  EXPECT_DOUBLE_EQ(moved.bytes_ring_per_gpu, 150'000'000);  // 2 x 3/4 x P x 4
  EXPECT_EQ(ferry::format_bytes(static_cast<double>(moved.bytes)), "200 MB");
}

TEST(CostModelExercises, Ex4_2_GlobalBatch256On4GpusIs64Each) {
  EXPECT_EQ(cost::per_gpu_batch(256, 4), 64);
}

TEST(CostModelExercises, Ex5_1_LoggingEveryStepWastes3Point81Percent) {
  const cost::LoopTime loop = cost::loop_time(5e-3, 20e-3, 1e-3, 1000, 100);
  EXPECT_NEAR(loop.total_s_log_every_step, 26.0, 1e-9);  // (a) (25 + 1) ms x 1000
  EXPECT_NEAR(loop.total_s, 25.01, 1e-9);                // (b) 25 ms x 1000 + 1 ms x 10
  EXPECT_EQ(loop.logs, 10);
  EXPECT_NEAR(loop.waste_fraction, 990.0 / 26000.0, 1e-12);  // (c)
  EXPECT_NEAR(std::round(loop.waste_fraction * 1e4) / 1e4, 0.0381, 1e-12);
}

TEST(CostModelExercises, Ex5_2_Batch512On4GpusIs128AndNMustDivideB) {
  EXPECT_EQ(cost::per_gpu_batch(512, 4), 128);
  const std::string message = invalid_argument_message([] { cost::per_gpu_batch(510, 4); });
  EXPECT_NE(message.find("B = 510"), std::string::npos) << message;
  EXPECT_NE(message.find("N = 4"), std::string::npos) << message;
  EXPECT_NE(message.find("508"), std::string::npos) << message;
  EXPECT_NE(message.find("512"), std::string::npos) << message;
}

// ---- tensor_bytes --------------------------------------------------------------------------------

TEST(CostModel, TensorBytesOfEveryDType) {
  EXPECT_EQ(cost::tensor_bytes({2, 3}, DType::Float64), 48);
  EXPECT_EQ(cost::tensor_bytes({2, 3}, DType::Int32), 24);
  EXPECT_EQ(cost::tensor_bytes({2, 3}, DType::Int64), 48);
  EXPECT_EQ(cost::tensor_bytes({2, 3}, DType::UInt8), 6);
  EXPECT_EQ(cost::tensor_bytes({2, 3}, DType::Bool), 6);
}

TEST(CostModel, ScalarAndEmptyTensors) {
  EXPECT_EQ(cost::tensor_elements({}), 1);  // a scalar has one element
  EXPECT_EQ(cost::tensor_bytes({}, DType::Float32), 4);
  EXPECT_EQ(cost::tensor_bytes({0, 1000}, DType::Float32), 0);
}

TEST(CostModel, TensorBytesRejectsNegativeDimensions) {
  const std::string message = invalid_argument_message([] { cost::tensor_bytes({-3, 4}, DType::Float32); });
  EXPECT_NE(message.find("-3"), std::string::npos) << message;
}

TEST(CostModel, TensorBytesRejectsOverflow) {
  // Elements fit, bytes do not.
  invalid_argument_message([] { cost::tensor_bytes({kInt64Max / 2}, DType::Float32); });
  // Elements do not fit.
  invalid_argument_message([] { cost::tensor_bytes({1LL << 32, 1LL << 32}, DType::UInt8); });
  // A zero dimension anywhere makes the tensor empty, even after huge ones.
  EXPECT_EQ(cost::tensor_bytes({kInt64Max, 0}, DType::Float64), 0);
  // Just fits: 2^62 bytes.
  EXPECT_EQ(cost::tensor_bytes({1LL << 30, 1LL << 30}, DType::Float32), 1LL << 62);
}

// ---- transfer_seconds, theoretical_speedup, golden_rule -----------------------------------------

TEST(CostModel, TransferSecondsChecksInputs) {
  EXPECT_EQ(cost::transfer_seconds(0, 16e9), 0.0);
  invalid_argument_message([] { cost::transfer_seconds(-1, 16e9); });
  invalid_argument_message([] { cost::transfer_seconds(4e6, 0); });
  invalid_argument_message([] { cost::transfer_seconds(4e6, -16e9); });
  invalid_argument_message([] { cost::transfer_seconds(kNaN, 16e9); });
  invalid_argument_message([] { cost::transfer_seconds(4e6, kNaN); });
  invalid_argument_message([] { cost::transfer_seconds(kInf, 16e9); });
}

TEST(CostModel, SpeedupChecksInputs) {
  invalid_argument_message([] { cost::theoretical_speedup(0, 8000, 3e9, 16); });
  invalid_argument_message([] { cost::theoretical_speedup(1.5e9, 0, 3e9, 16); });
  invalid_argument_message([] { cost::theoretical_speedup(1.5e9, 8000, kNaN, 16); });
  invalid_argument_message([] { cost::theoretical_speedup(1.5e9, 8000, 3e9, -16); });
  invalid_argument_message([] { cost::theoretical_speedup(1e300, kInt64Max, 1e-300, 1); });  // S overflows
}

TEST(CostModel, GoldenRuleChecksInputs) {
  invalid_argument_message([] { cost::golden_rule(250, 0, 0.7); });  // divides by T_compute
  invalid_argument_message([] { cost::golden_rule(250, 0.1, -0.7); });
  invalid_argument_message([] { cost::golden_rule(0, 0.1, 0.7); });
  invalid_argument_message([] { cost::golden_rule(kNaN, 0.1, 0.7); });
  invalid_argument_message([] { cost::golden_rule(250, kInf, 0.7); });
}

TEST(CostModel, GoldenRuleEfficiencyFallsAsTransfersGrow) {
  double previous = 1.0;
  for (double transfer_s : {0.01, 0.1, 1.0, 10.0}) {
    const cost::GoldenRule rule = cost::golden_rule(100, 0.1, transfer_s);
    EXPECT_LT(rule.efficiency, previous);
    EXPECT_DOUBLE_EQ(rule.speedup_real, 100 * rule.efficiency);
    previous = rule.efficiency;
  }
  EXPECT_DOUBLE_EQ(cost::golden_rule(100, 0.1, 0.1).efficiency, 0.5);  // transfer = compute halves S
}

// ---- allreduce_bytes -----------------------------------------------------------------------------

TEST(CostModel, AllReduceRingBytesDependOnN) {
  EXPECT_DOUBLE_EQ(cost::allreduce_bytes(25'000'000, DType::Float32, 1).bytes_ring_per_gpu, 0.0);
  EXPECT_DOUBLE_EQ(cost::allreduce_bytes(25'000'000, DType::Float32, 2).bytes_ring_per_gpu, 100'000'000);
  EXPECT_DOUBLE_EQ(cost::allreduce_bytes(25'000'000, DType::Float32, 8).bytes_ring_per_gpu, 175'000'000);
  // The estimate does not depend on N, and the ring approaches it as N grows.
  EXPECT_EQ(cost::allreduce_bytes(25'000'000, DType::Float32, 1000).bytes, 200'000'000);
  EXPECT_LT(cost::allreduce_bytes(25'000'000, DType::Float32, 1000).bytes_ring_per_gpu, 200'000'000);
  EXPECT_EQ(cost::allreduce_bytes(25'000'000, DType::Float64, 4).bytes, 400'000'000);
  EXPECT_EQ(cost::allreduce_bytes(0, DType::Float32, 4).bytes, 0);
}

TEST(CostModel, AllReduceChecksInputs) {
  const std::string message = invalid_argument_message([] { cost::allreduce_bytes(25'000'000, DType::Float32, 0); });
  EXPECT_NE(message.find("GPUs"), std::string::npos) << message;
  invalid_argument_message([] { cost::allreduce_bytes(25'000'000, DType::Float32, -4); });
  invalid_argument_message([] { cost::allreduce_bytes(-1, DType::Float32, 4); });
  invalid_argument_message([] { cost::allreduce_bytes(kInt64Max / 4, DType::Float32, 4); });  // overflow
}

// ---- per_gpu_batch -------------------------------------------------------------------------------

TEST(CostModel, PerGpuBatchNamesTheNearestValidSizes) {
  const std::string message = invalid_argument_message([] { cost::per_gpu_batch(250, 4); });
  EXPECT_NE(message.find("B = 250"), std::string::npos) << message;
  EXPECT_NE(message.find("N = 4"), std::string::npos) << message;
  EXPECT_NE(message.find("248 (62 per GPU)"), std::string::npos) << message;
  EXPECT_NE(message.find("252 (63 per GPU)"), std::string::npos) << message;
}

TEST(CostModel, PerGpuBatchBelowNOffersOnlyTheSizeAbove) {
  const std::string message = invalid_argument_message([] { cost::per_gpu_batch(3, 4); });
  EXPECT_NE(message.find("4 (1 per GPU)"), std::string::npos) << message;
  EXPECT_EQ(message.find("0 (0 per GPU)"), std::string::npos) << message;
}

TEST(CostModel, PerGpuBatchNearInt64MaxOffersOnlyTheSizeBelow) {
  const std::string message = invalid_argument_message([] { cost::per_gpu_batch(kInt64Max, 2); });
  EXPECT_NE(message.find(std::to_string(kInt64Max - 1)), std::string::npos) << message;
}

TEST(CostModel, PerGpuBatchChecksInputs) {
  EXPECT_EQ(cost::per_gpu_batch(7, 1), 7);
  EXPECT_EQ(cost::per_gpu_batch(4, 4), 1);
  invalid_argument_message([] { cost::per_gpu_batch(256, 0); });
  invalid_argument_message([] { cost::per_gpu_batch(256, -4); });
  invalid_argument_message([] { cost::per_gpu_batch(0, 4); });
  invalid_argument_message([] { cost::per_gpu_batch(-256, 4); });
}

// ---- loop_time -----------------------------------------------------------------------------------

TEST(CostModel, LoopTimeLoggingEveryStepWastesNothing) {
  const cost::LoopTime loop = cost::loop_time(5e-3, 20e-3, 1e-3, 1000, 1);
  EXPECT_DOUBLE_EQ(loop.total_s, loop.total_s_log_every_step);
  EXPECT_EQ(loop.waste_fraction, 0.0);
  EXPECT_EQ(loop.logs, 1000);
}

TEST(CostModel, LoopTimeCountsOnlyWholeLogIntervals) {
  EXPECT_EQ(cost::loop_time(0, 1, 1, 1050, 100).logs, 10);  // the 100th ... 1000th steps
  EXPECT_EQ(cost::loop_time(0, 1, 1, 99, 100).logs, 0);
  const cost::LoopTime free = cost::loop_time(0, 0, 0, 1000, 100);
  EXPECT_EQ(free.total_s, 0.0);
  EXPECT_EQ(free.waste_fraction, 0.0);  // no division by zero
}

TEST(CostModel, LoopTimeChecksInputs) {
  invalid_argument_message([] { cost::loop_time(-5e-3, 20e-3, 1e-3, 1000, 100); });
  invalid_argument_message([] { cost::loop_time(5e-3, kNaN, 1e-3, 1000, 100); });
  invalid_argument_message([] { cost::loop_time(5e-3, 20e-3, kInf, 1000, 100); });
  invalid_argument_message([] { cost::loop_time(5e-3, 20e-3, 1e-3, -1, 100); });
  // No steps: the waste fraction would be 0 / 0 ("(0 s - 0 s) / 0 s = 0").
  EXPECT_NE(invalid_argument_message([] { cost::loop_time(5e-3, 20e-3, 1e-3, 0, 100); }).find(">= 1, got 0"),
            std::string::npos);
  invalid_argument_message([] { cost::loop_time(5e-3, 20e-3, 1e-3, 1000, 0); });
  invalid_argument_message([] { cost::loop_time(1e300, 1e300, 0, kInt64Max, 1); });  // total overflows
}

}  // namespace
