// cuda_runtime.h (emulated) — the device side of CUDA C++ for ferry's kernels compiled with g++ on the
// host (tests only; see ../emulator.h). Found before the toolkit's header on the emulated build's include
// path. It gives kernels what nvcc would: the execution-space keywords, threadIdx/blockIdx/blockDim/
// gridDim, __shared__ memory, __syncthreads, warp shuffles, atomics and the rounding intrinsics ferry
// uses. Launches (`kernel<<<grid, block, shared, stream>>>(args)`) are rewritten by launch_syntax.pl into
// ferry::emu::launch(...) below, which checks the configuration as CUDA does and enqueues the grid.
// Not here: the runtime API (cuda_runtime_api.h and runtime.cpp), cuBLAS (cublas.cpp).
#pragma once

#include <cuda_runtime_api.h>  // the emulated API's renames, then the toolkit's declarations
#include <math.h>              // float overloads of sqrt, exp, ... in the global namespace, as device code has

#include <atomic>
#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "emulator.h"

// The toolkit's host_defines.h turns these into attributes g++ does not know: on the host they are nothing.
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Blocks run one at a time (device.cpp), so a function-local static is one block's shared memory.
#define __shared__ static

namespace ferry::emu {

// The running thread's coordinates, set by device.cpp as it switches threads (read on every loop trip of
// a kernel, so a load, not a call).
struct Coordinates {
  uint3 thread{}, block{};
  dim3 block_dim{}, grid_dim{};
};
extern Coordinates g_coordinates;

// __syncthreads: waits until every thread of the block that has not exited arrives.
void sync_block();

// One round of a warp exchange: this lane offers `bytes` of `value`; once every lane named in `mask`
// (that has not exited) has offered, reads lane `source`'s offer into `out`. A source lane that made no
// offer (exited, or not in the mask) leaves a poison pattern in `out`, as its value is undefined in CUDA.
void warp_exchange(unsigned mask, const void* value, std::size_t bytes, int source, void* out);

template <typename Kernel, typename... Args>
void launch(const LaunchConfig& config, Kernel kernel, Args&&... args) {
  const cudaError_t status = check_launch(config);
  if (status != cudaSuccess) {
    set_last_error(status);
    return;
  }
  // Arguments are evaluated and copied now, as a launch copies its parameters.
  enqueue(config.stream, [config, kernel, params = std::make_tuple(std::decay_t<Args>(std::forward<Args>(args))...)] {
    run_grid(config, [&] { std::apply(kernel, params); });
  });
}

template <typename T>
T shuffle(unsigned mask, T value, int source) {
  static_assert(std::is_arithmetic_v<T>, "CUDA shuffles move arithmetic values");
  T out;
  warp_exchange(mask, &value, sizeof(T), source, &out);
  return out;
}

}  // namespace ferry::emu

#define threadIdx (static_cast<const uint3&>(::ferry::emu::g_coordinates.thread))
#define blockIdx (static_cast<const uint3&>(::ferry::emu::g_coordinates.block))
#define blockDim (static_cast<const dim3&>(::ferry::emu::g_coordinates.block_dim))
#define gridDim (static_cast<const dim3&>(::ferry::emu::g_coordinates.grid_dim))
#define warpSize 32

inline void __syncthreads() { ::ferry::emu::sync_block(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// Shuffles within the full warp (width 32, the only width ferry uses).
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  static_assert(std::is_arithmetic_v<T>);
  if (width != 32) std::abort();
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int source = lane + static_cast<int>(delta) < 32 ? lane + static_cast<int>(delta) : lane;
  return ::ferry::emu::shuffle(mask, value, source);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  static_assert(std::is_arithmetic_v<T>);
  if (width != 32) std::abort();
  const int lane = static_cast<int>(threadIdx.x % 32);
  return ::ferry::emu::shuffle(mask, value, (lane ^ lane_mask) & 31);
}

// Atomics: threads switch only at barriers, so a read-modify-write cannot be interleaved.
template <typename T>
T ferry_emu_atomic_add(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}
inline int atomicAdd(int* a, int v) { return ferry_emu_atomic_add(a, v); }
inline unsigned atomicAdd(unsigned* a, unsigned v) { return ferry_emu_atomic_add(a, v); }
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) { return ferry_emu_atomic_add(a, v); }
inline float atomicAdd(float* a, float v) { return ferry_emu_atomic_add(a, v); }
inline double atomicAdd(double* a, double v) { return ferry_emu_atomic_add(a, v); }
template <typename T>
T ferry_emu_atomic_cas(T* address, T compare, T value) {
  const T old = *address;
  if (old == compare) *address = value;
  return old;
}
inline int atomicCAS(int* a, int c, int v) { return ferry_emu_atomic_cas(a, c, v); }
inline unsigned atomicCAS(unsigned* a, unsigned c, unsigned v) { return ferry_emu_atomic_cas(a, c, v); }
inline unsigned long long atomicCAS(unsigned long long* a, unsigned long long c, unsigned long long v) {
  return ferry_emu_atomic_cas(a, c, v);
}

// Correctly rounded operations (the emulated build has -ffp-contract=off, so a * b is rounded on its own).
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
