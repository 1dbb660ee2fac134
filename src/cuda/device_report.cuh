// device_report.cuh — how a kernel reports a bad index without faulting: plain stores into the
// device's error report (mapped host memory), raised as InvalidArgument at the next sync.
// Not here: reading and raising the report (cuda_backend.cpp, raise_kernel_errors).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "device_state.h"

namespace ferry::cuda {

// Racing threads may each leave a field, but every value left is a genuine bad index and its limit;
// `kind` is written last, after a fence, so a reader that sees it sees a value and a limit.
__device__ __forceinline__ void report_kernel_error(DeviceErrorReport* report, KernelErrorKind kind,
                                                    std::int64_t value, std::int64_t limit) {
  report->value = value;
  report->limit = limit;
  __threadfence_system();
  report->kind = static_cast<std::int32_t>(kind);
}

}  // namespace ferry::cuda
