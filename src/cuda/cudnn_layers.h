// cudnn_layers.h — convolution and BatchNorm (training) through cuDNN's descriptor API, which cuDNN 8
// and 9 both have. One handle per device; convolution algorithms chosen once per shape by timing them
// (cudnnFind*, as PyTorch's cudnn.benchmark) and cached; fp32 without TF32 unless allow_tf32().
// Every *_supported call is cheap after its first time, never throws, and says false when cuDNN is not
// built in, cannot be loaded, is switched off (FERRY_CUDNN=0), or has no algorithm for the shape: the
// nn layer then composes the layer from ferry's own kernels. Not here: the autograd side (src/nn).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "ferry/backend.h"

namespace ferry::cuda {

// Tensors are contiguous NCHW; weight (O, C, kh, kw). The caller has made `device` current.
bool cudnn_conv2d_supported(const Backend::Conv2dShape& shape, DType dtype, int device);
void cudnn_conv2d_forward(const KernelTensor& out, const KernelTensor& input, const KernelTensor& weight,
                          const Backend::Conv2dShape& shape, float beta, int device, cudaStream_t stream);
void cudnn_conv2d_backward_input(const KernelTensor& grad_input, const KernelTensor& grad_out,
                                 const KernelTensor& weight, const Backend::Conv2dShape& shape, int device,
                                 cudaStream_t stream);
void cudnn_conv2d_backward_weight(const KernelTensor& grad_weight, const KernelTensor& grad_out,
                                  const KernelTensor& input, const Backend::Conv2dShape& shape, int device,
                                  cudaStream_t stream);

// "cuDNN 9.19.0 (conv2d, batch_norm)", "cuDNN switched off (FERRY_CUDNN=0)", "no cuDNN in this build", ...
std::string cudnn_description(int device);
// Makes device `device`'s cuDNN handle now if no layer has (before a graph capture). Never throws.
void prepare_cudnn(int device);

bool cudnn_batch_norm_supported(const Backend::BatchNormShape& shape, DType dtype, int device);
void cudnn_batch_norm_forward(const KernelTensor& out, const KernelTensor& x, const KernelTensor& weight,
                              const KernelTensor& bias, const KernelTensor& running_mean,
                              const KernelTensor& running_var, const KernelTensor& save_mean,
                              const KernelTensor& save_invstd, const Backend::BatchNormShape& shape, double factor,
                              int device, cudaStream_t stream);
void cudnn_batch_norm_backward(const KernelTensor& grad_x, const KernelTensor& grad_weight,
                               const KernelTensor& grad_bias, const KernelTensor& grad_out, const KernelTensor& x,
                               const KernelTensor& weight, const KernelTensor& save_mean,
                               const KernelTensor& save_invstd, const Backend::BatchNormShape& shape, int device,
                               cudaStream_t stream);

}  // namespace ferry::cuda
