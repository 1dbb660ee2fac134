// blas_threads.h — ferry runs every OpenBLAS call single-threaded and splits the work over its own OpenMP
// threads instead. OpenBLAS's pthreads build keeps its own workers, which after each threaded call poll
// (sched_yield) for a long while before sleeping; on a small machine they then fight ferry's OpenMP threads
// for the cores in every following kernel (measured on 2 cores: ~8 % of an fmnist step in the scheduler).
// Not here: the GEMM split itself (host_kernels.cpp) and conv's per-sample GEMMs (nn/host_conv.cpp).
#pragma once

#include <cblas.h>

namespace ferry::cpu {

// OpenBLAS runs single-threaded in every calling thread while this is alive (the previous setting is restored
// after, so that another library in the process keeps its own). Safe to call concurrently when single-threaded.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : saved_(openblas_get_num_threads()) {
    if (saved_ != 1) openblas_set_num_threads(1);
  }
  ~SingleThreadedBlas() {
    if (saved_ != 1) openblas_set_num_threads(saved_);
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int saved_;
};

}  // namespace ferry::cpu
