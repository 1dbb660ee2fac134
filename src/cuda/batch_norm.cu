// batch_norm.cu — training-mode BatchNorm + ReLU as ferry's own kernels, two launches each way:
//
//   forward:  sums    x            -> per (channel, slice): sum(x - K), sum((x - K)^2)
//             apply   x, partials  -> y = relu(x * scale + shift); save_mean, save_invstd, running stats
//   backward: sums    dy, y, x     -> per (channel, slice): sum(dy'), sum(dy' (x - mean)), dy' = dy masked by y > 0
//             apply   dy, y, x     -> dx = dy' k + x a + b; grad_weight, grad_bias
//
// Each channel (N * inner elements, strided by C * inner) is cut into `splits` slices, one block each, so
// even the few channels of a small CNN (32 x 100352 elements in the fmnist model) fill the GPU. Every block
// of an apply kernel adds its channel's partial sums itself, in the same order, so all of them use the
// same numbers; the channel's first block stores them. Against cuDNN's BatchNorm followed by a ReLU kernel
// (two launches each way as well), the ReLU's own read and write of the whole activation are gone forward
// and backward. The per-channel arithmetic is src/nn/batch_norm_rule.h, shared with the host loops that sim runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../nn/batch_norm_rule.h"
#include "check.h"
#include "kernels.h"

namespace ferry::cuda {

namespace {

using nn::detail::BatchNormSums;

constexpr int kThreads = 256;       // per block: 8 warps
constexpr int kMaxSplits = 128;     // slices per channel
constexpr int kTargetBlocks = 1024; // about 8 blocks per multiprocessor on a 132-SM H200

struct Layout {
  std::int64_t channels = 0, inner = 0;
  std::int64_t count = 0;  // elements per channel: batch * inner
  std::int64_t chunk = 0;  // elements per slice
  int splits = 0;          // slices per channel; block b is channel b / splits, slice b % splits
};

Layout make_layout(const Backend::BatchNormShape& s) {
  Layout l;
  l.channels = s.channels;
  l.inner = s.inner;
  l.count = s.batch * s.inner;
  if (l.count <= 0 || l.channels <= 0) return l;  // nothing to launch (splits 0)
  const std::int64_t wanted = std::max<std::int64_t>(1, kTargetBlocks / std::max<std::int64_t>(1, s.channels));
  const std::int64_t most = std::max<std::int64_t>(1, l.count / (kThreads * 4));  // >= 4 elements per thread
  const std::int64_t splits = std::min<std::int64_t>({wanted, most, kMaxSplits});
  l.chunk = (l.count + splits - 1) / splits;
  l.splits = static_cast<int>((l.count + l.chunk - 1) / l.chunk);  // no empty slice
  return l;
}

// Offset of element j (0 <= j < count) of channel c: sample j / inner, position j % inner. Index is
// 32-bit when count allows (the division is then a few instructions, not a 64-bit software routine).
template <typename Index>
__device__ __forceinline__ std::int64_t offset_of(const Layout& l, std::int64_t c, Index j) {
  const Index inner = static_cast<Index>(l.inner);
  const Index n = j / inner;
  return (static_cast<std::int64_t>(n) * l.channels + c) * l.inner + static_cast<std::int64_t>(j - n * inner);
}

// One past the last element of the slice that starts at `begin`.
template <typename Index>
__device__ __forceinline__ Index slice_end(const Layout& l, Index begin) {
  const std::int64_t end = static_cast<std::int64_t>(begin) + l.chunk;
  return static_cast<Index>(end < l.count ? end : l.count);
}

// The sum of every thread's pair, valid in thread 0. Called once per kernel, by all threads.
__device__ BatchNormSums block_sum(BatchNormSums v) {
  __shared__ double s1[kThreads / 32], s2[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    v.s1 += __shfl_down_sync(0xffffffffu, v.s1, o);
    v.s2 += __shfl_down_sync(0xffffffffu, v.s2, o);
  }
  if (lane == 0) {
    s1[warp] = v.s1;
    s2[warp] = v.s2;
  }
  __syncthreads();
  if (warp == 0) {
    v.s1 = lane < kThreads / 32 ? s1[lane] : 0.0;
    v.s2 = lane < kThreads / 32 ? s2[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) {
      v.s1 += __shfl_down_sync(0xffffffffu, v.s1, o);
      v.s2 += __shfl_down_sync(0xffffffffu, v.s2, o);
    }
  }
  return v;
}

// The channel's partial sums, added by the first warp (lane k takes slices k, k + 32, ...; then a fixed
// shuffle tree): the same order in every block of the channel, so all of them get the same numbers. Called
// by the 32 threads of warp 0; valid in thread 0.
__device__ BatchNormSums channel_sum(const BatchNormSums* partial, std::int64_t c, int splits) {
  BatchNormSums v;
  for (int k = static_cast<int>(threadIdx.x); k < splits; k += 32) {
    v.s1 += partial[c * splits + k].s1;
    v.s2 += partial[c * splits + k].s2;
  }
  for (int o = 16; o > 0; o >>= 1) {
    v.s1 += __shfl_down_sync(0xffffffffu, v.s1, o);
    v.s2 += __shfl_down_sync(0xffffffffu, v.s2, o);
  }
  return v;
}

template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads) forward_sums(const T* __restrict__ x, Layout l,
                                                         BatchNormSums* __restrict__ partial) {
  const std::int64_t c = blockIdx.x / l.splits;
  const Index begin = static_cast<Index>((blockIdx.x % l.splits) * l.chunk);
  const Index end = slice_end<Index>(l, begin);
  const double shift_by = static_cast<double>(x[c * l.inner]);
  BatchNormSums v;
  for (Index j = begin + threadIdx.x; j < end; j += kThreads) {
    const double d = static_cast<double>(x[offset_of(l, c, j)]) - shift_by;
    v.s1 += d;
    v.s2 += d * d;
  }
  v = block_sum(v);
  if (threadIdx.x == 0) partial[blockIdx.x] = v;
}

template <typename T, typename Index, bool kRelu>
__global__ void __launch_bounds__(kThreads)
    forward_apply(const T* __restrict__ x, T* __restrict__ y, const T* __restrict__ weight,
                  const T* __restrict__ bias, T* running_mean, T* running_var, T* save_mean, T* save_invstd,
                  const BatchNormSums* __restrict__ partial, Layout l, double eps, double factor) {
  const std::int64_t c = blockIdx.x / l.splits;
  const int slice = static_cast<int>(blockIdx.x % l.splits);
  __shared__ T numbers[2];  // scale, shift
  if (threadIdx.x < 32) {
    const BatchNormSums sums = channel_sum(partial, c, l.splits);
    if (threadIdx.x == 0) {
      const double count = static_cast<double>(l.count);
      const auto f = nn::detail::batch_norm_forward_numbers(static_cast<double>(x[c * l.inner]), sums, count, eps,
                                                            static_cast<double>(weight[c]),
                                                            static_cast<double>(bias[c]));
      numbers[0] = static_cast<T>(f.scale);
      numbers[1] = static_cast<T>(f.shift);
      if (slice == 0) {
        save_mean[c] = static_cast<T>(f.mean);
        save_invstd[c] = static_cast<T>(f.invstd);
        if (running_mean != nullptr) {
          running_mean[c] =
              static_cast<T>(nn::detail::running_mean_update(static_cast<double>(running_mean[c]), f.mean, factor));
          running_var[c] =
              static_cast<T>(nn::detail::running_var_update(static_cast<double>(running_var[c]), f.var, count, factor));
        }
      }
    }
  }
  __syncthreads();
  const T scale = numbers[0], shift = numbers[1];
  const Index begin = static_cast<Index>(slice * l.chunk);
  const Index end = slice_end<Index>(l, begin);
  for (Index j = begin + threadIdx.x; j < end; j += kThreads) {
    const std::int64_t o = offset_of(l, c, j);
    const T value = x[o] * scale + shift;
    y[o] = kRelu ? nn::detail::relu_value(value) : value;
  }
}

template <typename T, bool kRelu>
__device__ __forceinline__ T masked(const T* __restrict__ dy, const T* __restrict__ y, std::int64_t o) {
  if constexpr (kRelu) return nn::detail::relu_masked(dy[o], y[o]);
  else return dy[o];
}

template <typename T, typename Index, bool kRelu>
__global__ void __launch_bounds__(kThreads)
    backward_sums(const T* __restrict__ dy, const T* __restrict__ y, const T* __restrict__ x,
                  const T* __restrict__ save_mean, Layout l, BatchNormSums* __restrict__ partial) {
  const std::int64_t c = blockIdx.x / l.splits;
  const Index begin = static_cast<Index>((blockIdx.x % l.splits) * l.chunk);
  const Index end = slice_end<Index>(l, begin);
  const double mean = static_cast<double>(save_mean[c]);
  BatchNormSums v;
  for (Index j = begin + threadIdx.x; j < end; j += kThreads) {
    const std::int64_t o = offset_of(l, c, j);
    const double g = static_cast<double>(masked<T, kRelu>(dy, y, o));
    v.s1 += g;
    v.s2 += g * (static_cast<double>(x[o]) - mean);
  }
  v = block_sum(v);
  if (threadIdx.x == 0) partial[blockIdx.x] = v;
}

template <typename T, typename Index, bool kRelu>
__global__ void __launch_bounds__(kThreads)
    backward_apply(const T* __restrict__ dy, const T* __restrict__ y, const T* __restrict__ x,
                   const T* __restrict__ weight, const T* __restrict__ save_mean, const T* __restrict__ save_invstd,
                   const BatchNormSums* __restrict__ partial, Layout l, T* __restrict__ dx, T* grad_weight,
                   T* grad_bias) {
  const std::int64_t c = blockIdx.x / l.splits;
  const int slice = static_cast<int>(blockIdx.x % l.splits);
  __shared__ T numbers[3];  // k, a, b
  if (threadIdx.x < 32) {
    const BatchNormSums sums = channel_sum(partial, c, l.splits);
    if (threadIdx.x == 0) {
      const auto r = nn::detail::batch_norm_backward_numbers(
          sums, static_cast<double>(save_mean[c]), static_cast<double>(save_invstd[c]),
          static_cast<double>(weight[c]), static_cast<double>(l.count));
      numbers[0] = static_cast<T>(r.k);
      numbers[1] = static_cast<T>(r.a);
      numbers[2] = static_cast<T>(r.b);
      if (slice == 0) {
        grad_weight[c] = static_cast<T>(r.grad_weight);
        grad_bias[c] = static_cast<T>(r.grad_bias);
      }
    }
  }
  __syncthreads();
  const T k = numbers[0], a = numbers[1], b = numbers[2];
  const Index begin = static_cast<Index>(slice * l.chunk);
  const Index end = slice_end<Index>(l, begin);
  for (Index j = begin + threadIdx.x; j < end; j += kThreads) {
    const std::int64_t o = offset_of(l, c, j);
    dx[o] = masked<T, kRelu>(dy, y, o) * k + x[o] * a + b;
  }
}

// Calls body(T{}, Index{}, relu constant) for the tensor's dtype, the index width the layout allows, and
// shape.relu.
template <typename Body>
void dispatch(DType dtype, const Layout& l, bool relu, Body&& body) {
  const bool narrow = l.count + kThreads <= std::numeric_limits<std::int32_t>::max();
  const auto with_relu = [&](auto t, auto index) {
    if (relu) body(t, index, std::true_type{});
    else body(t, index, std::false_type{});
  };
  const auto with_index = [&](auto t) {
    if (narrow) with_relu(t, std::uint32_t{});
    else with_relu(t, std::int64_t{});
  };
  if (dtype == DType::Float32) with_index(float{});
  else if (dtype == DType::Float64) with_index(double{});
  else throw DTypeMismatch(detail::concat("batch_norm: expected float32 or float64, got ", dtype_name(dtype)));
}

unsigned grid_of(const Layout& l) {
  const std::int64_t blocks = l.channels * l.splits;
  FERRY_CHECK(blocks <= std::numeric_limits<std::int32_t>::max(), InvalidArgument, "batch_norm: ", l.channels,
              " channels are more than one launch can cover");
  return static_cast<unsigned>(blocks);
}

}  // namespace

bool batch_norm_kernels_supported(const Backend::BatchNormShape& s, DType dtype) {
  return (dtype == DType::Float32 || dtype == DType::Float64) && s.batch > 0 && s.channels > 0 && s.inner > 0;
}

void launch_batch_norm_forward(const KernelTensor& out, const KernelTensor& x, const KernelTensor& weight,
                               const KernelTensor& bias, const KernelTensor& running_mean,
                               const KernelTensor& running_var, const KernelTensor& save_mean,
                               const KernelTensor& save_invstd, const Backend::BatchNormShape& shape, double factor,
                               cudaStream_t stream) {
  const Layout l = make_layout(shape);
  if (l.splits == 0) return;
  const unsigned grid = grid_of(l);
  ScratchBuffer partial(sizeof(BatchNormSums) * grid, stream);  // freed in stream order after both launches
  dispatch(x.dtype, l, shape.relu, [&](auto t, auto index, auto relu) {
    using T = decltype(t);
    using Index = decltype(index);
    forward_sums<T, Index><<<grid, kThreads, 0, stream>>>(x.ptr<const T>(), l, partial.as<BatchNormSums>());
    FERRY_LAUNCH_CHECK();
    forward_apply<T, Index, decltype(relu)::value><<<grid, kThreads, 0, stream>>>(
        x.ptr<const T>(), out.ptr<T>(), weight.ptr<const T>(), bias.ptr<const T>(),
        running_mean.data ? running_mean.ptr<T>() : nullptr, running_var.data ? running_var.ptr<T>() : nullptr,
        save_mean.ptr<T>(), save_invstd.ptr<T>(), partial.as<BatchNormSums>(), l, shape.eps, factor);
    FERRY_LAUNCH_CHECK();
  });
}

void launch_batch_norm_backward(const KernelTensor& grad_x, const KernelTensor& grad_weight,
                                const KernelTensor& grad_bias, const KernelTensor& grad_out, const KernelTensor& x,
                                const KernelTensor& out, const KernelTensor& weight, const KernelTensor& save_mean,
                                const KernelTensor& save_invstd, const Backend::BatchNormShape& shape,
                                cudaStream_t stream) {
  const Layout l = make_layout(shape);
  if (l.splits == 0) return;
  FERRY_CHECK(!shape.relu || out.data != nullptr, InvalidArgument,
              "batch_norm backward with a fused ReLU needs the forward's output");
  const unsigned grid = grid_of(l);
  ScratchBuffer partial(sizeof(BatchNormSums) * grid, stream);
  dispatch(x.dtype, l, shape.relu, [&](auto t, auto index, auto relu) {
    using T = decltype(t);
    using Index = decltype(index);
    constexpr bool kRelu = decltype(relu)::value;
    const T* y = kRelu ? out.ptr<const T>() : nullptr;
    backward_sums<T, Index, kRelu><<<grid, kThreads, 0, stream>>>(grad_out.ptr<const T>(), y, x.ptr<const T>(),
                                                                  save_mean.ptr<const T>(), l,
                                                                  partial.as<BatchNormSums>());
    FERRY_LAUNCH_CHECK();
    backward_apply<T, Index, kRelu><<<grid, kThreads, 0, stream>>>(
        grad_out.ptr<const T>(), y, x.ptr<const T>(), weight.ptr<const T>(), save_mean.ptr<const T>(),
        save_invstd.ptr<const T>(), partial.as<BatchNormSums>(), l, grad_x.ptr<T>(), grad_weight.ptr<T>(),
        grad_bias.ptr<T>());
    FERRY_LAUNCH_CHECK();
  });
}

}  // namespace ferry::cuda
