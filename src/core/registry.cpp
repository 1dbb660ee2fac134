// registry.cpp — one backend per device type, created on first use; the default capabilities.
#include <array>
#include <mutex>

#include "internal.h"
#include "registry.h"

namespace ferry {

void* Backend::allocate_pinned(std::size_t) {
  throw NotSupported(detail::concat("Pinned host memory needs a CUDA device; this build or machine has none (devices: ",
                                    available_devices_text(), ")"));
}
void Backend::deallocate_pinned(void*) noexcept {}

namespace {
[[noreturn]] void no_library(const char* layer) {
  throw NotSupported(detail::concat(layer, " as one library call is not available on this device; ferry composes it "
                                    "from kernels when the backend's *_library query says false"));
}
}  // namespace

void Backend::conv2d_forward(const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                             const Conv2dShape&, const Stream&) {
  no_library("conv2d");
}
void Backend::conv2d_backward_input(const KernelTensor&, const KernelTensor&, const KernelTensor&, const Conv2dShape&,
                                    const Stream&) {
  no_library("conv2d");
}
void Backend::conv2d_backward_weight(const KernelTensor&, const KernelTensor&, const KernelTensor&, const Conv2dShape&,
                                     const Stream&) {
  no_library("conv2d");
}
void Backend::batch_norm_forward(const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                 const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                 const BatchNormShape&, double, const Stream&) {
  no_library("batch_norm");
}
void Backend::batch_norm_backward(const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                  const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                  const KernelTensor&, const BatchNormShape&, const Stream&) {
  no_library("batch_norm");
}
void Backend::batch_norm_relu_max_pool_forward(const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                               const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                               const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                               const BnReluPoolShape&, double, const Stream&) {
  no_library("batch_norm_relu_max_pool2d");
}
void Backend::batch_norm_relu_max_pool_backward(const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                                const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                                const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                                const KernelTensor&, const BnReluPoolShape&, const Stream&) {
  no_library("batch_norm_relu_max_pool2d");
}
void Backend::softmax_forward(const KernelTensor&, const KernelTensor&, std::int64_t, std::int64_t, bool,
                              const Stream&) {
  no_library("softmax");
}
void Backend::softmax_backward(const KernelTensor&, const KernelTensor&, const KernelTensor&, std::int64_t,
                               std::int64_t, bool, const Stream&) {
  no_library("softmax");
}
void Backend::multi_norm(const KernelTensor*, std::size_t, const KernelTensor&, double, const Stream&) {
  no_library("clip_grad_norm_ (multi_norm)");
}
void Backend::multi_scale(const KernelTensor*, std::size_t, const KernelTensor&, const Stream&) {
  no_library("clip_grad_norm_ (multi_scale)");
}
void Backend::layer_norm_forward(const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                 const KernelTensor&, const KernelTensor&, std::int64_t, std::int64_t, double,
                                 const Stream&) {
  no_library("layer_norm");
}
void Backend::layer_norm_backward(const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                  const KernelTensor&, const KernelTensor&, const KernelTensor&, std::int64_t,
                                  std::int64_t, const Stream&) {
  no_library("layer_norm");
}
void Backend::gelu_forward(const KernelTensor&, const KernelTensor&, const KernelTensor&, const Stream&) {
  no_library("gelu");
}
void Backend::gelu_backward(const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                            const Stream&) {
  no_library("gelu");
}
void Backend::lstm_cell_forward(const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                const KernelTensor&, const KernelTensor&, const RnnCellShape&, const Stream&) {
  no_library("lstm_cell");
}
void Backend::lstm_cell_backward(const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                 const KernelTensor&, const KernelTensor&, const RnnCellShape&, const Stream&) {
  no_library("lstm_cell");
}
void Backend::gru_cell_forward(const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                               const KernelTensor&, const RnnCellShape&, const Stream&) {
  no_library("gru_cell");
}
void Backend::gru_cell_backward(const KernelTensor&, const KernelTensor&, const KernelTensor&, const KernelTensor&,
                                const KernelTensor&, const KernelTensor&, const KernelTensor&, const RnnCellShape&,
                                const Stream&) {
  no_library("gru_cell");
}

namespace {
[[noreturn]] void no_graphs(DeviceType type, int index) {
  throw NotSupported(detail::concat(device_type_name(type), ":", index, " cannot capture graphs: its kernels run ",
                                    "as they are called (graphs need cuda, or sim to try them)"));
}
}  // namespace

void Backend::read_when_ready(void* /*dst*/, const void* /*src*/, std::size_t /*bytes*/, void* /*event*/, int index) {
  throw NotSupported(detail::concat(device_type_name(type()), ":", index, " has no events to read after"));
}
void Backend::begin_capture(int index) { no_graphs(type(), index); }
void* Backend::end_capture(int index, std::int64_t*) { no_graphs(type(), index); }
void Backend::replay_graph(void*, int index) { no_graphs(type(), index); }
void Backend::destroy_graph(void*, int) noexcept {}

Backend& backend(DeviceType type) {
  static std::array<std::unique_ptr<Backend>, kDeviceTypeCount> table;
  static std::array<std::once_flag, kDeviceTypeCount> once;
  const auto slot = static_cast<std::size_t>(type);
  std::call_once(once[slot], [&] {
    switch (type) {
      case DeviceType::CPU: table[slot] = cpu::make_cpu_backend(); break;
      case DeviceType::Sim: table[slot] = sim::make_sim_backend(); break;
      case DeviceType::CUDA:
#ifdef FERRY_HAVE_CUDA
        table[slot] = cuda::make_cuda_backend();
#else
        if (cuda::make_cuda_backend) table[slot] = cuda::make_cuda_backend();  // linked in by a test
#endif
        break;
    }
  });
  if (!table[slot]) {
    throw DeviceUnavailable("This build of ferry has no CUDA backend (configure with -DFERRY_CUDA=ON on a machine "
                            "with the CUDA toolkit)");
  }
  return *table[slot];
}

namespace detail {

KernelTensor kernel_view(const Tensor& t) {
  KernelTensor k;
  k.data = t.data_ptr();
  k.dtype = t.dtype();
  k.ndim = t.dim();
  FERRY_CHECK(k.ndim <= kMaxDims, InvalidArgument, "Tensors have at most ", kMaxDims, " dims, got ",
              shape_str(t.shape()));
  for (int d = 0; d < k.ndim; ++d) {
    k.shape[d] = t.shape()[d];
    k.strides[d] = t.strides()[d];
  }
  return k;
}

KernelTensor kernel_view_or_null(const Tensor& t) { return t.defined() ? kernel_view(t) : KernelTensor{}; }

KernelTensor kernel_broadcast(const Tensor& t, const Shape& shape) {
  KernelTensor k;
  k.data = t.data_ptr();
  k.dtype = t.dtype();
  k.ndim = static_cast<int>(shape.size());
  FERRY_CHECK(k.ndim <= kMaxDims, InvalidArgument, "Tensors have at most ", kMaxDims, " dims, got ", shape_str(shape));
  const int shift = k.ndim - t.dim();
  for (int d = 0; d < k.ndim; ++d) {
    k.shape[d] = shape[d];
    const int src = d - shift;
    k.strides[d] = (src < 0 || t.shape()[src] == 1) ? 0 : t.strides()[src];
  }
  return k;
}

KernelTensor kernel_flat(const Tensor& t) {
  KernelTensor k;
  k.data = t.data_ptr();
  k.dtype = t.dtype();
  k.ndim = 1;
  k.shape[0] = t.numel();
  k.strides[0] = 1;
  return k;
}

}  // namespace detail
}  // namespace ferry
