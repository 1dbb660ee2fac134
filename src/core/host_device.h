// host_device.h — FERRY_HOST_DEVICE marks a function that both the host loops and the cuda kernels call
// (the shared rules: philox.h, int_pow.h, rounded.h, sgd_rule.h, batch_norm_rule.h), so the two devices run the same
// code.
#pragma once

#if defined(__CUDACC__)
#define FERRY_HOST_DEVICE __host__ __device__
#else
#define FERRY_HOST_DEVICE
#endif
