// device.cpp — the emulated device's execution of a grid (tests only; see emulator.h): the launch check
// CUDA makes, then every block in turn, each block's threads as cooperative fibers on this host thread. A
// thread runs until it finishes or waits at a barrier (__syncthreads, or a warp shuffle's exchange); a
// barrier opens when every thread it waits for that has not exited has arrived, as on Volta and later.
// Threads and blocks run forward on one launch and in reverse on the next, so code that leans on an order
// CUDA does not promise (a missing __syncthreads, a race between blocks) gives different results. A
// kernel that deadlocks (a barrier some live thread never reaches) aborts the process with the thread's
// coordinates: on a real card it would hang.
// Fibers switch with a few instructions of x86-64 assembly (callee-saved registers and the stack pointer):
// ucontext's swapcontext makes a system call per switch, and grids of 10^5 threads switch 10^5 times.
// Not here: when a grid runs (the stream queues of runtime.cpp), the device keywords (include/cuda_runtime.h).
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "include/cuda_runtime.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define FERRY_EMU_ASAN 1
#endif

#if !defined(__x86_64__)
#error "the cuda emulator's fibers switch with x86-64 assembly"
#endif

// ferry_emu_switch(&from_sp, to_sp): pushes the callee-saved registers and the SSE/x87 control words on the
// current stack, stores the stack pointer in *from_sp, loads to_sp and pops the other context's.
extern "C" void ferry_emu_switch(void** from_sp, void* to_sp);
asm(R"(
  .text
  .globl ferry_emu_switch
  .type ferry_emu_switch, @function
ferry_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ferry_emu_switch, .-ferry_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

namespace ferry::emu {

Coordinates g_coordinates;

namespace {

constexpr std::size_t kStackBytes = std::size_t{256} << 10;  // per fiber (sanitizers need room)
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxGridX = 2147483647u, kMaxGridYZ = 65535u, kMaxBlockZ = 64u;
constexpr std::size_t kMaxStaticShared = 48 << 10;

struct Fiber {
  void* sp = nullptr;  // saved stack pointer while switched out
  char* stack = nullptr;
  uint3 index{};
  bool done = false;
  const std::uint64_t* waiting_on = nullptr;  // a barrier's generation while waiting at it
  std::uint64_t waited_generation = 0;
  bool runnable() const { return !done && (!waiting_on || *waiting_on != waited_generation); }
};

struct Warp {
  std::uint64_t generation = 0;  // bumps when the barrier opens
  unsigned arrived = 0;          // lanes at the barrier (bit per lane)
  unsigned live = 0;             // lanes that exist and have not exited
  unsigned offered = 0;          // lanes that wrote `slots` in this exchange
  bool reading = false;          // an exchange's second barrier is next (all offered; lanes read)
  unsigned char slots[32][16]{};
};

struct BlockRun {
  std::vector<Fiber> fibers;
  void* scheduler_sp = nullptr;
  int current = -1;
  dim3 block_dim{}, grid_dim{};
  const std::function<void()>* body = nullptr;
  std::uint64_t generation = 0;  // __syncthreads
  unsigned arrived = 0, live = 0;
  std::vector<Warp> warps;
#ifdef FERRY_EMU_ASAN
  const void* scheduler_stack = nullptr;
  std::size_t scheduler_stack_bytes = 0;
#endif
};

BlockRun* g_run = nullptr;  // the block running now: one grid at a time (runtime.cpp's lock)
std::uint64_t g_launches = 0;
std::vector<char*> g_stacks;  // reused from block to block
#ifdef FERRY_EMU_ASAN
// AddressSanitizer's fake stack (detect_stack_use_after_return) of the last fiber on each stack, handed to the
// next one: making and destroying one per fiber costs system calls, and grids have 10^5 fibers.
std::vector<void*> g_fake_stacks;
#endif

[[noreturn]] void fail(const char* what) {
  const Coordinates& c = g_coordinates;
  std::fprintf(stderr, "ferry cuda emulator: %s (block (%u,%u,%u) of (%u,%u,%u), thread (%u,%u,%u) of (%u,%u,%u))\n",
               what, c.block.x, c.block.y, c.block.z, c.grid_dim.x, c.grid_dim.y, c.grid_dim.z, c.thread.x,
               c.thread.y, c.thread.z, c.block_dim.x, c.block_dim.y, c.block_dim.z);
  std::abort();
}

Fiber& current_fiber() {
  if (!g_run || g_run->current < 0) {
    std::fprintf(stderr, "ferry cuda emulator: device code called outside a kernel\n");
    std::abort();
  }
  return g_run->fibers[static_cast<std::size_t>(g_run->current)];
}

// Back to the scheduler until it resumes this fiber.
void yield() {
  Fiber& f = current_fiber();
#ifdef FERRY_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, g_run->scheduler_stack, g_run->scheduler_stack_bytes);
  ferry_emu_switch(&f.sp, g_run->scheduler_sp);
  __sanitizer_finish_switch_fiber(fake, &g_run->scheduler_stack, &g_run->scheduler_stack_bytes);
#else
  ferry_emu_switch(&f.sp, g_run->scheduler_sp);
#endif
}

// Waits until `generation` moves on (the barrier this fiber arrived at opened).
void wait_for(const std::uint64_t& generation, std::uint64_t seen) {
  Fiber& f = current_fiber();
  f.waiting_on = &generation;
  f.waited_generation = seen;
  while (generation == seen) yield();
  f.waiting_on = nullptr;
}

// Opens the block barrier when every live thread is there.
void open_block_barrier(BlockRun& r) {
  if (r.arrived > 0 && r.arrived >= r.live) {
    r.arrived = 0;
    ++r.generation;
  }
}

// Opens a warp's barrier when every live lane is there.
void open_warp_barrier(Warp& w) {
  if (w.arrived != 0 && (w.live & ~w.arrived) == 0) {
    w.arrived = 0;
    ++w.generation;
    // An exchange is two barriers: offers are in after the first, read after the second. Cleared by the
    // barrier, not by each lane, so a lane that runs ahead into the next exchange keeps its offer.
    if (w.reading) w.offered = 0;
    w.reading = !w.reading;
  }
}

// A barrier for every live lane of the warp: ferry's shuffles name the full warp.
void warp_barrier(Warp& w, unsigned lane_bit, unsigned mask) {
  if ((mask & lane_bit) == 0) fail("a warp shuffle's mask leaves out the calling lane");
  const std::uint64_t seen = w.generation;
  w.arrived |= lane_bit;
  open_warp_barrier(w);
  if (w.generation == seen) wait_for(w.generation, seen);
}

// Where a fiber starts (the first switch into it "returns" here); it never returns.
[[noreturn]] void fiber_main() {
  BlockRun& r = *g_run;
#ifdef FERRY_EMU_ASAN
  __sanitizer_finish_switch_fiber(g_fake_stacks[static_cast<std::size_t>(r.current)], &r.scheduler_stack,
                                  &r.scheduler_stack_bytes);
#endif
  (*r.body)();
  Fiber& f = current_fiber();
  f.done = true;
  const int linear = r.current;
  --r.live;
  Warp& w = r.warps[static_cast<std::size_t>(linear / 32)];
  w.live &= ~(1u << (linear % 32));
  open_block_barrier(r);  // an exited thread counts as arrived at both
  open_warp_barrier(w);
#ifdef FERRY_EMU_ASAN
  // kept for the next fiber on this stack (nullptr would destroy it)
  __sanitizer_start_switch_fiber(&g_fake_stacks[static_cast<std::size_t>(linear)], r.scheduler_stack,
                                 r.scheduler_stack_bytes);
#endif
  ferry_emu_switch(&f.sp, r.scheduler_sp);
  std::abort();  // a finished fiber is never resumed
}

char* stack_for(std::size_t i) {
  while (g_stacks.size() <= i) {
    void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "ferry cuda emulator: cannot map a fiber stack\n");
      std::abort();
    }
    g_stacks.push_back(static_cast<char*>(p));
#ifdef FERRY_EMU_ASAN
    g_fake_stacks.push_back(nullptr);
#endif
  }
  return g_stacks[i];
}

// A fresh context at the top of `stack` that ferry_emu_switch resumes into fiber_main, with the stack
// aligned as a call would leave it.
void* fresh_context(char* stack) {
  auto* top = reinterpret_cast<std::uint64_t*>(stack + kStackBytes);  // 16-byte aligned (mmap)
  std::uint32_t control[2] = {0, 0};
  asm volatile("stmxcsr %0" : "=m"(control[0]));
  asm volatile("fnstcw %0" : "=m"(control[1]));
  *--top = 0;                                             // fiber_main's return address: none
  *--top = reinterpret_cast<std::uint64_t>(&fiber_main);  // where `ret` goes
  for (int i = 0; i < 6; ++i) *--top = 0;                 // rbp, rbx, r12-r15
  --top;
  std::memcpy(top, &control[0], 4);                        // mxcsr
  std::memcpy(reinterpret_cast<char*>(top) + 4, &control[1], 2);  // x87 control word
  return top;
}

void run_block(BlockRun& r, bool reverse) {
  const unsigned threads = r.block_dim.x * r.block_dim.y * r.block_dim.z;
  r.fibers.assign(threads, Fiber{});
  r.warps.assign((threads + 31) / 32, Warp{});
  r.live = threads;
  r.arrived = 0;
  for (unsigned i = 0; i < threads; ++i) {
    Fiber& f = r.fibers[i];
    f.index = uint3{i % r.block_dim.x, (i / r.block_dim.x) % r.block_dim.y, i / (r.block_dim.x * r.block_dim.y)};
    r.warps[i / 32].live |= 1u << (i % 32);
    f.stack = stack_for(i);
    f.sp = fresh_context(f.stack);
  }
  unsigned finished = 0;
  while (finished < threads) {
    bool progressed = false;
    for (unsigned k = 0; k < threads; ++k) {
      const unsigned i = reverse ? threads - 1 - k : k;
      Fiber& f = r.fibers[i];
      if (!f.runnable()) continue;
      r.current = static_cast<int>(i);
      g_coordinates.thread = f.index;
#ifdef FERRY_EMU_ASAN
      void* fake = nullptr;
      __sanitizer_start_switch_fiber(&fake, f.stack, kStackBytes);
      ferry_emu_switch(&r.scheduler_sp, f.sp);
      __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
      ferry_emu_switch(&r.scheduler_sp, f.sp);
#endif
      r.current = -1;
      progressed = true;
      if (f.done) ++finished;
    }
    if (!progressed) {
      fail("deadlock: threads wait at a barrier (__syncthreads or a warp shuffle) that other live threads never reach");
    }
  }
}

}  // namespace

cudaError_t check_launch(const LaunchConfig& c) {
  const std::uint64_t threads = std::uint64_t{c.block.x} * c.block.y * c.block.z;
  if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || threads == 0 || threads > kMaxThreadsPerBlock ||
      c.grid.x > kMaxGridX || c.grid.y > kMaxGridYZ || c.grid.z > kMaxGridYZ || c.block.z > kMaxBlockZ ||
      c.shared_bytes > kMaxStaticShared) {
    return cudaErrorInvalidConfiguration;
  }
  return cudaSuccess;
}

void run_grid(const LaunchConfig& config, const std::function<void()>& body) {
  if (g_run) {
    std::fprintf(stderr, "ferry cuda emulator: a grid launched from inside a kernel\n");
    std::abort();
  }
  BlockRun run;
  run.block_dim = config.block;
  run.grid_dim = config.grid;
  run.body = &body;
  g_run = &run;
  g_coordinates.block_dim = config.block;
  g_coordinates.grid_dim = config.grid;
  const bool reverse = (g_launches++ % 2) == 1;
  const std::uint64_t blocks = std::uint64_t{config.grid.x} * config.grid.y * config.grid.z;
  for (std::uint64_t k = 0; k < blocks; ++k) {
    const std::uint64_t b = reverse ? blocks - 1 - k : k;
    g_coordinates.block = uint3{static_cast<unsigned>(b % config.grid.x),
                                static_cast<unsigned>((b / config.grid.x) % config.grid.y),
                                static_cast<unsigned>(b / (std::uint64_t{config.grid.x} * config.grid.y))};
    run_block(run, reverse);
  }
  g_run = nullptr;
}

void sync_block() {
  BlockRun& r = *g_run;
  current_fiber();
  const std::uint64_t seen = r.generation;
  ++r.arrived;
  open_block_barrier(r);
  if (r.generation == seen) wait_for(r.generation, seen);
}

void warp_exchange(unsigned mask, const void* value, std::size_t bytes, int source, void* out) {
  BlockRun& r = *g_run;
  current_fiber();
  const int linear = r.current;
  Warp& w = r.warps[static_cast<std::size_t>(linear / 32)];
  const unsigned lane_bit = 1u << (linear % 32);
  std::memcpy(w.slots[linear % 32], value, bytes);
  w.offered |= lane_bit;
  warp_barrier(w, lane_bit, mask);  // every live lane has offered
  if (w.offered & (1u << source)) {
    std::memcpy(out, w.slots[source], bytes);
  } else {
    std::memset(out, 0x7f, bytes);  // undefined in CUDA: a value no correct kernel would keep
  }
  warp_barrier(w, lane_bit, mask);  // every live lane has read
}

}  // namespace ferry::emu
