// ferry/backend.h — the one interface every device implements (cpu, sim, cuda), and its registry.
// Backends see raw strided memory (KernelTensor); shape rules, device checks and autograd live above.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ferry/device.h"
#include "ferry/dtype.h"

namespace ferry {

inline constexpr int kMaxDims = 8;

// A view of device memory handed to a kernel. No ownership. `data` points at element 0 of the view.
struct KernelTensor {
  void* data = nullptr;
  DType dtype = DType::Float32;
  int ndim = 0;
  std::array<std::int64_t, kMaxDims> shape{};    // elements per dim
  std::array<std::int64_t, kMaxDims> strides{};  // elements (not bytes) between neighbours; 0 = broadcast

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= shape[d];
    return n;
  }
  bool is_contiguous() const {  // as Tensor::is_contiguous: a tensor without elements is, whatever its strides
    for (int d = 0; d < ndim; ++d) {
      if (shape[d] == 0) return true;
    }
    std::int64_t expected = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      if (shape[d] != 1 && strides[d] != expected) return false;
      expected *= shape[d];
    }
    return true;
  }
  template <typename T> T* ptr() const { return static_cast<T*>(data); }
};

// A queue of work on one device. cpu and sim run work at once, so their streams are empty handles;
// on cuda `handle` is a cudaStream_t.
struct Stream {
  Device device;
  void* handle = nullptr;
};

struct MemoryStats {
  // bytes held by live tensors, by a call's temporary memory while it runs (cuda: cuDNN's workspace, partial
  // sums) and by the vendor libraries' workspaces kept for the process (`library`), as PyTorch counts them
  std::int64_t allocated = 0;
  std::int64_t library = 0;    // of `allocated`: the libraries' workspaces (cuda: cuBLAS's, 32 MiB per device)
  std::int64_t reserved = 0;   // bytes the allocator holds from the device (>= allocated)
  std::int64_t peak = 0;       // highest `allocated` since the last reset_peak_memory_stats
  std::int64_t free = 0;       // bytes the device reports free (0 when it cannot say)
  std::int64_t total = 0;      // bytes of device memory (0 when it cannot say)
  std::int64_t allocations = 0;  // number of allocate calls
};

// What ferry::devices reports about a device; enough for the sheet's speedup formula (Ex 2.3).
struct DeviceProperties {
  std::string name;
  int cores = 0;                 // cpu: hardware threads; cuda: CUDA cores (SMs x cores per SM)
  double clock_hz = 0;           // nominal clock
  int multiprocessors = 0;       // cuda SMs
  std::int64_t memory_bytes = 0;
  double link_bytes_per_second = 0;  // host link (PCIe rate, or the sim link setting); 0 for cpu
  std::string link;              // "PCIe Gen5 x16", "simulated", ""
  std::string bus_id;            // cuda: PCI bus id ("0000:65:00.0"), one physical GPU whatever its ordinal; else ""
  double memory_bytes_per_second = 0;  // device memory bandwidth where known
  std::string libraries;         // vendor libraries in use, e.g. "cuBLAS 13.0.0, cuDNN 9.19.0 (conv2d, batch_norm)"
};

// How a backend copies between pageable host memory and its devices, for people and benchmarks. A backend that
// tunes that path at run time (cuda: the staging ring times its first large copies each way to choose its threads,
// stores and chunk size) says whether it has chosen yet, and from what size a copy takes part in the choice.
// A backend whose host threads stage the copies says where their time went, over the copies of tuning_bytes or
// more made since it chose: copying (the host's memory is the limit) or waiting for the link (the DMA engine is).
struct PageableCopyPath {
  bool settled = true;           // false: copies of tuning_bytes or more are still being timed to choose a way
  std::size_t tuning_bytes = 0;  // bytes: the smallest copy that takes part in the choice (0: nothing is chosen)
  std::string description;       // for people, e.g. "copies of 4 MiB or more go through the pinned staging ring,
                                 // with memcpy, 16 threads, 1 MiB chunks"; empty: nothing to say
  std::size_t timed_copies = 0;  // copies the split below is over (0: none yet, or no threads stage)
  double copying_share = 0;      // of the staging threads' time (threads x wall): copying between pageable memory
                                 // and the pinned buffers
  double waiting_share = 0;      // of it: waiting for the link (host->device: for a buffer whose DMA is done;
                                 // device->host: for a chunk's DMA to land); the rest starts threads and enqueues DMAs
  double copying_rate = 0;       // bytes/s: the threads' joint rate while copying, the copy's rate were the link free
};

enum class UnaryOp : std::uint8_t {
  Copy,  // out = in, with dtype conversion when the dtypes differ
  Neg, Exp, Log, Sqrt, Rsqrt, Abs, Sign, Relu, Sigmoid, Tanh, Square, Reciprocal, LogicalNot,
  Erf,  // the error function (GELU)
  Sin, Cos,
  Log1p, Expm1,               // log(1 + x), e^x - 1: exact near 0, where log(1 + x) and exp(x) - 1 lose digits
  Floor, Ceil, Round, Trunc,  // Round: to nearest, ties to even (PyTorch's round); integers pass unchanged
};
enum class BinaryOp : std::uint8_t {
  Add, Sub, Mul, Div, Pow, Maximum, Minimum,
  Eq, Ne, Lt, Le, Gt, Ge,  // write bool
  ReluBackward,            // out = b <= 0 ? 0 : a: grad, relu output (NaN passes the gradient, as PyTorch)
  ThresholdMask,           // out = (a > 0) ? b : 0  (ReluBackward with the mask first, but NaN gives 0)
  AddRelu,                 // out = relu(a + b): a layer's bias and its ReLU in one pass (floating point)
};
enum class ReduceOp : std::uint8_t { Sum, Mean, Max, Min, ArgMax, ArgMin, Prod };
enum class RandomKind : std::uint8_t { Uniform, Normal, Integer };

// One interface, one final implementation per device type. Ops are enums, not one virtual per op.
// Every call that enqueues work takes its stream. Capabilities a device lacks throw NotSupported.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceType type() const = 0;
  virtual int device_count() const = 0;
  virtual DeviceProperties properties(int index) const = 0;

  // --- memory ------------------------------------------------------------------------------------
  // Throws OutOfMemory with the numbers when the request cannot be met.
  virtual void* allocate(std::size_t bytes, int index) = 0;
  // Memory whose first writer is the copy stream (the destination of a host->device copy): on cuda it is
  // taken in the copy stream's order, so the copy need not wait for the compute stream's queued work
  // (a prefetch overlaps the step that is running). Freed by deallocate like any other block.
  virtual void* allocate_for_copy(std::size_t bytes, int index) { return allocate(bytes, index); }
  virtual void deallocate(void* ptr, std::size_t bytes, int index) noexcept = 0;
  virtual MemoryStats memory_stats(int index) const = 0;
  virtual void reset_peak_memory_stats(int index) = 0;
  virtual void empty_cache(int /*index*/) {}
  // Page-locked host memory the device can DMA from; only accelerators with a link have it.
  virtual void* allocate_pinned(std::size_t bytes);
  virtual void deallocate_pinned(void* ptr) noexcept;

  // --- streams and events ------------------------------------------------------------------------
  virtual Stream compute_stream(int index) = 0;
  virtual Stream copy_stream(int index) = 0;
  virtual void synchronize(const Stream& stream) = 0;  // host waits for the stream
  virtual void synchronize_device(int index) = 0;      // host waits for every stream of the device
  // Make `waiter` wait (on the device, not the host) for work enqueued so far on `producer`.
  virtual void stream_wait(const Stream& waiter, const Stream& producer) = 0;
  // Events: record_event marks the work enqueued so far on `stream`; event_synchronize makes the host wait for
  // that work alone, not for what was enqueued after it. Recorded on a stream that this thread is capturing, the
  // record becomes a node of the graph: each replay marks that point of itself. cpu and sim finish work as it is
  // called, so their events are null handles that are always complete.
  virtual void* create_event(int /*index*/) { return nullptr; }
  virtual void destroy_event(void* /*event*/, int /*index*/) noexcept {}
  virtual void record_event(void* /*event*/, const Stream& /*stream*/) {}
  virtual void event_synchronize(void* /*event*/, int /*index*/) {}
  // Copies `bytes` of device `index`'s memory into (pageable) host memory once `event` (made by create_event) is
  // complete, and returns when they have landed: a read that waits for nothing else queued on the device (the
  // value of a loss while its backward pass runs). Only backends whose create_event gives events are asked.
  virtual void read_when_ready(void* dst, const void* src, std::size_t bytes, void* event, int index);

  // --- copies ------------------------------------------------------------------------------------
  // Copy `bytes` contiguous bytes. One of src/dst is this backend's device; the other is this
  // device, another device of this type, or host memory (cpu). `pinned` says host memory is
  // page-locked; `non_blocking` allows the call to return before the copy is done. Called only from
  // ferry's one door (src/core/transfer.cpp), which records every crossing in the ledger.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes,
                    const Stream& stream, bool pinned, bool non_blocking) = 0;
  // The path of copies from (host_to_device) or to pageable host memory, as it stands now.
  virtual PageableCopyPath pageable_copy_path(bool /*host_to_device*/) const { return {}; }

  // --- kernels -----------------------------------------------------------------------------------
  // Shapes of `out` and inputs agree (inputs are broadcast by stride 0); dtypes as the op layer chose.
  virtual void fill(const KernelTensor& out, double value, const Stream& stream) = 0;
  virtual void arange(const KernelTensor& out, double start, double step, const Stream& stream) = 0;
  // Counter-based (Philox 4x32-10): element i of the result depends only on (seed, offset + i), so
  // every device draws the same numbers. Uniform in [low, high); Normal(mean=low, std=high);
  // Integer uniform in [low, high).
  virtual void random(const KernelTensor& out, RandomKind kind, double low, double high,
                      std::uint64_t seed, std::uint64_t offset, const Stream& stream) = 0;
  virtual void unary(UnaryOp op, const KernelTensor& out, const KernelTensor& in, const Stream& stream) = 0;
  virtual void binary(BinaryOp op, const KernelTensor& out, const KernelTensor& a, const KernelTensor& b,
                      const Stream& stream) = 0;
  // out = op(a, scalar) (or op(scalar, a) when scalar_first).
  virtual void binary_scalar(BinaryOp op, const KernelTensor& out, const KernelTensor& a, double scalar,
                             bool scalar_first, const Stream& stream) = 0;
  // out = cond ? a : b
  virtual void where(const KernelTensor& out, const KernelTensor& cond, const KernelTensor& a,
                     const KernelTensor& b, const Stream& stream) = 0;
  // in is contiguous (outer, reduce, inner); out is contiguous (outer, inner). Arg ops write int64. Sum, Mean and
  // Prod accumulate in double (integers: int64, wrapping); the sum and product of nothing are 0 and 1.
  virtual void reduce(ReduceOp op, const KernelTensor& out, const KernelTensor& in, std::int64_t outer,
                      std::int64_t reduce, std::int64_t inner, const Stream& stream) = 0;
  // Batched strided GEMM, row-major: C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b];
  // op(A) is (m, k), op(B) is (k, n), C is (m, n); lda/ldb/ldc are row strides in elements.
  struct GemmArgs {
    bool trans_a = false, trans_b = false;
    std::int64_t m = 0, n = 0, k = 0;
    float alpha = 1, beta = 0;
    const void* a = nullptr; std::int64_t lda = 0, stride_a = 0;
    const void* b = nullptr; std::int64_t ldb = 0, stride_b = 0;
    void* c = nullptr; std::int64_t ldc = 0, stride_c = 0;
    std::int64_t batch = 1;
    DType dtype = DType::Float32;
  };
  virtual void gemm(const GemmArgs& args, const Stream& stream) = 0;
  // in contiguous (outer, n_in, inner), index int64 (n_out) -> out contiguous (outer, n_out, inner):
  // out[o, j, i] = in[o, index[j], i]. Indices are checked: out-of-range throws InvalidArgument
  // (cpu) or is reported at the next sync (cuda).
  virtual void index_select(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index,
                            std::int64_t outer, std::int64_t n_in, std::int64_t inner,
                            const Stream& stream) = 0;
  // out (outer, n_out, inner) += scattered: out[o, index[j], i] += src[o, j, i]. The backward of
  // index_select.
  virtual void index_add(const KernelTensor& out, const KernelTensor& src, const KernelTensor& index,
                         std::int64_t outer, std::int64_t n_out, std::int64_t inner, const Stream& stream) = 0;
  // gather along the middle dim (torch.gather): in contiguous (outer, n_in, inner), index int64 contiguous
  // (outer, n_out, inner) -> out contiguous (outer, n_out, inner): out[o, j, i] = in[o, index[o, j, i], i].
  // Indices are checked as index_select's.
  virtual void gather(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index, std::int64_t outer,
                      std::int64_t n_in, std::int64_t inner, const Stream& stream) = 0;
  // gather's backward (torch's scatter_add_): out contiguous (outer, n_out, inner) += src at
  // out[o, index[o, j, i], i], with src and index contiguous (outer, n_src, inner). Under
  // deterministic_algorithms() every device adds in the cpu's order (j ascending), so the bits agree.
  virtual void scatter_add(const KernelTensor& out, const KernelTensor& src, const KernelTensor& index,
                           std::int64_t outer, std::int64_t n_out, std::int64_t inner, const Stream& stream) = 0;
  // Inclusive prefix sum along the middle dim: in and out contiguous (outer, n, inner),
  // out[o, j, i] = in[o, 0, i] + ... + in[o, j, i], summed in order j = 0, 1, ... in double (floating point) or
  // int64 (integers) and each prefix rounded to out's dtype, on every device (so the devices agree bit for bit).
  virtual void cumsum(const KernelTensor& out, const KernelTensor& in, std::int64_t outer, std::int64_t n,
                      std::int64_t inner, const Stream& stream) = 0;
  // Stable argsort of each row: in contiguous (rows, n) -> indices int64 contiguous (rows, n), the positions of the
  // row's elements in ascending (descending) order; equal elements keep their order; NaN after every number
  // ascending and before them descending, as PyTorch's stable sort.
  virtual void argsort(const KernelTensor& indices, const KernelTensor& in, std::int64_t rows, std::int64_t n,
                       bool descending, const Stream& stream) = 0;
  // Along the last dim of contiguous (rows, classes) logits with int64 targets (rows):
  // loss_rows[r] = logsumexp(logits[r]) - logits[r, target[r]]; grad (rows, classes) =
  // (softmax(logits) - onehot(target)) * grad_scale, written only when grad.data != nullptr.
  virtual void cross_entropy(const KernelTensor& loss_rows, const KernelTensor& grad, const KernelTensor& logits,
                             const KernelTensor& target, double grad_scale, const Stream& stream) = 0;
  // softmax (log_softmax when `log`) along the last dim of contiguous (rows, n), one read and one write of each
  // element each way, where the composed op (src/core/ops.cpp) runs seven kernels forward and four backward. The
  // composed arithmetic: each row shifted by its max (so a row holding +inf, or all -inf, is NaN, as PyTorch's),
  // e^x in the dtype, sums in double rounded to the dtype. cpu and sim run host loops
  // (src/cpu/softmax.cpp), cuda one kernel each way (src/cuda/softmax.cu), for float32 and float64; false means
  // "compose it from the kernels above".
  virtual bool softmax_library(DType /*dtype*/, int /*index*/) { return false; }
  // in (rows, n) -> out (rows, n), overwritten: e^(x - shift) / sum, or (x - shift) - log(sum e^(x - shift)).
  virtual void softmax_forward(const KernelTensor& out, const KernelTensor& in, std::int64_t rows, std::int64_t n,
                               bool log, const Stream& stream);
  // grad_out and the forward's out (rows, n) -> grad_in (rows, n), overwritten: out (g - sum(g out)) for softmax,
  // g - e^out sum(g) for log_softmax.
  virtual void softmax_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& out,
                                std::int64_t rows, std::int64_t n, bool log, const Stream& stream);
  // LayerNorm over the last d elements of contiguous (rows, d), one call forward and one backward, where the composed
  // layer (src/nn/composed_layers.cpp) runs nine kernels forward and about eleven backward. The composed arithmetic:
  // mean and variance (biased) summed in double and rounded to the dtype, the rest in the dtype, each operation
  // rounded on its own. cpu and sim run host loops (src/cpu/layer_norm.cpp), cuda its kernels
  // (src/cuda/layer_norm.cu), for float32 and float64; false means "compose it from the kernels above".
  virtual bool layer_norm_library(DType /*dtype*/, int /*index*/) { return false; }
  // in (rows, d); weight and bias (d), or null data -> normalized (rows, d) = (x - mean) rstd, rstd (rows) =
  // 1 / sqrt(var + eps), out (rows, d) = normalized weight + bias. Without weight and bias, out may be normalized
  // itself (written once).
  virtual void layer_norm_forward(const KernelTensor& out, const KernelTensor& normalized, const KernelTensor& rstd,
                                  const KernelTensor& in, const KernelTensor& weight, const KernelTensor& bias,
                                  std::int64_t rows, std::int64_t d, double eps, const Stream& stream);
  // grad_out (rows, d), weight (d) or null data, the forward's normalized and rstd -> grad_in (rows, d) =
  // rstd ((gn - mean(gn)) - normalized mean(gn normalized)), gn = grad_out weight; grad_weight (d) = the sum over
  // rows of grad_out normalized, grad_bias (d) = the sum of grad_out, each summed in double. Each of the three is
  // written only where its data is not null.
  virtual void layer_norm_backward(const KernelTensor& grad_in, const KernelTensor& grad_weight,
                                   const KernelTensor& grad_bias, const KernelTensor& grad_out,
                                   const KernelTensor& weight, const KernelTensor& normalized,
                                   const KernelTensor& rstd, std::int64_t rows, std::int64_t d, const Stream& stream);
  // GELU, the exact form x Phi(x), over contiguous tensors of one shape, one call each way where the composed layer
  // runs five kernels forward and seven backward. Each operation is the composed one's, rounded on its own (no
  // multiply-add contraction), so the result is the composed layer's on the same device, bit for bit. cpu and sim:
  // src/cpu/gelu.cpp; cuda: src/cuda/gelu.cu; float32 and float64; false means "compose it".
  virtual bool gelu_library(DType /*dtype*/, int /*index*/) { return false; }
  // in -> cdf = Phi(x) = (erf(x / sqrt 2) + 1) / 2 (kept for backward) and out = x cdf.
  virtual void gelu_forward(const KernelTensor& out, const KernelTensor& cdf, const KernelTensor& in,
                            const Stream& stream);
  // grad_out, the forward's in and cdf -> grad_in = grad_out (cdf + x phi(x)), phi(x) = e^(-x^2 / 2) / sqrt(2 pi).
  virtual void gelu_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& in,
                             const KernelTensor& cdf, const Stream& stream);

  // --- convolution and pooling (NCHW, contiguous) -------------------------------------------------
  struct Conv2dShape {
    std::int64_t batch = 0, in_channels = 0, height = 0, width = 0;
    std::int64_t out_channels = 0, kernel_h = 0, kernel_w = 0;
    std::int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
    std::int64_t out_h() const { return (height + 2 * pad_h - dilation_h * (kernel_h - 1) - 1) / stride_h + 1; }
    std::int64_t out_w() const { return (width + 2 * pad_w - dilation_w * (kernel_w - 1) - 1) / stride_w + 1; }
  };
  // image (C, H, W) of one sample -> columns (C*kh*kw, out_h*out_w).
  virtual void im2col(const KernelTensor& columns, const KernelTensor& image, const Conv2dShape& shape,
                      const Stream& stream) = 0;
  // columns (C*kh*kw, out_h*out_w) -> image (C, H, W), summing overlaps; image is overwritten.
  virtual void col2im(const KernelTensor& image, const KernelTensor& columns, const Conv2dShape& shape,
                      const Stream& stream) = 0;
  struct Pool2dShape {
    std::int64_t planes = 0, height = 0, width = 0;  // planes = N * C
    std::int64_t kernel_h = 0, kernel_w = 0, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
    std::int64_t out_h() const { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
    std::int64_t out_w() const { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
  };
  // max: out (planes, oh, ow) and argmax int64 flat index into each (H, W) plane.
  virtual void max_pool2d(const KernelTensor& out, const KernelTensor& argmax, const KernelTensor& in,
                          const Pool2dShape& shape, const Stream& stream) = 0;
  virtual void max_pool2d_backward(const KernelTensor& grad_in, const KernelTensor& grad_out,
                                   const KernelTensor& argmax, const Pool2dShape& shape, const Stream& stream) = 0;
  // average with count_include_pad = true (PyTorch's default).
  virtual void avg_pool2d(const KernelTensor& out, const KernelTensor& in, const Pool2dShape& shape,
                          const Stream& stream) = 0;
  virtual void avg_pool2d_backward(const KernelTensor& grad_in, const KernelTensor& grad_out,
                                   const Pool2dShape& shape, const Stream& stream) = 0;

  // --- optimizer -----------------------------------------------------------------------------------
  // One SGD step over `count` parameters in one call (one kernel launch on cuda instead of ~6 per
  // parameter), with torch.optim.SGD's rule and the roundings of its single-tensor path, in the
  // parameters' dtype (float32 or float64): d = (maximize ? -g : g) + (p * weight_decay);
  // with momentum: buf = first ? d : buf * momentum + d * (1 - dampening), d = nesterov ? d + buf *
  // momentum : buf; then p = p + d * -lr. params[i], grads[i] and (with momentum) buffers[i] are
  // contiguous with the same numel; `buffers` is null when momentum is 0.
  struct SgdStep {
    double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
    bool nesterov = false, maximize = false;
    bool first = false;  // the momentum buffers are new: buf = d
    // When set: a float64 scalar in the parameters' device memory holding the learning rate, read as
    // the step runs (lr is then ignored), so a step captured in a graph follows a schedule written
    // into it between replays.
    const double* lr_on_device = nullptr;
  };
  virtual void sgd_step(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* buffers,
                        std::size_t count, const SgdStep& step, const Stream& stream) = 0;
  // One Adam or AdamW step over `count` parameters in one call, with torch.optim.Adam's single-tensor rule and
  // its roundings, each operation rounded in the parameters' dtype as the op-by-op step (src/optim/adam.cpp):
  // g = maximize ? -g : g; AdamW p = p * (1 - lr wd), Adam g = g + p * wd; m = m * b1 + g * (1 - b1);
  // v = v * b2 + (g * g) * (1 - b2); amsgrad vmax = max(vmax, v); denom = sqrt(v or vmax) / bc2_sqrt + eps;
  // p = p + (m / denom) * -step_size. Every tensor contiguous with its parameter's numel; max_exp_avg_sqs null
  // without amsgrad. The scalars are the host's (the step count lives there), the same for all `count`; unless
  // `steps` is given (Adam's capturable): then each parameter's step count t is a float64 scalar in device memory,
  // incremented first, and the step reads the learning rate and the bias corrections from the device as it runs
  // (step_size = lr / table[t][0], bias_correction2_sqrt = table[t][1], AdamW decay_factor = 1 - lr * weight_decay,
  // each rounded in double: src/optim/adam_rule.h), so that a step captured in a graph follows them on each replay.
  struct AdamStep {
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
    double decay_factor = 1;  // AdamW: 1 - lr * weight_decay
    double weight_decay = 0;  // Adam: the L2 term added to the gradient (AdamW with steps: the decay's rate)
    double step_size = 0;     // lr / (1 - beta1^t)
    double bias_correction2_sqrt = 1;  // sqrt(1 - beta2^t)
    bool decoupled = false, amsgrad = false, maximize = false;
    // With steps: a float64 scalar holding the learning rate, and the table of bias corrections, float64
    // (table_rows, 2), row t = (1 - beta1^t, sqrt(1 - beta2^t)); a count past the last row reads the last row.
    const double* lr_on_device = nullptr;
    const double* bias_corrections = nullptr;
    std::int64_t table_rows = 0;
  };
  virtual void adam_step(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* exp_avgs,
                         const KernelTensor* exp_avg_sqs, const KernelTensor* max_exp_avg_sqs,
                         const KernelTensor* steps, std::size_t count, const AdamStep& step,
                         const Stream& stream) = 0;

  // --- gradient clipping: many tensors in one call ----------------------------------------------------
  // clip_grad_norm_'s two passes over every gradient as one call each (src/nn/clip_grad.cpp), where the composed
  // form runs three kernels and a copy per gradient for the norms and one kernel per gradient for the scale. For
  // `count` contiguous tensors of one dtype (float32 or float64) and p = 1, 2 or +inf; false means "compose it".
  virtual bool multi_norm_library(DType /*dtype*/, int /*index*/) { return false; }
  // norms (count), contiguous, of the tensors' dtype: norms[i] = the p-norm of tensors[i] as the composed ops
  // compute it: p = 2 sqrt(sum(x * x)), p = 1 sum(|x|), each sum in double rounded to the dtype; p = inf max(|x|),
  // NaN when any element is NaN. A tensor without elements has norm 0.
  virtual void multi_norm(const KernelTensor* tensors, std::size_t count, const KernelTensor& norms, double p,
                          const Stream& stream);
  // tensors[i] = tensors[i] * scale for every i, in their dtype; scale a one-element tensor of that dtype on the
  // device, read when the call runs (so a captured step scales by the value computed before it in the step).
  virtual void multi_scale(const KernelTensor* tensors, std::size_t count, const KernelTensor& scale,
                           const Stream& stream);

  // --- library layers (cuDNN on cuda, oneDNN on cpu and sim) ---------------------------------------
  // Convolution and BatchNorm as one vendor-library call each, where the device has such a library.
  // The *_library queries (for device `index`) never throw: false means "compose the layer from the
  // kernels above" (im2col + GEMM, per-channel passes), which every device can do. cpu and sim say yes
  // to float32 convolutions in a build with oneDNN (src/cpu/onednn_conv.h).
  // All tensors contiguous NCHW; weight (O, C, kh, kw).
  virtual bool conv2d_library(const Conv2dShape& /*shape*/, DType /*dtype*/, int /*index*/) { return false; }
  // out (N, O, oh, ow) = conv(input (N, C, H, W), weight) + bias (O), overwritten; bias.data null for none.
  virtual void conv2d_forward(const KernelTensor& out, const KernelTensor& input, const KernelTensor& weight,
                              const KernelTensor& bias, const Conv2dShape& shape, const Stream& stream);
  // grad_input (N, C, H, W) = the input gradient of the convolution, overwritten.
  virtual void conv2d_backward_input(const KernelTensor& grad_input, const KernelTensor& grad_out,
                                     const KernelTensor& weight, const Conv2dShape& shape, const Stream& stream);
  // grad_weight (O, C, kh, kw) = the weight gradient, summed over the batch, overwritten.
  virtual void conv2d_backward_weight(const KernelTensor& grad_weight, const KernelTensor& grad_out,
                                      const KernelTensor& input, const Conv2dShape& shape, const Stream& stream);

  // BatchNorm in training mode over x viewed as (batch, channels, inner), statistics per channel.
  struct BatchNormShape {
    std::int64_t batch = 0, channels = 0, inner = 0;
    double eps = 1e-5;
    bool relu = false;  // a ReLU fused in: out = max(0, ...) forward; grad_out masked where out <= 0 backward
  };
  // True when this device runs the layer as the calls below: a vendor library (cuDNN on cuda), or, for
  // BatchNorm + ReLU, fused kernels of ferry's own (cuda; cpu and sim run the same arithmetic as host loops).
  virtual bool batch_norm_library(const BatchNormShape& /*shape*/, DType /*dtype*/, int /*index*/) { return false; }
  // out = (x - mean) * invstd * weight + bias with the batch's mean and invstd = 1/sqrt(var + eps) (C),
  // written to save_mean and save_invstd; then the ReLU when shape.relu. When running_mean.data is not
  // null: running_mean = (1 - factor) running_mean + factor mean, running_var likewise with the unbiased
  // variance.
  virtual void batch_norm_forward(const KernelTensor& out, const KernelTensor& x, const KernelTensor& weight,
                                  const KernelTensor& bias, const KernelTensor& running_mean,
                                  const KernelTensor& running_var, const KernelTensor& save_mean,
                                  const KernelTensor& save_invstd, const BatchNormShape& shape, double factor,
                                  const Stream& stream);
  // The training-mode gradients: grad_x (N, C, inner), grad_weight and grad_bias (C), all overwritten.
  // `out` is the forward's output, read only when shape.relu (the ReLU's mask).
  virtual void batch_norm_backward(const KernelTensor& grad_x, const KernelTensor& grad_weight,
                                   const KernelTensor& grad_bias, const KernelTensor& grad_out, const KernelTensor& x,
                                   const KernelTensor& out, const KernelTensor& weight, const KernelTensor& save_mean,
                                   const KernelTensor& save_invstd, const BatchNormShape& shape,
                                   const Stream& stream);
  // BatchNorm (training) + ReLU + 2x2/2 max pooling as one layer, the CNNs' block tail: x (N, C, H, W) ->
  // out (N, C, H/2, W/2), the normalised activation never stored. cpu and sim run it as host loops
  // (src/cpu/bn_relu_pool.cpp) for float32 and float64 with H, W >= 2; cuda composes it (BatchNorm + ReLU, pooling).
  struct BnReluPoolShape {
    std::int64_t batch = 0, channels = 0, height = 0, width = 0;
    double eps = 1e-5;
  };
  virtual bool batch_norm_relu_max_pool_library(const BnReluPoolShape& /*shape*/, DType /*dtype*/, int /*index*/) {
    return false;
  }
  // out and argmax (N, C, H/2, W/2; argmax int64, the winner's index in its (H, W) plane: the first maximum in
  // window order, the first NaN, as PyTorch), save_mean and save_invstd (C), all overwritten. weight and bias (C),
  // data null for ones and zeros; running_mean and running_var as in batch_norm_forward (data null: not updated).
  virtual void batch_norm_relu_max_pool_forward(const KernelTensor& out, const KernelTensor& argmax,
                                                const KernelTensor& x, const KernelTensor& weight,
                                                const KernelTensor& bias, const KernelTensor& running_mean,
                                                const KernelTensor& running_var, const KernelTensor& save_mean,
                                                const KernelTensor& save_invstd, const BnReluPoolShape& shape,
                                                double factor, const Stream& stream);
  // grad_x (N, C, H, W), grad_weight and grad_bias (C), overwritten, from grad_out (N, C, H/2, W/2) and the
  // forward's out, argmax and saved statistics; weight data null for ones.
  virtual void batch_norm_relu_max_pool_backward(const KernelTensor& grad_x, const KernelTensor& grad_weight,
                                                 const KernelTensor& grad_bias, const KernelTensor& grad_out,
                                                 const KernelTensor& out, const KernelTensor& argmax,
                                                 const KernelTensor& x, const KernelTensor& weight,
                                                 const KernelTensor& save_mean, const KernelTensor& save_invstd,
                                                 const BnReluPoolShape& shape, const Stream& stream);

  // --- recurrent cells ------------------------------------------------------------------------------
  // One step of an LSTM or GRU layer after its two projections (the GEMMs stay in the layer): the gate
  // activations, the state update and the new hidden state as one call each way, where the composed step runs
  // about ten elementwise kernels forward and twenty backward on small (N, H) tensors. cpu and sim run host loops
  // (src/cpu/rnn_cells.cpp), cuda one kernel each way (src/cuda/rnn_cells.cu), both for float32 and float64; false
  // means "compose the step from the kernels above". Every tensor contiguous, of the query's dtype; gates in
  // PyTorch's order: LSTM (i, f, g, o), GRU (r, z, n). sigmoid(x) = 1 / (1 + e^-x), as UnaryOp::Sigmoid.
  struct RnnCellShape {
    std::int64_t batch = 0, hidden = 0;  // N, H
  };
  virtual bool rnn_cell_library(const RnnCellShape& /*shape*/, DType /*dtype*/, int /*index*/) { return false; }
  // x_gates, h_gates (N, 4H): the step's input and hidden projections with their biases; c (N, H) ->
  // out (2, N, H) = [h', c'] with c' = sigmoid(f) c + sigmoid(i) tanh(g) and h' = sigmoid(o) tanh(c');
  // act (N, 4H) = the activated gates and tanh_c (N, H) = tanh(c'), kept for backward. All outputs overwritten.
  virtual void lstm_cell_forward(const KernelTensor& out, const KernelTensor& act, const KernelTensor& tanh_c,
                                 const KernelTensor& x_gates, const KernelTensor& h_gates, const KernelTensor& c,
                                 const RnnCellShape& shape, const Stream& stream);
  // grad_out (2, N, H) = [dh', dc'] -> d_gates (N, 4H), the gradient of x_gates and of h_gates alike, and d_c
  // (N, H; data null: not wanted), overwritten, from the forward's act, tanh_c and c.
  virtual void lstm_cell_backward(const KernelTensor& d_gates, const KernelTensor& d_c, const KernelTensor& grad_out,
                                  const KernelTensor& act, const KernelTensor& tanh_c, const KernelTensor& c,
                                  const RnnCellShape& shape, const Stream& stream);
  // x_gates, h_gates (N, 3H), h (N, H) -> out (N, H) = n + z (h - n) with r = sigmoid(x_r + h_r),
  // z = sigmoid(x_z + h_z), n = tanh(x_n + r h_n), as PyTorch's GRU; act (N, 3H) = [r, z, n] for backward.
  virtual void gru_cell_forward(const KernelTensor& out, const KernelTensor& act, const KernelTensor& x_gates,
                                const KernelTensor& h_gates, const KernelTensor& h, const RnnCellShape& shape,
                                const Stream& stream);
  // grad_out (N, H) -> d_x_gates, d_h_gates (N, 3H) and d_h (N, H; data null: not wanted), overwritten, from the
  // forward's act, h_gates and h.
  virtual void gru_cell_backward(const KernelTensor& d_x_gates, const KernelTensor& d_h_gates, const KernelTensor& d_h,
                                 const KernelTensor& grad_out, const KernelTensor& act, const KernelTensor& h_gates,
                                 const KernelTensor& h, const RnnCellShape& shape, const Stream& stream);

  // --- graphs (CUDA graphs on cuda; recorded host calls on sim; cpu: none) -------------------------
  // Between begin_capture and end_capture the compute stream of device `index` records the work this thread
  // enqueues instead of running it; memory allocated meanwhile belongs to the graph and keeps its address on
  // every replay. end_capture returns an owned handle and the number of operations recorded, or throws
  // GraphCaptureError with the reason when something in between could not be recorded (the capture is over
  // either way). replay_graph enqueues the recorded work on the compute stream; destroy_graph frees the handle.
  virtual bool graph_supported(int /*index*/) { return false; }
  virtual void begin_capture(int index);
  virtual void* end_capture(int index, std::int64_t* operations);
  virtual void replay_graph(void* graph, int index);
  virtual void destroy_graph(void* graph, int index) noexcept;
  // What a graph holds, by kind, for people ("112 kernels, 30 allocations, 30 frees, 2 memsets"); empty where
  // the backend cannot tell. Kernels include those cuBLAS and cuDNN launch inside their calls.
  virtual std::string describe_graph(void* /*graph*/, int /*index*/) const { return {}; }
};

// The registry: one backend per device type, created on first use. Throws DeviceUnavailable for a
// type this build lacks (cuda without FERRY_CUDA).
Backend& backend(DeviceType type);
inline Backend& backend(Device device) { return backend(device.type); }

// --- the sim device's settings (host-memory accelerator; see ferry/device.h) ----------------------
// Link bandwidth in bytes/s (default 16e9, the sheet's PCIe figure; env FERRY_SIM_LINK, e.g. "8GB/s";
// 0 = unthrottled) and device count (default 2; env FERRY_SIM_DEVICES).
void set_sim_link_bandwidth(double bytes_per_second);
double sim_link_bandwidth();
void set_sim_device_count(int count);

// --- the host's threads (the cpu's and sim's loops and GEMMs) --------------------------------------
// The factor on the work a host loop needs before it splits over OpenMP's threads: 1 where they spin between
// loops (libgomp's default), 16 where they sleep (OMP_WAIT_POLICY=passive) and each loop would first wake them;
// env FERRY_PARALLEL_SCALE=N (1 to 4096) sets it. Read at the first call; throws InvalidArgument for a bad value.
// The setter (1 to 4096, else InvalidArgument) overrides both for the process, from the next loop on.
std::int64_t host_parallel_work_scale();
void set_host_parallel_work_scale(std::int64_t scale);

}  // namespace ferry
