// cudnn.h (emulator shim) — found before cuDNN's own header when the cuda backend is built for the
// host-emulated GPU (tests/cuda_on_host). It renames the cuDNN entry points ferry calls to ferry_emu_<name>
// and includes the real header, whose declarations then declare the renamed functions that
// tests/cuda_on_host/cudnn.cpp defines; the real libcudnn is left alone. As cublas_v2.h: not an
// implementation, and no declarations of its own.
#pragma once

#if defined(CUDNN_H_) || defined(CUDNN_GRAPH_H_)
#error "cuDNN's header was included before the emulator's shim (tests/cuda_on_host/include)"
#endif

// The runtime shim first: cuDNN's headers pull in CUDA types, and every later CUDA header must find the
// runtime's declarations already renamed.
#include <cuda_runtime_api.h>

#define cudnnCreate ferry_emu_cudnnCreate
#define cudnnDestroy ferry_emu_cudnnDestroy
#define cudnnSetStream ferry_emu_cudnnSetStream
#define cudnnGetStream ferry_emu_cudnnGetStream
#define cudnnGetErrorString ferry_emu_cudnnGetErrorString
#define cudnnGetVersion ferry_emu_cudnnGetVersion
#define cudnnCreateTensorDescriptor ferry_emu_cudnnCreateTensorDescriptor
#define cudnnDestroyTensorDescriptor ferry_emu_cudnnDestroyTensorDescriptor
#define cudnnSetTensor4dDescriptor ferry_emu_cudnnSetTensor4dDescriptor
#define cudnnCreateFilterDescriptor ferry_emu_cudnnCreateFilterDescriptor
#define cudnnDestroyFilterDescriptor ferry_emu_cudnnDestroyFilterDescriptor
#define cudnnSetFilter4dDescriptor ferry_emu_cudnnSetFilter4dDescriptor
#define cudnnCreateConvolutionDescriptor ferry_emu_cudnnCreateConvolutionDescriptor
#define cudnnDestroyConvolutionDescriptor ferry_emu_cudnnDestroyConvolutionDescriptor
#define cudnnSetConvolution2dDescriptor ferry_emu_cudnnSetConvolution2dDescriptor
#define cudnnSetConvolutionMathType ferry_emu_cudnnSetConvolutionMathType
#define cudnnGetConvolution2dForwardOutputDim ferry_emu_cudnnGetConvolution2dForwardOutputDim
#define cudnnFindConvolutionForwardAlgorithm ferry_emu_cudnnFindConvolutionForwardAlgorithm
#define cudnnFindConvolutionBackwardDataAlgorithm ferry_emu_cudnnFindConvolutionBackwardDataAlgorithm
#define cudnnFindConvolutionBackwardFilterAlgorithm ferry_emu_cudnnFindConvolutionBackwardFilterAlgorithm
#define cudnnConvolutionForward ferry_emu_cudnnConvolutionForward
#define cudnnConvolutionBackwardData ferry_emu_cudnnConvolutionBackwardData
#define cudnnConvolutionBackwardFilter ferry_emu_cudnnConvolutionBackwardFilter
#define cudnnDeriveBNTensorDescriptor ferry_emu_cudnnDeriveBNTensorDescriptor
#define cudnnBatchNormalizationForwardTraining ferry_emu_cudnnBatchNormalizationForwardTraining
#define cudnnBatchNormalizationBackward ferry_emu_cudnnBatchNormalizationBackward

#include_next <cudnn.h>
