// cudnn_layers.cpp — convolution and training-mode BatchNorm through cuDNN (see cudnn_layers.h).
// Without cuDNN in the build every query says false and the layers are composed from ferry's kernels.
#include "cudnn_layers.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "../core/environment.h"
#include "check.h"
#include "cuda_backend.h"
#include "device_state.h"
#include "ferry/determinism.h"
#include "ferry/error.h"
#include "ferry/ledger.h"

namespace ferry::cuda {

#if defined(FERRY_HAVE_CUDNN) && defined(FERRY_HAVE_CUDNN_HEADER)

namespace {

// The largest workspace an algorithm may ask for; faster ones that want more are passed over.
constexpr std::size_t kMaxWorkspaceBytes = std::size_t{1} << 30;

// One handle per device, created on first use. The mutex covers setting the handle's stream and
// enqueuing one call (a handle is not safe on two threads at once), and the plan cache.
struct CudnnState;
struct ConvPlan;
using ConvKey = std::array<std::int64_t, 15>;  // the Conv2dShape's fields, TF32 and determinism

struct CudnnState {
  std::mutex mutex;
  cudnnHandle_t handle = nullptr;  // null when cuDNN cannot be used here
  std::atomic<bool> batch_norm_off{false};  // a BatchNorm call was refused: composed from now on
  std::map<ConvKey, std::unique_ptr<ConvPlan>> plans;  // null: the shape cannot run on cuDNN
};

std::array<std::atomic<CudnnState*>, kMaxDevices> g_states{};
std::array<std::once_flag, kMaxDevices> g_state_once;

// FERRY_CUDNN=0 (a switch, ../core/environment.h: a value it cannot read is an InvalidArgument) composes
// convolution and BatchNorm from ferry's kernels for the whole run.
bool switched_off() {
  static const bool off = !ferry::detail::environment_switch("FERRY_CUDNN", true);
  return off;
}

// Throws only for a FERRY_CUDNN it cannot read: a cuDNN that cannot start leaves handle null and says why, once, on
// stderr.
CudnnState& state(int device) {
  std::call_once(g_state_once[static_cast<std::size_t>(device)], [device] {
    auto s = std::make_unique<CudnnState>();
    if (!switched_off()) {
      const cudnnStatus_t status = cudnnCreate(&s->handle);
      if (status != CUDNN_STATUS_SUCCESS) {
        s->handle = nullptr;
        std::fprintf(stderr,
                     "ferry: cuDNN cannot be used on cuda:%d (cudnnCreate: %s); convolution and BatchNorm are "
                     "composed from ferry's own kernels\n",
                     device, cudnnGetErrorString(status));
      }
    }
    g_states[static_cast<std::size_t>(device)].store(s.release());  // kept for the process
  });
  return *g_states[static_cast<std::size_t>(device)].load();
}

bool fits_int(std::int64_t value) { return value >= 0 && value <= INT_MAX; }
int as_int(std::int64_t value) { return static_cast<int>(value); }

// A status by which cuDNN refused a call before running it (cuDNN 9: 2xxx bad parameter, 3xxx not supported; a
// sub-library missing on this machine): the layer can be composed from ferry's kernels instead.
bool refused(cudnnStatus_t status) {
  const int family = static_cast<int>(status) / 1000;
  return family == 2 || family == 3 || status == CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED ||
         status == CUDNN_STATUS_NOT_INITIALIZED;
}

// --- descriptors, owned --------------------------------------------------------------------------
// One cuDNN descriptor, created with the object and destroyed with it.
template <typename Handle, cudnnStatus_t (*Create)(Handle*), cudnnStatus_t (*Destroy)(Handle)>
class Descriptor {
 public:
  Descriptor() { FERRY_CUDNN_CHECK(Create(&desc_)); }
  ~Descriptor() { Destroy(desc_); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Handle get() const { return desc_; }

 private:
  Handle desc_ = nullptr;
};
using TensorDesc = Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc = Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc = Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                            cudnnDestroyConvolutionDescriptor>;

// A contiguous float NCHW tensor.
void set_nchw(const TensorDesc& desc, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  FERRY_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, as_int(n), as_int(c),
                                               as_int(h), as_int(w)));
}

// The descriptors of one convolution shape and the algorithm chosen for each direction.
struct ConvPlan {
  bool usable = false;  // an algorithm was found for all three directions
  TensorDesc x, y;      // input (N, C, H, W), output (N, O, oh, ow)
  FilterDesc w;         // (O, C, kh, kw)
  ConvDesc conv;
  cudnnConvolutionFwdAlgo_t forward{};
  cudnnConvolutionBwdDataAlgo_t backward_input{};
  cudnnConvolutionBwdFilterAlgo_t backward_weight{};
  std::size_t forward_bytes = 0, backward_input_bytes = 0, backward_weight_bytes = 0;  // workspaces
  // The math each chosen algorithm was timed with (FMA for fp32; with TF32 allowed it may be tensor-op math):
  // set on `conv` before each call, since the workspace size and the algorithm hold for that math only.
  cudnnMathType_t forward_math = CUDNN_FMA_MATH, backward_input_math = CUDNN_FMA_MATH,
                  backward_weight_math = CUDNN_FMA_MATH;
};

// How algorithms are chosen: the settings of the moment (cuda_backend.h, ferry/determinism.h).
struct ConvMode {
  bool tf32 = false;           // tensor-op (TF32) algorithms allowed
  bool deterministic = false;  // only algorithms that sum in a fixed order, chosen by cuDNN's heuristics
};
ConvMode current_mode() { return {allow_tf32(), deterministic_algorithms()}; }

ConvKey key_of(const Backend::Conv2dShape& s, const ConvMode& mode) {
  return {s.batch,      s.in_channels, s.height,     s.width,      s.out_channels,
          s.kernel_h,   s.kernel_w,    s.stride_h,   s.stride_w,   s.pad_h,
          s.pad_w,      s.dilation_h,  s.dilation_w, mode.tf32 ? 1 : 0, mode.deterministic ? 1 : 0};
}

// An algorithm that much slower than the fastest usable one may still be chosen for a smaller workspace.
constexpr double kWorkspaceTimeSlack = 1.05;

// Says on stderr why no algorithm of a direction was usable (the layer then runs on ferry's own kernels), with
// what cuDNN offered.
template <typename Perf>
void say_none_usable(const Perf* results, int count, const ConvMode& mode, const char* direction,
                     const Backend::Conv2dShape& s) {
  std::string offers;
  for (int i = 0; i < count; ++i) {
    offers += detail::concat(i ? ", " : "", "algo ", static_cast<int>(results[i].algo), " ",
                             cudnnGetErrorString(results[i].status), " math ", static_cast<int>(results[i].mathType),
                             results[i].determinism == CUDNN_DETERMINISTIC ? " deterministic " : " non-deterministic ",
                             results[i].memory, " B");
  }
  std::fprintf(stderr,
               "ferry: cuDNN has no usable %s algorithm for conv2d N%lld C%lld H%lld W%lld -> O%lld k%lldx%lld "
               "(wanted: success, %s math, %sworkspace <= 1 GiB; offered: %s); this shape runs on ferry's kernels\n",
               direction, static_cast<long long>(s.batch), static_cast<long long>(s.in_channels),
               static_cast<long long>(s.height), static_cast<long long>(s.width), static_cast<long long>(s.out_channels),
               static_cast<long long>(s.kernel_h), static_cast<long long>(s.kernel_w), mode.tf32 ? "any" : "FMA (fp32)",
               mode.deterministic ? "deterministic, " : "", offers.empty() ? "none" : offers.c_str());
}

// The precision rule: fp32 means fp32 (no TF32 tensor cores) unless TF32 is allowed.
bool math_allowed(cudnnMathType_t math, const ConvMode& mode) { return mode.tf32 || math == CUDNN_FMA_MATH; }

// From timed results (cudnnFind*, fastest first): among those that succeeded, keep the requested precision and
// fit the workspace cap, the one with the smallest workspace within 5 % of the fastest's time (a step's peak
// memory counts the workspace, as PyTorch's does, and a few percent of one convolution are not worth hundreds
// of megabytes). The chosen one's workspace is asked for again with its math set on `conv` (Find has reported
// less than the algorithm then needs, which PyTorch guards against the same way); the larger figure is kept.
// Leaves `conv` with `search_math`.
template <typename Perf, typename Algo, typename WorkspaceSize>
bool choose_timed(const Perf* results, int count, const ConvMode& mode, cudnnConvolutionDescriptor_t conv,
                  cudnnMathType_t search_math, WorkspaceSize workspace_size, Algo* algo, std::size_t* bytes,
                  cudnnMathType_t* math, const char* direction, const Backend::Conv2dShape& s) {
  const Perf* best = nullptr;
  double time_limit = 0;
  for (int i = 0; i < count; ++i) {
    const Perf& r = results[i];
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > kMaxWorkspaceBytes || !math_allowed(r.mathType, mode)) continue;
    if (best == nullptr) {
      best = &r;
      time_limit = static_cast<double>(r.time) * kWorkspaceTimeSlack;
    } else if (static_cast<double>(r.time) <= time_limit && r.memory < best->memory) {
      best = &r;
    }
  }
  if (best == nullptr) {
    say_none_usable(results, count, mode, direction, s);
    return false;
  }
  *algo = best->algo;
  *bytes = best->memory;
  *math = best->mathType;
  FERRY_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, best->mathType));
  std::size_t asked = 0;
  if (workspace_size(best->algo, &asked) == CUDNN_STATUS_SUCCESS) *bytes = std::max(*bytes, asked);
  FERRY_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, search_math));
  return true;
}

// From cuDNN's heuristics (cudnnGet*Algorithm_v7, best expected first, nothing run): the first that succeeds,
// sums in a fixed order and keeps the requested precision, whose workspace (asked for with its math set on
// `conv`: workspace_size(algo, &bytes) returns cuDNN's status) fits the cap. Leaves `conv` with `search_math`.
template <typename Perf, typename Algo, typename WorkspaceSize>
bool choose_deterministic(const Perf* results, int count, const ConvMode& mode, cudnnConvolutionDescriptor_t conv,
                          cudnnMathType_t search_math, WorkspaceSize workspace_size, Algo* algo, std::size_t* bytes,
                          cudnnMathType_t* math, const char* direction, const Backend::Conv2dShape& s) {
  for (int i = 0; i < count; ++i) {
    const Perf& r = results[i];
    if (r.status != CUDNN_STATUS_SUCCESS || r.determinism != CUDNN_DETERMINISTIC || !math_allowed(r.mathType, mode))
      continue;
    FERRY_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, r.mathType));
    std::size_t needed = 0;
    if (workspace_size(r.algo, &needed) != CUDNN_STATUS_SUCCESS || needed > kMaxWorkspaceBytes) continue;
    *algo = r.algo;
    *bytes = needed;
    *math = r.mathType;
    FERRY_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, search_math));
    return true;
  }
  FERRY_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, search_math));
  say_none_usable(results, count, mode, direction, s);
  return false;
}

// Builds the plan for a shape. By default it times every algorithm once (this synchronizes the device, once
// per shape, as PyTorch's cudnn.benchmark does); in deterministic mode it asks cuDNN's heuristics instead (no
// sync; ferry/determinism.h). Called with the state's mutex held.
std::unique_ptr<ConvPlan> make_plan(cudnnHandle_t handle, const Backend::Conv2dShape& s, const ConvMode& mode,
                                    cudaStream_t stream) {
  auto plan = std::make_unique<ConvPlan>();
  set_nchw(plan->x, s.batch, s.in_channels, s.height, s.width);
  set_nchw(plan->y, s.batch, s.out_channels, s.out_h(), s.out_w());
  FERRY_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan->w.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                               as_int(s.out_channels), as_int(s.in_channels), as_int(s.kernel_h),
                                               as_int(s.kernel_w)));
  FERRY_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(plan->conv.get(), as_int(s.pad_h), as_int(s.pad_w),
                                                    as_int(s.stride_h), as_int(s.stride_w), as_int(s.dilation_h),
                                                    as_int(s.dilation_w), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  const cudnnMathType_t search_math = mode.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  FERRY_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv.get(), search_math));
  // The output shape cuDNN computes must be ours (it is, for the same formula; a mismatch is a bug).
  int n = 0, c = 0, h = 0, w = 0;
  FERRY_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(plan->conv.get(), plan->x.get(), plan->w.get(), &n, &c, &h, &w));
  if (n != s.batch || c != s.out_channels || h != s.out_h() || w != s.out_w()) return plan;  // unusable

  FERRY_CUDNN_CHECK(cudnnSetStream(handle, stream));
  constexpr int kRequested = 16;
  int returned = 0;
  const cudnnTensorDescriptor_t x = plan->x.get(), y = plan->y.get();
  const cudnnFilterDescriptor_t wd = plan->w.get();
  const cudnnConvolutionDescriptor_t conv = plan->conv.get();

  std::array<cudnnConvolutionFwdAlgoPerf_t, kRequested> forward{};
  const auto forward_workspace = [&](cudnnConvolutionFwdAlgo_t algo, std::size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(handle, x, wd, conv, y, algo, bytes);
  };
  if (mode.deterministic) {
    FERRY_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, x, wd, conv, y, kRequested, &returned, forward.data()));
    if (!choose_deterministic(forward.data(), returned, mode, conv, search_math, forward_workspace, &plan->forward,
                              &plan->forward_bytes, &plan->forward_math, "forward", s))
      return plan;
  } else {
    FERRY_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(handle, x, wd, conv, y, kRequested, &returned, forward.data()));
    if (!choose_timed(forward.data(), returned, mode, conv, search_math, forward_workspace, &plan->forward,
                      &plan->forward_bytes, &plan->forward_math, "forward", s))
      return plan;
  }

  std::array<cudnnConvolutionBwdDataAlgoPerf_t, kRequested> backward_input{};
  const auto data_workspace = [&](cudnnConvolutionBwdDataAlgo_t algo, std::size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, wd, y, conv, x, algo, bytes);
  };
  if (mode.deterministic) {
    FERRY_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, wd, y, conv, x, kRequested, &returned,
                                                                  backward_input.data()));
    if (!choose_deterministic(backward_input.data(), returned, mode, conv, search_math, data_workspace,
                              &plan->backward_input, &plan->backward_input_bytes, &plan->backward_input_math,
                              "backward-data", s))
      return plan;
  } else {
    FERRY_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(handle, wd, y, conv, x, kRequested, &returned,
                                                                backward_input.data()));
    if (!choose_timed(backward_input.data(), returned, mode, conv, search_math, data_workspace,
                      &plan->backward_input, &plan->backward_input_bytes, &plan->backward_input_math,
                      "backward-data", s))
      return plan;
  }

  std::array<cudnnConvolutionBwdFilterAlgoPerf_t, kRequested> backward_weight{};
  const auto filter_workspace = [&](cudnnConvolutionBwdFilterAlgo_t algo, std::size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, x, y, conv, wd, algo, bytes);
  };
  if (mode.deterministic) {
    FERRY_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, x, y, conv, wd, kRequested, &returned,
                                                                    backward_weight.data()));
    if (!choose_deterministic(backward_weight.data(), returned, mode, conv, search_math, filter_workspace,
                              &plan->backward_weight, &plan->backward_weight_bytes, &plan->backward_weight_math,
                              "backward-filter", s))
      return plan;
  } else {
    FERRY_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(handle, x, y, conv, wd, kRequested, &returned,
                                                                  backward_weight.data()));
    if (!choose_timed(backward_weight.data(), returned, mode, conv, search_math, filter_workspace,
                      &plan->backward_weight, &plan->backward_weight_bytes, &plan->backward_weight_math,
                      "backward-filter", s))
      return plan;
  }
  plan->usable = true;
  return plan;
}

// The cached plan of a shape; null when the shape cannot run on cuDNN. Called with the mutex held.
ConvPlan* plan_for(CudnnState& st, const Backend::Conv2dShape& s, int device, cudaStream_t stream) {
  const ConvMode mode = current_mode();
  const ConvKey key = key_of(s, mode);
  if (auto found = st.plans.find(key); found != st.plans.end()) return found->second.get();
  Ledger& ledger = Ledger::global();
  const double start = ledger.now_ms();
  std::unique_ptr<ConvPlan> plan = make_plan(st.handle, s, mode, stream);
  // The timed search waits for the device: a host sync, in the ledger with its reason (the heuristics do not).
  if (!mode.deterministic)
    ledger.record_sync({.device = Device(DeviceType::CUDA, device),
                        .reason = detail::concat("cuDNN algorithm search, conv2d ", s.in_channels, "->",
                                                 s.out_channels, " on ", s.batch, "x", s.height, "x", s.width,
                                                 " (once per shape)"),
                        .start_ms = start,
                        .duration_ms = ledger.now_ms() - start});
  if (!plan->usable) plan.reset();
  return st.plans.emplace(key, std::move(plan)).first->second.get();
}

ConvPlan& plan_or_throw(CudnnState& st, const Backend::Conv2dShape& s, int device, cudaStream_t stream) {
  ConvPlan* plan = plan_for(st, s, device, stream);
  FERRY_CHECK(plan != nullptr, NotSupported, "cuDNN has no algorithm for this convolution (ask cudnn_conv2d_supported first)");
  return *plan;
}

// The status of one convolution call, with the state's mutex held. A refusal (an algorithm the search offered
// that will not run after all, say) makes the shape composed from ferry's kernels from now on, said once on
// stderr; cudnn_conv2d_supported then says false and the caller (nn/functional.cpp) redoes the layer so. Any
// failure throws.
void check_conv_call(CudnnState& st, const Backend::Conv2dShape& s, int device, cudnnStatus_t status,
                     const char* call, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  if (refused(status)) {
    auto found = st.plans.find(key_of(s, current_mode()));
    if (found != st.plans.end() && found->second) {
      found->second.reset();
      std::fprintf(stderr,
                   "ferry: cuDNN refused %s for conv2d N%lld C%lld H%lld W%lld -> O%lld on cuda:%d (%s); this shape "
                   "runs on ferry's kernels from now on\n",
                   call, static_cast<long long>(s.batch), static_cast<long long>(s.in_channels),
                   static_cast<long long>(s.height), static_cast<long long>(s.width),
                   static_cast<long long>(s.out_channels), device, cudnnGetErrorString(status));
    }
  }
  throw_cudnn_error(status, call, __FILE__, line);
}

}  // namespace

bool cudnn_conv2d_supported(const Backend::Conv2dShape& s, DType dtype, int device) {
  if (dtype != DType::Float32) return false;
  for (std::int64_t v : {s.batch, s.in_channels, s.height, s.width, s.out_channels, s.kernel_h, s.kernel_w, s.stride_h,
                         s.stride_w, s.pad_h, s.pad_w, s.dilation_h, s.dilation_w})
    if (!fits_int(v)) return false;
  if (s.batch < 1 || s.in_channels < 1 || s.out_channels < 1 || s.out_h() < 1 || s.out_w() < 1) return false;
  // cuDNN's 4-d descriptors count elements in int.
  if (!fits_int(s.batch * s.in_channels * s.height * s.width) || !fits_int(s.batch * s.out_channels * s.out_h() * s.out_w()))
    return false;
  CudnnState& st = state(device);
  if (st.handle == nullptr) return false;
  const cudaStream_t stream = device_state(device).compute_stream;
  try {
    std::lock_guard lock(st.mutex);
    // Timing algorithms synchronizes the device, which a graph capture (ferry/graph.h) cannot record: a shape
    // first met inside a capture is composed from ferry's kernels there (StepGraph's eager warm-up steps make
    // the plans before it captures, so this is the exception). Deterministic mode's heuristics would not sync,
    // but no plan is made inside a capture either way: one rule, and no cuDNN query runs while capturing.
    if (!st.plans.count(key_of(s, current_mode()))) {
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {  // cannot tell: as if capturing
        cudaGetLastError();
        return false;
      }
      if (capture != cudaStreamCaptureStatusNone) return false;
    }
    return plan_for(st, s, device, stream) != nullptr;
  } catch (const std::exception& e) {  // a cuDNN that fails here is not used for this shape
    std::fprintf(stderr, "ferry: cuDNN cannot run a convolution on cuda:%d (%s); using ferry's own kernels\n", device,
                 e.what());
    std::lock_guard lock(st.mutex);
    st.plans.try_emplace(key_of(s, current_mode()), nullptr);  // remembered as unusable (unless a plan was made meanwhile)
    return false;
  }
}

void cudnn_conv2d_forward(const KernelTensor& out, const KernelTensor& input, const KernelTensor& weight,
                          const Backend::Conv2dShape& s, float beta, int device, cudaStream_t stream) {
  CudnnState& st = state(device);
  std::lock_guard lock(st.mutex);
  ConvPlan& plan = plan_or_throw(st, s, device, stream);
  ScratchBuffer workspace(plan.forward_bytes, stream);
  const float alpha = 1.0f;
  FERRY_CUDNN_CHECK(cudnnSetStream(st.handle, stream));
  FERRY_CUDNN_CHECK(cudnnSetConvolutionMathType(plan.conv.get(), plan.forward_math));
  check_conv_call(st, s, device,
                  cudnnConvolutionForward(st.handle, &alpha, plan.x.get(), input.data, plan.w.get(), weight.data,
                                          plan.conv.get(), plan.forward, workspace.data(), plan.forward_bytes, &beta,
                                          plan.y.get(), out.data),
                  "cudnnConvolutionForward", __LINE__);
}

void cudnn_conv2d_backward_input(const KernelTensor& grad_input, const KernelTensor& grad_out,
                                 const KernelTensor& weight, const Backend::Conv2dShape& s, int device,
                                 cudaStream_t stream) {
  CudnnState& st = state(device);
  std::lock_guard lock(st.mutex);
  ConvPlan& plan = plan_or_throw(st, s, device, stream);
  ScratchBuffer workspace(plan.backward_input_bytes, stream);
  const float alpha = 1.0f, beta = 0.0f;
  FERRY_CUDNN_CHECK(cudnnSetStream(st.handle, stream));
  FERRY_CUDNN_CHECK(cudnnSetConvolutionMathType(plan.conv.get(), plan.backward_input_math));
  check_conv_call(st, s, device,
                  cudnnConvolutionBackwardData(st.handle, &alpha, plan.w.get(), weight.data, plan.y.get(),
                                               grad_out.data, plan.conv.get(), plan.backward_input, workspace.data(),
                                               plan.backward_input_bytes, &beta, plan.x.get(), grad_input.data),
                  "cudnnConvolutionBackwardData", __LINE__);
}

void cudnn_conv2d_backward_weight(const KernelTensor& grad_weight, const KernelTensor& grad_out,
                                  const KernelTensor& input, const Backend::Conv2dShape& s, int device,
                                  cudaStream_t stream) {
  CudnnState& st = state(device);
  std::lock_guard lock(st.mutex);
  ConvPlan& plan = plan_or_throw(st, s, device, stream);
  ScratchBuffer workspace(plan.backward_weight_bytes, stream);
  const float alpha = 1.0f, beta = 0.0f;
  FERRY_CUDNN_CHECK(cudnnSetStream(st.handle, stream));
  FERRY_CUDNN_CHECK(cudnnSetConvolutionMathType(plan.conv.get(), plan.backward_weight_math));
  check_conv_call(st, s, device,
                  cudnnConvolutionBackwardFilter(st.handle, &alpha, plan.x.get(), input.data, plan.y.get(),
                                                 grad_out.data, plan.conv.get(), plan.backward_weight, workspace.data(),
                                                 plan.backward_weight_bytes, &beta, plan.w.get(), grad_weight.data),
                  "cudnnConvolutionBackwardFilter", __LINE__);
}

// --- BatchNorm (CUDNN_BATCHNORM_SPATIAL: statistics over N and the spatial dims, per channel) ----------

namespace {
// x as (N, C, inner, 1) and the (1, C, 1, 1) descriptor cuDNN derives for the per-channel tensors.
struct BatchNormDescs {
  TensorDesc x, channel;
  explicit BatchNormDescs(const Backend::BatchNormShape& s) {
    set_nchw(x, s.batch, s.channels, s.inner, 1);
    FERRY_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(channel.get(), x.get(), CUDNN_BATCHNORM_SPATIAL));
  }
};
}  // namespace

std::string cudnn_description(int device) {
  if (switched_off()) return "cuDNN switched off (FERRY_CUDNN=0): conv2d and batch_norm on ferry's kernels";
  if (state(device).handle == nullptr) return "cuDNN cannot start here: conv2d and batch_norm on ferry's kernels";
  const std::size_t v = cudnnGetVersion();  // e.g. 91900 for 9.19.0
  return detail::concat("cuDNN ", v / 10000, ".", (v % 10000) / 100, ".", v % 100, " (conv2d, batch_norm)");
}

void prepare_cudnn(int device) { (void)state(device); }

bool cudnn_batch_norm_supported(const Backend::BatchNormShape& s, DType dtype, int device) {
  if (dtype != DType::Float32 || s.eps < CUDNN_BN_MIN_EPSILON) return false;
  if (s.batch < 1 || s.channels < 1 || s.inner < 1 || !fits_int(s.batch) || !fits_int(s.channels) || !fits_int(s.inner) ||
      !fits_int(s.batch * s.channels * s.inner))
    return false;
  const CudnnState& st = state(device);
  return st.handle != nullptr && !st.batch_norm_off.load();
}

void cudnn_batch_norm_forward(const KernelTensor& out, const KernelTensor& x, const KernelTensor& weight,
                              const KernelTensor& bias, const KernelTensor& running_mean,
                              const KernelTensor& running_var, const KernelTensor& save_mean,
                              const KernelTensor& save_invstd, const Backend::BatchNormShape& s, double factor,
                              int device, cudaStream_t stream) {
  CudnnState& st = state(device);
  FERRY_CHECK(st.handle != nullptr, NotSupported, "cuDNN is not usable on cuda:", device);
  const BatchNormDescs descs(s);
  const float alpha = 1.0f, beta = 0.0f;
  std::lock_guard lock(st.mutex);
  FERRY_CUDNN_CHECK(cudnnSetStream(st.handle, stream));
  const cudnnStatus_t status = cudnnBatchNormalizationForwardTraining(
      st.handle, CUDNN_BATCHNORM_SPATIAL, &alpha, &beta, descs.x.get(), x.data, descs.x.get(), out.data,
      descs.channel.get(), weight.data, bias.data, running_mean.data ? factor : 0.0, running_mean.data,
      running_var.data, s.eps, save_mean.data, save_invstd.data);
  if (status == CUDNN_STATUS_SUCCESS) return;
  // Refused before it ran (a sub-library missing on this machine, a shape it does not take): BatchNorm is
  // composed from ferry's kernels from now on, and the caller retries this layer so (nn/functional.cpp).
  if (refused(status) && !st.batch_norm_off.exchange(true)) {
    std::fprintf(stderr, "ferry: cuDNN refused BatchNorm on cuda:%d (%s); BatchNorm is composed from ferry's own "
                 "kernels from now on\n", device, cudnnGetErrorString(status));
  }
  throw_cudnn_error(status, "cudnnBatchNormalizationForwardTraining", __FILE__, __LINE__);
}

void cudnn_batch_norm_backward(const KernelTensor& grad_x, const KernelTensor& grad_weight,
                               const KernelTensor& grad_bias, const KernelTensor& grad_out, const KernelTensor& x,
                               const KernelTensor& weight, const KernelTensor& save_mean,
                               const KernelTensor& save_invstd, const Backend::BatchNormShape& s, int device,
                               cudaStream_t stream) {
  CudnnState& st = state(device);
  FERRY_CHECK(st.handle != nullptr, NotSupported, "cuDNN is not usable on cuda:", device);
  const BatchNormDescs descs(s);
  const float one = 1.0f, zero = 0.0f;
  std::lock_guard lock(st.mutex);
  FERRY_CUDNN_CHECK(cudnnSetStream(st.handle, stream));
  FERRY_CUDNN_CHECK(cudnnBatchNormalizationBackward(
      st.handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, descs.x.get(), x.data, descs.x.get(),
      grad_out.data, descs.x.get(), grad_x.data, descs.channel.get(), weight.data, grad_weight.data, grad_bias.data,
      s.eps, save_mean.data, save_invstd.data));
}

#else  // no cuDNN in this build: every layer is composed from ferry's kernels

std::string cudnn_description(int) { return "no cuDNN in this build: conv2d and batch_norm on ferry's kernels"; }
void prepare_cudnn(int) {}  // nothing to make before a graph capture

bool cudnn_conv2d_supported(const Backend::Conv2dShape&, DType, int) { return false; }
void cudnn_conv2d_forward(const KernelTensor&, const KernelTensor&, const KernelTensor&, const Backend::Conv2dShape&,
                          float, int, cudaStream_t) {
  throw NotSupported("This build of ferry has no cuDNN");
}
void cudnn_conv2d_backward_input(const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                 const Backend::Conv2dShape&, int, cudaStream_t) {
  throw NotSupported("This build of ferry has no cuDNN");
}
void cudnn_conv2d_backward_weight(const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                  const Backend::Conv2dShape&, int, cudaStream_t) {
  throw NotSupported("This build of ferry has no cuDNN");
}
bool cudnn_batch_norm_supported(const Backend::BatchNormShape&, DType, int) { return false; }
void cudnn_batch_norm_forward(const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                              const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                              const Backend::BatchNormShape&, double, int, cudaStream_t) {
  throw NotSupported("This build of ferry has no cuDNN");
}
void cudnn_batch_norm_backward(const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                               const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                               const Backend::BatchNormShape&, int, cudaStream_t) {
  throw NotSupported("This build of ferry has no cuDNN");
}

#endif

}  // namespace ferry::cuda
