// nccl.h (emulator shim) — found before NCCL's own header when ferry is built for the host-emulated GPU
// (tests/cuda_on_host). It renames the NCCL entry points ferry calls to ferry_emu_<name> and includes the real
// header, whose declarations then declare the renamed functions that tests/cuda_on_host/nccl.cpp defines (NCCL
// over MPI, on the emulated cards' host memory); the real libnccl is left alone. A function missing from the
// list below would call the real libnccl: `nm` of the emulated build's objects must show no plain ncclXxx.
// Not an implementation, and no declarations of its own.
#pragma once

#if defined(NCCL_H_)
#error "NCCL's header was included before the emulator's shim (tests/cuda_on_host/include)"
#endif

// The runtime shim first: NCCL's header pulls in cuda_runtime.h, whose declarations must already be renamed.
#include <cuda_runtime_api.h>

#define ncclGetUniqueId ferry_emu_ncclGetUniqueId
#define ncclCommInitRank ferry_emu_ncclCommInitRank
#define ncclCommDestroy ferry_emu_ncclCommDestroy
#define ncclCommAbort ferry_emu_ncclCommAbort
#define ncclCommGetAsyncError ferry_emu_ncclCommGetAsyncError
#define ncclGetErrorString ferry_emu_ncclGetErrorString
#define ncclAllReduce ferry_emu_ncclAllReduce
#define ncclBroadcast ferry_emu_ncclBroadcast
#define ncclAllGather ferry_emu_ncclAllGather
#define ncclReduceScatter ferry_emu_ncclReduceScatter

#include_next <nccl.h>
