// src/ledger/cost_model.cpp — the exercise sheet's arithmetic (ferry/cost_model.h): bytes, link time, speedup,
// the Golden Rule, all-reduce bytes, batch splitting, logging cost. Not here: measurement, parsing, printing.

#include "ferry/cost_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ferry/error.h"

namespace ferry::cost {
namespace {

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// "[1000, 1000]"; long shapes are cut so that a message stays one readable line.
std::string shape_text(const std::vector<std::int64_t>& shape) {
  constexpr std::size_t kMaxShown = 16;  // dimensions
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i == kMaxShown) {
      text += fmt::format(", ... ({} dimensions)", shape.size());
      break;
    }
    text += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  }
  return text + "]";
}

// Throws unless `value` is a finite number >= 0 (or > 0 when `positive`).
void check_time_or_size(double value, bool positive, const char* name, const char* unit) {
  const bool ok = std::isfinite(value) && (positive ? value > 0 : value >= 0);
  FERRY_CHECK(ok, InvalidArgument, "Expected ", name, positive ? " > 0" : " >= 0", unit, ", got ",
              fmt::format("{}", value));
}

void check_result(double value, const char* what) {
  FERRY_CHECK(std::isfinite(value), InvalidArgument, "The ", what,
              " is too large to represent; check the inputs' units");
}

}  // namespace

std::int64_t tensor_elements(const std::vector<std::int64_t>& shape) {
  std::int64_t elements = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    FERRY_CHECK(shape[i] >= 0, InvalidArgument, "Expected dimensions >= 0, got ", shape[i],
                " at index ", i, " of shape ", shape_text(shape));
  }
  for (const std::int64_t dimension : shape) {
    FERRY_CHECK(!__builtin_mul_overflow(elements, dimension, &elements), InvalidArgument, "Shape ",
                shape_text(shape), " has more elements than a 64-bit integer can count");
  }
  return elements;
}

std::int64_t tensor_bytes(const std::vector<std::int64_t>& shape, DType dtype) {
  const std::int64_t elements = tensor_elements(shape);
  std::int64_t bytes = 0;
  FERRY_CHECK(!__builtin_mul_overflow(elements, static_cast<std::int64_t>(element_size(dtype)), &bytes),
              InvalidArgument, "Shape ", shape_text(shape), " of ", dtype_name(dtype),
              " has more bytes than a 64-bit integer can count");
  return bytes;
}

double transfer_seconds(double bytes, double bytes_per_second) {
  check_time_or_size(bytes, false, "the size", " bytes");
  check_time_or_size(bytes_per_second, true, "the link bandwidth", " bytes/s");
  return bytes / bytes_per_second;  // s = bytes / (bytes/s)
}

double theoretical_speedup(double gpu_hz, std::int64_t gpu_cores, double cpu_hz, std::int64_t cpu_cores) {
  check_time_or_size(gpu_hz, true, "the GPU clock", " Hz");
  check_time_or_size(cpu_hz, true, "the CPU clock", " Hz");
  FERRY_CHECK(gpu_cores > 0, InvalidArgument, "Expected GPU cores > 0, got ", gpu_cores);
  FERRY_CHECK(cpu_cores > 0, InvalidArgument, "Expected CPU cores > 0, got ", cpu_cores);
  const double gpu_rate = gpu_hz * static_cast<double>(gpu_cores);  // core-cycles per second
  const double cpu_rate = cpu_hz * static_cast<double>(cpu_cores);
  const double speedup = gpu_rate / cpu_rate;
  check_result(speedup, "speedup");
  return speedup;
}

GoldenRule golden_rule(double speedup_theoretical, double t_compute_s, double t_transfer_s) {
  check_time_or_size(speedup_theoretical, true, "the theoretical speedup S", "");
  check_time_or_size(t_compute_s, true, "T_compute", " s (the Golden Rule divides by it)");
  check_time_or_size(t_transfer_s, false, "T_transfer", " s");
  const double efficiency = 1.0 / (1.0 + t_transfer_s / t_compute_s);
  return {speedup_theoretical * efficiency, efficiency};
}

AllReduceBytes allreduce_bytes(std::int64_t params, DType dtype, std::int64_t gpus) {
  FERRY_CHECK(params >= 0, InvalidArgument, "Expected a parameter count P >= 0, got ", params);
  FERRY_CHECK(gpus >= 1, InvalidArgument, "Expected a number of GPUs N >= 1, got ", gpus);
  const auto size = static_cast<std::int64_t>(element_size(dtype));  // bytes per parameter
  std::int64_t bytes = 0;
  const bool overflow = __builtin_mul_overflow(params, size, &bytes) || __builtin_mul_overflow(bytes, 2, &bytes);
  FERRY_CHECK(!overflow, InvalidArgument, "2 x P x sizeof(", dtype_name(dtype), ") with P = ", params,
              " is more bytes than a 64-bit integer can count");
  // 2(N-1)/N x P x size, multiplied out before the one division so that whole results stay whole.
  const double ring = 2.0 * static_cast<double>(gpus - 1) * static_cast<double>(params) *
                      static_cast<double>(size) / static_cast<double>(gpus);
  return {bytes, ring};
}

std::int64_t per_gpu_batch(std::int64_t global_batch, std::int64_t gpus) {
  FERRY_CHECK(gpus > 0, InvalidArgument, "Expected a number of GPUs N > 0, got N = ", gpus);
  FERRY_CHECK(global_batch > 0, InvalidArgument, "Expected a global batch size B > 0, got B = ", global_batch);
  if (global_batch % gpus == 0) return global_batch / gpus;

  // The multiples of N on either side of B, when they are valid (> 0 and representable).
  const std::int64_t per_gpu_below = global_batch / gpus;
  std::vector<std::string> nearest;
  if (per_gpu_below > 0) nearest.push_back(fmt::format("{} ({} per GPU)", per_gpu_below * gpus, per_gpu_below));
  if (per_gpu_below * gpus <= kInt64Max - gpus) {
    nearest.push_back(fmt::format("{} ({} per GPU)", (per_gpu_below + 1) * gpus, per_gpu_below + 1));
  }
  throw InvalidArgument(fmt::format(
      "Global batch B = {} does not split evenly across N = {} GPUs ({} / {} = {:.4g}); B must be a "
      "multiple of N, the nearest valid batch {} {}",
      global_batch, gpus, global_batch, gpus, static_cast<double>(global_batch) / static_cast<double>(gpus),
      nearest.size() == 1 ? "size is" : "sizes are", fmt::join(nearest, " and ")));
}

LoopTime loop_time(double transfer_s, double compute_s, double log_s, std::int64_t steps, std::int64_t log_every) {
  check_time_or_size(transfer_s, false, "T_transfer", " s per step");
  check_time_or_size(compute_s, false, "T_compute", " s per step");
  check_time_or_size(log_s, false, "T_log", " s per log");
  // 0 steps would make the waste fraction 0 / 0: a loop has at least one step.
  FERRY_CHECK(steps >= 1, InvalidArgument, "Expected a number of steps >= 1, got ", steps);
  FERRY_CHECK(log_every >= 1, InvalidArgument, "Expected to log every n >= 1 steps, got ", log_every);

  const auto step_count = static_cast<double>(steps);
  const std::int64_t logs = steps / log_every;
  const double base_s = step_count * (transfer_s + compute_s);  // transfers and compute, every step
  LoopTime loop;
  loop.logs = logs;
  loop.total_s = base_s + static_cast<double>(logs) * log_s;
  loop.total_s_log_every_step = base_s + step_count * log_s;
  check_result(loop.total_s_log_every_step, "total loop time");
  loop.waste_fraction = loop.total_s_log_every_step > 0
                            ? (loop.total_s_log_every_step - loop.total_s) / loop.total_s_log_every_step
                            : 0.0;
  return loop;
}

}  // namespace ferry::cost
