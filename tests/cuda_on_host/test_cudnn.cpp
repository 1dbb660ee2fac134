// test_cudnn.cpp — the emulated cuDNN's own promises (cudnn.cpp), each a behaviour of the real library that the
// tests of ferry's cudnn_layers.cpp lean on: the convolution against a direct sum (strides, padding, dilation,
// both modes, alpha and beta), the three directions as adjoints of each other, BatchNorm's statistics and
// running averages, the workspace and pointer checks, the search's refusal inside a capture, the heuristics and
// the non-deterministic algorithms' varying sums. Last, ferry's
// fallback when cuDNN refuses a convolution at the call, which only the emulated cuDNN can be made to do.
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "ferry/nn/functional.h"
#include "test_helpers.h"

namespace {

// Device memory holding a copy of host values, read back with get().
struct DeviceArray {
  float* data = nullptr;
  std::size_t count = 0;
  explicit DeviceArray(const std::vector<float>& values) : count(values.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&data), count * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data, values.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit DeviceArray(std::size_t n) : DeviceArray(std::vector<float>(n, 0.0f)) {}
  ~DeviceArray() { cudaFree(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<float> get() const {
    std::vector<float> out(count);
    EXPECT_EQ(cudaMemcpy(out.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};

std::vector<float> values(std::size_t n, int seed) {
  std::vector<float> v(n);
  std::uint32_t state = 2654435761u * static_cast<std::uint32_t>(seed + 1);
  for (float& e : v) {
    state = state * 1664525u + 1013904223u;
    e = static_cast<float>(state >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  }
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// One convolution's descriptors, set from its sizes; the algorithms the search picks first for each direction.
struct Conv {
  int n = 2, c = 3, h = 9, w = 8, o = 4, kh = 3, kw = 2, pad_h = 1, pad_w = 2, stride_h = 2, stride_w = 1,
      dilation_h = 1, dilation_w = 2;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnHandle_t handle = nullptr;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t f = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int oh = 0, ow = 0;

  void make() {
    ASSERT_EQ(cudnnCreate(&handle), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(cudnnCreateTensorDescriptor(&x), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(cudnnCreateTensorDescriptor(&y), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(cudnnCreateFilterDescriptor(&f), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(cudnnCreateConvolutionDescriptor(&conv), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(cudnnSetFilter4dDescriptor(f, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, o, c, kh, kw), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(cudnnSetConvolution2dDescriptor(conv, pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w, mode,
                                              CUDNN_DATA_FLOAT),
              CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH), CUDNN_STATUS_SUCCESS);
    int on = 0, oc = 0;
    ASSERT_EQ(cudnnGetConvolution2dForwardOutputDim(conv, x, f, &on, &oc, &oh, &ow), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, on, oc, oh, ow), CUDNN_STATUS_SUCCESS);
  }
  ~Conv() {
    cudnnDestroyTensorDescriptor(x);
    cudnnDestroyTensorDescriptor(y);
    cudnnDestroyFilterDescriptor(f);
    cudnnDestroyConvolutionDescriptor(conv);
    cudnnDestroy(handle);
  }
  std::size_t x_count() const { return static_cast<std::size_t>(n) * c * h * w; }
  std::size_t f_count() const { return static_cast<std::size_t>(o) * c * kh * kw; }
  std::size_t y_count() const { return static_cast<std::size_t>(n) * o * oh * ow; }

  // The direct sum, in double.
  std::vector<float> reference(const std::vector<float>& in, const std::vector<float>& filter) const {
    std::vector<float> out(y_count());
    for (int b = 0; b < n; ++b)
      for (int k = 0; k < o; ++k)
        for (int oy = 0; oy < oh; ++oy)
          for (int ox = 0; ox < ow; ++ox) {
            double s = 0;
            for (int ci = 0; ci < c; ++ci)
              for (int i = 0; i < kh; ++i)
                for (int j = 0; j < kw; ++j) {
                  const int iy = oy * stride_h - pad_h + i * dilation_h, ix = ox * stride_w - pad_w + j * dilation_w;
                  if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                  const int fi = mode == CUDNN_CONVOLUTION ? kh - 1 - i : i, fj = mode == CUDNN_CONVOLUTION ? kw - 1 - j : j;
                  s += static_cast<double>(in[((b * c + ci) * h + iy) * w + ix]) * filter[((k * c + ci) * kh + fi) * kw + fj];
                }
            out[((b * o + k) * oh + oy) * ow + ox] = static_cast<float>(s);
          }
    return out;
  }
};

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tolerance) << "element " << i;
}

TEST(EmulatedCudnn, ConvolutionForwardIsTheDirectSumBlendedWithAlphaAndBeta) {
  for (const cudnnConvolutionMode_t mode : {CUDNN_CROSS_CORRELATION, CUDNN_CONVOLUTION}) {
    Conv cv;
    cv.mode = mode;
    cv.make();
    const std::vector<float> xs = values(cv.x_count(), 1), fs = values(cv.f_count(), 2), ys = values(cv.y_count(), 3);
    DeviceArray x(xs), f(fs), y(ys);
    int returned = 0;
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    ASSERT_EQ(cudnnFindConvolutionForwardAlgorithm(cv.handle, cv.x, cv.f, cv.conv, cv.y, 8, &returned, perf),
              CUDNN_STATUS_SUCCESS);
    ASSERT_GE(returned, 2);
    for (int i = 0; i < returned; ++i) EXPECT_EQ(perf[i].mathType, CUDNN_FMA_MATH) << "FMA math asked: no tensor ops";
    // Every runnable algorithm gives the same result; beta = 0.5 keeps half of what y held.
    for (int i = 0; i < returned && perf[i].status == CUDNN_STATUS_SUCCESS; ++i) {
      DeviceArray out(ys);
      void* workspace = nullptr;
      if (perf[i].memory) {
        ASSERT_EQ(cudaMalloc(&workspace, perf[i].memory), cudaSuccess);
      }
      const float alpha = 2.0f, beta = 0.5f;
      ASSERT_EQ(cudnnConvolutionForward(cv.handle, &alpha, cv.x, x.data, cv.f, f.data, cv.conv, perf[i].algo, workspace,
                                        perf[i].memory, &beta, cv.y, out.data),
                CUDNN_STATUS_SUCCESS);
      std::vector<float> want = cv.reference(xs, fs);
      for (std::size_t k = 0; k < want.size(); ++k) want[k] = 2.0f * want[k] + 0.5f * ys[k];
      expect_near_all(out.get(), want, 1e-4);
      cudaFree(workspace);
    }
  }
}

// <conv(x, w), dy> = <x, backward_data(dy, w)> = <w, backward_filter(x, dy)>: the three directions agree.
TEST(EmulatedCudnn, BackwardDataAndFilterAreTheForwardsAdjoints) {
  Conv cv;
  cv.make();
  const std::vector<float> xs = values(cv.x_count(), 4), fs = values(cv.f_count(), 5), dys = values(cv.y_count(), 6);
  DeviceArray x(xs), f(fs), dy(dys), y(cv.y_count()), dx(cv.x_count()), df(cv.f_count());
  int returned = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[8];
  cudnnConvolutionBwdDataAlgoPerf_t bwd_data[8];
  cudnnConvolutionBwdFilterAlgoPerf_t bwd_filter[8];
  ASSERT_EQ(cudnnFindConvolutionForwardAlgorithm(cv.handle, cv.x, cv.f, cv.conv, cv.y, 8, &returned, fwd),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnFindConvolutionBackwardDataAlgorithm(cv.handle, cv.f, cv.y, cv.conv, cv.x, 8, &returned, bwd_data),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnFindConvolutionBackwardFilterAlgorithm(cv.handle, cv.x, cv.y, cv.conv, cv.f, 8, &returned, bwd_filter),
            CUDNN_STATUS_SUCCESS);
  const std::size_t bytes = std::max({fwd[0].memory, bwd_data[0].memory, bwd_filter[0].memory});
  void* workspace = nullptr;
  ASSERT_EQ(cudaMalloc(&workspace, bytes), cudaSuccess);
  const float one = 1.0f, zero = 0.0f;
  ASSERT_EQ(cudnnConvolutionForward(cv.handle, &one, cv.x, x.data, cv.f, f.data, cv.conv, fwd[0].algo, workspace, bytes,
                                    &zero, cv.y, y.data),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnConvolutionBackwardData(cv.handle, &one, cv.f, f.data, cv.y, dy.data, cv.conv, bwd_data[0].algo,
                                         workspace, bytes, &zero, cv.x, dx.data),
            CUDNN_STATUS_SUCCESS);
  const std::vector<float> dx_first = dx.get();  // beta = 0 overwrote the zeros; beta = 1 adds again
  ASSERT_EQ(cudnnConvolutionBackwardData(cv.handle, &one, cv.f, f.data, cv.y, dy.data, cv.conv, bwd_data[0].algo,
                                         workspace, bytes, &one, cv.x, dx.data),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnConvolutionBackwardFilter(cv.handle, &one, cv.x, x.data, cv.y, dy.data, cv.conv, bwd_filter[0].algo,
                                           workspace, bytes, &zero, cv.f, df.data),
            CUDNN_STATUS_SUCCESS);
  const double forward = dot(y.get(), dys);
  EXPECT_NEAR(dot(xs, dx_first), forward, 1e-3 * std::abs(forward) + 1e-3);
  EXPECT_NEAR(dot(fs, df.get()), forward, 1e-3 * std::abs(forward) + 1e-3);
  const std::vector<float> dx_twice = dx.get();
  for (std::size_t i = 0; i < dx_twice.size(); ++i) ASSERT_NEAR(dx_twice[i], 2 * dx_first[i], 1e-5);
  cudaFree(workspace);
}

TEST(EmulatedCudnn, RefusesTooSmallAWorkspaceAndPointersOffTheCard) {
  Conv cv;
  cv.make();
  DeviceArray x(cv.x_count()), f(cv.f_count()), y(cv.y_count());
  const float one = 1.0f, zero = 0.0f;
  // The GEMM algorithm keeps its im2col columns in the workspace: without one it cannot run.
  EXPECT_EQ(cudnnConvolutionForward(cv.handle, &one, cv.x, x.data, cv.f, f.data, cv.conv,
                                    CUDNN_CONVOLUTION_FWD_ALGO_GEMM, nullptr, 0, &zero, cv.y, y.data),
            CUDNN_STATUS_BAD_PARAM);
  std::vector<float> host(cv.y_count());
  EXPECT_EQ(cudnnConvolutionForward(cv.handle, &one, cv.x, x.data, cv.f, f.data, cv.conv,
                                    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, cv.y, host.data()),
            CUDNN_STATUS_EXECUTION_FAILED);  // y in host memory
  // A tensor-op algorithm while the descriptor asks for FMA math.
  EXPECT_EQ(cudnnConvolutionForward(cv.handle, &one, cv.x, x.data, cv.f, f.data, cv.conv,
                                    CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, nullptr, 1 << 20, &zero, cv.y, y.data),
            CUDNN_STATUS_NOT_SUPPORTED);
  // An output descriptor of the wrong shape.
  cudnnTensorDescriptor_t wrong = nullptr;
  ASSERT_EQ(cudnnCreateTensorDescriptor(&wrong), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetTensor4dDescriptor(wrong, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, cv.n, cv.o, cv.oh + 1, cv.ow),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnConvolutionForward(cv.handle, &one, cv.x, x.data, cv.f, f.data, cv.conv,
                                    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, wrong, y.data),
            CUDNN_STATUS_BAD_PARAM);
  cudnnDestroyTensorDescriptor(wrong);
}

// The search times the algorithms and so synchronizes: inside a capture it fails, and the capture is invalid.
TEST(EmulatedCudnn, TheSearchFailsInsideACapture) {
  Conv cv;
  cv.make();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudnnSetStream(cv.handle, stream), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  int returned = 0;
  cudnnConvolutionFwdAlgoPerf_t perf[8];
  EXPECT_NE(cudnnFindConvolutionForwardAlgorithm(cv.handle, cv.x, cv.f, cv.conv, cv.y, 8, &returned, perf),
            CUDNN_STATUS_SUCCESS);
  cudaGraph_t graph = nullptr;
  EXPECT_NE(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
  cudaStreamDestroy(stream);
}

// Runs call(workspace, out) twice, each into fresh zeros of `count` floats with `bytes` of workspace; expects both
// results close and says whether they are the same bits.
template <typename Call>
bool same_bits_twice(std::size_t count, std::size_t bytes, Call call) {
  void* workspace = nullptr;
  if (bytes) {
    EXPECT_EQ(cudaMalloc(&workspace, bytes), cudaSuccess);
  }
  std::vector<float> runs[2];
  for (std::vector<float>& run : runs) {
    DeviceArray out(count);
    EXPECT_EQ(call(workspace, out.data), CUDNN_STATUS_SUCCESS);
    run = out.get();
  }
  cudaFree(workspace);
  expect_near_all(runs[1], runs[0], 1e-4);
  return runs[0] == runs[1];
}

// The heuristics list every algorithm without running one (no sync, no times), each with its determinism; the
// workspace queries agree with the search's figures; and the algorithms cuDNN documents as non-deterministic sum
// in another order on each call here (two calls differ in the last bits), as atomics do on a real card, while the
// deterministic ones repeat bit for bit. ferry's deterministic mode (ferry/determinism.h) leans on all three.
TEST(EmulatedCudnn, HeuristicsListDeterminismAndNonDeterministicAlgorithmsVaryTheirSums) {
  Conv cv;
  cv.n = 6, cv.c = 5, cv.h = 12, cv.w = 12, cv.o = 7, cv.kh = 3, cv.kw = 3, cv.pad_h = 1, cv.pad_w = 1, cv.stride_h = 1,
  cv.stride_w = 1, cv.dilation_h = 1, cv.dilation_w = 1;
  cv.make();
  int returned = 0;
  cudnnConvolutionBwdFilterAlgoPerf_t heuristics[8], timed[8];
  ASSERT_EQ(cudnnGetConvolutionBackwardFilterAlgorithm_v7(cv.handle, cv.x, cv.y, cv.conv, cv.f, 8, &returned, heuristics),
            CUDNN_STATUS_SUCCESS);
  ASSERT_GE(returned, 2);
  int timed_count = 0;
  ASSERT_EQ(cudnnFindConvolutionBackwardFilterAlgorithm(cv.handle, cv.x, cv.y, cv.conv, cv.f, 8, &timed_count, timed),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(timed_count, returned);
  EXPECT_EQ(timed[0].determinism, CUDNN_NON_DETERMINISTIC) << "the fastest backward-filter algorithm adds with atomics";
  EXPECT_EQ(heuristics[0].determinism, CUDNN_NON_DETERMINISTIC) << "the heuristics' first choice too";
  EXPECT_LT(heuristics[0].time, 0.0f) << "the heuristics time nothing";
  const float one = 1.0f, zero = 0.0f;
  DeviceArray x(values(cv.x_count(), 11)), dy(values(cv.y_count(), 12)), w(values(cv.f_count(), 13));
  for (int i = 0; i < returned && heuristics[i].status == CUDNN_STATUS_SUCCESS; ++i) {
    std::size_t bytes = 0;
    ASSERT_EQ(cudnnGetConvolutionBackwardFilterWorkspaceSize(cv.handle, cv.x, cv.y, cv.conv, cv.f, heuristics[i].algo,
                                                             &bytes),
              CUDNN_STATUS_SUCCESS);
    for (int k = 0; k < timed_count; ++k) {
      if (timed[k].algo == heuristics[i].algo) {
        EXPECT_EQ(bytes, timed[k].memory) << "algo " << heuristics[i].algo;
      }
    }
    const bool same = same_bits_twice(cv.f_count(), bytes, [&](void* workspace, float* dw) {
      return cudnnConvolutionBackwardFilter(cv.handle, &one, cv.x, x.data, cv.y, dy.data, cv.conv, heuristics[i].algo,
                                            workspace, bytes, &zero, cv.f, dw);
    });
    EXPECT_EQ(same, heuristics[i].determinism == CUDNN_DETERMINISTIC) << "algo " << heuristics[i].algo;
  }
  // Backward-data: the same rule for its non-deterministic algorithm (the pixels' terms in another order).
  cudnnConvolutionBwdDataAlgoPerf_t data[8];
  ASSERT_EQ(cudnnGetConvolutionBackwardDataAlgorithm_v7(cv.handle, cv.f, cv.y, cv.conv, cv.x, 8, &returned, data),
            CUDNN_STATUS_SUCCESS);
  for (int i = 0; i < returned && data[i].status == CUDNN_STATUS_SUCCESS; ++i) {
    std::size_t bytes = 0;
    ASSERT_EQ(cudnnGetConvolutionBackwardDataWorkspaceSize(cv.handle, cv.f, cv.y, cv.conv, cv.x, data[i].algo, &bytes),
              CUDNN_STATUS_SUCCESS);
    const bool same = same_bits_twice(cv.x_count(), bytes, [&](void* workspace, float* dx) {
      return cudnnConvolutionBackwardData(cv.handle, &one, cv.f, w.data, cv.y, dy.data, cv.conv, data[i].algo, workspace,
                                          bytes, &zero, cv.x, dx);
    });
    EXPECT_EQ(same, data[i].determinism == CUDNN_DETERMINISTIC) << "algo " << data[i].algo;
  }
  // The heuristics run inside a capture (they time nothing), where the search cannot.
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudnnSetStream(cv.handle, stream), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudnnGetConvolutionBackwardFilterAlgorithm_v7(cv.handle, cv.x, cv.y, cv.conv, cv.f, 8, &returned, heuristics),
            CUDNN_STATUS_SUCCESS);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (graph) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Training BatchNorm: y normalised per channel with the batch's statistics, the running averages moved by the
// factor (the variance unbiased), the saved mean and 1/sqrt(var + eps); backward's sums.
TEST(EmulatedCudnn, BatchNormTrainingUsesTheBatchStatistics) {
  const int N = 4, C = 3, H = 2, W = 5, inner = H * W;
  const double eps = 1e-5, factor = 0.25;
  cudnnHandle_t handle = nullptr;
  cudnnTensorDescriptor_t xd = nullptr, cd = nullptr;
  ASSERT_EQ(cudnnCreate(&handle), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnCreateTensorDescriptor(&xd), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnCreateTensorDescriptor(&cd), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, C, H, W), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnDeriveBNTensorDescriptor(cd, xd, CUDNN_BATCHNORM_SPATIAL), CUDNN_STATUS_SUCCESS);
  const std::vector<float> xs = values(N * C * inner, 7), dys = values(N * C * inner, 8);
  const std::vector<float> scale = {1.5f, -0.5f, 2.0f}, bias = {0.25f, 0.0f, -1.0f};
  DeviceArray x(xs), y(xs.size()), g(scale), b(bias), rm(std::vector<float>{1, 2, 3}), rv(std::vector<float>{4, 5, 6});
  DeviceArray sm(C), si(C), dy(dys), dx(xs.size()), dg(C), db(C);
  const float one = 1.0f, zero = 0.0f;
  ASSERT_EQ(cudnnBatchNormalizationForwardTraining(handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd, x.data, xd, y.data,
                                                   cd, g.data, b.data, factor, rm.data, rv.data, eps, sm.data, si.data),
            CUDNN_STATUS_SUCCESS);
  // A running mean without a running variance is refused.
  EXPECT_EQ(cudnnBatchNormalizationForwardTraining(handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd, x.data, xd, y.data,
                                                   cd, g.data, b.data, factor, rm.data, nullptr, eps, sm.data, si.data),
            CUDNN_STATUS_BAD_PARAM);
  const std::vector<float> out = y.get(), means = sm.get(), invstds = si.get(), rms = rm.get(), rvs = rv.get();
  for (int c = 0; c < C; ++c) {
    double sum = 0, squares = 0;
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < inner; ++i) sum += xs[(n * C + c) * inner + i];
    const double mean = sum / (N * inner);
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < inner; ++i) squares += std::pow(xs[(n * C + c) * inner + i] - mean, 2);
    const double var = squares / (N * inner);
    EXPECT_NEAR(means[c], mean, 1e-6);
    EXPECT_NEAR(invstds[c], 1 / std::sqrt(var + eps), 1e-4);
    EXPECT_NEAR(rms[c], (1 - factor) * (1 + c) + factor * mean, 1e-6);
    EXPECT_NEAR(rvs[c], (1 - factor) * (4 + c) + factor * var * (N * inner) / (N * inner - 1), 1e-5);
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < inner; ++i) {
        const int k = (n * C + c) * inner + i;
        EXPECT_NEAR(out[k], scale[c] * (xs[k] - mean) / std::sqrt(var + eps) + bias[c], 1e-4);
      }
  }
  ASSERT_EQ(cudnnBatchNormalizationBackward(handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, xd, x.data, xd,
                                            dy.data, xd, dx.data, cd, g.data, dg.data, db.data, eps, sm.data, si.data),
            CUDNN_STATUS_SUCCESS);
  // dbias = sum(dy), dscale = sum(dy * xhat); dx sums to zero over each channel (the mean is subtracted).
  const std::vector<float> dgs = dg.get(), dbs = db.get(), dxs = dx.get(), ys = y.get();
  for (int c = 0; c < C; ++c) {
    double sum_dy = 0, sum_dy_xhat = 0, sum_dx = 0;
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < inner; ++i) {
        const int k = (n * C + c) * inner + i;
        sum_dy += dys[k];
        sum_dy_xhat += dys[k] * (ys[k] - bias[c]) / scale[c];
        sum_dx += dxs[k];
      }
    EXPECT_NEAR(dbs[c], sum_dy, 1e-4);
    EXPECT_NEAR(dgs[c], sum_dy_xhat, 1e-3);
    EXPECT_NEAR(sum_dx, 0.0, 1e-4);
  }
  cudnnDestroyTensorDescriptor(xd);
  cudnnDestroyTensorDescriptor(cd);
  cudnnDestroy(handle);
}

// cuDNN refuses a convolution call its search offered (FERRY_EMU_CUDNN_REFUSE): ferry composes the layer from its
// own kernels instead, in that pass and for that shape from then on, and the results are the cpu's.
TEST(EmulatedCudnn, FerryComposesAConvolutionCudnnRefusesAtTheCall) {
  using namespace ferry;
  if (const char* off = std::getenv("FERRY_CUDNN"); off && std::string(off) == "0") {
    GTEST_SKIP() << "cuDNN switched off (FERRY_CUDNN=0): nothing to refuse";
  }
  const Device cuda(DeviceType::CUDA, 0);
  for (const char* direction : {"forward", "backward"}) {
    SCOPED_TRACE(direction);
    // A shape of each direction's own: a refusal is remembered per shape for the rest of the process.
    const std::int64_t channels = std::string(direction) == "forward" ? 5 : 7;
    manual_seed(61);
    const Tensor x = randn({3, channels, 9, 8}), w = randn({4, channels, 3, 3}), b = randn({4});
    const Tensor probe = randn({3, 4, 9, 8});
    const auto pass = [&](Device device) {
      // Leaves of their own on each device (on the cpu, to() would return x itself).
      Tensor xd = x.to(device).detach().requires_grad_(), wd = w.to(device).detach().requires_grad_();
      Tensor bd = b.to(device).detach().requires_grad_();
      const Tensor out = nn::functional::conv2d(xd, wd, bd, 1, 1, 1);
      sum(mul(out, probe.to(device))).backward();
      return std::vector<Tensor>{out.detach().cpu(), xd.grad().cpu(), wd.grad().cpu(), bd.grad().cpu()};
    };
    const std::vector<Tensor> cpu = pass(Device(DeviceType::CPU));
    Backend::Conv2dShape s;
    s.batch = 3, s.in_channels = channels, s.height = 9, s.width = 8, s.out_channels = 4, s.kernel_h = 3;
    s.kernel_w = 3, s.stride_h = 1, s.stride_w = 1, s.pad_h = 1, s.pad_w = 1, s.dilation_h = 1, s.dilation_w = 1;
    ASSERT_TRUE(backend(cuda).conv2d_library(s, DType::Float32, 0)) << "the search offers the shape";
    std::vector<Tensor> refused;
    {
      struct Refusal {  // unset again however the pass ends
        explicit Refusal(const char* direction) { setenv("FERRY_EMU_CUDNN_REFUSE", direction, 1); }
        ~Refusal() { unsetenv("FERRY_EMU_CUDNN_REFUSE"); }
      } refusal(direction);
      refused = pass(cuda);
    }
    EXPECT_FALSE(backend(cuda).conv2d_library(s, DType::Float32, 0)) << "the shape is composed from now on";
    const std::vector<Tensor> after = pass(cuda);
    const char* names[] = {"out", "grad input", "grad weight", "grad bias"};
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(ferry::testing::all_close(refused[i], cpu[i], 1e-4, 1e-4)) << names[i] << ", the pass cuDNN refused";
      EXPECT_TRUE(ferry::testing::all_close(after[i], cpu[i], 1e-4, 1e-4)) << names[i] << ", the pass after";
    }
  }
}

}  // namespace
