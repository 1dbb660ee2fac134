// cudnn.cpp — the part of cuDNN ferry uses, emulated on the host for tests (see emulator.h): handles with
// their stream; 4-d tensor, filter and convolution descriptors; the algorithm search; convolution forward,
// backward-data and backward-filter; BatchNorm training forward and backward (spatial mode). Each function
// is the ferry_emu_ twin of the cuDNN function of the same name (include/cudnn.h renames them). The algorithm
// heuristics (cudnnGet*Algorithm_v7) and workspace queries are here too, for ferry's deterministic mode.
//
// What it checks, as a real cuDNN and a real card would fail on it:
//   - descriptors that were never set or do not fit together (channels, the output shape of the
//     convolution, the BatchNorm parameter descriptor) are CUDNN_STATUS_BAD_PARAM, as are null data
//     pointers and an epsilon below CUDNN_BN_MIN_EPSILON;
//   - the work is enqueued on the handle's stream (cudnnSetStream) and runs when that stream is flushed,
//     so a call on the wrong stream reads its inputs too early in the emulator's eager schedules;
//   - each algorithm has a workspace size of its own: a call given fewer bytes than its algorithm needs is
//     CUDNN_STATUS_BAD_PARAM, and every pointer (data and workspace) must lie inside a device allocation
//     of the right size (else CUDNN_STATUS_EXECUTION_FAILED, with a line on stderr): the algorithms that
//     use a workspace keep their im2col columns in it, so a workspace that is too small or freed too early
//     shows up under the sanitizers;
//   - an algorithm that needs tensor-op math, run while the descriptor asks for FMA math, is refused
//     (CUDNN_STATUS_NOT_SUPPORTED), as the math type an algorithm was found with must be set again before
//     the call; with tensor-op math the inputs are rounded to TF32, as tensor cores round them;
//   - the search synchronizes the device (cudaDeviceSynchronize), so it fails inside a stream capture and
//     invalidates it, as the real one does; the heuristics do not;
//   - the algorithms cuDNN documents as non-deterministic (they add with atomics) sum in another order on
//     every call here, so two runs differ in the last bits, as on a real card.
// The algorithm menu is the emulator's own (see kForward/kBackwardData/kBackwardFilter): one fast algorithm
// with a workspace, one slower without, one that needs tensor-op math, one that is not supported; the times
// are made up so that ferry's choice (the smallest workspace within 5 % of the fastest) is exercised both
// ways. Not here: other layouts than packed NCHW, data types other than float, groups, the rest of cuDNN.
// The arithmetic is im2col + the host BLAS (OpenBLAS) for convolutions, double sums for BatchNorm.
#include <cblas.h>
#include <cudnn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <unordered_set>
#include <vector>

#include "emulator.h"

namespace {

struct Handle {
  cudaStream_t stream = nullptr;  // cuDNN's default: the legacy stream
  int device = 0;                 // current when the handle was made
};

struct Tensor4d {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;  // packed NCHW
  std::size_t count() const {
    return static_cast<std::size_t>(n) * static_cast<std::size_t>(c) * static_cast<std::size_t>(h) *
           static_cast<std::size_t>(w);
  }
};

struct Filter4d {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int k = 0, c = 0, h = 0, w = 0;  // (out channels, in channels, kh, kw), NCHW
};

struct Conv2d {
  bool set = false;
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

std::mutex g_mutex;  // guards the sets below
std::unordered_set<const void*> g_handles, g_tensors, g_filters, g_convs;

template <typename T>
T* find(const std::unordered_set<const void*>& set, const void* handle) {
  std::lock_guard lock(g_mutex);
  return set.count(handle) ? static_cast<T*>(const_cast<void*>(handle)) : nullptr;
}
Handle* find_handle(cudnnHandle_t h) { return find<Handle>(g_handles, h); }
Tensor4d* find_tensor(cudnnTensorDescriptor_t d) { return find<Tensor4d>(g_tensors, d); }
Filter4d* find_filter(cudnnFilterDescriptor_t d) { return find<Filter4d>(g_filters, d); }
Conv2d* find_conv(cudnnConvolutionDescriptor_t d) { return find<Conv2d>(g_convs, d); }

template <typename Object, typename Out>
cudnnStatus_t create(std::unordered_set<const void*>& set, Out* out) {
  if (!out) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  auto* object = new Object();
  {
    std::lock_guard lock(g_mutex);
    set.insert(object);
  }
  *out = reinterpret_cast<Out>(object);
  return CUDNN_STATUS_SUCCESS;
}

template <typename Object>
cudnnStatus_t destroy(std::unordered_set<const void*>& set, const void* handle) {
  if (!handle) return CUDNN_STATUS_SUCCESS;  // cuDNN accepts destroying a null descriptor
  std::lock_guard lock(g_mutex);
  if (!set.erase(handle)) return CUDNN_STATUS_BAD_PARAM;
  delete static_cast<const Object*>(handle);
  return CUDNN_STATUS_SUCCESS;
}

// A pointer the emulated card would fault on: said on stderr, so that the failing test names it.
bool device_pointer_ok(const void* p, std::size_t bytes, const char* call, const char* what) {
  if (bytes == 0 || ferry::emu::device_range(p, bytes)) return true;
  std::fprintf(stderr, "emulated cuDNN: %s: %s %p (%zu bytes) is not inside one device allocation\n", call, what, p,
               bytes);
  return false;
}

// --- convolution geometry and the algorithm menu -----------------------------------------------------

struct Geometry {
  int n, c, h, w;          // input
  int o, kh, kw;           // filter
  int oh, ow;              // output
  int pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w;
  bool flip;               // CUDNN_CONVOLUTION: the filter is flipped (ferry uses cross-correlation)
  std::size_t rows() const { return static_cast<std::size_t>(c) * kh * kw; }              // im2col rows
  std::size_t columns() const { return static_cast<std::size_t>(oh) * ow; }               // im2col columns
  std::size_t col_bytes() const { return rows() * columns() * sizeof(float); }            // one image's columns
  std::size_t input_count() const { return static_cast<std::size_t>(c) * h * w; }         // per image
  std::size_t output_count() const { return static_cast<std::size_t>(o) * oh * ow; }      // per image
  std::size_t weight_count() const { return static_cast<std::size_t>(o) * rows(); }         // the filter
};

int output_size(int in, int pad, int k, int dilation, int stride) {
  const int span = (k - 1) * dilation + 1;
  const int room = in + 2 * pad - span;
  return room < 0 ? 0 : 1 + room / stride;
}

// Checks the descriptors of one convolution against each other, as cuDNN does before any work.
cudnnStatus_t geometry(const Tensor4d* x, const Filter4d* w, const Conv2d* conv, const Tensor4d* y, Geometry* g) {
  if (!x || !w || !conv || !y || !x->set || !w->set || !conv->set || !y->set) return CUDNN_STATUS_BAD_PARAM;
  if (x->type != CUDNN_DATA_FLOAT || w->type != CUDNN_DATA_FLOAT || y->type != CUDNN_DATA_FLOAT)
    return CUDNN_STATUS_NOT_SUPPORTED;  // the emulator has float only (ferry asks for nothing else)
  if (x->c != w->c || y->n != x->n || y->c != w->k) return CUDNN_STATUS_BAD_PARAM;
  const int oh = output_size(x->h, conv->pad_h, w->h, conv->dilation_h, conv->stride_h);
  const int ow = output_size(x->w, conv->pad_w, w->w, conv->dilation_w, conv->stride_w);
  if (oh < 1 || ow < 1 || y->h != oh || y->w != ow) return CUDNN_STATUS_BAD_PARAM;
  *g = {x->n,         x->c,         x->h,          x->w,          w->k,           w->h,
        w->w,         oh,           ow,            conv->pad_h,   conv->pad_w,    conv->stride_h,
        conv->stride_w, conv->dilation_h, conv->dilation_w, conv->mode == CUDNN_CONVOLUTION};
  return CUDNN_STATUS_SUCCESS;
}

// One entry of the emulated algorithm menu of a direction.
struct Algorithm {
  int algo;
  float time_ms;         // made up: only their order and ratios matter to ferry's choice
  bool columns;          // keeps one image's im2col columns in the workspace (else needs none)
  bool tensor_op;        // needs tensor-op math (TF32): offered only when the descriptor's math allows it
  bool supported;        // false: listed with CUDNN_STATUS_NOT_SUPPORTED, as cuDNN lists what cannot run
  bool deterministic;    // false: adds with atomics, so its sums run in another order on every call
};
// Each menu is listed in the order of the emulated heuristics (cudnnGet*Algorithm_v7: best expected first); the
// search (cudnnFind*) sorts by time. Which algorithms are non-deterministic follows cuDNN's documentation
// (backward-data algo 0, backward-filter algos 0 and 3).
// Forward: the fastest FMA algorithm uses a workspace, the one without is 30 % slower (so a workspace is
// passed); backward-data: the one without a workspace is within 5 % (so ferry takes it, and passes none), and
// its tensor-op algorithm is the slowest (so with TF32 allowed the three directions of one descriptor use
// different math, which must be set again before each call); backward-filter: the fastest FMA algorithm needs
// no workspace. Both backward choices of the timed search are non-deterministic, as they often are on a real
// card; the heuristics list a non-deterministic algorithm before the deterministic one, so deterministic mode
// must pass it over.
constexpr Algorithm kForward[] = {{CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, 0.4f, true, true, true, true},
                                  {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, 1.0f, true, false, true, true},
                                  {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, 1.3f, false, false, true, true},
                                  {CUDNN_CONVOLUTION_FWD_ALGO_FFT, 0.0f, false, false, false, true}};
constexpr Algorithm kBackwardData[] = {
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED, 1.5f, true, true, true, true},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, 1.03f, false, false, true, false},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, 1.0f, true, false, true, true},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT, 0.0f, false, false, false, true}};
constexpr Algorithm kBackwardFilter[] = {
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED, 0.5f, true, true, true, true},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, 0.9f, false, false, true, false},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, 1.0f, true, false, true, true},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, 0.0f, false, false, false, false}};

// The order in which a non-deterministic algorithm sums this call: a different rotation each call, starting from
// a random one in each process, as atomics land in a different order on every run of a real one. 0 for a
// deterministic algorithm. FERRY_EMU_ATOMIC_SEED=S starts from S instead, so that a test can make two runs
// differ for sure: the orders repeat (3 steps of train_on_emulated_gpu.sh's CNN give the same bits from seeds 1 and
// 577), so two random starts agree now and then.
unsigned first_rotation() {
  if (const char* text = std::getenv("FERRY_EMU_ATOMIC_SEED"))
    return static_cast<unsigned>(std::strtoul(text, nullptr, 10));
  return std::random_device{}();
}
std::atomic<unsigned> g_atomic_calls{first_rotation()};
unsigned sum_rotation(const Algorithm& a) { return a.deterministic ? 0u : ++g_atomic_calls; }

template <std::size_t N>
const Algorithm* lookup(const Algorithm (&menu)[N], int algo) {
  for (const Algorithm& a : menu)
    if (a.algo == algo) return &a;
  return nullptr;
}

bool tensor_op_allowed(cudnnMathType_t math) { return math != CUDNN_FMA_MATH; }

// The menu as cuDNN lists it for one convolution: runnable algorithms first (in menu order), then the unsupported
// ones; tensor-op algorithms only when the descriptor's math allows them. The checks of the search and the
// heuristics come first.
template <typename Perf, typename AlgoT, std::size_t N>
cudnnStatus_t list_algorithms(cudnnHandle_t handle, cudnnTensorDescriptor_t x_desc, cudnnFilterDescriptor_t w_desc,
                              cudnnConvolutionDescriptor_t conv_desc, cudnnTensorDescriptor_t y_desc,
                              const Algorithm (&menu)[N], int requested, int* returned, std::vector<Perf>& list) {
  Handle* h = find_handle(handle);
  const Conv2d* found = find_conv(conv_desc);
  Geometry g{};
  if (!h) return CUDNN_STATUS_BAD_PARAM;
  if (const cudnnStatus_t s = geometry(find_tensor(x_desc), find_filter(w_desc), found, find_tensor(y_desc), &g);
      s != CUDNN_STATUS_SUCCESS)
    return s;
  const Conv2d& conv = *found;
  if (!returned || requested < 1) return CUDNN_STATUS_BAD_PARAM;
  int device = 0;
  cudaGetDevice(&device);
  if (device != h->device) return CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH;
  for (const Algorithm& a : menu) {
    if (a.tensor_op && !tensor_op_allowed(conv.math)) continue;  // FMA math asked: no tensor cores
    Perf p{};
    p.algo = static_cast<AlgoT>(a.algo);
    p.status = a.supported ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED;
    p.time = a.supported ? a.time_ms : -1.0f;
    p.memory = a.supported && a.columns ? g.col_bytes() : 0;
    p.determinism = a.deterministic ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
    p.mathType = a.tensor_op ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
    list.push_back(p);
  }
  std::stable_partition(list.begin(), list.end(), [](const Perf& p) { return p.status == CUDNN_STATUS_SUCCESS; });
  return CUDNN_STATUS_SUCCESS;
}

// What cudnnFind* (`timed`) and cudnnGet*_v7 return. The search: runnable algorithms fastest first, then the
// unsupported ones; it synchronizes the device (the real one times each algorithm), which fails inside a capture.
// The heuristics: the list in the menu's order (best expected first), nothing run, no sync, no times (-1).
template <typename Perf, typename AlgoT, std::size_t N>
cudnnStatus_t return_algorithms(bool timed, cudnnHandle_t handle, cudnnTensorDescriptor_t x_desc,
                                cudnnFilterDescriptor_t w_desc, cudnnConvolutionDescriptor_t conv_desc,
                                cudnnTensorDescriptor_t y_desc, const Algorithm (&menu)[N], int requested,
                                int* returned, Perf* results) {
  std::vector<Perf> list;
  if (!results) return CUDNN_STATUS_BAD_PARAM;
  if (const cudnnStatus_t s = list_algorithms<Perf, AlgoT>(handle, x_desc, w_desc, conv_desc, y_desc, menu, requested,
                                                          returned, list);
      s != CUDNN_STATUS_SUCCESS)
    return s;
  if (timed) {
    if (cudaDeviceSynchronize() != cudaSuccess) return CUDNN_STATUS_EXECUTION_FAILED_CUDART;
    std::stable_sort(list.begin(), list.end(), [](const Perf& a, const Perf& b) {
      if ((a.status == CUDNN_STATUS_SUCCESS) != (b.status == CUDNN_STATUS_SUCCESS)) return a.status == CUDNN_STATUS_SUCCESS;
      return a.time < b.time;
    });
  } else {
    for (Perf& p : list) p.time = -1.0f;
  }
  *returned = std::min<int>(requested, static_cast<int>(list.size()));
  std::copy_n(list.begin(), *returned, results);
  return CUDNN_STATUS_SUCCESS;
}

// The workspace one algorithm needs with the descriptor's current math: its im2col columns, or nothing.
template <std::size_t N>
cudnnStatus_t workspace_size(cudnnHandle_t handle, cudnnTensorDescriptor_t x_desc, cudnnFilterDescriptor_t w_desc,
                             cudnnConvolutionDescriptor_t conv_desc, cudnnTensorDescriptor_t y_desc,
                             const Algorithm (&menu)[N], int algo, size_t* bytes) {
  const Conv2d* conv = find_conv(conv_desc);
  Geometry g{};
  if (!find_handle(handle) || !bytes) return CUDNN_STATUS_BAD_PARAM;
  if (const cudnnStatus_t s = geometry(find_tensor(x_desc), find_filter(w_desc), conv, find_tensor(y_desc), &g);
      s != CUDNN_STATUS_SUCCESS)
    return s;
  const Algorithm* a = lookup(menu, algo);
  if (!a || !a->supported || (a->tensor_op && !tensor_op_allowed(conv->math))) return CUDNN_STATUS_NOT_SUPPORTED;
  *bytes = a->columns ? g.col_bytes() : 0;
  return CUDNN_STATUS_SUCCESS;
}

// The checks every convolution call makes before it enqueues: the algorithm, its math, its workspace.
cudnnStatus_t check_algorithm(const Algorithm* a, const Conv2d& conv, const Geometry& g, const void* workspace,
                              std::size_t workspace_bytes, const char* call) {
  if (!a || !a->supported) return CUDNN_STATUS_NOT_SUPPORTED;
  if (a->tensor_op && !tensor_op_allowed(conv.math)) return CUDNN_STATUS_NOT_SUPPORTED;
  const std::size_t needed = a->columns ? g.col_bytes() : 0;
  if (workspace_bytes < needed) {
    std::fprintf(stderr, "emulated cuDNN: %s: algorithm %d needs %zu workspace bytes, given %zu\n", call, a->algo,
                 needed, workspace_bytes);
    return CUDNN_STATUS_BAD_PARAM;
  }
  if (needed && !device_pointer_ok(workspace, needed, call, "workspace")) return CUDNN_STATUS_EXECUTION_FAILED;
  return CUDNN_STATUS_SUCCESS;
}

std::vector<float> rounded_copy(const float* p, std::size_t count, bool tf32) {
  std::vector<float> v(p, p + count);
  if (tf32)
    for (float& e : v) e = ferry::emu::to_tf32(e);
  return v;
}

// The input position a column element reads, or -1 when it falls in the padding.
long long source_index(const Geometry& g, int c, int i, int j, int oy, int ox) {
  if (g.flip) i = g.kh - 1 - i, j = g.kw - 1 - j;
  const int y = oy * g.stride_h - g.pad_h + i * g.dilation_h;
  const int x = ox * g.stride_w - g.pad_w + j * g.dilation_w;
  if (y < 0 || y >= g.h || x < 0 || x >= g.w) return -1;
  return (static_cast<long long>(c) * g.h + y) * g.w + x;
}

// cols (C*kh*kw, oh*ow) of one image, rounded to TF32 when the algorithm multiplies on tensor cores.
void im2col(const Geometry& g, const float* image, float* cols, bool tf32) {
  std::size_t r = 0;
  for (int c = 0; c < g.c; ++c)
    for (int i = 0; i < g.kh; ++i)
      for (int j = 0; j < g.kw; ++j, ++r)
        for (int oy = 0; oy < g.oh; ++oy)
          for (int ox = 0; ox < g.ow; ++ox) {
            const long long s = source_index(g, c, i, j, oy, ox);
            const float v = s < 0 ? 0.0f : image[s];
            cols[r * g.columns() + static_cast<std::size_t>(oy) * g.ow + ox] = tf32 ? ferry::emu::to_tf32(v) : v;
          }
}

// image += the columns folded back (the adjoint of im2col), the rows (c, i, j) taken from `rotation` on
// (0: in order), so that a non-deterministic algorithm adds each pixel's terms in another order.
void col2im(const Geometry& g, const float* cols, float* image, unsigned rotation) {
  const std::size_t rows = g.rows(), taps = static_cast<std::size_t>(g.kh) * g.kw;
  for (std::size_t k = 0; k < rows; ++k) {
    const std::size_t r = (k + rotation) % rows;
    const int c = static_cast<int>(r / taps), i = static_cast<int>(r % taps) / g.kw, j = static_cast<int>(r % taps) % g.kw;
    for (int oy = 0; oy < g.oh; ++oy)
      for (int ox = 0; ox < g.ow; ++ox) {
        const long long s = source_index(g, c, i, j, oy, ox);
        if (s >= 0) image[s] += cols[r * g.columns() + static_cast<std::size_t>(oy) * g.ow + ox];
      }
  }
}

// out = alpha * value + beta * out, where beta == 0 does not read out (cuDNN's blending rule).
void blend(float* out, const float* value, std::size_t count, float alpha, float beta) {
  for (std::size_t i = 0; i < count; ++i) out[i] = alpha * value[i] + (beta == 0.0f ? 0.0f : beta * out[i]);
}

// The columns of one image: in the workspace when the algorithm keeps them there, else on the host heap.
float* columns_buffer(const Algorithm& a, void* workspace, std::vector<float>& own, const Geometry& g) {
  if (a.columns) return static_cast<float*>(workspace);
  own.resize(g.rows() * g.columns());
  return own.data();
}

float read_scale(const void* p) { return *static_cast<const float*>(p); }

// --- BatchNorm ---------------------------------------------------------------------------------------

// x (N, C, H, W) and the (1, C, 1, 1) descriptor of the per-channel tensors, checked.
cudnnStatus_t batch_norm_shape(cudnnBatchNormMode_t mode, const Tensor4d* x, const Tensor4d* other,
                               const Tensor4d* channel, double epsilon) {
  if (mode != CUDNN_BATCHNORM_SPATIAL) return CUDNN_STATUS_NOT_SUPPORTED;  // the emulator has spatial mode only
  if (!x || !other || !channel || !x->set || !other->set || !channel->set) return CUDNN_STATUS_BAD_PARAM;
  if (x->type != CUDNN_DATA_FLOAT || other->type != CUDNN_DATA_FLOAT || channel->type != CUDNN_DATA_FLOAT)
    return CUDNN_STATUS_NOT_SUPPORTED;
  if (other->n != x->n || other->c != x->c || other->h != x->h || other->w != x->w) return CUDNN_STATUS_BAD_PARAM;
  if (channel->n != 1 || channel->c != x->c || channel->h != 1 || channel->w != 1) return CUDNN_STATUS_BAD_PARAM;
  if (!(epsilon >= CUDNN_BN_MIN_EPSILON)) return CUDNN_STATUS_BAD_PARAM;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

// === handles, versions, errors ===========================================================================

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return CUDNN_STATUS_NOT_INITIALIZED;
  const cudnnStatus_t status = create<Handle>(g_handles, handle);
  if (status == CUDNN_STATUS_SUCCESS) reinterpret_cast<Handle*>(*handle)->device = device;
  return status;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) { return destroy<Handle>(g_handles, handle); }

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  Handle* h = find_handle(handle);
  if (!h) return CUDNN_STATUS_BAD_PARAM;
  h->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* stream) {
  Handle* h = find_handle(handle);
  if (!h || !stream) return CUDNN_STATUS_BAD_PARAM;
  *stream = h->stream;
  return CUDNN_STATUS_SUCCESS;
}

size_t cudnnGetVersion() { return CUDNN_VERSION; }  // the headers' version: the emulator claims to be that cuDNN

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE: return "CUDNN_STATUS_NOT_SUPPORTED_SHAPE";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    case CUDNN_STATUS_EXECUTION_FAILED_CUDART: return "CUDNN_STATUS_EXECUTION_FAILED_CUDART";
    default: return "CUDNN_STATUS_UNKNOWN (emulated cuDNN)";
  }
}

// === descriptors ==========================================================================================

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* desc) { return create<Tensor4d>(g_tensors, desc); }
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc) { return destroy<Tensor4d>(g_tensors, desc); }

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
  Tensor4d* t = find_tensor(desc);
  if (!t || n < 1 || c < 1 || h < 1 || w < 1) return CUDNN_STATUS_BAD_PARAM;
  if (format != CUDNN_TENSOR_NCHW) return CUDNN_STATUS_NOT_SUPPORTED;  // the emulator has packed NCHW only
  *t = {true, type, n, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* desc) { return create<Filter4d>(g_filters, desc); }
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc) { return destroy<Filter4d>(g_filters, desc); }

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t type, cudnnTensorFormat_t format,
                                         int k, int c, int h, int w) {
  Filter4d* f = find_filter(desc);
  if (!f || k < 1 || c < 1 || h < 1 || w < 1) return CUDNN_STATUS_BAD_PARAM;
  if (format != CUDNN_TENSOR_NCHW) return CUDNN_STATUS_NOT_SUPPORTED;
  *f = {true, type, k, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* desc) {
  return create<Conv2d>(g_convs, desc);
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc) {
  return destroy<Conv2d>(g_convs, desc);
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t desc, int pad_h, int pad_w, int u, int v,
                                              int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute_type) {
  Conv2d* conv = find_conv(desc);
  if (!conv || pad_h < 0 || pad_w < 0 || u < 1 || v < 1 || dilation_h < 1 || dilation_w < 1)
    return CUDNN_STATUS_BAD_PARAM;
  if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION) return CUDNN_STATUS_BAD_PARAM;
  if (compute_type != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
  const cudnnMathType_t math = conv->math;  // setting the geometry keeps the math type
  *conv = {true, pad_h, pad_w, u, v, dilation_h, dilation_w, mode, math};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc, cudnnMathType_t math) {
  Conv2d* conv = find_conv(desc);
  if (!conv) return CUDNN_STATUS_BAD_PARAM;
  if (math != CUDNN_DEFAULT_MATH && math != CUDNN_TENSOR_OP_MATH && math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION &&
      math != CUDNN_FMA_MATH)
    return CUDNN_STATUS_BAD_PARAM;
  conv->math = math;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t conv_desc,
                                                    const cudnnTensorDescriptor_t input_desc,
                                                    const cudnnFilterDescriptor_t filter_desc, int* n, int* c, int* h,
                                                    int* w) {
  const Conv2d* conv = find_conv(conv_desc);
  const Tensor4d* x = find_tensor(input_desc);
  const Filter4d* f = find_filter(filter_desc);
  if (!conv || !x || !f || !conv->set || !x->set || !f->set || !n || !c || !h || !w) return CUDNN_STATUS_BAD_PARAM;
  if (x->c != f->c) return CUDNN_STATUS_BAD_PARAM;
  const int oh = output_size(x->h, conv->pad_h, f->h, conv->dilation_h, conv->stride_h);
  const int ow = output_size(x->w, conv->pad_w, f->w, conv->dilation_w, conv->stride_w);
  if (oh < 1 || ow < 1) return CUDNN_STATUS_BAD_PARAM;
  *n = x->n, *c = f->k, *h = oh, *w = ow;
  return CUDNN_STATUS_SUCCESS;
}

// === convolution ==========================================================================================

namespace {

// FERRY_EMU_CUDNN_REFUSE=forward|backward|all: the convolution calls of that direction are refused
// (CUDNN_STATUS_NOT_SUPPORTED_SHAPE) although the search offered them, as a real cuDNN may refuse an algorithm at
// the call; for the tests of ferry's fallback to its own kernels.
bool forced_refusal(bool forward) {
  const char* value = std::getenv("FERRY_EMU_CUDNN_REFUSE");
  if (value == nullptr) return false;
  return std::strcmp(value, "all") == 0 || std::strcmp(value, forward ? "forward" : "backward") == 0;
}

// What every convolution call checks before it enqueues, in cuDNN's order: the handle, alpha and beta; the
// descriptors; null data; the algorithm, its math and its workspace; the data pointers on the card. The data
// are named by their place: the input-shaped tensor (x or dx), the filter (w or dw), the output-shaped one
// (y or dy). On success `c` describes the call.
struct ConvCall {
  cudaStream_t stream = nullptr;  // the handle's
  Geometry g{};
  Algorithm algorithm{};
  float alpha = 1, beta = 0;  // read at the call, as cuDNN reads host scalars
};
template <std::size_t N>
cudnnStatus_t check_convolution(const char* call, cudnnHandle_t handle, const void* alpha, const void* beta,
                                cudnnTensorDescriptor_t x_desc, cudnnFilterDescriptor_t w_desc,
                                cudnnConvolutionDescriptor_t conv_desc, cudnnTensorDescriptor_t y_desc,
                                const void* x, const void* w, const void* y, const char* const (&names)[3],
                                const Algorithm (&menu)[N], int algo, const void* workspace,
                                std::size_t workspace_bytes, ConvCall& c) {
  const Handle* h = find_handle(handle);
  const Conv2d* conv = find_conv(conv_desc);
  if (!h || !alpha || !beta) return CUDNN_STATUS_BAD_PARAM;
  if (forced_refusal(std::strcmp(call, "cudnnConvolutionForward") == 0)) return CUDNN_STATUS_NOT_SUPPORTED_SHAPE;
  Geometry& g = c.g;
  if (const cudnnStatus_t s = geometry(find_tensor(x_desc), find_filter(w_desc), conv, find_tensor(y_desc), &g);
      s != CUDNN_STATUS_SUCCESS)
    return s;
  if (!x || !w || !y) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  const Algorithm* a = lookup(menu, algo);
  if (const cudnnStatus_t s = check_algorithm(a, *conv, g, workspace, workspace_bytes, call); s != CUDNN_STATUS_SUCCESS)
    return s;
  if (!device_pointer_ok(x, g.n * g.input_count() * sizeof(float), call, names[0]) ||
      !device_pointer_ok(w, g.weight_count() * sizeof(float), call, names[1]) ||
      !device_pointer_ok(y, g.n * g.output_count() * sizeof(float), call, names[2]))
    return CUDNN_STATUS_EXECUTION_FAILED;
  c.stream = h->stream;
  c.algorithm = *a;
  c.alpha = read_scale(alpha);
  c.beta = read_scale(beta);
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(cudnnHandle_t handle, const cudnnTensorDescriptor_t x_desc,
                                                   const cudnnFilterDescriptor_t w_desc,
                                                   const cudnnConvolutionDescriptor_t conv_desc,
                                                   const cudnnTensorDescriptor_t y_desc, const int requested,
                                                   int* returned, cudnnConvolutionFwdAlgoPerf_t* results) {
  return return_algorithms<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
      true, handle, x_desc, w_desc, conv_desc, y_desc, kForward, requested, returned, results);
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithm(cudnnHandle_t handle, const cudnnFilterDescriptor_t w_desc,
                                                        const cudnnTensorDescriptor_t dy_desc,
                                                        const cudnnConvolutionDescriptor_t conv_desc,
                                                        const cudnnTensorDescriptor_t dx_desc, const int requested,
                                                        int* returned, cudnnConvolutionBwdDataAlgoPerf_t* results) {
  return return_algorithms<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
      true, handle, dx_desc, w_desc, conv_desc, dy_desc, kBackwardData, requested, returned, results);
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithm(cudnnHandle_t handle, const cudnnTensorDescriptor_t x_desc,
                                                          const cudnnTensorDescriptor_t dy_desc,
                                                          const cudnnConvolutionDescriptor_t conv_desc,
                                                          const cudnnFilterDescriptor_t dw_desc, const int requested,
                                                          int* returned,
                                                          cudnnConvolutionBwdFilterAlgoPerf_t* results) {
  return return_algorithms<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      true, handle, x_desc, dw_desc, conv_desc, dy_desc, kBackwardFilter, requested, returned, results);
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t x_desc,
                                                     const cudnnFilterDescriptor_t w_desc,
                                                     const cudnnConvolutionDescriptor_t conv_desc,
                                                     const cudnnTensorDescriptor_t y_desc, const int requested,
                                                     int* returned, cudnnConvolutionFwdAlgoPerf_t* results) {
  return return_algorithms<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
      false, handle, x_desc, w_desc, conv_desc, y_desc, kForward, requested, returned, results);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t handle, const cudnnFilterDescriptor_t w_desc,
                                                          const cudnnTensorDescriptor_t dy_desc,
                                                          const cudnnConvolutionDescriptor_t conv_desc,
                                                          const cudnnTensorDescriptor_t dx_desc, const int requested,
                                                          int* returned, cudnnConvolutionBwdDataAlgoPerf_t* results) {
  return return_algorithms<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
      false, handle, dx_desc, w_desc, conv_desc, dy_desc, kBackwardData, requested, returned, results);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t x_desc,
                                                            const cudnnTensorDescriptor_t dy_desc,
                                                            const cudnnConvolutionDescriptor_t conv_desc,
                                                            const cudnnFilterDescriptor_t dw_desc, const int requested,
                                                            int* returned,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* results) {
  return return_algorithms<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      false, handle, x_desc, dw_desc, conv_desc, dy_desc, kBackwardFilter, requested, returned, results);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t x_desc,
                                                      const cudnnFilterDescriptor_t w_desc,
                                                      const cudnnConvolutionDescriptor_t conv_desc,
                                                      const cudnnTensorDescriptor_t y_desc,
                                                      cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
  return workspace_size(handle, x_desc, w_desc, conv_desc, y_desc, kForward, algo, bytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle, const cudnnFilterDescriptor_t w_desc,
                                                           const cudnnTensorDescriptor_t dy_desc,
                                                           const cudnnConvolutionDescriptor_t conv_desc,
                                                           const cudnnTensorDescriptor_t dx_desc,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
  return workspace_size(handle, dx_desc, w_desc, conv_desc, dy_desc, kBackwardData, algo, bytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t x_desc,
                                                             const cudnnTensorDescriptor_t dy_desc,
                                                             const cudnnConvolutionDescriptor_t conv_desc,
                                                             const cudnnFilterDescriptor_t dw_desc,
                                                             cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
  return workspace_size(handle, x_desc, dw_desc, conv_desc, dy_desc, kBackwardFilter, algo, bytes);
}

// y = alpha * conv(x, w) + beta * y
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t x_desc,
                                      const void* x, const cudnnFilterDescriptor_t w_desc, const void* w,
                                      const cudnnConvolutionDescriptor_t conv_desc, cudnnConvolutionFwdAlgo_t algo,
                                      void* workspace, size_t workspace_bytes, const void* beta,
                                      const cudnnTensorDescriptor_t y_desc, void* y) {
  ConvCall c;
  if (const cudnnStatus_t s = check_convolution("cudnnConvolutionForward", handle, alpha, beta, x_desc, w_desc, conv_desc,
                                                y_desc, x, w, y, {"x", "w", "y"}, kForward, algo, workspace,
                                                workspace_bytes, c);
      s != CUDNN_STATUS_SUCCESS)
    return s;
  ferry::emu::enqueue(c.stream, [=] {
    const Geometry& g = c.g;
    const auto* in = static_cast<const float*>(x);
    auto* out = static_cast<float*>(y);
    const std::vector<float> filter = rounded_copy(static_cast<const float*>(w), g.weight_count(), c.algorithm.tensor_op);
    std::vector<float> own;
    float* cols = columns_buffer(c.algorithm, workspace, own, g);
    for (int n = 0; n < g.n; ++n) {
      im2col(g, in + n * g.input_count(), cols, c.algorithm.tensor_op);
      float* out_n = out + n * g.output_count();
      // out_n (O, oh*ow) = alpha * filter (O, C*kh*kw) . cols (C*kh*kw, oh*ow) + beta * out_n
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g.o, static_cast<int>(g.columns()),
                  static_cast<int>(g.rows()), c.alpha, filter.data(), static_cast<int>(g.rows()), cols,
                  static_cast<int>(g.columns()), c.beta, out_n, static_cast<int>(g.columns()));
    }
  });
  return CUDNN_STATUS_SUCCESS;
}

// dx = alpha * conv_transpose(dy, w) + beta * dx
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha, const cudnnFilterDescriptor_t w_desc,
                                           const void* w, const cudnnTensorDescriptor_t dy_desc, const void* dy,
                                           const cudnnConvolutionDescriptor_t conv_desc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* workspace, size_t workspace_bytes,
                                           const void* beta, const cudnnTensorDescriptor_t dx_desc, void* dx) {
  ConvCall c;
  if (const cudnnStatus_t s = check_convolution("cudnnConvolutionBackwardData", handle, alpha, beta, dx_desc, w_desc,
                                                conv_desc, dy_desc, dx, w, dy, {"dx", "w", "dy"}, kBackwardData, algo,
                                                workspace, workspace_bytes, c);
      s != CUDNN_STATUS_SUCCESS)
    return s;
  ferry::emu::enqueue(c.stream, [=] {
    const Geometry& g = c.g;
    const std::vector<float> filter = rounded_copy(static_cast<const float*>(w), g.weight_count(), c.algorithm.tensor_op);
    std::vector<float> own, image(g.input_count());
    float* cols = columns_buffer(c.algorithm, workspace, own, g);
    const unsigned rotation = sum_rotation(c.algorithm);
    for (int n = 0; n < g.n; ++n) {
      const std::vector<float> grad =
          rounded_copy(static_cast<const float*>(dy) + n * g.output_count(), g.output_count(), c.algorithm.tensor_op);
      // cols (C*kh*kw, oh*ow) = filter^T (C*kh*kw, O) . dy_n (O, oh*ow)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(g.rows()), static_cast<int>(g.columns()),
                  g.o, 1.0f, filter.data(), static_cast<int>(g.rows()), grad.data(), static_cast<int>(g.columns()),
                  0.0f, cols, static_cast<int>(g.columns()));
      std::fill(image.begin(), image.end(), 0.0f);
      col2im(g, cols, image.data(), rotation);
      blend(static_cast<float*>(dx) + n * g.input_count(), image.data(), image.size(), c.alpha, c.beta);
    }
  });
  return CUDNN_STATUS_SUCCESS;
}

// dw = alpha * sum over images of dy_n . im2col(x_n)^T + beta * dw
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             const cudnnTensorDescriptor_t x_desc, const void* x,
                                             const cudnnTensorDescriptor_t dy_desc, const void* dy,
                                             const cudnnConvolutionDescriptor_t conv_desc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* workspace,
                                             size_t workspace_bytes, const void* beta,
                                             const cudnnFilterDescriptor_t dw_desc, void* dw) {
  ConvCall c;
  if (const cudnnStatus_t s = check_convolution("cudnnConvolutionBackwardFilter", handle, alpha, beta, x_desc, dw_desc,
                                                conv_desc, dy_desc, x, dw, dy, {"x", "dw", "dy"}, kBackwardFilter, algo,
                                                workspace, workspace_bytes, c);
      s != CUDNN_STATUS_SUCCESS)
    return s;
  ferry::emu::enqueue(c.stream, [=] {
    const Geometry& g = c.g;
    std::vector<float> own, sum(g.weight_count(), 0.0f);
    float* cols = columns_buffer(c.algorithm, workspace, own, g);
    const unsigned rotation = sum_rotation(c.algorithm);  // the images summed from another one on
    for (int k = 0; k < g.n; ++k) {
      const int n = static_cast<int>((static_cast<unsigned>(k) + rotation) % static_cast<unsigned>(g.n));
      im2col(g, static_cast<const float*>(x) + n * g.input_count(), cols, c.algorithm.tensor_op);
      const std::vector<float> grad =
          rounded_copy(static_cast<const float*>(dy) + n * g.output_count(), g.output_count(), c.algorithm.tensor_op);
      // sum (O, C*kh*kw) += dy_n (O, oh*ow) . cols^T (oh*ow, C*kh*kw)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g.o, static_cast<int>(g.rows()),
                  static_cast<int>(g.columns()), 1.0f, grad.data(), static_cast<int>(g.columns()), cols,
                  static_cast<int>(g.columns()), 1.0f, sum.data(), static_cast<int>(g.rows()));
    }
    blend(static_cast<float*>(dw), sum.data(), sum.size(), c.alpha, c.beta);
  });
  return CUDNN_STATUS_SUCCESS;
}

// === BatchNorm ============================================================================================

cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derived, const cudnnTensorDescriptor_t x_desc,
                                            cudnnBatchNormMode_t mode) {
  Tensor4d* out = find_tensor(derived);
  const Tensor4d* x = find_tensor(x_desc);
  if (!out || !x || !x->set) return CUDNN_STATUS_BAD_PARAM;
  if (mode != CUDNN_BATCHNORM_SPATIAL) return CUDNN_STATUS_NOT_SUPPORTED;
  *out = {true, x->type, 1, x->c, 1, 1};
  return CUDNN_STATUS_SUCCESS;
}

// Statistics per channel over N and the spatial dims: y = alpha * (scale * (x - mean) * invstd + bias) + beta * y;
// the running averages move by `factor` (the variance's unbiased estimate, as cuDNN's); mean and 1/sqrt(var + eps)
// saved for the backward pass.
cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alpha, const void* beta,
    const cudnnTensorDescriptor_t x_desc, const void* x, const cudnnTensorDescriptor_t y_desc, void* y,
    const cudnnTensorDescriptor_t channel_desc, const void* scale, const void* bias, double factor, void* running_mean,
    void* running_var, double epsilon, void* save_mean, void* save_invstd) {
  static constexpr const char* kCall = "cudnnBatchNormalizationForwardTraining";
  Handle* h = find_handle(handle);
  if (!h || !alpha || !beta) return CUDNN_STATUS_BAD_PARAM;
  const Tensor4d* xd = find_tensor(x_desc);
  if (const cudnnStatus_t s = batch_norm_shape(mode, xd, find_tensor(y_desc), find_tensor(channel_desc), epsilon);
      s != CUDNN_STATUS_SUCCESS)
    return s;
  if (!x || !y || !scale || !bias) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  if ((running_mean == nullptr) != (running_var == nullptr) || (save_mean == nullptr) != (save_invstd == nullptr))
    return CUDNN_STATUS_BAD_PARAM;  // each pair is given or left out together
  const int N = xd->n, C = xd->c;
  const std::size_t inner = static_cast<std::size_t>(xd->h) * xd->w, bytes = xd->count() * sizeof(float);
  const std::size_t channel_bytes = static_cast<std::size_t>(C) * sizeof(float);
  if (!device_pointer_ok(x, bytes, kCall, "x") || !device_pointer_ok(y, bytes, kCall, "y") ||
      !device_pointer_ok(scale, channel_bytes, kCall, "scale") || !device_pointer_ok(bias, channel_bytes, kCall, "bias") ||
      (running_mean && (!device_pointer_ok(running_mean, channel_bytes, kCall, "running mean") ||
                        !device_pointer_ok(running_var, channel_bytes, kCall, "running variance"))) ||
      (save_mean && (!device_pointer_ok(save_mean, channel_bytes, kCall, "saved mean") ||
                     !device_pointer_ok(save_invstd, channel_bytes, kCall, "saved inverse deviation"))))
    return CUDNN_STATUS_EXECUTION_FAILED;
  const float al = read_scale(alpha), be = read_scale(beta);
  ferry::emu::enqueue(h->stream, [=] {
    const auto* in = static_cast<const float*>(x);
    auto* out = static_cast<float*>(y);
    const double count = static_cast<double>(N) * static_cast<double>(inner);
    for (int c = 0; c < C; ++c) {
      double sum = 0;
      for (int n = 0; n < N; ++n)
        for (std::size_t i = 0; i < inner; ++i) sum += in[(static_cast<std::size_t>(n) * C + c) * inner + i];
      const double mean = sum / count;
      double squares = 0;
      for (int n = 0; n < N; ++n)
        for (std::size_t i = 0; i < inner; ++i) {
          const double d = in[(static_cast<std::size_t>(n) * C + c) * inner + i] - mean;
          squares += d * d;
        }
      const double var = squares / count, invstd = 1.0 / std::sqrt(var + epsilon);
      const double g = static_cast<const float*>(scale)[c], b = static_cast<const float*>(bias)[c];
      for (int n = 0; n < N; ++n)
        for (std::size_t i = 0; i < inner; ++i) {
          const std::size_t k = (static_cast<std::size_t>(n) * C + c) * inner + i;
          const float value = static_cast<float>(g * (in[k] - mean) * invstd + b);
          out[k] = al * value + (be == 0.0f ? 0.0f : be * out[k]);
        }
      if (running_mean) {
        auto* rm = static_cast<float*>(running_mean);
        auto* rv = static_cast<float*>(running_var);
        const double unbiased = count > 1 ? var * count / (count - 1) : var;
        rm[c] = static_cast<float>((1 - factor) * rm[c] + factor * mean);
        rv[c] = static_cast<float>((1 - factor) * rv[c] + factor * unbiased);
      }
      if (save_mean) {
        static_cast<float*>(save_mean)[c] = static_cast<float>(mean);
        static_cast<float*>(save_invstd)[c] = static_cast<float>(invstd);
      }
    }
  });
  return CUDNN_STATUS_SUCCESS;
}

// dx = alpha_d * scale * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)) + beta_d * dx; dscale = sum(dy * xhat)
// and dbias = sum(dy), blended with alpha_p / beta_p. The saved mean and invstd when given, else recomputed.
cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alpha_data, const void* beta_data,
    const void* alpha_param, const void* beta_param, const cudnnTensorDescriptor_t x_desc, const void* x,
    const cudnnTensorDescriptor_t dy_desc, const void* dy, const cudnnTensorDescriptor_t dx_desc, void* dx,
    const cudnnTensorDescriptor_t channel_desc, const void* scale, void* dscale, void* dbias, double epsilon,
    const void* saved_mean, const void* saved_invstd) {
  static constexpr const char* kCall = "cudnnBatchNormalizationBackward";
  Handle* h = find_handle(handle);
  if (!h || !alpha_data || !beta_data || !alpha_param || !beta_param) return CUDNN_STATUS_BAD_PARAM;
  const Tensor4d* xd = find_tensor(x_desc);
  if (const cudnnStatus_t s = batch_norm_shape(mode, xd, find_tensor(dy_desc), find_tensor(channel_desc), epsilon);
      s != CUDNN_STATUS_SUCCESS)
    return s;
  if (const cudnnStatus_t s = batch_norm_shape(mode, xd, find_tensor(dx_desc), find_tensor(channel_desc), epsilon);
      s != CUDNN_STATUS_SUCCESS)
    return s;
  if (!x || !dy || !dx || !scale || !dscale || !dbias) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  if ((saved_mean == nullptr) != (saved_invstd == nullptr)) return CUDNN_STATUS_BAD_PARAM;
  const int N = xd->n, C = xd->c;
  const std::size_t inner = static_cast<std::size_t>(xd->h) * xd->w, bytes = xd->count() * sizeof(float);
  const std::size_t channel_bytes = static_cast<std::size_t>(C) * sizeof(float);
  if (!device_pointer_ok(x, bytes, kCall, "x") || !device_pointer_ok(dy, bytes, kCall, "dy") ||
      !device_pointer_ok(dx, bytes, kCall, "dx") || !device_pointer_ok(scale, channel_bytes, kCall, "scale") ||
      !device_pointer_ok(dscale, channel_bytes, kCall, "dscale") ||
      !device_pointer_ok(dbias, channel_bytes, kCall, "dbias") ||
      (saved_mean && (!device_pointer_ok(saved_mean, channel_bytes, kCall, "saved mean") ||
                      !device_pointer_ok(saved_invstd, channel_bytes, kCall, "saved inverse deviation"))))
    return CUDNN_STATUS_EXECUTION_FAILED;
  const float ad = read_scale(alpha_data), bd = read_scale(beta_data);
  const float ap = read_scale(alpha_param), bp = read_scale(beta_param);
  ferry::emu::enqueue(h->stream, [=] {
    const auto* in = static_cast<const float*>(x);
    const auto* grad = static_cast<const float*>(dy);
    auto* out = static_cast<float*>(dx);
    const double count = static_cast<double>(N) * static_cast<double>(inner);
    const auto at = [&](int n, int c, std::size_t i) { return (static_cast<std::size_t>(n) * C + c) * inner + i; };
    for (int c = 0; c < C; ++c) {
      double mean = 0, invstd = 0;
      if (saved_mean) {
        mean = static_cast<const float*>(saved_mean)[c];
        invstd = static_cast<const float*>(saved_invstd)[c];
      } else {
        double sum = 0, squares = 0;
        for (int n = 0; n < N; ++n)
          for (std::size_t i = 0; i < inner; ++i) sum += in[at(n, c, i)];
        mean = sum / count;
        for (int n = 0; n < N; ++n)
          for (std::size_t i = 0; i < inner; ++i) squares += (in[at(n, c, i)] - mean) * (in[at(n, c, i)] - mean);
        invstd = 1.0 / std::sqrt(squares / count + epsilon);
      }
      double sum_dy = 0, sum_dy_xhat = 0;
      for (int n = 0; n < N; ++n)
        for (std::size_t i = 0; i < inner; ++i) {
          sum_dy += grad[at(n, c, i)];
          sum_dy_xhat += grad[at(n, c, i)] * (in[at(n, c, i)] - mean) * invstd;
        }
      const double g = static_cast<const float*>(scale)[c];
      for (int n = 0; n < N; ++n)
        for (std::size_t i = 0; i < inner; ++i) {
          const std::size_t k = at(n, c, i);
          const double xhat = (in[k] - mean) * invstd;
          const auto value = static_cast<float>(g * invstd * (grad[k] - sum_dy / count - xhat * sum_dy_xhat / count));
          out[k] = ad * value + (bd == 0.0f ? 0.0f : bd * out[k]);
        }
      auto* ds = static_cast<float*>(dscale);
      auto* db = static_cast<float*>(dbias);
      ds[c] = ap * static_cast<float>(sum_dy_xhat) + (bp == 0.0f ? 0.0f : bp * ds[c]);
      db[c] = ap * static_cast<float>(sum_dy) + (bp == 0.0f ? 0.0f : bp * db[c]);
    }
  });
  return CUDNN_STATUS_SUCCESS;
}
