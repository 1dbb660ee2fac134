// test_core_ledger.cpp — the one door (invariant 5): crossings and syncs are recorded with their
// direction, bytes and reason; the sync policy and per-step budgets stop what they forbid.
#include <atomic>
#include <latch>
#include <optional>
#include <thread>

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

// A read over the device->host byte budget throws, but the host did wait for it: the sync is recorded with the copy.
// A disabled ledger records nothing and holds no budget.
TEST(Ledger, ABudgetErrorKeepsTheSyncAndADisabledLedgerHoldsNoBudget) {
  Ledger& ledger = Ledger::global();
  const Tensor on = ones({4}, {.device = kSim0});
  ledger.set_budget({.max_device_to_host_bytes = 0});
  ledger.begin_step(2);
  const std::int64_t syncs = ledger.totals().syncs, transfers = ledger.totals().transfers;
  EXPECT_THROW(sum(on).item<float>(), SyncPolicyViolation);
  EXPECT_EQ(ledger.totals().syncs - syncs, 1);
  EXPECT_EQ(ledger.totals().transfers - transfers, 1);
  ledger.end_step();
  ledger.set_budget({.max_syncs = 0});
  ledger.set_enabled(false);
  ledger.begin_step(3);
  EXPECT_NO_THROW(sum(on).item<float>());
  EXPECT_NO_THROW(sum(on).item<float>());
  ledger.end_step();
  ledger.set_enabled(true);
  ledger.set_budget({});
}

// On sim, as on a card: the read is queued as a non-blocking copy (no sync, allowed under SyncPolicy::Error and a
// budget of no syncs), and wait() is the sync the policy and the budget see.
TEST(PendingRead, OnSimTheSyncIsInWaitAsOnACard) {
  Ledger& ledger = Ledger::global();
  const Tensor x = full({3}, 2.0, {.device = kSim0});
  const std::int64_t syncs = ledger.totals().syncs;
  std::optional<PendingRead> read;
  {
    SyncPolicyGuard error(SyncPolicy::Error);
    read.emplace(x, "logged loss");
    EXPECT_EQ(ledger.totals().syncs, syncs);
    EXPECT_FALSE(ledger.transfers().back().blocking);
    EXPECT_TRUE(ledger.transfers().back().pinned);  // where a card's copy goes: pinned memory
    EXPECT_THROW(read->wait(), SyncPolicyViolation);
  }
  EXPECT_EQ(read->wait().to_vector<float>(), (std::vector<float>{2, 2, 2}));
  EXPECT_EQ(ledger.totals().syncs - syncs, 1);
  EXPECT_EQ(ledger.syncs().back().reason, "logged loss");
}

// SyncPolicy::Warn says when a non_blocking copy from pageable memory is really blocking (Error refuses it).
TEST(Ledger, WarnPolicyNamesAPageableNonBlockingCopy) {
  SyncPolicyGuard warn(SyncPolicy::Warn);
  ::testing::internal::CaptureStderr();
  const Tensor moved = ones({8}).to(kSim0, /*non_blocking=*/true);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("from pageable host memory is really blocking"), std::string::npos) << said;
  EXPECT_EQ(moved.device(), kSim0);
}

// The ledger is one per process and its records come from any thread (a training loop, a prefetch thread, a
// data-parallel rank's threads); the sync policy is each thread's own. Several threads move tensors and read them
// back at once, one of them under SyncPolicy::Error, while another reads the ledger: every crossing is recorded
// once, the totals add up exactly, and only the thread under Error is refused.
TEST(Ledger, RecordsEveryCrossingFromSeveralThreadsAndKeepsEachThreadsPolicy) {
  Ledger& ledger = Ledger::global();
  ledger.clear();
  constexpr int kAllowed = 3, kRounds = 200;
  constexpr std::int64_t kElements = 64;  // 256 bytes host->device a round, 4 bytes back per item()
  std::atomic<int> refused{0}, wrong{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kAllowed; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const Tensor on = full({kElements}, static_cast<double>(t + 1)).to(kSim0);
        if (sum(on).item<double>() != static_cast<double>((t + 1) * kElements)) ++wrong;
      }
    });
  }
  threads.emplace_back([&] {
    SyncPolicyGuard error(SyncPolicy::Error);  // this thread's only
    for (int r = 0; r < kRounds; ++r) {
      const Tensor on = full({kElements}, 1.0).to(kSim0);  // a blocking copy in: recorded, not a sync
      try {
        (void)sum(on).item<double>();
      } catch (const SyncPolicyViolation&) {
        ++refused;
      }
    }
  });
  std::int64_t seen = 0, went_back = 0;
  std::thread reader([&] {  // the report's view while the records come in: never fewer than before
    while (!done.load()) {
      const std::int64_t now = ledger.totals().transfers;
      if (now < seen) ++went_back;
      seen = now;
      if (static_cast<std::int64_t>(ledger.transfers().size()) < now) ++went_back;
    }
  });
  for (std::thread& thread : threads) thread.join();
  done = true;
  reader.join();

  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(refused.load(), kRounds) << "SyncPolicy::Error on one thread must refuse each of its item() calls";
  EXPECT_EQ(went_back, 0) << "a reader saw the ledger's counts go down";
  const Ledger::Totals totals = ledger.totals();
  const std::int64_t copies_in = (kAllowed + 1) * kRounds, reads = kAllowed * kRounds;
  EXPECT_EQ(totals.transfers, copies_in + reads);
  EXPECT_EQ(totals.bytes_host_to_device, copies_in * kElements * 4);
  EXPECT_EQ(totals.bytes_device_to_host, reads * 4);
  EXPECT_EQ(totals.syncs, reads);
  EXPECT_EQ(static_cast<std::int64_t>(ledger.transfers().size()), totals.transfers);
  EXPECT_EQ(static_cast<std::int64_t>(ledger.syncs().size()), totals.syncs);
  EXPECT_EQ(current_sync_policy(), SyncPolicy::Allow) << "the other thread's guard leaked into this one";
}

// The same at the ledger's own rate: threads that do nothing but record, so that a record or a total left
// unguarded would lose counts (or crash in the record vectors) rather than hide behind the tensor work.
TEST(Ledger, CountsEveryRecordWhenThreadsRecordAtOnce) {
  Ledger& ledger = Ledger::global();
  ledger.clear();
  constexpr int kThreads = 4, kRecords = 100000;
  std::latch start(kThreads);  // all at once, not one after another as they are made
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&ledger, &start, t] {
      start.arrive_and_wait();
      for (int r = 0; r < kRecords; ++r) {
        TransferRecord copy;
        copy.direction = (r % 2 == 0) ? Direction::HostToDevice : Direction::DeviceToHost;
        copy.source = copy.direction == Direction::HostToDevice ? kCPU : kSim0;
        copy.target = copy.direction == Direction::HostToDevice ? kSim0 : kCPU;
        copy.bytes = t + 1;
        ledger.record_transfer(copy);
        if (r % 4 == 0) ledger.record_sync({.device = kSim0, .reason = "test"});
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const Ledger::Totals totals = ledger.totals();
  EXPECT_EQ(totals.transfers, kThreads * kRecords);
  EXPECT_EQ(totals.syncs, kThreads * kRecords / 4);
  // each thread t moved (t + 1) bytes per record, half of its records each way: 1 + 2 + 3 + 4 = 10
  EXPECT_EQ(totals.bytes_host_to_device, 10 * kRecords / 2);
  EXPECT_EQ(totals.bytes_device_to_host, 10 * kRecords / 2);
  EXPECT_EQ(static_cast<std::int64_t>(ledger.transfers().size()), totals.transfers);
  EXPECT_EQ(static_cast<std::int64_t>(ledger.syncs().size()), totals.syncs);
  ledger.clear();
}

}  // namespace
}  // namespace ferry
