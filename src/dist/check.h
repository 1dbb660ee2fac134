// check.h — the one status-check macro of ferry::dist: an MPI or NCCL status other than success
// becomes a BackendError naming the call, file:line and rank. Not here: user mistakes (FERRY_CHECK).
#pragma once

#include <string>

#include "ferry/error.h"

#ifdef FERRY_HAVE_MPI
#include <mpi.h>
#endif
#ifdef FERRY_HAVE_NCCL
#include <nccl.h>
#endif

namespace ferry::dist::comm_check {

// "rank 1 of 4" once MPI has started, "rank ? (MPI not started)" before.
std::string rank_text();
void set_rank_text(int rank, int world_size);

[[noreturn]] void throw_comm_error(const char* library, const std::string& what, const char* call, const char* file,
                                   int line);

#ifdef FERRY_HAVE_MPI
void check_status(int mpi_status, const char* call, const char* file, int line);  // MPI calls return int
#endif
#ifdef FERRY_HAVE_NCCL
void check_status(ncclResult_t status, const char* call, const char* file, int line);
#endif

}  // namespace ferry::dist::comm_check

// FERRY_COMM_CHECK(MPI_Isend(...)); FERRY_COMM_CHECK(ncclAllReduce(...));
#define FERRY_COMM_CHECK(call) ::ferry::dist::comm_check::check_status((call), #call, __FILE__, __LINE__)
