// sim_backend.cpp — the sim device: a discrete accelerator simulated in host memory. Each sim:N has
// its own allocations and capacity; every copy to or from it crosses a link of settable bandwidth
// (throttled on the host clock). It computes with the cpu kernels. Tests use it to exercise every
// device-management rule without a GPU; users use it to watch the cost model. It also captures graphs the
// way CUDA does (ferry/graph.h): while capturing, kernel calls are recorded instead of run, memory allocated
// belongs to the graph and keeps its address until the graph is destroyed, and freeing memory from before the
// capture, a copy or a sync spoils the capture, so capture mistakes show up here without a GPU.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "../core/registry.h"
#include "../cpu/host_cache.h"
#include "../cpu/host_kernels.h"
#include "../cpu/host_memory.h"
#include "ferry/error.h"
#include "ferry/units.h"

namespace ferry {

namespace {
constexpr int kMaxSimDevices = 8;
constexpr std::int64_t kSimCapacity = std::int64_t{8} << 30;  // bytes of "device memory" per sim device

// FERRY_SIM_LINK: "16GB/s", "500 MB/s", "400Gbit/s" (ferry::parse_bandwidth's units), or "0" (unthrottled).
double parse_link_setting(const char* text) {
  if (std::string_view(text) == "0") return 0;
  try {
    return parse_bandwidth(text);
  } catch (const Error& e) {
    throw InvalidArgument(detail::concat("FERRY_SIM_LINK='", detail::printable(text), "' is not a bandwidth: ",
                                         e.what(), " (e.g. FERRY_SIM_LINK=16GB/s, or 0 for no limit)"));
  }
}

// FERRY_SIM_DEVICES: a whole number of simulated devices, 0 to kMaxSimDevices.
int parse_device_setting(const char* text) {
  std::int64_t count = -1;
  try {
    count = parse_whole_count(text);
  } catch (const Error&) {
  }
  FERRY_CHECK(count >= 0 && count <= kMaxSimDevices, InvalidArgument, "FERRY_SIM_DEVICES='", detail::printable(text),
              "' is not a number of simulated devices from 0 to ", kMaxSimDevices);
  return static_cast<int>(count);
}

// Read once, at the first use of a sim device; a bad setting throws there (and again at each later use).
struct SimSettings {
  std::mutex mutex;
  double link_bytes_per_second = 16e9;
  int device_count = 2;
  SimSettings() {
    if (const char* link = std::getenv("FERRY_SIM_LINK")) link_bytes_per_second = parse_link_setting(link);
    if (const char* count = std::getenv("FERRY_SIM_DEVICES")) device_count = parse_device_setting(count);
  }
};
SimSettings& settings() {
  static SimSettings s;
  return s;
}

// Hold the host until `bytes` would have crossed the link since `start`.
void wait_for_link(std::chrono::steady_clock::time_point start, std::size_t bytes) {
  const double rate = sim_link_bandwidth();
  if (rate <= 0) return;
  const auto due = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(static_cast<double>(bytes) / rate));
  if (due - std::chrono::steady_clock::now() > std::chrono::microseconds(200)) std::this_thread::sleep_until(due);
  while (std::chrono::steady_clock::now() < due) {}
}
}  // namespace

void set_sim_link_bandwidth(double bytes_per_second) {
  FERRY_CHECK(bytes_per_second >= 0, InvalidArgument, "sim link bandwidth must be >= 0 bytes/s, got ",
              bytes_per_second);
  std::lock_guard lock(settings().mutex);
  settings().link_bytes_per_second = bytes_per_second;
}
double sim_link_bandwidth() {
  std::lock_guard lock(settings().mutex);
  return settings().link_bytes_per_second;
}
void set_sim_device_count(int count) {
  FERRY_CHECK(count >= 0 && count <= kMaxSimDevices, InvalidArgument, "sim device count must be in [0, ",
              kMaxSimDevices, "], got ", count);
  std::lock_guard lock(settings().mutex);
  settings().device_count = count;
}

namespace sim {

// One captured graph: the recorded kernel calls, and the memory allocated while capturing.
struct SimGraph {
  int index = 0;
  std::vector<std::function<void()>> operations;
  std::vector<void*> blocks;
  std::int64_t memory_operations = 0;  // allocations and frees recorded (CUDA's memory nodes)
};

class SimBackend final : public cpu::HostKernels {
 public:
  DeviceType type() const override { return DeviceType::Sim; }
  int device_count() const override {
    std::lock_guard lock(settings().mutex);
    return settings().device_count;
  }
  DeviceProperties properties(int index) const override {
    DeviceProperties p = backend(DeviceType::CPU).properties(0);
    p.name = "ferry sim:" + std::to_string(index) + " (host-memory accelerator, computes with the cpu kernels)";
    p.memory_bytes = kSimCapacity;
    p.link_bytes_per_second = sim_link_bandwidth();
    p.link = "simulated";
    return p;
  }
  // Memory as a card's pool keeps it: freed blocks of 64 KiB and more wait in the device's cache for the next
  // request of their size (reserved, not allocated), so a step does not fault in fresh pages each time. The
  // capacity counts live bytes: a request that fits only without the cache gives the cache back first.
  void* allocate(std::size_t bytes, int index) override {
    check_index(index);
    const auto request = static_cast<std::int64_t>(bytes);
    MemoryStats s = stats(index);
    if (request > s.free && s.reserved > s.allocated) {
      caches_[index].release_all();
      s = stats(index);
    }
    if (request > s.free) {
      throw OutOfMemory(detail::concat("Out of memory on sim:", index, ": tried to allocate ", bytes, " bytes; ",
                                       s.allocated, " bytes allocated, ", s.reserved, " reserved, ", s.free,
                                       " free of ", s.total, " bytes total"));
    }
    void* ptr = cpu::allocate_cached(caches_[index], bytes, Device(DeviceType::Sim, index), counters_[index],
                                     kSimCapacity);
    if (SimGraph* graph = recording(index)) {  // the graph owns it: same address on every replay
      std::lock_guard lock(graph_mutex_);
      owned_[ptr] = {graph, false, cpu::cached_block_size(bytes)};
      graph->blocks.push_back(ptr);
      graph->memory_operations += 1;
    }
    return ptr;
  }
  void deallocate(void* ptr, std::size_t bytes, int index) noexcept override {
    counters_[index].remove(bytes);
    SimGraph* capturing = recording(index);
    {
      std::lock_guard lock(graph_mutex_);
      if (auto it = owned_.find(ptr); it != owned_.end()) {  // graph memory: kept while its graph lives
        it->second.released = true;
        if (capturing && it->second.graph == capturing) capturing->memory_operations += 1;
        if (it->second.graph == nullptr) {  // its graph is gone already
          owned_.erase(it);
          caches_[index].give(ptr, cpu::cached_block_size(bytes));
        }
        return;
      }
      if (capturing && capture_error_[index].empty()) {
        capture_error_[index] = detail::concat("Freeing ", bytes, " bytes of sim:", index, " memory allocated before ",
                                               "the capture (a tensor made before it was released inside it); release "
                                               "such tensors before capturing");
      }
    }
    caches_[index].give(ptr, cpu::cached_block_size(bytes));
  }
  void empty_cache(int index) override {
    check_index(index);
    caches_[index].release_all();
  }
  MemoryStats memory_stats(int index) const override {
    check_index(index);
    return stats(index);
  }
  void reset_peak_memory_stats(int index) override { counters_[index].reset_peak(); }
  Stream compute_stream(int index) override { return {Device(DeviceType::Sim, index), nullptr}; }
  Stream copy_stream(int index) override { return {Device(DeviceType::Sim, index), nullptr}; }
  void synchronize(const Stream& stream) override { spoil_capture(stream.device.index, "a host sync"); }
  void synchronize_device(int index) override { spoil_capture(index, "a host sync"); }
  void stream_wait(const Stream&, const Stream&) override {}
  void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes, const Stream&, bool,
            bool) override {
    for (Device d : {dst_device, src_device}) {
      if (d.type == DeviceType::Sim) spoil_capture(d.index, "a copy between devices");
    }
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(dst, src, bytes);
    if (dst_device != src_device) wait_for_link(start, bytes);
  }

  // --- kernels: run now, or recorded while capturing -------------------------------------------------
  void fill(const KernelTensor& out, double value, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::fill(out, value, stream); });
  }
  void arange(const KernelTensor& out, double start, double step, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::arange(out, start, step, stream); });
  }
  void random(const KernelTensor& out, RandomKind kind, double low, double high, std::uint64_t seed,
              std::uint64_t offset, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::random(out, kind, low, high, seed, offset, stream); });
  }
  void unary(UnaryOp op, const KernelTensor& out, const KernelTensor& in, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::unary(op, out, in, stream); });
  }
  void binary(BinaryOp op, const KernelTensor& out, const KernelTensor& a, const KernelTensor& b,
              const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::binary(op, out, a, b, stream); });
  }
  void binary_scalar(BinaryOp op, const KernelTensor& out, const KernelTensor& a, double scalar, bool scalar_first,
                     const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::binary_scalar(op, out, a, scalar, scalar_first, stream); });
  }
  void where(const KernelTensor& out, const KernelTensor& cond, const KernelTensor& a, const KernelTensor& b,
             const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::where(out, cond, a, b, stream); });
  }
  void reduce(ReduceOp op, const KernelTensor& out, const KernelTensor& in, std::int64_t outer, std::int64_t n,
              std::int64_t inner, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::reduce(op, out, in, outer, n, inner, stream); });
  }
  void gemm(const GemmArgs& args, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::gemm(args, stream); });
  }
  void index_select(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index, std::int64_t outer,
                    std::int64_t n_in, std::int64_t inner, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::index_select(out, in, index, outer, n_in, inner, stream); });
  }
  void index_add(const KernelTensor& out, const KernelTensor& src, const KernelTensor& index, std::int64_t outer,
                 std::int64_t n_out, std::int64_t inner, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::index_add(out, src, index, outer, n_out, inner, stream); });
  }
  void gather(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index, std::int64_t outer,
              std::int64_t n_in, std::int64_t inner, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::gather(out, in, index, outer, n_in, inner, stream); });
  }
  void scatter_add(const KernelTensor& out, const KernelTensor& src, const KernelTensor& index, std::int64_t outer,
                   std::int64_t n_out, std::int64_t inner, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::scatter_add(out, src, index, outer, n_out, inner, stream); });
  }
  void cumsum(const KernelTensor& out, const KernelTensor& in, std::int64_t outer, std::int64_t n, std::int64_t inner,
              const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::cumsum(out, in, outer, n, inner, stream); });
  }
  void argsort(const KernelTensor& indices, const KernelTensor& in, std::int64_t rows, std::int64_t n, bool descending,
               const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::argsort(indices, in, rows, n, descending, stream); });
  }
  void sgd_step(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* buffers, std::size_t count,
                const SgdStep& step, const Stream& stream) override {
    if (!recording(stream.device.index)) return HostKernels::sgd_step(params, grads, buffers, count, step, stream);
    std::vector<KernelTensor> p(params, params + count), g(grads, grads + count);
    std::vector<KernelTensor> b = buffers ? std::vector<KernelTensor>(buffers, buffers + count) : std::vector<KernelTensor>{};
    run_or_record(stream, [=, this] {
      HostKernels::sgd_step(p.data(), g.data(), b.empty() ? nullptr : b.data(), count, step, stream);
    });
  }
  void adam_step(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* exp_avgs,
                 const KernelTensor* exp_avg_sqs, const KernelTensor* max_exp_avg_sqs, const KernelTensor* steps,
                 std::size_t count, const AdamStep& step, const Stream& stream) override {
    if (!recording(stream.device.index)) {
      return HostKernels::adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, count, step,
                                    stream);
    }
    const auto copy = [count](const KernelTensor* views) {
      return views ? std::vector<KernelTensor>(views, views + count) : std::vector<KernelTensor>{};
    };
    const auto or_null = [](const std::vector<KernelTensor>& views) { return views.empty() ? nullptr : views.data(); };
    run_or_record(stream, [=, this, p = copy(params), g = copy(grads), m = copy(exp_avgs), v = copy(exp_avg_sqs),
                           vmax = copy(max_exp_avg_sqs), t = copy(steps)] {
      HostKernels::adam_step(p.data(), g.data(), m.data(), v.data(), or_null(vmax), or_null(t), count, step, stream);
    });
  }
  void cross_entropy(const KernelTensor& loss_rows, const KernelTensor& grad, const KernelTensor& logits,
                     const KernelTensor& target, double grad_scale, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::cross_entropy(loss_rows, grad, logits, target, grad_scale, stream); });
  }
  void im2col(const KernelTensor& columns, const KernelTensor& image, const Conv2dShape& shape,
              const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::im2col(columns, image, shape, stream); });
  }
  void col2im(const KernelTensor& image, const KernelTensor& columns, const Conv2dShape& shape,
              const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::col2im(image, columns, shape, stream); });
  }
  void max_pool2d(const KernelTensor& out, const KernelTensor& argmax, const KernelTensor& in,
                  const Pool2dShape& shape, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::max_pool2d(out, argmax, in, shape, stream); });
  }
  void max_pool2d_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& argmax,
                           const Pool2dShape& shape, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::max_pool2d_backward(grad_in, grad_out, argmax, shape, stream); });
  }
  void avg_pool2d(const KernelTensor& out, const KernelTensor& in, const Pool2dShape& shape,
                  const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::avg_pool2d(out, in, shape, stream); });
  }
  void avg_pool2d_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const Pool2dShape& shape,
                           const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::avg_pool2d_backward(grad_in, grad_out, shape, stream); });
  }

  // --- convolution through oneDNN, as the cpu's (HostKernels, src/cpu/onednn_conv.h): recorded while capturing,
  // as cuda's graphs record cuDNN's kernels; its scratch blocks are allocated when the call runs.
  void conv2d_forward(const KernelTensor& out, const KernelTensor& input, const KernelTensor& weight,
                      const KernelTensor& bias, const Conv2dShape& shape, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::conv2d_forward(out, input, weight, bias, shape, stream); });
  }
  void conv2d_backward_input(const KernelTensor& grad_input, const KernelTensor& grad_out, const KernelTensor& weight,
                             const Conv2dShape& shape, const Stream& stream) override {
    run_or_record(stream,
                  [=, this] { HostKernels::conv2d_backward_input(grad_input, grad_out, weight, shape, stream); });
  }
  void conv2d_backward_weight(const KernelTensor& grad_weight, const KernelTensor& grad_out, const KernelTensor& input,
                              const Conv2dShape& shape, const Stream& stream) override {
    run_or_record(stream,
                  [=, this] { HostKernels::conv2d_backward_weight(grad_weight, grad_out, input, shape, stream); });
  }

  // --- BatchNorm + ReLU: cuda runs it as fused kernels of ferry's own (src/cuda/batch_norm.cu); sim, like
  // the cpu, runs the same arithmetic on the host (src/cpu/batch_norm.cpp): one call each way here too; and
  // BatchNorm + ReLU + 2x2 pooling as the cpu's one layer (src/cpu/bn_relu_pool.cpp).
  void batch_norm_forward(const KernelTensor& out, const KernelTensor& x, const KernelTensor& weight,
                          const KernelTensor& bias, const KernelTensor& running_mean, const KernelTensor& running_var,
                          const KernelTensor& save_mean, const KernelTensor& save_invstd, const BatchNormShape& shape,
                          double factor, const Stream& stream) override {
    run_or_record(stream, [=, this] {
      HostKernels::batch_norm_forward(out, x, weight, bias, running_mean, running_var, save_mean, save_invstd, shape,
                                      factor, stream);
    });
  }
  void batch_norm_backward(const KernelTensor& grad_x, const KernelTensor& grad_weight, const KernelTensor& grad_bias,
                           const KernelTensor& grad_out, const KernelTensor& x, const KernelTensor& out,
                           const KernelTensor& weight, const KernelTensor& save_mean, const KernelTensor& save_invstd,
                           const BatchNormShape& shape, const Stream& stream) override {
    run_or_record(stream, [=, this] {
      HostKernels::batch_norm_backward(grad_x, grad_weight, grad_bias, grad_out, x, out, weight, save_mean, save_invstd,
                                       shape, stream);
    });
  }

  void batch_norm_relu_max_pool_forward(const KernelTensor& out, const KernelTensor& argmax, const KernelTensor& x,
                                        const KernelTensor& weight, const KernelTensor& bias,
                                        const KernelTensor& running_mean, const KernelTensor& running_var,
                                        const KernelTensor& save_mean, const KernelTensor& save_invstd,
                                        const BnReluPoolShape& shape, double factor, const Stream& stream) override {
    run_or_record(stream, [=, this] {
      HostKernels::batch_norm_relu_max_pool_forward(out, argmax, x, weight, bias, running_mean, running_var, save_mean,
                                                    save_invstd, shape, factor, stream);
    });
  }
  void batch_norm_relu_max_pool_backward(const KernelTensor& grad_x, const KernelTensor& grad_weight,
                                         const KernelTensor& grad_bias, const KernelTensor& grad_out,
                                         const KernelTensor& out, const KernelTensor& argmax, const KernelTensor& x,
                                         const KernelTensor& weight, const KernelTensor& save_mean,
                                         const KernelTensor& save_invstd, const BnReluPoolShape& shape,
                                         const Stream& stream) override {
    run_or_record(stream, [=, this] {
      HostKernels::batch_norm_relu_max_pool_backward(grad_x, grad_weight, grad_bias, grad_out, out, argmax, x, weight,
                                                     save_mean, save_invstd, shape, stream);
    });
  }

  // --- softmax along the last dim, as the cpu's (src/cpu/softmax.cpp) --------------------------------
  void softmax_forward(const KernelTensor& out, const KernelTensor& in, std::int64_t rows, std::int64_t n, bool log,
                       const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::softmax_forward(out, in, rows, n, log, stream); });
  }
  void softmax_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& out,
                        std::int64_t rows, std::int64_t n, bool log, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::softmax_backward(grad_in, grad_out, out, rows, n, log, stream); });
  }

  // --- clip_grad_norm_'s norms and scale, as the cpu's (src/cpu/multi_norm.cpp) ------------------------------
  void multi_norm(const KernelTensor* tensors, std::size_t count, const KernelTensor& norms, double p,
                  const Stream& stream) override {
    run_or_record(stream, [=, this, t = std::vector<KernelTensor>(tensors, tensors + count)] {
      HostKernels::multi_norm(t.data(), count, norms, p, stream);
    });
  }
  void multi_scale(const KernelTensor* tensors, std::size_t count, const KernelTensor& scale,
                   const Stream& stream) override {
    run_or_record(stream, [=, this, t = std::vector<KernelTensor>(tensors, tensors + count)] {
      HostKernels::multi_scale(t.data(), count, scale, stream);
    });
  }

  // --- LayerNorm and GELU, as the cpu's (src/cpu/layer_norm.cpp, src/cpu/gelu.cpp) ------------------------
  void layer_norm_forward(const KernelTensor& out, const KernelTensor& normalized, const KernelTensor& rstd,
                          const KernelTensor& in, const KernelTensor& weight, const KernelTensor& bias,
                          std::int64_t rows, std::int64_t d, double eps, const Stream& stream) override {
    run_or_record(stream, [=, this] {
      HostKernels::layer_norm_forward(out, normalized, rstd, in, weight, bias, rows, d, eps, stream);
    });
  }
  void layer_norm_backward(const KernelTensor& grad_in, const KernelTensor& grad_weight, const KernelTensor& grad_bias,
                           const KernelTensor& grad_out, const KernelTensor& weight, const KernelTensor& normalized,
                           const KernelTensor& rstd, std::int64_t rows, std::int64_t d, const Stream& stream) override {
    run_or_record(stream, [=, this] {
      HostKernels::layer_norm_backward(grad_in, grad_weight, grad_bias, grad_out, weight, normalized, rstd, rows, d,
                                       stream);
    });
  }
  void gelu_forward(const KernelTensor& out, const KernelTensor& cdf, const KernelTensor& in,
                    const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::gelu_forward(out, cdf, in, stream); });
  }
  void gelu_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& in,
                     const KernelTensor& cdf, const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::gelu_backward(grad_in, grad_out, in, cdf, stream); });
  }

  // --- one LSTM or GRU step after its projections, as the cpu's (src/cpu/rnn_cells.cpp) ---------------
  void lstm_cell_forward(const KernelTensor& out, const KernelTensor& act, const KernelTensor& tanh_c,
                         const KernelTensor& x_gates, const KernelTensor& h_gates, const KernelTensor& c,
                         const RnnCellShape& shape, const Stream& stream) override {
    run_or_record(stream, [=, this] {
      HostKernels::lstm_cell_forward(out, act, tanh_c, x_gates, h_gates, c, shape, stream);
    });
  }
  void lstm_cell_backward(const KernelTensor& d_gates, const KernelTensor& d_c, const KernelTensor& grad_out,
                          const KernelTensor& act, const KernelTensor& tanh_c, const KernelTensor& c,
                          const RnnCellShape& shape, const Stream& stream) override {
    run_or_record(stream, [=, this] {
      HostKernels::lstm_cell_backward(d_gates, d_c, grad_out, act, tanh_c, c, shape, stream);
    });
  }
  void gru_cell_forward(const KernelTensor& out, const KernelTensor& act, const KernelTensor& x_gates,
                        const KernelTensor& h_gates, const KernelTensor& h, const RnnCellShape& shape,
                        const Stream& stream) override {
    run_or_record(stream, [=, this] { HostKernels::gru_cell_forward(out, act, x_gates, h_gates, h, shape, stream); });
  }
  void gru_cell_backward(const KernelTensor& d_x_gates, const KernelTensor& d_h_gates, const KernelTensor& d_h,
                         const KernelTensor& grad_out, const KernelTensor& act, const KernelTensor& h_gates,
                         const KernelTensor& h, const RnnCellShape& shape, const Stream& stream) override {
    run_or_record(stream, [=, this] {
      HostKernels::gru_cell_backward(d_x_gates, d_h_gates, d_h, grad_out, act, h_gates, h, shape, stream);
    });
  }

  // --- graphs --------------------------------------------------------------------------------------
  bool graph_supported(int index) override { return index >= 0 && index < device_count(); }
  void begin_capture(int index) override {
    check_index(index);
    FERRY_CHECK(!recording(index), GraphCaptureError, "sim:", index, " is capturing a graph already");
    std::lock_guard lock(graph_mutex_);
    capture_error_[index].clear();
    auto* graph = new SimGraph;
    graph->index = index;
    recording_[index].store(graph);
  }
  void* end_capture(int index, std::int64_t* operations) override {
    check_index(index);
    SimGraph* graph = recording_[index].exchange(nullptr);
    FERRY_CHECK(graph != nullptr, GraphCaptureError, "sim:", index, " is not capturing a graph");
    std::string error;
    {
      std::lock_guard lock(graph_mutex_);
      error.swap(capture_error_[index]);
    }
    if (!error.empty()) {
      destroy_graph(graph, index);
      throw GraphCaptureError(detail::concat("The capture on sim:", index, " failed: ", error));
    }
    if (operations) *operations = static_cast<std::int64_t>(graph->operations.size()) + graph->memory_operations;
    return graph;
  }
  void replay_graph(void* graph, int index) override {
    FERRY_CHECK(!recording(index), GraphCaptureError, "A graph cannot be replayed inside a capture on sim:", index);
    for (const auto& operation : static_cast<SimGraph*>(graph)->operations) operation();
  }
  void destroy_graph(void* handle, int) noexcept override {
    auto* graph = static_cast<SimGraph*>(handle);
    if (!graph) return;
    std::lock_guard lock(graph_mutex_);
    for (void* ptr : graph->blocks) {  // released blocks go now; live ones when their tensor lets go
      auto it = owned_.find(ptr);
      if (it == owned_.end()) continue;
      if (it->second.released) {
        caches_[graph->index].give(ptr, it->second.block_bytes);
        owned_.erase(it);
      } else {
        it->second.graph = nullptr;
      }
    }
    delete graph;
  }

 private:
  SimGraph* recording(int index) const {
    return index >= 0 && index < kMaxSimDevices ? recording_[index].load(std::memory_order_acquire) : nullptr;
  }
  template <typename Work>
  void run_or_record(const Stream& stream, Work&& work) {
    if (SimGraph* graph = recording(stream.device.index)) {
      graph->operations.emplace_back(std::forward<Work>(work));
    } else {
      work();
    }
  }
  void spoil_capture(int index, const char* what) {
    if (!recording(index)) return;
    std::lock_guard lock(graph_mutex_);
    if (capture_error_[index].empty()) capture_error_[index] = detail::concat(what, " cannot be captured");
  }

  struct OwnedBlock {
    SimGraph* graph = nullptr;    // nullptr once the graph is destroyed
    bool released = false;        // the tensor let go (its memory stays the graph's)
    std::size_t block_bytes = 0;  // the block's size, for the cache when the graph goes
  };
  std::atomic<SimGraph*> recording_[kMaxSimDevices] = {};
  std::mutex graph_mutex_;
  std::string capture_error_[kMaxSimDevices];
  std::unordered_map<void*, OwnedBlock> owned_;

  // reserved = live bytes + the cache's; free = the capacity less what is reserved (what a card's driver reports)
  MemoryStats stats(int index) const {
    const auto cached = static_cast<std::int64_t>(caches_[index].cached_bytes());
    const std::int64_t allocated = counters_[index].stats(0, 0).allocated;
    MemoryStats s = counters_[index].stats(kSimCapacity, kSimCapacity - allocated - cached);
    s.reserved += cached;
    return s;
  }
  void check_index(int index) const {
    FERRY_CHECK(index >= 0 && index < device_count(), DeviceUnavailable, "sim:", index,
                " is not available; devices present: ", available_devices_text());
  }
  mutable cpu::HostMemoryCounter counters_[kMaxSimDevices];
  mutable cpu::HostBlockCache caches_[kMaxSimDevices];  // each with the cpu's limit; it holds what its device freed
};

std::unique_ptr<Backend> make_sim_backend() { return std::make_unique<SimBackend>(); }

}  // namespace sim
}  // namespace ferry
