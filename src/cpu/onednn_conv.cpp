// onednn_conv.cpp — float32 conv2d on host memory through oneDNN (onednn_conv.h). Per shape, once: the three
// primitives (forward, backward-data, backward-weights) in the layouts oneDNN prefers for them ("any": blocked,
// e.g. nChw16c on an AVX-512 CPU), and the reorders between those layouts and ferry's NCHW / OIHW. Per call: the
// reorders and the primitive, on scratch blocks of the device (from its block cache, as any tensor's memory).
// Not here: the im2col path (nn/host_conv.cpp), the choice between the paths (nn/functional.cpp).
#include "onednn_conv.h"

#include <omp.h>

#include <atomic>
#include <cstring>

#include "../core/environment.h"
#include "host_kernels.h"
#include "ferry/error.h"

#if FERRY_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>
#endif

namespace ferry::cpu {

namespace {
// FERRY_ONEDNN=0 switches the path off for a whole run; a switch read on first use (../core/environment.h).
std::atomic<bool>& onednn_flag() {
  static std::atomic<bool> enabled{ferry::detail::environment_switch("FERRY_ONEDNN", true)};
  return enabled;
}
}  // namespace

void set_onednn_enabled(bool enabled) { onednn_flag() = enabled; }
bool onednn_enabled() { return onednn_flag(); }

#if FERRY_HAVE_ONEDNN

namespace {

using dnnl::memory;
using Dims = memory::dims;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

memory::desc plain(const Dims& dims, memory::format_tag tag) { return {dims, memory::data_type::f32, tag}; }
memory::desc any(const Dims& dims) { return {dims, memory::data_type::f32, memory::format_tag::any}; }

// A copy between ferry's layout and the one a primitive wants; none when they are the same.
struct Reorder {
  memory::desc from, to;
  std::optional<dnnl::reorder> op;
  Reorder() = default;
  Reorder(const memory::desc& from_desc, const memory::desc& to_desc) : from(from_desc), to(to_desc) {
    if (from != to) op.emplace(dnnl::reorder::primitive_desc(cpu_engine(), from, cpu_engine(), to));
  }
};

// Everything oneDNN needs for one shape, made once. The primitives hold no data: a call brings its own buffers.
// The forward always adds a bias (zeros when the layer has none: one primitive, and y + 0 is y).
struct ConvPlan {
  memory::desc x_plain, w_plain, y_plain, b_plain;  // ferry's layouts: x (N, C, H, W), w (O, C, kh, kw), y, bias (O)
  dnnl::convolution_forward::primitive_desc forward_pd;
  dnnl::convolution_backward_data::primitive_desc data_pd;
  dnnl::convolution_backward_weights::primitive_desc weights_pd;
  dnnl::convolution_forward forward;
  dnnl::convolution_backward_data backward_data;
  dnnl::convolution_backward_weights backward_weights;
  Reorder x_in, w_in, y_out;                   // forward
  Reorder g_in_data, w_in_data, gx_out;        // backward-data
  Reorder x_in_weights, g_in_weights, gw_out;  // backward-weights
};

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // ours per call: safe when threads share a plan
  return attr;
}

// Throws dnnl::error when oneDNN has no implementation for the shape.
std::unique_ptr<ConvPlan> make_plan(const Backend::Conv2dShape& s) {
  using namespace dnnl;
  auto plan = std::make_unique<ConvPlan>();
  const Dims x_dims{s.batch, s.in_channels, s.height, s.width}, w_dims{s.out_channels, s.in_channels, s.kernel_h, s.kernel_w},
      y_dims{s.batch, s.out_channels, s.out_h(), s.out_w()}, b_dims{s.out_channels};
  const Dims strides{s.stride_h, s.stride_w}, dilates{s.dilation_h - 1, s.dilation_w - 1},  // oneDNN counts from 0
      padding_l{s.pad_h, s.pad_w};
  // The right padding that gives out_h x out_w exactly (ferry's sizes round down; oneDNN wants them exact).
  const Dims padding_r{(s.out_h() - 1) * s.stride_h + (s.kernel_h - 1) * s.dilation_h + 1 - s.height - s.pad_h,
                       (s.out_w() - 1) * s.stride_w + (s.kernel_w - 1) * s.dilation_w + 1 - s.width - s.pad_w};
  plan->x_plain = plain(x_dims, memory::format_tag::nchw);
  plan->w_plain = plain(w_dims, memory::format_tag::oihw);
  plan->y_plain = plain(y_dims, memory::format_tag::nchw);
  plan->b_plain = plain(b_dims, memory::format_tag::x);
  const primitive_attr attr = user_scratchpad();
  plan->forward_pd = convolution_forward::primitive_desc(
      convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct, any(x_dims), any(w_dims),
                                plan->b_plain, any(y_dims), strides, dilates, padding_l, padding_r),
      attr, cpu_engine());
  plan->data_pd = convolution_backward_data::primitive_desc(
      convolution_backward_data::desc(algorithm::convolution_direct, any(x_dims), any(w_dims), any(y_dims), strides,
                                      dilates, padding_l, padding_r),
      attr, cpu_engine(), plan->forward_pd);
  plan->weights_pd = convolution_backward_weights::primitive_desc(
      convolution_backward_weights::desc(algorithm::convolution_direct, any(x_dims), any(w_dims), any(y_dims), strides,
                                         dilates, padding_l, padding_r),
      attr, cpu_engine(), plan->forward_pd);
  plan->forward = convolution_forward(plan->forward_pd);
  plan->backward_data = convolution_backward_data(plan->data_pd);
  plan->backward_weights = convolution_backward_weights(plan->weights_pd);
  plan->x_in = Reorder(plan->x_plain, plan->forward_pd.src_desc());
  plan->w_in = Reorder(plan->w_plain, plan->forward_pd.weights_desc());
  plan->y_out = Reorder(plan->forward_pd.dst_desc(), plan->y_plain);
  plan->g_in_data = Reorder(plan->y_plain, plan->data_pd.diff_dst_desc());
  plan->w_in_data = Reorder(plan->w_plain, plan->data_pd.weights_desc());
  plan->gx_out = Reorder(plan->data_pd.diff_src_desc(), plan->x_plain);
  plan->x_in_weights = Reorder(plan->x_plain, plan->weights_pd.src_desc());
  plan->g_in_weights = Reorder(plan->y_plain, plan->weights_pd.diff_dst_desc());
  plan->gw_out = Reorder(plan->weights_pd.diff_weights_desc(), plan->w_plain);
  return plan;
}

// The shape, and the OpenMP threads a plan is made for (oneDNN splits the work, and sizes its scratchpad, for them).
using ShapeKey = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                            std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                            std::int64_t, int>;
ShapeKey key_of(const Backend::Conv2dShape& s) {
  return {s.batch,    s.in_channels, s.height, s.width, s.out_channels, s.kernel_h, s.kernel_w,
          s.stride_h, s.stride_w,    s.pad_h,  s.pad_w, s.dilation_h,   s.dilation_w, omp_get_max_threads()};
}

// The plans made so far, by shape; nullptr for a shape oneDNN refused. Cleared when it holds kMaxPlans (a run
// with ever-changing shapes plans again rather than keeping them all); a call in progress keeps its own plan alive.
constexpr std::size_t kMaxPlans = 256;
std::mutex g_plans_mutex;
std::map<ShapeKey, std::shared_ptr<const ConvPlan>>& shared_plans() {
  static std::map<ShapeKey, std::shared_ptr<const ConvPlan>> table;
  return table;
}

std::shared_ptr<const ConvPlan> plan_for(const Backend::Conv2dShape& s) {
  const ShapeKey key = key_of(s);
  std::lock_guard lock(g_plans_mutex);
  auto& table = shared_plans();
  if (auto it = table.find(key); it != table.end()) return it->second;
  if (table.size() >= kMaxPlans) table.clear();
  std::shared_ptr<const ConvPlan> plan;
  try {
    plan = make_plan(s);
  } catch (const dnnl::error&) {
    plan = nullptr;  // no implementation: the im2col path takes this shape
  }
  table.emplace(key, plan);
  return plan;
}

// One call's buffers: ferry's tensors wrapped as oneDNN memory, and scratch blocks from the device's allocator,
// given back when the call returns (its stream is waited for before that).
class Buffers {
 public:
  Buffers(Backend& memory, int index) : memory_(memory), index_(index) {}
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() {
    for (const auto& [ptr, bytes] : blocks_) memory_.deallocate(ptr, bytes, index_);
  }
  // A view of a tensor's data in its own (plain) layout.
  static memory wrap(const memory::desc& desc, const KernelTensor& t) { return memory(desc, cpu_engine(), t.data); }
  memory scratch(const memory::desc& desc) { return memory(desc, cpu_engine(), block(desc.get_size())); }
  memory zeros(const memory::desc& desc) {
    void* data = block(desc.get_size());
    std::memset(data, 0, desc.get_size());
    return memory(desc, cpu_engine(), data);
  }
  // `user` in the layout `r.to`: the same memory when no reorder is needed, else a scratch buffer filled from it.
  memory into(const Reorder& r, memory user, dnnl::stream& stream) {  // memory: a handle, copied cheaply
    if (!r.op) return user;
    memory laid = scratch(r.to);
    r.op->execute(stream, user, laid);
    return laid;
  }
  // Where a primitive writes a result that `r` then copies into `user`: `user` itself when no reorder is needed.
  memory out(const Reorder& r, const memory& user) { return r.op ? scratch(r.from) : user; }
  static void finish(const Reorder& r, memory laid, memory user, dnnl::stream& stream) {
    if (r.op) r.op->execute(stream, laid, user);
  }

 private:
  void* block(std::size_t bytes) {
    bytes = bytes > 0 ? bytes : 1;
    void* ptr = memory_.allocate(bytes, index_);
    blocks_.emplace_back(ptr, bytes);
    return ptr;
  }
  Backend& memory_;
  int index_;
  std::vector<std::pair<void*, std::size_t>> blocks_;
};

}  // namespace

bool onednn_conv2d_supported(const Backend::Conv2dShape& s, DType dtype) {
  if (dtype != DType::Float32 || !onednn_flag() || omp_in_parallel()) return false;
  if (s.batch < 1 || s.in_channels < 1 || s.out_channels < 1 || s.out_h() < 1 || s.out_w() < 1) return false;
  return plan_for(s) != nullptr;
}

namespace {
std::shared_ptr<const ConvPlan> plan_or_fail(const Backend::Conv2dShape& s, const char* call) {
  std::shared_ptr<const ConvPlan> plan = plan_for(s);
  FERRY_ASSERT(plan, call, " called for a shape oneDNN refused (ask onednn_conv2d_supported first)");
  return plan;
}
}  // namespace

void onednn_conv2d_forward(const KernelTensor& out, const KernelTensor& x, const KernelTensor& w,
                           const KernelTensor& bias, const Backend::Conv2dShape& s, Backend& memory, int index) {
  const std::shared_ptr<const ConvPlan> plan = plan_or_fail(s, "onednn_conv2d_forward");
  dnnl::stream stream(cpu_engine());
  Buffers buffers(memory, index);
  const dnnl::memory x_user = Buffers::wrap(plan->x_plain, x), w_user = Buffers::wrap(plan->w_plain, w),
                     y_user = Buffers::wrap(plan->y_plain, out);
  const dnnl::memory x_laid = buffers.into(plan->x_in, x_user, stream),
                     w_laid = buffers.into(plan->w_in, w_user, stream), y_laid = buffers.out(plan->y_out, y_user),
                     b = bias.data ? Buffers::wrap(plan->b_plain, bias) : buffers.zeros(plan->b_plain),
                     scratchpad = buffers.scratch(plan->forward_pd.scratchpad_desc());
  plan->forward.execute(stream, {{DNNL_ARG_SRC, x_laid}, {DNNL_ARG_WEIGHTS, w_laid}, {DNNL_ARG_BIAS, b},
                                 {DNNL_ARG_DST, y_laid}, {DNNL_ARG_SCRATCHPAD, scratchpad}});
  Buffers::finish(plan->y_out, y_laid, y_user, stream);
  stream.wait();
}

void onednn_conv2d_backward_input(const KernelTensor& grad_input, const KernelTensor& grad_out, const KernelTensor& w,
                                  const Backend::Conv2dShape& s, Backend& memory, int index) {
  const std::shared_ptr<const ConvPlan> plan = plan_or_fail(s, "onednn_conv2d_backward_input");
  dnnl::stream stream(cpu_engine());
  Buffers buffers(memory, index);
  const dnnl::memory gx_user = Buffers::wrap(plan->x_plain, grad_input);
  const dnnl::memory g_laid = buffers.into(plan->g_in_data, Buffers::wrap(plan->y_plain, grad_out), stream),
                     w_laid = buffers.into(plan->w_in_data, Buffers::wrap(plan->w_plain, w), stream),
                     gx_laid = buffers.out(plan->gx_out, gx_user),
                     scratchpad = buffers.scratch(plan->data_pd.scratchpad_desc());
  plan->backward_data.execute(stream, {{DNNL_ARG_DIFF_DST, g_laid}, {DNNL_ARG_WEIGHTS, w_laid},
                                       {DNNL_ARG_DIFF_SRC, gx_laid}, {DNNL_ARG_SCRATCHPAD, scratchpad}});
  Buffers::finish(plan->gx_out, gx_laid, gx_user, stream);
  stream.wait();
}

void onednn_conv2d_backward_weight(const KernelTensor& grad_weight, const KernelTensor& grad_out,
                                   const KernelTensor& x, const Backend::Conv2dShape& s, Backend& memory, int index) {
  const std::shared_ptr<const ConvPlan> plan = plan_or_fail(s, "onednn_conv2d_backward_weight");
  dnnl::stream stream(cpu_engine());
  Buffers buffers(memory, index);
  const dnnl::memory gw_user = Buffers::wrap(plan->w_plain, grad_weight);
  const dnnl::memory x_laid = buffers.into(plan->x_in_weights, Buffers::wrap(plan->x_plain, x), stream),
                     g_laid = buffers.into(plan->g_in_weights, Buffers::wrap(plan->y_plain, grad_out), stream),
                     gw_laid = buffers.out(plan->gw_out, gw_user),
                     scratchpad = buffers.scratch(plan->weights_pd.scratchpad_desc());
  plan->backward_weights.execute(stream, {{DNNL_ARG_SRC, x_laid}, {DNNL_ARG_DIFF_DST, g_laid},
                                          {DNNL_ARG_DIFF_WEIGHTS, gw_laid}, {DNNL_ARG_SCRATCHPAD, scratchpad}});
  Buffers::finish(plan->gw_out, gw_laid, gw_user, stream);
  stream.wait();
}

#else  // no oneDNN in this build: the im2col path takes every convolution

bool onednn_conv2d_supported(const Backend::Conv2dShape&, DType) { return false; }
namespace {
[[noreturn]] void no_onednn() {
  throw NotSupported("conv2d through oneDNN: this build of ferry has no oneDNN (apt-get install libdnnl-dev, rebuild)");
}
}  // namespace
void onednn_conv2d_forward(const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                           const Backend::Conv2dShape&, Backend&, int) {
  no_onednn();
}
void onednn_conv2d_backward_input(const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                  const Backend::Conv2dShape&, Backend&, int) {
  no_onednn();
}
void onednn_conv2d_backward_weight(const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                   const Backend::Conv2dShape&, Backend&, int) {
  no_onednn();
}

#endif

// --- the host devices' library layer: the calls above, with this device's allocator --------------------------

bool HostKernels::conv2d_library(const Conv2dShape& shape, DType dtype, int /*index*/) {
  return onednn_conv2d_supported(shape, dtype);
}
void HostKernels::conv2d_forward(const KernelTensor& out, const KernelTensor& input, const KernelTensor& weight,
                                 const KernelTensor& bias, const Conv2dShape& shape, const Stream& stream) {
  onednn_conv2d_forward(out, input, weight, bias, shape, *this, stream.device.index);
}
void HostKernels::conv2d_backward_input(const KernelTensor& grad_input, const KernelTensor& grad_out,
                                        const KernelTensor& weight, const Conv2dShape& shape, const Stream& stream) {
  onednn_conv2d_backward_input(grad_input, grad_out, weight, shape, *this, stream.device.index);
}
void HostKernels::conv2d_backward_weight(const KernelTensor& grad_weight, const KernelTensor& grad_out,
                                         const KernelTensor& input, const Conv2dShape& shape, const Stream& stream) {
  onednn_conv2d_backward_weight(grad_weight, grad_out, input, shape, *this, stream.device.index);
}

}  // namespace ferry::cpu
