// test_report.cpp — the ledger report: per-step T_transfer, T_compute, T_sync and bytes add up, the
// Golden Rule comes out as the cost model says, and advice appears when copies or syncs dominate.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "ferry/cost_model.h"
#include "ferry/backend.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/ledger.h"
#include "ferry/ops.h"
#include "ferry/phase.h"
#include "ferry/report.h"

namespace ferry {
namespace {

const Device kSim0{DeviceType::Sim, 0};

// Sets the sim link for one test and puts the old setting back.
class SimLink {
 public:
  explicit SimLink(double bytes_per_second) : previous_(sim_link_bandwidth()) { set_sim_link_bandwidth(bytes_per_second); }
  ~SimLink() { set_sim_link_bandwidth(previous_); }

 private:
  double previous_;
};

bool has_line(const LedgerReport& report, const std::string& text) {
  for (const std::string& line : report.advice) {
    if (line.find(text) != std::string::npos) return true;
  }
  return false;
}

std::string all_advice(const LedgerReport& report) {
  std::string out;
  for (const std::string& line : report.advice) out += line + "\n";
  return out;
}

// A step the way a training loop on sim:0 records it: 10 ms long; a 16 MB pageable copy in a 4.1 ms
// transfer phase, 5.5 ms of compute, a 0.3 ms sync phase holding item(), 0.1 ms outside every phase.
void add_synthetic_step(LedgerSnapshot& s, std::int64_t step, double t0_ms) {
  s.steps.push_back({.step = step, .start_ms = t0_ms, .duration_ms = 10.0});
  s.phases.push_back({.kind = PhaseKind::Transfer, .device = kSim0, .label = "batch", .start_ms = t0_ms,
                      .duration_ms = 4.1, .step = step});
  s.phases.push_back({.kind = PhaseKind::Compute, .device = kSim0, .label = "forward+backward",
                      .start_ms = t0_ms + 4.1, .duration_ms = 5.5, .step = step});
  s.phases.push_back({.kind = PhaseKind::Sync, .device = kSim0, .label = "log", .start_ms = t0_ms + 9.6,
                      .duration_ms = 0.3, .step = step});
  TransferRecord batch;
  batch.direction = Direction::HostToDevice;
  batch.source = kCPU;
  batch.target = kSim0;
  batch.bytes = 16'000'000;
  batch.start_ms = t0_ms + 0.05;
  batch.duration_ms = 4.0;
  batch.step = step;
  batch.label = "to()";
  s.transfers.push_back(batch);
  TransferRecord loss = batch;
  loss.direction = Direction::DeviceToHost;
  loss.source = kSim0;
  loss.target = kCPU;
  loss.bytes = 4;
  loss.start_ms = t0_ms + 9.65;
  loss.duration_ms = 0.25;
  loss.label = "item()";
  s.transfers.push_back(loss);
  s.syncs.push_back({.device = kSim0, .reason = "item()", .start_ms = t0_ms + 9.65, .duration_ms = 0.25, .step = step});
}

TEST(Report, SyntheticStepsAddUp) {
  LedgerSnapshot s;
  for (int step = 0; step < 4; ++step) add_synthetic_step(s, step, 100.0 + 10.0 * step);
  const LedgerReport r = make_report(s, {.speedup = 250.0});
  ASSERT_EQ(r.steps, 4);
  EXPECT_EQ(r.transfer_source, "phases");
  EXPECT_EQ(r.compute_source, "phases");
  EXPECT_EQ(r.sync_source, "phases");
  EXPECT_NEAR(r.mean.t_step_ms, 10.0, 1e-9);
  EXPECT_NEAR(r.mean.t_transfer_ms, 4.1, 1e-9);
  EXPECT_NEAR(r.mean.t_compute_ms, 5.5, 1e-9);
  EXPECT_NEAR(r.mean.t_sync_ms, 0.3, 1e-9);
  EXPECT_NEAR(r.mean.t_other_ms, 0.1, 1e-9);
  EXPECT_NEAR(r.mean.t_overlap_ms, 0.0, 1e-9);
  EXPECT_NEAR(r.transfer_fraction + r.compute_fraction + r.sync_fraction + r.other_fraction, 1.0, 1e-12);
  EXPECT_NEAR(r.transfer_fraction, 0.41, 1e-12);
  EXPECT_EQ(r.mean.bytes_host_to_device, 16'000'000);
  EXPECT_EQ(r.mean.bytes_device_to_host, 4);
  EXPECT_EQ(r.mean.syncs, 1);
  EXPECT_EQ(r.mean.transfers, 2);
  EXPECT_EQ(r.sync_reasons.at("item()"), 4);

  // The totals are the sums of the steps, and the steps are 4 x the mean.
  double transfer = 0, compute = 0, sync = 0, step_time = 0;
  std::int64_t bytes = 0;
  for (const StepAccount& a : r.per_step) {
    transfer += a.t_transfer_ms;
    compute += a.t_compute_ms;
    sync += a.t_sync_ms;
    step_time += a.t_step_ms;
    bytes += a.bytes_host_to_device;
    // Within a step the parts (less what overlaps) and the rest make the wall time.
    EXPECT_NEAR(a.t_transfer_ms + a.t_compute_ms + a.t_sync_ms - a.t_overlap_ms + a.t_other_ms, a.t_step_ms, 1e-9);
  }
  EXPECT_NEAR(r.total.t_transfer_ms, transfer, 1e-9);
  EXPECT_NEAR(r.total.t_compute_ms, compute, 1e-9);
  EXPECT_NEAR(r.total.t_sync_ms, sync, 1e-9);
  EXPECT_NEAR(r.total.t_step_ms, step_time, 1e-9);
  EXPECT_NEAR(r.total.t_step_ms, 40.0, 1e-9);
  EXPECT_EQ(r.total.bytes_host_to_device, bytes);
  EXPECT_EQ(r.total.bytes_host_to_device, 64'000'000);

  // The Golden Rule from the mean step, as the cost model computes it.
  const cost::GoldenRule rule = cost::golden_rule(250, 5.5e-3, 4.1e-3);
  ASSERT_TRUE(r.speedup_real.has_value());
  EXPECT_NEAR(*r.speedup_real, rule.speedup_real, 1e-9);
  EXPECT_NEAR(*r.efficiency, rule.efficiency, 1e-12);
  EXPECT_NEAR(*r.speedup_real_with_syncs, 250.0 / (1.0 + 4.4 / 5.5), 1e-9);

  // Copies dominate: that advice comes first, in the words users read.
  ASSERT_FALSE(r.advice.empty());
  EXPECT_EQ(r.advice[0].rfind("copies every step take 41 % of the step: keep the dataset resident on sim:0 or "
                              "prefetch from pinned memory",
                              0),
            0u)
      << all_advice(r);
  EXPECT_TRUE(has_line(r, "16 MB per step cross from pageable memory")) << all_advice(r);
  EXPECT_TRUE(has_line(r, "item() every step costs 3.0 % of the step: log every 100th step")) << all_advice(r);
  EXPECT_FALSE(has_line(r, "nothing to fix")) << all_advice(r);
}

TEST(Report, JsonAndTextCarryTheNumbers) {
  LedgerSnapshot s;
  for (int step = 0; step < 3; ++step) add_synthetic_step(s, step, 10.0 * step);
  const LedgerReport r = make_report(s, {.speedup = 250.0});
  const nlohmann::json j = nlohmann::json::parse(report_json(r));
  EXPECT_EQ(j["steps"], 3);
  EXPECT_NEAR(j["per_step"]["t_transfer_ms"].get<double>(), 4.1, 1e-9);
  EXPECT_NEAR(j["per_step"]["t_compute_ms"].get<double>(), 5.5, 1e-9);
  EXPECT_NEAR(j["per_step"]["t_sync_ms"].get<double>(), 0.3, 1e-9);
  EXPECT_NEAR(j["per_step"]["bytes_host_to_device"].get<double>(), 16e6, 1e-3);
  EXPECT_NEAR(j["per_step"]["syncs"].get<double>(), 1.0, 1e-12);
  EXPECT_NEAR(j["total"]["t_step_ms"].get<double>(), 30.0, 1e-9);
  EXPECT_NEAR(j["speedup_real"].get<double>(), *r.speedup_real, 1e-12);
  EXPECT_EQ(j["sync_reasons"]["item()"], 3);
  EXPECT_EQ(j["sources"]["transfer"], "phases");
  EXPECT_EQ(j["step_details"].size(), 3u);
  EXPECT_EQ(j["advice"].size(), r.advice.size());

  const std::string text = report_text(r);
  for (const char* needle : {"T_transfer", "T_compute", "T_sync", "4.1 ms", "Golden Rule", "advice:", "item() x3"}) {
    EXPECT_NE(text.find(needle), std::string::npos) << needle << " not in\n" << text;
  }
  // Without S there is no S_real.
  const nlohmann::json plain = nlohmann::json::parse(report_json(make_report(s)));
  EXPECT_TRUE(plain["speedup_real"].is_null());
}

TEST(Report, StepNumbersThatRestartEachEpochStayApart) {
  // Two epochs of 2,000 steps numbered 0..1999 each: records go to the step whose window holds them.
  LedgerSnapshot s;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int step = 0; step < 2000; ++step) add_synthetic_step(s, step, 10.0 * (2000 * epoch + step));
  }
  s.phases[0].duration_ms = 9.0;  // epoch 0, step 0: a long copy, and only there
  const LedgerReport r = make_report(s);
  ASSERT_EQ(r.steps, 4000);
  EXPECT_NEAR(r.per_step[0].t_transfer_ms, 9.0, 1e-9);
  EXPECT_NEAR(r.per_step[2000].t_transfer_ms, 4.1, 1e-9);  // epoch 1, step 0
  EXPECT_EQ(r.per_step[2000].step, 0);
  EXPECT_EQ(r.per_step[2000].bytes_host_to_device, 16'000'000);
  EXPECT_EQ(r.total.syncs, 4000);
}

TEST(Report, WarmupStepsAreLeftOut) {
  LedgerSnapshot s;
  for (int step = 0; step < 4; ++step) add_synthetic_step(s, step, 10.0 * step);
  s.steps[0].duration_ms = 500;  // a slow first step (first-touch allocations)
  const LedgerReport all = make_report(s);
  const LedgerReport warm = make_report(s, {.warmup_steps = 1});
  EXPECT_EQ(all.steps, 4);
  EXPECT_EQ(warm.steps, 3);
  EXPECT_EQ(warm.warmup_steps_skipped, 1);
  EXPECT_NEAR(warm.mean.t_step_ms, 10.0, 1e-9);
  EXPECT_GT(all.mean.t_step_ms, 100.0);
  EXPECT_EQ(warm.per_step.front().step, 1);
}

TEST(Report, ResidentDataNeedsNoCopyAdvice) {
  LedgerSnapshot s;
  for (int step = 0; step < 5; ++step) {
    const double t0 = 20.0 * step;
    s.steps.push_back({.step = step, .start_ms = t0, .duration_ms = 20});
    s.phases.push_back({.kind = PhaseKind::Compute, .device = kSim0, .start_ms = t0, .duration_ms = 19.9, .step = step});
  }
  const LedgerReport r = make_report(s, {.speedup = 10.0});
  EXPECT_FALSE(has_line(r, "copies every step")) << all_advice(r);
  EXPECT_TRUE(has_line(r, "nothing to fix")) << all_advice(r);
  EXPECT_NEAR(*r.speedup_real, 10.0, 1e-12);  // Exercise 3.2: T_transfer = 0 keeps all of S
  EXPECT_NEAR(*r.efficiency, 1.0, 1e-12);
}

// A data-parallel run's wait for gradients: nothing under the threshold; above it the fraction, the bytes and their
// dtype, and (for float32) the 16-bit option; a run already in bfloat16 is not told to use it.
TEST(Report, AllreduceAdviceNamesTheWaitTheBytesAndWhatHalvesThem) {
  EXPECT_EQ(allreduce_advice(0.05, 418600, DType::Float32), "");
  EXPECT_EQ(allreduce_advice(0.0, 418600, DType::Float32), "");
  const std::string f32 = allreduce_advice(0.23, 418600, DType::Float32);
  EXPECT_NE(f32.find("waited 23 % of each step"), std::string::npos) << f32;
  EXPECT_NE(f32.find("419 kB per step in float32"), std::string::npos) << f32;
  EXPECT_NE(f32.find("--allreduce-dtype"), std::string::npos) << f32;
  const std::string bf16 = allreduce_advice(0.23, 209300, DType::BFloat16);
  EXPECT_NE(bf16.find("209 kB per step in bfloat16"), std::string::npos) << bf16;
  EXPECT_EQ(bf16.find("--allreduce-dtype"), std::string::npos) << bf16;
  EXPECT_NE(bf16.find("larger batch per rank"), std::string::npos) << bf16;
  EXPECT_EQ(allreduce_advice(0.05, 418600, DType::Float32, 0.01).empty(), false);  // the threshold is the caller's
}

TEST(Report, WithoutPhasesTimesComeFromTheLedger) {
  LedgerSnapshot s;
  for (int step = 0; step < 2; ++step) {
    TransferRecord copy;
    copy.direction = Direction::HostToDevice;
    copy.source = kCPU;
    copy.target = kSim0;
    copy.bytes = 1000;
    copy.start_ms = 10.0 * step;
    copy.duration_ms = 2.0;
    copy.step = step;
    copy.label = "to()";
    s.transfers.push_back(copy);
    TransferRecord back = copy;  // a blocking read-back is a sync: its time is T_sync, not T_transfer
    back.direction = Direction::DeviceToHost;
    back.source = kSim0;
    back.target = kCPU;
    back.start_ms = 10.0 * step + 5;
    back.duration_ms = 1.0;
    back.label = "cpu()";
    s.transfers.push_back(back);
    s.syncs.push_back({.device = kSim0, .reason = "cpu()", .start_ms = 10.0 * step + 5, .duration_ms = 1.0, .step = step});
  }
  const LedgerReport r = make_report(s);
  EXPECT_EQ(r.steps, 2);
  EXPECT_EQ(r.transfer_source, "ledger");
  EXPECT_EQ(r.compute_source, "none");
  EXPECT_EQ(r.sync_source, "ledger");
  EXPECT_NEAR(r.mean.t_transfer_ms, 2.0, 1e-12);
  EXPECT_NEAR(r.mean.t_sync_ms, 1.0, 1e-12);
  EXPECT_NEAR(r.mean.t_step_ms, 6.0, 1e-12);  // first start to last end, without ferry::Step
  EXPECT_NEAR(r.mean.t_other_ms, 3.0, 1e-12);
  EXPECT_EQ(r.mean.bytes_device_to_host, 1000);
  EXPECT_TRUE(has_line(r, "no compute phase was recorded")) << all_advice(r);
  EXPECT_FALSE(r.speedup_real.has_value());
  EXPECT_FALSE(make_report(s, {.speedup = 5.0}).speedup_real.has_value());  // no T_compute, no S_real
}

TEST(Report, OverlapIsCountedOnce) {
  // A loader thread copies the next batch (0..5 ms) while the main thread computes (2..8 ms).
  LedgerSnapshot s;
  s.steps.push_back({.step = 0, .start_ms = 0, .duration_ms = 8});
  s.phases.push_back({.kind = PhaseKind::Transfer, .device = kSim0, .start_ms = 0, .duration_ms = 5, .step = 0});
  s.phases.push_back({.kind = PhaseKind::Compute, .device = kSim0, .start_ms = 2, .duration_ms = 6, .step = 0});
  const LedgerReport r = make_report(s, {.speedup = 100.0});
  EXPECT_NEAR(r.mean.t_transfer_ms, 5, 1e-12);
  EXPECT_NEAR(r.mean.t_compute_ms, 6, 1e-12);
  EXPECT_NEAR(r.mean.t_overlap_ms, 3, 1e-12);
  EXPECT_NEAR(r.mean.t_other_ms, 0, 1e-12);
  EXPECT_NEAR(*r.speedup_real, 100.0 / (1.0 + 5.0 / 6.0), 1e-9);        // the sheet's rule charges all 5 ms
  EXPECT_NEAR(*r.speedup_real_exposed, 100.0 / (1.0 + 2.0 / 6.0), 1e-9);  // only 2 ms were not hidden
}

TEST(Report, ExactTimingSyncsAreCountedApart) {
  clear_ledger_records();
  Tensor on = ones({64}, {.device = kSim0});
  {
    Step step(0);
    {
      Phase compute(PhaseKind::Compute, kSim0, "add", PhaseTiming::Exact);
      on = on + on;
    }
    Phase sync(PhaseKind::Sync, kSim0, "log");
    EXPECT_DOUBLE_EQ(sum(on).item<double>(), 128.0);
  }
  const auto syncs = Ledger::global().syncs();
  int exact = 0;
  for (const SyncRecord& s : syncs) exact += s.reason == kExactTimingReason;
  EXPECT_EQ(exact, 2);  // one at the phase's start, one at its end
  const LedgerReport r = make_report();
  EXPECT_TRUE(r.exact_timing);
  EXPECT_EQ(r.total.timing_syncs, 2);
  EXPECT_EQ(r.total.syncs, 1);  // item() only
  EXPECT_TRUE(has_line(r, "exact timing added 2 syncs per step")) << all_advice(r);
  // Under SyncPolicy::Error an exact phase refuses to start: its sync is a host sync like any other.
  SyncPolicyGuard guard(SyncPolicy::Error);
  EXPECT_THROW(Phase(PhaseKind::Compute, kSim0, "", PhaseTiming::Exact), SyncPolicyViolation);
  EXPECT_NO_THROW(Phase(PhaseKind::Compute, kSim0));  // host timing never syncs
}

// A real loop on sim:0 whose link is slow: an 8 MB batch at 0.5 GB/s takes 16 ms, the compute far less.
TEST(Report, RealLoopOnSimWhereCopiesDominate) {
  SimLink link(0.5e9);
  clear_ledger_records();
  const Tensor host_batch = ones({2'000'000});  // float32: 8,000,000 bytes
  for (int i = 0; i < 4; ++i) {
    Step step(i);
    Tensor batch;
    {
      Phase copy(PhaseKind::Transfer, kSim0, "batch to device");
      batch = host_batch.to(kSim0);
    }
    Tensor loss;
    {
      Phase compute(PhaseKind::Compute, kSim0, "compute");
      loss = sum(batch.narrow(0, 0, 1000));
    }
    Phase sync(PhaseKind::Sync, kSim0, "log");
    EXPECT_DOUBLE_EQ(loss.item<double>(), 1000.0);
  }
  const LedgerReport r = make_report({.speedup = 1.0});
  ASSERT_EQ(r.steps, 4);
  EXPECT_EQ(r.mean.bytes_host_to_device, 8'000'000);  // exact: the ledger counts bytes, not time
  EXPECT_EQ(r.total.bytes_host_to_device, 32'000'000);
  EXPECT_EQ(r.mean.bytes_device_to_host, 4);             // one float32 per item()
  EXPECT_EQ(r.total.syncs, 4);
  EXPECT_EQ(r.sync_reasons.at("item()"), 4);
  EXPECT_GE(r.mean.t_transfer_ms, 15.9);  // 8 MB at 0.5 GB/s
  EXPECT_GT(r.transfer_fraction, 0.25);     // loose: a busy shared host can stretch the compute
  ASSERT_FALSE(r.advice.empty());
  EXPECT_EQ(r.advice[0].rfind("copies every step take", 0), 0u) << all_advice(r);
  EXPECT_NE(r.advice[0].find("keep the dataset resident on sim:0 or prefetch from pinned memory"), std::string::npos)
      << all_advice(r);
  for (const StepAccount& a : r.per_step) {
    EXPECT_NEAR(a.t_transfer_ms + a.t_compute_ms + a.t_sync_ms - a.t_overlap_ms + a.t_other_ms, a.t_step_ms, 1e-6);
    EXPECT_LE(a.t_transfer_ms + a.t_compute_ms + a.t_sync_ms, a.t_step_ms + 1e-6);
  }
}

TEST(Report, RealLoopWithResidentDataOnSim) {
  SimLink link(1e9);
  clear_ledger_records();
  const Tensor data = ones({256, 256}).to(kSim0);  // moved once, before the steps
  const Tensor weight = ones({256, 256}, {.device = kSim0});
  for (int i = 0; i < 10; ++i) {
    Step step(i);
    Tensor out;
    {
      Phase compute(PhaseKind::Compute, kSim0, "matmul");
      out = matmul(data, weight);
    }
    if (i % 5 == 4) {
      Phase sync(PhaseKind::Sync, kSim0, "log");
      sum(out).item<double>();
    }
  }
  const LedgerReport r = make_report();
  EXPECT_EQ(r.steps, 10);
  EXPECT_EQ(r.outside_transfers, 1);
  EXPECT_EQ(r.outside_bytes_host_to_device, 256 * 256 * 4);
  EXPECT_EQ(r.total.bytes_host_to_device, 0);
  EXPECT_EQ(r.total.syncs, 2);
  EXPECT_FALSE(has_line(r, "copies every step")) << all_advice(r);
  EXPECT_FALSE(has_line(r, "every step costs")) << all_advice(r);  // syncs only every 5th step
}

TEST(Report, RejectsBadOptions) {
  EXPECT_THROW(make_report(LedgerSnapshot{}, {.warmup_steps = -1}), InvalidArgument);
  EXPECT_THROW(make_report(LedgerSnapshot{}, {.speedup = 0.0}), InvalidArgument);
  EXPECT_THROW(make_report(LedgerSnapshot{}, {.speedup = std::nan("")}), InvalidArgument);
  ReportOptions bad_log;
  bad_log.log_every = 0;
  EXPECT_THROW(make_report(LedgerSnapshot{}, bad_log), InvalidArgument);
  const LedgerReport empty = make_report(LedgerSnapshot{});
  EXPECT_EQ(empty.steps, 0);
  ASSERT_EQ(empty.advice.size(), 1u);
  EXPECT_NE(empty.advice[0].find("ferry::Step"), std::string::npos);
}

TEST(Report, DisabledLedgerRecordsNoPhases) {
  clear_ledger_records();
  Ledger::global().set_enabled(false);
  {
    Step step(0);
    Phase compute(PhaseKind::Compute);
  }
  Ledger::global().set_enabled(true);
  EXPECT_TRUE(PhaseLog::global().phases().empty());
  EXPECT_TRUE(PhaseLog::global().steps().empty());
  {
    Step step(1);
    Phase compute(PhaseKind::Compute);
    compute.end();
    const double first = compute.elapsed_ms();
    compute.end();  // a second end() changes nothing
    EXPECT_EQ(compute.elapsed_ms(), first);
  }
  ASSERT_EQ(PhaseLog::global().phases().size(), 1u);
  EXPECT_EQ(PhaseLog::global().phases()[0].step, 1);
  EXPECT_EQ(Ledger::global().current_step(), -1);  // Step ended the ledger's step
}

}  // namespace
}  // namespace ferry
