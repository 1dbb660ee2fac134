// ferry/nn/clip_grad.h — gradient clipping, as torch.nn.utils: scale every gradient so that their joint norm is at
// most max_norm, or clamp each element. Both run on the gradients' device with no host read (the scale is
// min(1, max_norm / (norm + 1e-6)), applied always), so they fit inside a captured step (ferry/step_graph.h).
// Not here: the optimizers (ferry/optim.h), which read the clipped gradients.
#pragma once

#include <limits>
#include <vector>

#include "ferry/tensor.h"

namespace ferry::nn::utils {

// The p-norm of all the parameters' gradients together (p = norm_type: 2 by default, any p > 0, or infinity for
// the largest |element|), as if they were one vector, computed as PyTorch does: the norm of each gradient, then
// the norm of those. Each gradient is then multiplied by min(1, max_norm / (total + 1e-6)), in place. Parameters
// without a gradient are skipped. Returns the total norm before clipping: a 0-dim float tensor on the gradients'
// device (0 when no parameter has a gradient); reading it is a sync, and it is left to the caller.
// error_if_nonfinite: a NaN or infinite total is an Error instead of NaN gradients (one read back, a sync the
// ledger names "clip_grad_norm_ (error_if_nonfinite)").
// InvalidArgument: max_norm negative or NaN, norm_type <= 0 or NaN, gradients on different devices, or an integer
// gradient.
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

// Clamps each element of each gradient to [-clip_value, clip_value], in place. InvalidArgument: clip_value negative
// or NaN.
void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value);

constexpr double kInfinityNorm = std::numeric_limits<double>::infinity();  // norm_type for the largest |element|

}  // namespace ferry::nn::utils
