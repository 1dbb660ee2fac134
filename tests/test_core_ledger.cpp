// test_core_ledger.cpp — the one door (invariant 5): crossings and syncs are recorded with their
// direction, bytes and reason; the sync policy and per-step budgets stop what they forbid.
#include "ferry/readback.h"
#include "test_helpers.h"

namespace ferry {
namespace {

const Device kSim0{DeviceType::Sim, 0};

TEST(Ledger, RecordsCrossingsAndSyncs) {
  Ledger& ledger = Ledger::global();
  ledger.clear();
  Tensor x = ones({256});
  Tensor on = x.to(kSim0);
  const double value = sum(on).item<double>();
  EXPECT_DOUBLE_EQ(value, 256.0);
  const auto transfers = ledger.transfers();
  ASSERT_EQ(transfers.size(), 2u);
  EXPECT_EQ(transfers[0].direction, Direction::HostToDevice);
  EXPECT_EQ(transfers[0].bytes, 1024);
  EXPECT_EQ(transfers[0].source, kCPU);
  EXPECT_EQ(transfers[0].target, kSim0);
  EXPECT_EQ(transfers[0].label, "to()");
  EXPECT_EQ(transfers[1].direction, Direction::DeviceToHost);
  EXPECT_EQ(transfers[1].bytes, 4);
  EXPECT_EQ(transfers[1].label, "item()");
  const auto syncs = ledger.syncs();
  ASSERT_EQ(syncs.size(), 1u);
  EXPECT_EQ(syncs[0].reason, "item()");
  EXPECT_EQ(syncs[0].device, kSim0);
  synchronize(kSim0, "test");
  EXPECT_EQ(ledger.syncs().back().reason, "test");
  // cpu work is not a sync, and cpu -> cpu is not a crossing.
  ledger.clear();
  EXPECT_DOUBLE_EQ(sum(x).item<double>(), 256.0);
  EXPECT_EQ(ledger.totals().syncs, 0);
  EXPECT_EQ(ledger.totals().transfers, 0);
}

TEST(Ledger, SimLinkTakesBytesOverBandwidth) {
  const double previous = sim_link_bandwidth();
  set_sim_link_bandwidth(1e9);  // 1 GB/s: 8 MB takes 8 ms
  Ledger::global().clear();
  Tensor t = zeros({2'000'000}).to(kSim0);
  const auto record = Ledger::global().transfers().back();
  EXPECT_EQ(record.bytes, 8'000'000);
  EXPECT_GE(record.duration_ms, 7.9);
  set_sim_link_bandwidth(previous);
}

TEST(Ledger, SyncPolicyErrorForbidsHostSyncs) {
  Tensor on = ones({4}, {.device = kSim0});
  {
    SyncPolicyGuard guard(SyncPolicy::Error);
    EXPECT_EQ(current_sync_policy(), SyncPolicy::Error);
    try {
      sum(on).item<float>();
      ADD_FAILURE() << "item() was allowed";
    } catch (const SyncPolicyViolation& e) {
      EXPECT_NE(std::string(e.what()).find("item()"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("sim:0"), std::string::npos) << e.what();
    }
    EXPECT_THROW(on.cpu(), SyncPolicyViolation);
    EXPECT_THROW(synchronize(kSim0), SyncPolicyViolation);
    Tensor still = on + on;  // device work is fine
    EXPECT_FLOAT_EQ(sum(ones({2})).item<float>(), 2.f);  // cpu values are not syncs
    {
      SyncPolicyGuard inner(SyncPolicy::Allow);
      EXPECT_FLOAT_EQ(sum(on).item<float>(), 4.f);
    }
  }
  EXPECT_EQ(current_sync_policy(), SyncPolicy::Allow);
  EXPECT_FLOAT_EQ(sum(on).item<float>(), 4.f);
}

TEST(Ledger, StepBudgets) {
  Ledger& ledger = Ledger::global();
  Tensor on = ones({4}, {.device = kSim0});
  ledger.set_budget({.max_syncs = 1, .max_host_to_device_bytes = 100});
  ledger.begin_step(7);
  EXPECT_NO_THROW(sum(on).item<float>());
  try {
    sum(on).item<float>();
    ADD_FAILURE() << "second sync allowed";
  } catch (const SyncPolicyViolation& e) {
    EXPECT_NE(std::string(e.what()).find("Step 7"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(ones({25}).to(kSim0));  // 100 bytes: at the limit
  try {
    ones({1}).to(kSim0);
    ADD_FAILURE() << "a copy over the byte budget allowed";
  } catch (const SyncPolicyViolation& e) {  // the step, the total, the budget, and the copy that went over
    const std::string what = e.what();
    EXPECT_NE(what.find("Step 7 moved 104 bytes host->device, over its budget of 100 bytes"), std::string::npos)
        << what;
    EXPECT_NE(what.find("the last copy: 4 bytes cpu -> sim:0 from pageable memory, blocking"), std::string::npos)
        << what;
  }
  EXPECT_EQ(ledger.transfers().back().bytes, 4);  // recorded all the same: it happened
  ledger.end_step();
  EXPECT_NO_THROW(ones({100}).to(kSim0));  // outside steps, no budget
  ledger.set_budget({});
  ledger.begin_step(8);
  EXPECT_NO_THROW(sum(on).item<float>());
  EXPECT_NO_THROW(sum(on).item<float>());
  EXPECT_EQ(ledger.syncs().back().step, 8);
  ledger.end_step();
}

// A pending read (how ferry train logs its loss): the value as of when it was queued, even when later work
// overwrites it, one sync with its label when read, and nothing left pending after.
TEST(PendingRead, ReadsTheValueAsQueuedAndCountsOneSyncWithItsLabel) {
  for (const Device device : testing::accelerators()) {
    SCOPED_TRACE(device.str());
    Ledger& ledger = Ledger::global();
    Tensor x = full({3}, 2.0, {.device = device});
    const std::int64_t syncs = ledger.totals().syncs;
    PendingRead read(x, "pending test read");
    EXPECT_TRUE(read.pending());
    x.fill_(5.0);  // queued after the copy: it must not change what the read sees
    const Tensor host = read.wait();
    EXPECT_EQ(host.device(), kCPU);
    EXPECT_EQ(host.to_vector<float>(), (std::vector<float>{2, 2, 2}));
    EXPECT_EQ(ledger.totals().syncs - syncs, 1);
    EXPECT_EQ(ledger.syncs().back().reason, "pending test read");
    EXPECT_FALSE(read.pending());
    EXPECT_THROW(read.wait(), InvalidArgument);
    EXPECT_EQ(sum(x).item<float>(), 15.0F);
  }
}

}  // namespace
}  // namespace ferry
