// test_trace.cpp — the Chrome trace export: it parses as JSON, holds one complete event per transfer,
// sync, phase, step and collective with the right arguments, in microseconds, on one track per device and kind.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "ferry/backend.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/ledger.h"
#include "ferry/ops.h"
#include "ferry/phase.h"
#include "ferry/trace.h"
#include "test_helpers.h"

namespace ferry {
namespace {

const Device kSim0{DeviceType::Sim, 0};
using Json = nlohmann::json;

std::vector<Json> events_of(const Json& trace, const std::string& phase, const std::string& category = "") {
  std::vector<Json> out;
  for (const Json& e : trace.at("traceEvents")) {
    if (e.at("ph") == phase && (category.empty() || e.value("cat", "") == category)) out.push_back(e);
  }
  return out;
}

// The name a metadata event gives to (pid, tid), or to pid when tid < 0.
std::string track_name(const Json& trace, int pid, int tid) {
  for (const Json& e : events_of(trace, "M")) {
    if (e.at("pid") != pid) continue;
    if (tid < 0 && e.at("name") == "process_name") return e.at("args").at("name");
    if (tid >= 0 && e.at("name") == "thread_name" && e.value("tid", -1) == tid) return e.at("args").at("name");
  }
  return "";
}

TEST(Trace, RealRunOnSimHasEveryRecord) {
  const double previous = sim_link_bandwidth();
  set_sim_link_bandwidth(4e9);
  clear_ledger_records();
  const Tensor host_batch = ones({250'000});  // 1,000,000 bytes
  for (int i = 0; i < 2; ++i) {
    Step step(i);
    Tensor batch;
    {
      Phase copy(PhaseKind::Transfer, kSim0, "batch");
      batch = host_batch.to(kSim0);
    }
    Tensor loss;
    {
      Phase compute(PhaseKind::Compute, kSim0, "forward");
      loss = sum(batch);
    }
    Phase log(PhaseKind::Sync, kSim0, "log");
    loss.item<double>();
  }
  { Phase host_work(PhaseKind::Compute, kCPU, "host side"); }
  set_sim_link_bandwidth(previous);

  const LedgerSnapshot snapshot = ledger_snapshot();
  const Json trace = Json::parse(chrome_trace_json());
  ASSERT_TRUE(trace.at("traceEvents").is_array());
  EXPECT_EQ(trace.at("displayTimeUnit"), "ms");

  for (const Json& e : events_of(trace, "X")) {
    for (const char* key : {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}) {
      ASSERT_TRUE(e.contains(key)) << key << " missing in " << e.dump();
    }
    EXPECT_GE(e.at("ts").get<double>(), 0.0);
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
  }

  const auto copies = events_of(trace, "X", "transfer");
  ASSERT_EQ(copies.size(), snapshot.transfers.size());
  ASSERT_EQ(copies.size(), 4u);  // per step: the batch up, the loss back
  const Json& up = copies[0];
  EXPECT_EQ(up.at("name"), "to()");
  EXPECT_EQ(up.at("args").at("bytes"), 1'000'000);
  EXPECT_EQ(up.at("args").at("direction"), "host->device");
  EXPECT_EQ(up.at("args").at("pinned"), false);
  EXPECT_EQ(up.at("args").at("blocking"), true);
  EXPECT_EQ(up.at("args").at("label"), "to()");
  EXPECT_EQ(up.at("args").at("step"), 0);
  EXPECT_EQ(up.at("args").at("target"), "sim:0");
  EXPECT_NEAR(up.at("ts").get<double>(), snapshot.transfers[0].start_ms * 1e3, 1e-6);   // us
  EXPECT_NEAR(up.at("dur").get<double>(), snapshot.transfers[0].duration_ms * 1e3, 1e-6);
  EXPECT_GE(up.at("dur").get<double>(), 240.0);  // 1 MB at 4 GB/s = 250 us
  const Json& back = copies[1];
  EXPECT_EQ(back.at("args").at("direction"), "device->host");
  EXPECT_EQ(back.at("args").at("bytes"), 4);
  EXPECT_EQ(back.at("args").at("label"), "item()");

  const auto syncs = events_of(trace, "X", "sync");
  ASSERT_EQ(syncs.size(), 2u);
  EXPECT_EQ(syncs[0].at("args").at("reason"), "item()");
  EXPECT_EQ(syncs[1].at("args").at("step"), 1);

  const auto phases = events_of(trace, "X", "phase");
  ASSERT_EQ(phases.size(), 7u);
  std::set<std::string> kinds;
  for (const Json& p : phases) kinds.insert(p.at("args").at("kind").get<std::string>());
  EXPECT_EQ(kinds, (std::set<std::string>{"transfer", "compute", "sync"}));

  const auto steps = events_of(trace, "X", "step");
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[1].at("name"), "step 1");

  // Tracks: the copies, syncs and sim:0's phases share sim:0's process; the host-side phase has its
  // own; each kind has its own thread, named.
  const int sim_pid = up.at("pid");
  EXPECT_EQ(track_name(trace, sim_pid, -1), "sim:0");
  EXPECT_EQ(track_name(trace, sim_pid, up.at("tid")), "copies host->device");
  EXPECT_EQ(track_name(trace, sim_pid, back.at("tid")), "copies device->host");
  EXPECT_EQ(track_name(trace, sim_pid, syncs[0].at("tid")), "host syncs");
  EXPECT_EQ(syncs[0].at("pid"), sim_pid);
  std::set<int> phase_tids;
  int cpu_pid = -1;
  for (const Json& p : phases) {
    if (p.at("args").at("device") == "cpu") {
      cpu_pid = p.at("pid");
      continue;
    }
    EXPECT_EQ(p.at("pid"), sim_pid);
    phase_tids.insert(p.at("tid").get<int>());
    EXPECT_EQ(track_name(trace, sim_pid, p.at("tid")), "phase: " + p.at("args").at("kind").get<std::string>());
  }
  EXPECT_EQ(phase_tids.size(), 3u);
  EXPECT_NE(cpu_pid, -1);
  EXPECT_NE(cpu_pid, sim_pid);
  EXPECT_EQ(track_name(trace, cpu_pid, -1), "cpu");
  EXPECT_EQ(track_name(trace, steps[0].at("pid"), -1), "steps");
}

TEST(Trace, MicrosecondsFromMilliseconds) {
  LedgerSnapshot s;
  TransferRecord t;
  t.direction = Direction::DeviceToDevice;
  t.source = Device(DeviceType::Sim, 1);
  t.target = kSim0;
  t.bytes = 123;
  t.pinned = true;
  t.blocking = false;
  t.start_ms = 1.5;
  t.duration_ms = 2.5;
  t.step = 7;
  t.label = "peer";
  s.transfers.push_back(t);
  const Json trace = Json::parse(chrome_trace_json(s));
  const auto copies = events_of(trace, "X", "transfer");
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_DOUBLE_EQ(copies[0].at("ts").get<double>(), 1500.0);
  EXPECT_DOUBLE_EQ(copies[0].at("dur").get<double>(), 2500.0);
  EXPECT_EQ(copies[0].at("args").at("pinned"), true);
  EXPECT_EQ(copies[0].at("args").at("blocking"), false);
  EXPECT_EQ(copies[0].at("args").at("step"), 7);
  EXPECT_EQ(track_name(trace, copies[0].at("pid"), -1), "sim:1");  // device->device: the source's track
  EXPECT_EQ(track_name(trace, copies[0].at("pid"), copies[0].at("tid")), "copies device->device");
}

// A data-parallel step's all-reduces are drawn on their device's "collectives" track, launch to completion,
// with how they moved the bytes and how long the host waited for them.
TEST(Trace, CollectivesHaveATrackOfTheirOwn) {
  LedgerSnapshot s;
  CollectiveRecord c;
  c.op = "all_reduce";
  c.backend = "mpi";
  c.algorithm = "ring";
  c.device = kCPU;
  c.bytes = 418600;
  c.world_size = 4;
  c.start_ms = 10;
  c.duration_ms = 3;
  c.wait_ms = 1.25;
  c.step = 2;
  c.label = "gradient bucket 0";
  s.collectives.push_back(c);
  const Json trace = Json::parse(chrome_trace_json(s));
  const auto collectives = events_of(trace, "X", "collective");
  ASSERT_EQ(collectives.size(), 1u);
  const Json& e = collectives[0];
  EXPECT_EQ(e.at("name"), "all_reduce: gradient bucket 0");
  EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 10000.0);
  EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 3000.0);
  EXPECT_EQ(e.at("args").at("algorithm"), "ring");
  EXPECT_EQ(e.at("args").at("bytes"), 418600);
  EXPECT_EQ(e.at("args").at("world_size"), 4);
  EXPECT_DOUBLE_EQ(e.at("args").at("host_wait_ms").get<double>(), 1.25);
  EXPECT_EQ(track_name(trace, e.at("pid"), -1), "cpu");
  EXPECT_EQ(track_name(trace, e.at("pid"), e.at("tid")), "collectives");
}

TEST(Trace, EmptyLedgerIsAValidTrace) {
  const Json trace = Json::parse(chrome_trace_json(LedgerSnapshot{}));
  EXPECT_TRUE(trace.at("traceEvents").is_array());
  EXPECT_TRUE(trace.at("traceEvents").empty());
}

TEST(Trace, WritesAFile) {
  clear_ledger_records();
  Tensor moved = ones({16}).to(kSim0);
  const std::string path = ::testing::TempDir() + "ferry_test_trace.json";
  write_chrome_trace(path);
  const Json trace = Json::parse(testing::read_file(path));
  EXPECT_EQ(events_of(trace, "X", "transfer").size(), 1u);
  std::remove(path.c_str());
  EXPECT_THROW(write_chrome_trace("/nonexistent-dir/ferry/trace.json"), IoError);
}

}  // namespace
}  // namespace ferry
