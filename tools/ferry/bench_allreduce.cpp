// bench_allreduce.cpp — `ferry bench allreduce` under mpirun -np N: ferry's all-reduce from 1 KB to 256 MB,
// time, algbw and busbw as nccl-tests define them, every size's result checked, raw MPI_Allreduce timed in the
// same run for the ratio. With --dtype bfloat16 | float16, ferry's 16-bit sum beside ferry's own float32 sum of the
// same number of elements: what compressing gradients saves. Not here: the collectives (ferry/dist/process_group.h).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "ferry/dist/process_group.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/ledger.h"
#include "ferry/units.h"

#ifdef FERRY_HAVE_MPI
#include <mpi.h>
#endif

namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

struct AllReduceOptions {
  std::string device = "cpu";
  std::string backend = "auto";
  std::string dtype = "float32";  // ferry's; the reference always sums float32 (the same element count)
  std::string min_bytes = "1KiB", max_bytes = "256MiB";  // powers of two, as nccl-tests
  int factor = 2;               // size multiplier between points
  int iterations = 20;          // timed all-reduces per run, at most
  int warmup = 2;               // untimed all-reduces per size
  int repeats = 9;              // timed runs per size and path, interleaved; the best is reported (more,
                                // shorter runs: noise moves the ratio less; docs/distributed.md)
  double max_seconds = 0.2;     // s per timed run: fewer iterations for large sizes
  double timeout_s = ferry::dist::kDefaultTimeoutSeconds;
  bool json = false;
};

struct Point {
  std::int64_t bytes = 0, count = 0;  // ferry's bytes; the reference (raw_*) moves count x 4
  // s per all-reduce, best run, slowest rank. raw: the reference, MPI_Allreduce of float32 on host memory; for a
  // 16-bit --dtype, ferry's own float32 all-reduce of the same elements (raw MPI sums no 16-bit type).
  double seconds = 0, raw_seconds = 0;
  std::int64_t wrong = 0, raw_wrong = 0;  // elements that differ from the expected sum
  std::string algorithm;                  // the one ferry chose for this size (the ledger's record)
};

#ifdef FERRY_HAVE_MPI

double slowest_rank(double seconds) {
  double slowest = seconds;
  MPI_Allreduce(MPI_IN_PLACE, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

// Rank r's element i: (r + 1) + (i mod 7). Every rank's sum is then exact in float32: N(N+1)/2 + N (i mod 7).
void fill_pattern(float* data, std::int64_t count, int rank) {
  for (std::int64_t i = 0; i < count; ++i) data[i] = static_cast<float>(rank + 1 + i % 7);
}
std::int64_t count_wrong(const float* data, std::int64_t count, int world_size) {
  std::int64_t wrong = 0;
  const double base = world_size * (world_size + 1) / 2.0;
  for (std::int64_t i = 0; i < count; ++i) {
    if (data[i] != static_cast<float>(base + world_size * (i % 7))) ++wrong;
  }
  return wrong;
}
std::int64_t wrong_on_any_rank(std::int64_t wrong) {
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return wrong;
}

// Seconds per call of `run`, over `iterations` calls after a barrier, for the slowest rank.
template <typename Run>
double time_calls(int iterations, Run&& run) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) run();
  return slowest_rank(std::chrono::duration<double>(Clock::now() - start).count() / iterations);
}

Point measure(ferry::dist::ProcessGroup& group, std::int64_t bytes, ferry::DType dtype, const AllReduceOptions& o) {
  Point p;
  p.bytes = bytes;
  p.count = std::max<std::int64_t>(1, bytes / static_cast<std::int64_t>(ferry::element_size(dtype)));
  const int n = group.world_size(), rank = group.rank();
  ferry::Tensor host = ferry::empty({p.count});  // float32, host: the pattern, and raw MPI's buffer
  ferry::Tensor data = ferry::empty({p.count}, {.device = group.device(), .dtype = dtype});
  auto* h = host.data<float>();

  // Correctness first: one all-reduce of the pattern on each path, every element checked (its sums are small
  // integers: exact in the 16-bit types too).
  fill_pattern(h, p.count, rank);
  data.copy_(host);
  group.all_reduce(data);
  const std::vector<ferry::CollectiveRecord> records = ferry::Ledger::global().collectives();
  if (!records.empty()) p.algorithm = records.back().algorithm;
  p.wrong = wrong_on_any_rank(count_wrong(data.cpu().to(ferry::DType::Float32).data<float>(), p.count, n));
  const bool compressed = dtype != ferry::DType::Float32;
  ferry::Tensor reference = compressed ? ferry::empty({p.count}, {.device = group.device()}) : ferry::Tensor();
  fill_pattern(h, p.count, rank);
  if (compressed) {
    reference.copy_(host);
    group.all_reduce(reference);
    p.raw_wrong = wrong_on_any_rank(count_wrong(reference.cpu().data<float>(), p.count, n));
  } else {
    MPI_Allreduce(MPI_IN_PLACE, h, static_cast<int>(p.count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    p.raw_wrong = wrong_on_any_rank(count_wrong(h, p.count, n));
  }

  // Then time, on zeros: they stay zeros however often they are summed (no overflow, no denormals).
  data.fill_(0);
  host.fill_(0);
  if (compressed) reference.fill_(0);
  auto ferry_call = [&] { group.all_reduce(data); };
  auto raw_call = [&] {
    if (compressed) group.all_reduce(reference);
    else MPI_Allreduce(MPI_IN_PLACE, h, static_cast<int>(p.count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  for (int i = 0; i < o.warmup; ++i) {
    ferry_call();
    raw_call();
  }
  const double estimate = std::max(time_calls(1, ferry_call), 1e-7);
  const int iterations = std::clamp(static_cast<int>(o.max_seconds / estimate), 1, o.iterations);
  p.seconds = p.raw_seconds = INFINITY;
  for (int r = 0; r < o.repeats; ++r) {  // interleaved, so both paths see the same machine
    p.seconds = std::min(p.seconds, time_calls(iterations, ferry_call));
    p.raw_seconds = std::min(p.raw_seconds, time_calls(iterations, raw_call));
  }
  return p;
}

#endif  // FERRY_HAVE_MPI

double bus_factor(int n) { return n > 1 ? 2.0 * (n - 1) / n : 0.0; }

void run(const AllReduceOptions& o) {
  const auto min_bytes = static_cast<std::int64_t>(ferry::parse_bytes(o.min_bytes));
  const auto max_bytes = static_cast<std::int64_t>(ferry::parse_bytes(o.max_bytes));
  FERRY_CHECK(min_bytes >= 4 && max_bytes >= min_bytes, InvalidArgument, "Expected 4 B <= --min-bytes <= --max-bytes, got ",
              o.min_bytes, " and ", o.max_bytes);
  FERRY_CHECK(max_bytes <= 4LL << 30, InvalidArgument, "--max-bytes is at most 4 GiB, got ", o.max_bytes);
  FERRY_CHECK(o.factor >= 2, InvalidArgument, "--factor must be >= 2, got ", o.factor);
  const ferry::DType dtype = ferry::parse_dtype(o.dtype);
  FERRY_CHECK(dtype == ferry::DType::Float32 || dtype == ferry::DType::BFloat16 || dtype == ferry::DType::Float16,
              InvalidArgument, "--dtype ", o.dtype, ": the bench sums float32, bfloat16 or float16");
  FERRY_CHECK(o.iterations >= 1 && o.repeats >= 1 && o.warmup >= 0, InvalidArgument,
              "--iters and --repeats must be >= 1 and --warmup >= 0");
  auto group = ferry::dist::init_process_group({.backend = ferry::dist::parse_comm_backend(o.backend),
                                                .device = ferry::Device::parse(o.device), .timeout_s = o.timeout_s});
#ifdef FERRY_HAVE_MPI
  std::vector<Point> points;
  for (std::int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= o.factor) {
    points.push_back(measure(*group, bytes, dtype, o));
    if (group->rank() == 0 && !o.json && isatty(STDERR_FILENO)) {
      std::fprintf(stderr, "ferry bench allreduce: %s done\n", ferry::format_bytes(static_cast<double>(bytes)).c_str());
    }
  }
#else
  std::vector<Point> points;
#endif
  const int n = group->world_size();
  const std::string backend(ferry::dist::comm_backend_name(group->backend()));
  const std::string device = group->device().str();
  const bool is_rank0 = group->rank() == 0;
  group.reset();
  ferry::dist::finalize();
  if (!is_rank0) return;

  // The goal: >= 0.9 of raw MPI's busbw from 1 MB up.
  std::vector<double> large_ratios;
  std::int64_t wrong = 0;
  Json rows = Json::array();
  const bool compressed = dtype != ferry::DType::Float32;
  std::string text = fmt::format(
      "all-reduce (sum, {}) over {} ranks, {} backend, {} tensors; best of {} runs per size.\n"
      "algbw = bytes / time; busbw = algbw x 2(N-1)/N (nccl-tests); raw = {}.\n"
      "{:>10} {:>10} {:>18} {:>10} {:>10} {:>10} | {:>10} {:>10} | {:>6} {:>6}\n",
      ferry::dtype_name(dtype), n, backend, device, o.repeats,
      compressed ? "ferry's own float32 all-reduce of the same elements (twice the bytes), same run;\n"
                   "ratio = its time / the 16-bit one's: what compressing the gradients saves"
                 : "MPI_Allreduce on host memory, same run",
      "size", "count", "ferry's algorithm", "time", "algbw", "busbw", "raw time", "raw busbw", "ratio", "check");
  for (const Point& p : points) {
    const double raw_bytes = 4.0 * static_cast<double>(p.count);  // float32
    const double algbw = static_cast<double>(p.bytes) / p.seconds, raw_algbw = raw_bytes / p.raw_seconds;
    const double busbw = algbw * bus_factor(n), raw_busbw = raw_algbw * bus_factor(n);
    const double ratio = p.seconds > 0 ? p.raw_seconds / p.seconds : 0;  // float32: = busbw / raw busbw
    if (p.bytes >= 1000000) large_ratios.push_back(ratio);
    wrong += p.wrong + p.raw_wrong;
    text += fmt::format("{:>10} {:>10} {:>18} {:>10} {:>10} {:>10} | {:>10} {:>10} | {:>6.2f} {:>6}\n",
                        ferry::format_bytes(static_cast<double>(p.bytes)), p.count, p.algorithm,
                        ferry::format_seconds(p.seconds),
                        ferry::format_bandwidth(algbw), n > 1 ? ferry::format_bandwidth(busbw) : "-",
                        ferry::format_seconds(p.raw_seconds), n > 1 ? ferry::format_bandwidth(raw_busbw) : "-", ratio,
                        p.wrong == 0 && p.raw_wrong == 0 ? "ok" : "WRONG");
    rows.push_back({{"bytes", p.bytes}, {"count", p.count}, {"algorithm", p.algorithm}, {"seconds", p.seconds},
                    {"algbw", algbw},
                    {"busbw", busbw}, {"raw_seconds", p.raw_seconds}, {"raw_algbw", raw_algbw},
                    {"raw_busbw", raw_busbw}, {"ratio", ratio}, {"wrong", p.wrong}, {"raw_wrong", p.raw_wrong}});
  }
  Json object{{"world_size", n}, {"backend", backend}, {"device", device}, {"dtype", ferry::dtype_name(dtype)},
              {"raw", compressed ? "ferry float32" : "MPI_Allreduce float32"}, {"op", "sum"}, {"points", rows},
              {"correct", wrong == 0}};
  if (compressed && !large_ratios.empty()) {  // the speedup of the 16-bit sum over float32's, same elements
    std::sort(large_ratios.begin(), large_ratios.end());
    const double median = large_ratios[large_ratios.size() / 2];
    object["speedup_min_ge_1MB"] = large_ratios.front();
    object["speedup_median_ge_1MB"] = median;
    text += fmt::format("sizes >= 1 MB: {} against float32, the same elements: {:.2f}x to {:.2f}x as fast "
                        "(median {:.2f}x)\n",
                        ferry::dtype_name(dtype), large_ratios.front(), large_ratios.back(), median);
  } else if (!large_ratios.empty()) {
    std::sort(large_ratios.begin(), large_ratios.end());
    const double median = large_ratios[large_ratios.size() / 2];
    object["ratio_min_ge_1MB"] = large_ratios.front();
    object["ratio_median_ge_1MB"] = median;
    object["goal_ratio"] = 0.9;
    object["goal_met"] = large_ratios.front() >= 0.9;
    text += fmt::format("sizes >= 1 MB: ferry / raw MPI busbw min {:.2f}, median {:.2f} (goal >= 0.90: {})\n",
                        large_ratios.front(), median, large_ratios.front() >= 0.9 ? "met" : "not met");
  }
  if (o.json) {
    fmt::print("{}\n", object.dump());
  } else {
    fmt::print("{}", text);
  }
  FERRY_CHECK(wrong == 0, Error, "all-reduce results were wrong: ", wrong, " elements differ from the expected sums");
}

}  // namespace

void register_bench_allreduce(CLI::App& bench) {
  auto o = std::make_shared<AllReduceOptions>();
  CLI::App* command = bench.add_subcommand(
      "allreduce",
      "All-reduce time, algbw and busbw (nccl-tests' definitions) from 1 KiB to 256 MiB, checked, against raw MPI.\n"
      "Run it under mpirun: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 ferry bench allreduce");
  command->add_option("--device", o->device, "Where the tensors live: cpu, sim[:N], cuda[:N]")->capture_default_str();
  command->add_option("--backend", o->backend, "auto | mpi | nccl")->capture_default_str();
  command->add_option("--dtype", o->dtype,
                      "float32 | bfloat16 | float16: ferry's dtype (a 16-bit run is timed against ferry's float32\n"
                      "all-reduce of the same elements: what DDP's --allreduce-dtype saves)")
      ->capture_default_str();
  command->add_option("--min-bytes", o->min_bytes, "Smallest size")->capture_default_str();
  command->add_option("--max-bytes", o->max_bytes, "Largest size")->capture_default_str();
  // Checked as they are read, before mpirun's ranks start their collectives.
  command->add_option("--factor", o->factor, "Size multiplier between points")
      ->capture_default_str()
      ->check(whole_number_at_least(2));
  command->add_option("--iters", o->iterations, "Timed all-reduces per run, at most")
      ->capture_default_str()
      ->check(whole_number_at_least(1));
  command->add_option("--warmup", o->warmup, "Untimed all-reduces per size")
      ->capture_default_str()
      ->check(whole_number_at_least(0));
  command->add_option("--repeats", o->repeats, "Timed runs per size and path (interleaved); the best counts")
      ->capture_default_str()
      ->check(whole_number_at_least(1));
  command->add_option("--max-seconds", o->max_seconds, "Seconds per timed run (fewer iterations for large sizes)")
      ->capture_default_str()
      ->check(number_above_zero());
  command->add_option("--timeout", o->timeout_s, "Seconds a rank waits for a collective before it stops")
      ->capture_default_str()
      ->check(number_above_zero());
  command->add_flag("--json", o->json, "Print one JSON object (rank 0) instead of the table");
  command->callback([o] { run(*o); });
}
