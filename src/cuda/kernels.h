// kernels.h — the kernel launchers of the cuda backend, one group per .cu file. Each takes its
// stream; the caller has made the stream's device current (DeviceGuard). Semantics match the cpu
// reference (src/cpu/host_kernels.cpp) op for op, dtype for dtype.
// Not here: memory, streams and copies (cuda_backend.cpp, copy.cpp), GEMM (gemm.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device_state.h"
#include "ferry/backend.h"

namespace ferry::cuda {

// --- fill.cu: fill, arange, random (Philox, same numbers as the cpu) --------------------------------
void launch_fill(const KernelTensor& out, double value, cudaStream_t stream);
void launch_arange(const KernelTensor& out, double start, double step, cudaStream_t stream);
void launch_random(const KernelTensor& out, RandomKind kind, double low, double high, std::uint64_t seed,
                   std::uint64_t offset, cudaStream_t stream);

// --- unary.cu: unary ops; UnaryOp::Copy is a memcpy or a conversion ----------------------------------
void launch_unary(UnaryOp op, const KernelTensor& out, const KernelTensor& in, cudaStream_t stream);
// --- convert.cu: out = in cast to out's dtype, any strides ---------------------------------------------
void launch_convert(const KernelTensor& out, const KernelTensor& in, cudaStream_t stream);

// --- binary.cu: binary ops with broadcasting, ops with a scalar, where ---------------------------------
void launch_binary(BinaryOp op, const KernelTensor& out, const KernelTensor& a, const KernelTensor& b,
                   cudaStream_t stream);
void launch_binary_scalar(BinaryOp op, const KernelTensor& out, const KernelTensor& a, double scalar,
                          bool scalar_first, cudaStream_t stream);
void launch_where(const KernelTensor& out, const KernelTensor& cond, const KernelTensor& a, const KernelTensor& b,
                  cudaStream_t stream);

// --- reduce.cu: in (outer, reduce, inner) -> out (outer, inner) ----------------------------------------
void launch_reduce(ReduceOp op, const KernelTensor& out, const KernelTensor& in, std::int64_t outer,
                   std::int64_t reduce, std::int64_t inner, cudaStream_t stream);

// --- index.cu: gather rows or elements, and their backwards (scatter-adds) --------------------------------
// Out-of-range indices are written to `report` (device pointer) and raised at the next sync.
void launch_index_select(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index,
                         std::int64_t outer, std::int64_t n_in, std::int64_t inner, DeviceErrorReport* report,
                         cudaStream_t stream);
void launch_index_add(const KernelTensor& out, const KernelTensor& src, const KernelTensor& index,
                      std::int64_t outer, std::int64_t n_out, std::int64_t inner, DeviceErrorReport* report,
                      cudaStream_t stream);
void launch_gather(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index, std::int64_t outer,
                   std::int64_t n_in, std::int64_t inner, DeviceErrorReport* report, cudaStream_t stream);
void launch_scatter_add(const KernelTensor& out, const KernelTensor& src, const KernelTensor& index,
                        std::int64_t outer, std::int64_t n_out, std::int64_t inner, DeviceErrorReport* report,
                        cudaStream_t stream);
// scan.cu: inclusive prefix sums along the middle dim of contiguous (outer, n, inner).
void launch_cumsum(const KernelTensor& out, const KernelTensor& in, std::int64_t outer, std::int64_t n,
                   std::int64_t inner, cudaStream_t stream);

// --- sort.cu: stable argsort of each row of a contiguous (rows, n) ------------------------------------------
void launch_argsort(const KernelTensor& indices, const KernelTensor& in, std::int64_t rows, std::int64_t n,
                    bool descending, cudaStream_t stream);

// --- loss.cu: softmax cross-entropy over the last dim -----------------------------------------------------
void launch_cross_entropy(const KernelTensor& loss_rows, const KernelTensor& grad, const KernelTensor& logits,
                          const KernelTensor& target, double grad_scale, DeviceErrorReport* report,
                          cudaStream_t stream);

// --- softmax.cu: softmax and log_softmax along the last dim, one launch each way -----------------------------
// The Backend::softmax_* contract (ferry/backend.h), for float32 and float64.
bool softmax_supported(DType dtype);
void launch_softmax_forward(const KernelTensor& out, const KernelTensor& in, std::int64_t rows, std::int64_t n,
                            bool log, cudaStream_t stream);
void launch_softmax_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& out,
                             std::int64_t rows, std::int64_t n, bool log, cudaStream_t stream);

// --- multi_norm.cu: clip_grad_norm_'s norms and scale over many tensors, one launch each way per 48 tensors -----
// The Backend::multi_norm / multi_scale contract (ferry/backend.h), for float32 and float64, p = 1, 2 or inf.
bool multi_norm_supported(DType dtype);
void launch_multi_norm(const KernelTensor* tensors, std::size_t count, const KernelTensor& norms, double p,
                       cudaStream_t stream);
void launch_multi_scale(const KernelTensor* tensors, std::size_t count, const KernelTensor& scale,
                        cudaStream_t stream);

// --- layer_norm.cu and gelu.cu: LayerNorm over the last dim and GELU, one launch forward each -------------
// The Backend::layer_norm_* and gelu_* contracts (ferry/backend.h), for float32 and float64.
bool layer_norm_supported(DType dtype);
void launch_layer_norm_forward(const KernelTensor& out, const KernelTensor& normalized, const KernelTensor& rstd,
                               const KernelTensor& in, const KernelTensor& weight, const KernelTensor& bias,
                               std::int64_t rows, std::int64_t d, double eps, cudaStream_t stream);
void launch_layer_norm_backward(const KernelTensor& grad_in, const KernelTensor& grad_weight,
                                const KernelTensor& grad_bias, const KernelTensor& grad_out,
                                const KernelTensor& weight, const KernelTensor& normalized, const KernelTensor& rstd,
                                std::int64_t rows, std::int64_t d, cudaStream_t stream);
bool gelu_supported(DType dtype);
void launch_gelu_forward(const KernelTensor& out, const KernelTensor& cdf, const KernelTensor& in,
                         cudaStream_t stream);
void launch_gelu_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& in,
                          const KernelTensor& cdf, cudaStream_t stream);

// --- conv.cu: im2col / col2im for one sample ------------------------------------------------------------
void launch_im2col(const KernelTensor& columns, const KernelTensor& image, const Backend::Conv2dShape& shape,
                   cudaStream_t stream);
void launch_col2im(const KernelTensor& image, const KernelTensor& columns, const Backend::Conv2dShape& shape,
                   cudaStream_t stream);

// --- pool.cu: 2-d max and average pooling, forward and backward --------------------------------------------
void launch_max_pool2d(const KernelTensor& out, const KernelTensor& argmax, const KernelTensor& in,
                       const Backend::Pool2dShape& shape, cudaStream_t stream);
void launch_max_pool2d_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& argmax,
                                const Backend::Pool2dShape& shape, cudaStream_t stream);
void launch_avg_pool2d(const KernelTensor& out, const KernelTensor& in, const Backend::Pool2dShape& shape,
                       cudaStream_t stream);
void launch_avg_pool2d_backward(const KernelTensor& grad_in, const KernelTensor& grad_out,
                                const Backend::Pool2dShape& shape, cudaStream_t stream);

// --- batch_norm.cu: training-mode BatchNorm + ReLU, two launches each way (rule: src/nn/batch_norm_rule.h) ----
// The Backend::batch_norm_forward / _backward contract (ferry/backend.h), for float32 and float64.
bool batch_norm_kernels_supported(const Backend::BatchNormShape& shape, DType dtype);
void launch_batch_norm_forward(const KernelTensor& out, const KernelTensor& x, const KernelTensor& weight,
                               const KernelTensor& bias, const KernelTensor& running_mean,
                               const KernelTensor& running_var, const KernelTensor& save_mean,
                               const KernelTensor& save_invstd, const Backend::BatchNormShape& shape, double factor,
                               cudaStream_t stream);
void launch_batch_norm_backward(const KernelTensor& grad_x, const KernelTensor& grad_weight,
                                const KernelTensor& grad_bias, const KernelTensor& grad_out, const KernelTensor& x,
                                const KernelTensor& out, const KernelTensor& weight, const KernelTensor& save_mean,
                                const KernelTensor& save_invstd, const Backend::BatchNormShape& shape,
                                cudaStream_t stream);

// --- rnn_cells.cu: one LSTM or GRU step after its projections, one launch each way -----------------------
// The Backend::lstm_cell_* / gru_cell_* contract (ferry/backend.h), for float32 and float64.
bool rnn_cell_supported(DType dtype);
void launch_lstm_cell_forward(const KernelTensor& out, const KernelTensor& act, const KernelTensor& tanh_c,
                              const KernelTensor& x_gates, const KernelTensor& h_gates, const KernelTensor& c,
                              const Backend::RnnCellShape& shape, cudaStream_t stream);
void launch_lstm_cell_backward(const KernelTensor& d_gates, const KernelTensor& d_c, const KernelTensor& grad_out,
                               const KernelTensor& act, const KernelTensor& tanh_c, const KernelTensor& c,
                               const Backend::RnnCellShape& shape, cudaStream_t stream);
void launch_gru_cell_forward(const KernelTensor& out, const KernelTensor& act, const KernelTensor& x_gates,
                             const KernelTensor& h_gates, const KernelTensor& h, const Backend::RnnCellShape& shape,
                             cudaStream_t stream);
void launch_gru_cell_backward(const KernelTensor& d_x_gates, const KernelTensor& d_h_gates, const KernelTensor& d_h,
                              const KernelTensor& grad_out, const KernelTensor& act, const KernelTensor& h_gates,
                              const KernelTensor& h, const Backend::RnnCellShape& shape, cudaStream_t stream);

// --- gemm.cpp: cuBLAS, row-major via the swap of operands ---------------------------------------------------
void gemm(const Backend::GemmArgs& args, int device, cudaStream_t stream);
// Makes device `device`'s cuBLAS handle and workspace now if no GEMM has (before a graph capture).
void prepare_cublas(int device);

// --- copy.cpp: every copy that touches this backend's memory ------------------------------------------------
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes,
                const Stream& stream, bool pinned, bool non_blocking);
// Whether the staging ring has chosen its way in that direction, which, and where its threads' time went in the
// large copies made with it since (Backend::pageable_copy_path).
PageableCopyPath pageable_copy_path(bool host_to_device);

// --- pinned.cpp: page-locked host memory, cached and reused once the copy streams are past it ---------------
void* pinned_allocate(std::size_t bytes);
void pinned_deallocate(void* ptr) noexcept;
void pinned_release_cached();  // give cached blocks back to the system (empty_cache)

// --- sgd.cu: one SGD step over many parameters of one dtype (rule: src/optim/sgd_rule.h) ---------------
void launch_sgd_step(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* buffers,
                     std::size_t count, const Backend::SgdStep& step, cudaStream_t stream);

// --- adam.cu: one Adam / AdamW step over many parameters of one dtype (rule: src/optim/adam_rule.h) ---------
void launch_adam_step(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* exp_avgs,
                      const KernelTensor* exp_avg_sqs, const KernelTensor* max_exp_avg_sqs, const KernelTensor* steps,
                      std::size_t count, const Backend::AdamStep& step, cudaStream_t stream);

}  // namespace ferry::cuda
