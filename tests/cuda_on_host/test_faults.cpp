// test_faults.cpp — ferry's cuda code when a CUDA call fails part-way through its work: faults the emulator
// injects on demand (emulator.h), which a healthy card never produces when a test wants them. Each test checks
// that the failure reaches the caller as a BackendError naming the call, that no thread is left waiting, and
// that the next piece of work is exact.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "emulator.h"
#include "ferry/error.h"
#include "ferry/ferry.h"

namespace ferry {
namespace {

const Device kCuda{DeviceType::CUDA, 0};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

// 60 MB and 7 bytes of pageable memory: 16 chunks through the staging ring's 8 buffers, so the failing chunk's
// DMA may be enqueued by a staging thread (not before the threads start) with other chunks in flight around it.
// Under 64 MB, so the ring's choice of stores (made on its first copies of 64 MB or more) is left to its own test.
Tensor pageable_bytes() {
  manual_seed(23);
  return randint(0, 256, {(std::int64_t{60} << 20) + 7}, {.dtype = DType::UInt8});
}

void expect_names_the_staged_copy(const std::string& message, const std::string& direction) {
  EXPECT_NE(message.find("cudaErrorUnknown"), std::string::npos) << message;
  EXPECT_NE(message.find("staged " + direction + " copy"), std::string::npos) << message;
}

TEST(CudaFaults, AStagedHostToDeviceCopyWhoseChunkFailsThrowsAndTheNextIsExact) {
  const Tensor host = pageable_bytes();
  for (const int after : {0, 5, 15}) {  // the first chunk, one in the middle, the last
    emu::fail_memcpy_async(cudaMemcpyHostToDevice, after, cudaErrorUnknown);
    try {
      const Tensor lost = host.to(kCuda);
      ADD_FAILURE() << "chunk " << after << ": the copy did not throw";
    } catch (const BackendError& e) {
      expect_names_the_staged_copy(e.what(), "host-to-device");
    }
    EXPECT_TRUE(same_bytes(host.to(kCuda).cpu(), host)) << "the copy after a failure at chunk " << after;
  }
}

TEST(CudaFaults, AStagedDeviceToHostCopyWhoseChunkFailsThrowsAndTheNextIsExact) {
  const Tensor host = pageable_bytes();
  const Tensor device = host.to(kCuda);
  for (const int after : {0, 10, 15}) {  // while the ring is primed, then from staging threads
    emu::fail_memcpy_async(cudaMemcpyDeviceToHost, after, cudaErrorUnknown);
    try {
      const Tensor lost = device.cpu();
      ADD_FAILURE() << "chunk " << after << ": the copy did not throw";
    } catch (const BackendError& e) {
      expect_names_the_staged_copy(e.what(), "device-to-host");
    }
    EXPECT_TRUE(same_bytes(device.cpu(), host)) << "the copy after a failure at chunk " << after;
  }
}

}  // namespace
}  // namespace ferry
