// openblas_info.h — which OpenBLAS the cpu's GEMMs run on, and which of its kernel sets.
// An OpenBLAS built for every x86 core (DYNAMIC_ARCH, as Debian's is) picks its kernels when it loads: from
// OPENBLAS_CORETYPE where that is set, else from the CPU. Some machines set it to an AVX2 set ("Haswell") on
// processors with AVX-512, because older OpenBLAS builds compute wrong results or crash on them; that costs the
// GEMMs half their width: on the 2-core Zen 5 of docs/BENCHMARKS.md (v0.35), 100 fmnist training steps took 5.1 s
// with OPENBLAS_CORETYPE=Haswell and 3.75 s with OpenBLAS 0.3.21's own choice (Cooperlake). ferry leaves the
// variable alone (it is the machine's or the user's) and says which kernels it chose.
// Not here: the GEMM calls (host_kernels.cpp, nn/host_conv.cpp) and their threads (blas_threads.h).
#pragma once

#include <string>

namespace ferry::cpu {

// Whether an OpenBLAS kernel set (its name, as openblas_get_corename() gives it) uses AVX-512:
// SkylakeX, Cooperlake, SapphireRapids (any case).
bool is_avx512_kernel_set(const std::string& corename);

// What `ferry devices` and `ferry train` say of the cpu's BLAS, from OpenBLAS's config and kernel set, the
// variable (nullptr when unset; named only where the config says DYNAMIC_ARCH, the builds that read it) and
// whether the CPU has AVX-512:
//   "OpenBLAS 0.3.21, Cooperlake kernels"
//   "OpenBLAS 0.3.21, Haswell kernels (OPENBLAS_CORETYPE=Haswell)"
//   "..., Haswell kernels (OPENBLAS_CORETYPE=Haswell: kernels without AVX-512 on a CPU that has it)"
std::string describe_openblas(const std::string& config, const std::string& corename, const char* coretype_variable,
                              bool cpu_has_avx512);

// This process's: the loaded OpenBLAS, the environment, the CPU.
std::string openblas_description();

}  // namespace ferry::cpu
