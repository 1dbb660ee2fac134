// fuzz/include/omp.h — a serial stand-in for OpenMP's header, used only by the fuzz build.
// Not OpenMP: the fuzz build compiles without -fopenmp (one thread, reproducible), so every helper answers "serial".
#pragma once

inline int omp_in_parallel() { return 1; }  // "already parallel": the cpu kernels take their serial path
inline int omp_get_max_threads() { return 1; }
inline int omp_get_thread_num() { return 0; }
inline int omp_get_num_threads() { return 1; }
