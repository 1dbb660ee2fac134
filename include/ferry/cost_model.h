// ferry/cost_model.h — the exercise sheet's cost model (seed/gpu-device-management-exercises.txt) as plain functions.
// Not here: measuring anything (ferry/ledger.h) or parsing "4MB"-style text (ferry/units.h); inputs are SI numbers.
#pragma once

#include <cstdint>
#include <vector>

#include "ferry/dtype.h"

// Every function checks its inputs before computing: a negative size, zero GPUs, a NaN or an infinite
// time throws ferry::InvalidArgument with a one-line message that names the input and its value.
namespace ferry::cost {

// Exercise 2.1 — elements in a tensor of `shape`: the product of the dimensions (1 for a scalar, {}).
// Throws when a dimension is negative or the product overflows int64.
std::int64_t tensor_elements(const std::vector<std::int64_t>& shape);

// Exercise 2.1 — bytes a dense tensor occupies: elements x element_size(dtype).
// (1000, 1000) float32 -> 1,000,000 x 4 = 4,000,000 bytes (4 MB). Throws on int64 overflow.
std::int64_t tensor_bytes(const std::vector<std::int64_t>& shape, DType dtype);  // bytes

// Exercise 2.2 — time to copy `bytes` over a link: time = data / rate.
// 4e6 bytes at 16e9 bytes/s -> 2.5e-4 s (0.25 ms). bytes >= 0, bytes_per_second > 0.
double transfer_seconds(double bytes, double bytes_per_second);  // s

// Exercise 2.3 — the sheet's theoretical speedup S ~ (f_gpu x c_gpu) / (f_cpu x c_cpu): clock times
// cores, GPU over CPU. 1.5 GHz x 8000 / (3 GHz x 16) = 250. An upper bound: every core busy, no memory
// or transfer cost. Clocks in Hz (> 0), cores > 0.
double theoretical_speedup(double gpu_hz, std::int64_t gpu_cores, double cpu_hz, std::int64_t cpu_cores);

// Exercises 3.1 and 3.2 — the Golden Rule S_real = S_theoretical / (1 + T_transfer / T_compute).
struct GoldenRule {
  double speedup_real;  // S_real (times faster than the CPU)
  double efficiency;    // S_real / S_theoretical = 1 / (1 + T_transfer / T_compute), in (0, 1]
};
// 3.1: S = 250, T_compute = 0.1 s, T_transfer = 0.7 s -> S_real = 31.25, efficiency = 0.125.
// 3.2: T_transfer = 0 (data resident on the GPU) -> S_real = 250, efficiency = 1.
// speedup_theoretical > 0, t_compute_s > 0 (seconds per step), t_transfer_s >= 0 (seconds per step).
GoldenRule golden_rule(double speedup_theoretical, double t_compute_s, double t_transfer_s);

// Exercise 4.1 — bytes an all-reduce of the gradients moves per iteration.
struct AllReduceBytes {
  std::int64_t bytes;         // the sheet's estimate 2 x P x sizeof(dtype), per iteration
  double bytes_ring_per_gpu;  // ring all-reduce: each GPU sends (and receives) 2(N-1)/N x P x sizeof(dtype)
};
// P = 25,000,000 float32, N = 4 -> bytes = 200,000,000 (200 MB), bytes_ring_per_gpu = 150,000,000.
// params >= 0, gpus >= 1 (with one GPU the ring moves nothing). Throws on int64 overflow.
AllReduceBytes allreduce_bytes(std::int64_t params, DType dtype, std::int64_t gpus);

// Exercises 4.2 (a) and 5.2 — samples per GPU when a global batch is split evenly: B / N.
// 256 / 4 -> 64; 512 / 4 -> 128. The constraint of 5.2: N must divide B, or the per-GPU gradients
// would be weighted unequally; otherwise throws, naming B, N and the nearest valid batch sizes
// (multiples of N) below and above B. Also throws for B <= 0 or N <= 0.
std::int64_t per_gpu_batch(std::int64_t global_batch, std::int64_t gpus);  // samples per GPU

// Exercise 5.1 — wall-clock time of a training loop that pays a transfer, a compute and sometimes a
// logging sync (loss.item()) per step.
struct LoopTime {
  double total_s;                  // logging every log_every-th step: steps x (T_transfer + T_compute) + logs x T_log
  double total_s_log_every_step;   // logging every step: steps x (T_transfer + T_compute + T_log)
  double waste_fraction;           // (total_s_log_every_step - total_s) / total_s_log_every_step; 0 if both are 0
  std::int64_t logs;               // floor(steps / log_every): the log_every-th, 2 log_every-th, ... steps
};
// 5 ms, 20 ms, 1 ms, 1000 steps, every 100 -> total_s = 25.01, total_s_log_every_step = 26,
// waste_fraction = 990 / 26000 ~ 0.0381. Times in seconds per step (>= 0), steps >= 1, log_every >= 1.
LoopTime loop_time(double transfer_s, double compute_s, double log_s, std::int64_t steps, std::int64_t log_every);

}  // namespace ferry::cost
