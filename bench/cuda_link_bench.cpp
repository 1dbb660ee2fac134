// cuda_link_bench.cpp — what ferry's cuda backend achieves on the measures of ANCHORS.md: host->device
// from pageable and pinned memory (4 MB, 256 MB), device->host, device->device, add over 3 x 256 MB,
// float32 -> bfloat16 / float16 of 256 MB, fp32 GEMM 4096 and 8192, and the host's own memcpy rate (the
// ceiling of the staged pageable copies). Medians of CUDA-event timings; prints one JSON object on stdout.
// `cuda_link_bench --transfers`: the host<->device rows only (scripts/gpu-check's staging sweep).
// Not here: PyTorch's side (bench/torch_link_bench.py) and the table of ratios (scripts/gpu-check).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../src/cuda/cuda_backend.h"
#include "ferry/ferry.h"

namespace {

using ferry::Device;
using ferry::Tensor;

const Device kCuda{ferry::DeviceType::CUDA, 0};
constexpr std::int64_t kMB = 1 << 20;  // bytes

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "cuda_link_bench: %s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

cudaStream_t stream_of(bool copy) {
  ferry::Backend& be = ferry::backend(kCuda);
  return static_cast<cudaStream_t>((copy ? be.copy_stream(0) : be.compute_stream(0)).handle);
}

// Median in ms of `reps` runs of `work`, each between two events on `stream` and waited for.
double median_ms(cudaStream_t stream, int warmup, int reps, const std::function<void()>& work) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < warmup; ++i) work();
  ferry::synchronize(kCuda, "bench");
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    work();
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms);
    ferry::synchronize(kCuda, "bench");
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

nlohmann::json rate(double ms, double bytes) {
  return {{"ms", ms}, {"bytes", bytes}, {"GBps", bytes / (ms * 1e-3) / 1e9}};
}

// The host's own ceiling for the staged copies: median ms of a plain memcpy of `bytes` between two
// touched host buffers, split over `threads` std::threads (5 runs after 1 warm-up).
double host_memcpy_ms(std::size_t bytes, int threads) {
  std::vector<char> from(bytes, 1), to(bytes, 0);
  std::vector<double> times;
  for (int rep = 0; rep < 6; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      const std::size_t lo = bytes * static_cast<std::size_t>(t) / static_cast<std::size_t>(threads);
      const std::size_t hi = bytes * static_cast<std::size_t>(t + 1) / static_cast<std::size_t>(threads);
      pool.emplace_back([&, lo, hi] { std::memcpy(to.data() + lo, from.data() + lo, hi - lo); });
    }
    for (auto& thread : pool) thread.join();
    if (rep > 0) times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// What the pageable rows' staging ring chose after its first copies (src/cuda/copy.cpp), and where its threads'
// time went in the 256 MB copies made with the way kept: copying, or waiting for the link.
nlohmann::json staging_choice() {
  nlohmann::json split;
  for (const bool to_device : {true, false}) {
    const ferry::PageableCopyPath path = ferry::backend(kCuda).pageable_copy_path(to_device);
    split[to_device ? "host_to_device" : "device_to_host"] = {
        {"copies", path.timed_copies}, {"copying_share", path.copying_share},
        {"waiting_share", path.waiting_share}, {"copying_GBps", path.copying_rate / 1e9}};
  }
  return {{"host_to_device", ferry::cuda::staging_choice(true)},
          {"device_to_host", ferry::cuda::staging_choice(false)},
          {"threads_time", split}};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (ferry::device_count(ferry::DeviceType::CUDA) == 0) {
      std::fprintf(stderr, "cuda_link_bench: no CUDA device (%s)\n", ferry::cuda::unavailable_reason().c_str());
      return 2;
    }
    const bool transfers_only = argc > 1 && std::string(argv[1]) == "--transfers";
    ferry::cuda::set_allow_tf32(false);
    ferry::Ledger::global().set_enabled(false);  // the ledger's bookkeeping is not what is measured
    nlohmann::json measures;
    const cudaStream_t copy = stream_of(true), compute = stream_of(false);
    ferry::manual_seed(1);

    // The staging ring tries several ways on its first pageable copies of 64 MB or more each way, then keeps the
    // fastest (src/cuda/copy.cpp): the 256 MB pageable rows copy until it has chosen, then warm up and are timed.
    auto until_chosen = [](bool host_to_device, const std::function<void()>& work) {
      for (int i = 0; i < 32 && !ferry::backend(kCuda).pageable_copy_path(host_to_device).settled; ++i) work();
      return work;
    };
    for (const std::int64_t mb : {std::int64_t{4}, std::int64_t{256}}) {
      const int reps = mb == 4 ? 30 : 10;
      const double bytes = static_cast<double>(mb * kMB);
      const Tensor pageable = ferry::rand({mb * kMB / 4});
      const Tensor pinned = pageable.pin_memory();
      const std::string size = std::to_string(mb) + "MB";
      const std::function<void()> to_device = [&] { Tensor d = pageable.to(kCuda); };
      measures["h2d_pageable_" + size] =
          rate(median_ms(copy, 3, reps, mb == 256 ? until_chosen(true, to_device) : to_device), bytes);
      measures["h2d_pinned_" + size] =
          rate(median_ms(copy, 3, reps, [&] { Tensor d = pinned.to(kCuda, /*non_blocking=*/true); }), bytes);
    }
    {
      const Tensor device = ferry::rand({256 * kMB / 4}, {.device = kCuda});
      const double bytes = static_cast<double>(256 * kMB);
      measures["d2h_pinned_256MB"] =
          rate(median_ms(copy, 3, 10, [&] { Tensor h = device.to(ferry::kCPU, /*non_blocking=*/true); }), bytes);
      measures["d2h_pageable_256MB"] =
          rate(median_ms(copy, 3, 10, until_chosen(false, [&] { Tensor h = device.cpu(); })), bytes);
    }
    if (transfers_only) {  // scripts/gpu-check's staging sweep: the copies only
      const nlohmann::json result = {{"library", "ferry"}, {"measures", measures}, {"staging", staging_choice()}};
      std::printf("%s\n", result.dump().c_str());
      return 0;
    }
    {
      const Tensor device = ferry::rand({256 * kMB / 4}, {.device = kCuda});
      const double bytes = static_cast<double>(256 * kMB);
      // bytes read + written, as ANCHORS.md counts device-to-device copies
      measures["d2d_256MB"] = rate(median_ms(compute, 3, 20, [&] { Tensor c = device.clone(); }), 2 * bytes);
      const Tensor other = ferry::rand({256 * kMB / 4}, {.device = kCuda});
      measures["add_3x256MB"] = rate(median_ms(compute, 3, 20, [&] { Tensor c = ferry::add(device, other); }), 3 * bytes);
      // float32 -> 16-bit storage (ferry/half.h's conversions in the elementwise map): 256 MB read, 128 MB written
      measures["to_bf16_256MB"] =
          rate(median_ms(compute, 3, 20, [&] { Tensor h = device.to(ferry::DType::BFloat16); }), 1.5 * bytes);
      measures["to_f16_256MB"] =
          rate(median_ms(compute, 3, 20, [&] { Tensor h = device.to(ferry::DType::Float16); }), 1.5 * bytes);
    }
    // What the host alone can copy (pageable -> pageable, 256 MB): the pageable rows' ceiling on this machine, with
    // 1 thread, half the staging ring's default threads and all of them.
    const int cores = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 16);
    for (const int threads : {1, cores / 2, cores}) {
      const std::string key = "host_memcpy_256MB_" + std::to_string(threads) + (threads == 1 ? "thread" : "threads");
      if (threads >= 1 && !measures.contains(key)) measures[key] = rate(host_memcpy_ms(256 * kMB, threads), 256.0 * kMB);
    }
    for (const std::int64_t n : {std::int64_t{4096}, std::int64_t{8192}}) {
      const Tensor a = ferry::randn({n, n}, {.device = kCuda}), b = ferry::randn({n, n}, {.device = kCuda});
      const double ms = median_ms(compute, 2, n == 4096 ? 10 : 5, [&] { Tensor c = ferry::matmul(a, b); });
      const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
      measures["gemm_fp32_" + std::to_string(n)] = {{"ms", ms}, {"TFLOPs", flops / (ms * 1e-3) / 1e12}};
    }
    const ferry::DeviceProperties p = ferry::backend(kCuda).properties(0);
    const nlohmann::json result = {{"library", "ferry"}, {"device", p.name}, {"measures", measures}, {"staging", staging_choice()}};
    std::printf("%s\n", result.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_link_bench: %s\n", e.what());
    return 1;
  }
}
