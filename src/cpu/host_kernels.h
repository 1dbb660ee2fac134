// host_kernels.h — the kernels every host-memory device shares (cpu, and sim, which computes with
// them in its own allocations): OpenMP loops and OpenBLAS GEMM. Memory, streams and copies are left
// to the device classes.
#pragma once

#include "ferry/backend.h"

namespace ferry::cpu {

class HostKernels : public Backend {
 public:
  void fill(const KernelTensor& out, double value, const Stream& stream) override;
  void arange(const KernelTensor& out, double start, double step, const Stream& stream) override;
  void random(const KernelTensor& out, RandomKind kind, double low, double high, std::uint64_t seed,
              std::uint64_t offset, const Stream& stream) override;
  void unary(UnaryOp op, const KernelTensor& out, const KernelTensor& in, const Stream& stream) override;
  void binary(BinaryOp op, const KernelTensor& out, const KernelTensor& a, const KernelTensor& b,
              const Stream& stream) override;
  void binary_scalar(BinaryOp op, const KernelTensor& out, const KernelTensor& a, double scalar, bool scalar_first,
                     const Stream& stream) override;
  void where(const KernelTensor& out, const KernelTensor& cond, const KernelTensor& a, const KernelTensor& b,
             const Stream& stream) override;
  void reduce(ReduceOp op, const KernelTensor& out, const KernelTensor& in, std::int64_t outer, std::int64_t reduce,
              std::int64_t inner, const Stream& stream) override;
  void gemm(const GemmArgs& args, const Stream& stream) override;
  void index_select(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index, std::int64_t outer,
                    std::int64_t n_in, std::int64_t inner, const Stream& stream) override;
  void index_add(const KernelTensor& out, const KernelTensor& src, const KernelTensor& index, std::int64_t outer,
                 std::int64_t n_out, std::int64_t inner, const Stream& stream) override;
  void gather(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index, std::int64_t outer,
              std::int64_t n_in, std::int64_t inner, const Stream& stream) override;
  void scatter_add(const KernelTensor& out, const KernelTensor& src, const KernelTensor& index, std::int64_t outer,
                   std::int64_t n_out, std::int64_t inner, const Stream& stream) override;
  void cumsum(const KernelTensor& out, const KernelTensor& in, std::int64_t outer, std::int64_t n, std::int64_t inner,
              const Stream& stream) override;
  void argsort(const KernelTensor& indices, const KernelTensor& in, std::int64_t rows, std::int64_t n, bool descending,
               const Stream& stream) override;
  void sgd_step(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* buffers, std::size_t count,
                const SgdStep& step, const Stream& stream) override;
  void adam_step(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* exp_avgs,
                 const KernelTensor* exp_avg_sqs, const KernelTensor* max_exp_avg_sqs, const KernelTensor* steps,
                 std::size_t count, const AdamStep& step, const Stream& stream) override;
  void cross_entropy(const KernelTensor& loss_rows, const KernelTensor& grad, const KernelTensor& logits,
                     const KernelTensor& target, double grad_scale, const Stream& stream) override;
  void im2col(const KernelTensor& columns, const KernelTensor& image, const Conv2dShape& shape,
              const Stream& stream) override;
  void col2im(const KernelTensor& image, const KernelTensor& columns, const Conv2dShape& shape,
              const Stream& stream) override;
  void max_pool2d(const KernelTensor& out, const KernelTensor& argmax, const KernelTensor& in,
                  const Pool2dShape& shape, const Stream& stream) override;
  void max_pool2d_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& argmax,
                           const Pool2dShape& shape, const Stream& stream) override;
  void avg_pool2d(const KernelTensor& out, const KernelTensor& in, const Pool2dShape& shape,
                  const Stream& stream) override;
  void avg_pool2d_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const Pool2dShape& shape,
                           const Stream& stream) override;
  // Convolution through oneDNN (onednn_conv.h): float32, in a build with it, the switch on. The scratch
  // blocks come from this device's allocate(), so a sim device's memory_stats count them as a card's would.
  bool conv2d_library(const Conv2dShape& shape, DType dtype, int index) override;
  void conv2d_forward(const KernelTensor& out, const KernelTensor& input, const KernelTensor& weight,
                      const KernelTensor& bias, const Conv2dShape& shape, const Stream& stream) override;
  void conv2d_backward_input(const KernelTensor& grad_input, const KernelTensor& grad_out, const KernelTensor& weight,
                             const Conv2dShape& shape, const Stream& stream) override;
  void conv2d_backward_weight(const KernelTensor& grad_weight, const KernelTensor& grad_out, const KernelTensor& input,
                              const Conv2dShape& shape, const Stream& stream) override;
  // Training-mode BatchNorm, with or without a ReLU, in cuda's fused arithmetic (batch_norm.cpp): two passes
  // per channel each way.
  bool batch_norm_library(const BatchNormShape& /*shape*/, DType dtype, int /*index*/) override {
    return dtype == DType::Float32 || dtype == DType::Float64;
  }
  void batch_norm_forward(const KernelTensor& out, const KernelTensor& x, const KernelTensor& weight,
                          const KernelTensor& bias, const KernelTensor& running_mean, const KernelTensor& running_var,
                          const KernelTensor& save_mean, const KernelTensor& save_invstd, const BatchNormShape& shape,
                          double factor, const Stream& stream) override;
  void batch_norm_backward(const KernelTensor& grad_x, const KernelTensor& grad_weight, const KernelTensor& grad_bias,
                           const KernelTensor& grad_out, const KernelTensor& x, const KernelTensor& out,
                           const KernelTensor& weight, const KernelTensor& save_mean, const KernelTensor& save_invstd,
                           const BatchNormShape& shape, const Stream& stream) override;
  // BatchNorm + ReLU + 2x2 pooling in one layer (bn_relu_pool.cpp): float32 and float64, H and W >= 2.
  bool batch_norm_relu_max_pool_library(const BnReluPoolShape& shape, DType dtype, int /*index*/) override {
    return (dtype == DType::Float32 || dtype == DType::Float64) && shape.height >= 2 && shape.width >= 2;
  }
  void batch_norm_relu_max_pool_forward(const KernelTensor& out, const KernelTensor& argmax, const KernelTensor& x,
                                        const KernelTensor& weight, const KernelTensor& bias,
                                        const KernelTensor& running_mean, const KernelTensor& running_var,
                                        const KernelTensor& save_mean, const KernelTensor& save_invstd,
                                        const BnReluPoolShape& shape, double factor, const Stream& stream) override;
  void batch_norm_relu_max_pool_backward(const KernelTensor& grad_x, const KernelTensor& grad_weight,
                                         const KernelTensor& grad_bias, const KernelTensor& grad_out,
                                         const KernelTensor& out, const KernelTensor& argmax, const KernelTensor& x,
                                         const KernelTensor& weight, const KernelTensor& save_mean,
                                         const KernelTensor& save_invstd, const BnReluPoolShape& shape,
                                         const Stream& stream) override;
  // softmax and log_softmax along the last dim (softmax.cpp): float32 and float64.
  bool softmax_library(DType dtype, int /*index*/) override {
    return dtype == DType::Float32 || dtype == DType::Float64;
  }
  void softmax_forward(const KernelTensor& out, const KernelTensor& in, std::int64_t rows, std::int64_t n, bool log,
                       const Stream& stream) override;
  void softmax_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& out,
                        std::int64_t rows, std::int64_t n, bool log, const Stream& stream) override;
  // clip_grad_norm_'s norms and scale over many tensors (multi_norm.cpp): float32 and float64.
  bool multi_norm_library(DType dtype, int /*index*/) override {
    return dtype == DType::Float32 || dtype == DType::Float64;
  }
  void multi_norm(const KernelTensor* tensors, std::size_t count, const KernelTensor& norms, double p,
                  const Stream& stream) override;
  void multi_scale(const KernelTensor* tensors, std::size_t count, const KernelTensor& scale,
                   const Stream& stream) override;
  // LayerNorm over the last dim (layer_norm.cpp) and GELU (gelu.cpp): float32 and float64.
  bool layer_norm_library(DType dtype, int /*index*/) override {
    return dtype == DType::Float32 || dtype == DType::Float64;
  }
  void layer_norm_forward(const KernelTensor& out, const KernelTensor& normalized, const KernelTensor& rstd,
                          const KernelTensor& in, const KernelTensor& weight, const KernelTensor& bias,
                          std::int64_t rows, std::int64_t d, double eps, const Stream& stream) override;
  void layer_norm_backward(const KernelTensor& grad_in, const KernelTensor& grad_weight, const KernelTensor& grad_bias,
                           const KernelTensor& grad_out, const KernelTensor& weight, const KernelTensor& normalized,
                           const KernelTensor& rstd, std::int64_t rows, std::int64_t d, const Stream& stream) override;
  bool gelu_library(DType dtype, int /*index*/) override { return dtype == DType::Float32 || dtype == DType::Float64; }
  void gelu_forward(const KernelTensor& out, const KernelTensor& cdf, const KernelTensor& in,
                    const Stream& stream) override;
  void gelu_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& in,
                     const KernelTensor& cdf, const Stream& stream) override;
  // One LSTM or GRU step after its projections (rnn_cells.cpp): float32 and float64.
  bool rnn_cell_library(const RnnCellShape& /*shape*/, DType dtype, int /*index*/) override {
    return dtype == DType::Float32 || dtype == DType::Float64;
  }
  void lstm_cell_forward(const KernelTensor& out, const KernelTensor& act, const KernelTensor& tanh_c,
                         const KernelTensor& x_gates, const KernelTensor& h_gates, const KernelTensor& c,
                         const RnnCellShape& shape, const Stream& stream) override;
  void lstm_cell_backward(const KernelTensor& d_gates, const KernelTensor& d_c, const KernelTensor& grad_out,
                          const KernelTensor& act, const KernelTensor& tanh_c, const KernelTensor& c,
                          const RnnCellShape& shape, const Stream& stream) override;
  void gru_cell_forward(const KernelTensor& out, const KernelTensor& act, const KernelTensor& x_gates,
                        const KernelTensor& h_gates, const KernelTensor& h, const RnnCellShape& shape,
                        const Stream& stream) override;
  void gru_cell_backward(const KernelTensor& d_x_gates, const KernelTensor& d_h_gates, const KernelTensor& d_h,
                         const KernelTensor& grad_out, const KernelTensor& act, const KernelTensor& h_gates,
                         const KernelTensor& h, const RnnCellShape& shape, const Stream& stream) override;
};

}  // namespace ferry::cpu
