// onednn_info.h — which oneDNN the cpu's float32 convolutions run on (src/cpu/onednn_conv.cpp), and with which of its
// kernel sets: oneDNN picks them from the CPU (AVX-512 where there is one), not from OPENBLAS_CORETYPE.
// Not here: the convolutions themselves (onednn_conv.cpp), the BLAS (openblas_info.h).
#pragma once

#include <string>

namespace ferry::cpu {

// "oneDNN 2.6.3 (avx512_core kernels)", or "" in a build without oneDNN.
std::string onednn_description();

}  // namespace ferry::cpu
