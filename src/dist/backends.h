// backends.h — how process_group.cpp reaches the two backends, and the MPI helpers both use.
// Not here: the public API (ferry/dist/process_group.h).
#pragma once

#include <memory>
#include <string>

#include "check.h"
#include "ferry/dist/process_group.h"

namespace ferry::dist {

// MPI_Init_thread once (MPI_THREAD_SERIALIZED; errors returned on MPI_COMM_WORLD, not fatal).
void start_mpi();
// "" when every rank on each host uses a different device index; else which ranks share which device.
std::string ranks_sharing_a_device(Device device);

std::unique_ptr<ProcessGroup> make_mpi_process_group(const ProcessGroupOptions& options);
std::unique_ptr<ProcessGroup> make_nccl_process_group(const ProcessGroupOptions& options);

#ifdef FERRY_HAVE_MPI
// Polls `request` until it completes; throws CollectiveTimeout naming `op` after `timeout_s` seconds.
void wait_mpi_request(MPI_Request& request, const char* op, double timeout_s);
struct LocalRanks {
  int rank = 0, size = 1;  // among the ranks of this host (MPI_COMM_TYPE_SHARED)
};
LocalRanks local_ranks();
#endif

}  // namespace ferry::dist
