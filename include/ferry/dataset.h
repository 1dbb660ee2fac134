// ferry/dataset.h — an in-memory labelled image dataset, and Fashion-MNIST loaded into one.
// Not here: batching and placement on a device (ferry/dataloader.h), the idx format (ferry/idx.h).
#pragma once

#include <string>

#include "ferry/tensor.h"

namespace ferry {

struct Dataset {
  Tensor images;  // (N, C, H, W) float32, normalised, on the host
  Tensor labels;  // (N) int64 class indices
  std::int64_t size() const { return labels.defined() ? labels.numel() : 0; }
};

// Fashion-MNIST's pixel statistics over the training set (x in [0, 1]).
inline constexpr double kFashionMnistMean = 0.2860;
inline constexpr double kFashionMnistStd = 0.3530;
// Its ten classes, by label.
inline constexpr const char* kFashionMnistClasses[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                         "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

// The train (60000) or test (10000) split from `dir` (Debian's dataset-fashion-mnist by default), as
// (N, 1, 28, 28) images normalised to (x / 255 - mean) / std. A missing folder or file names the
// package that provides it; a corrupt file is a FormatError. `limit` >= 0 keeps the first `limit` samples
// (all when the split holds fewer): the files are still read and checked whole, but only those samples
// are converted, so a quick run on 512 images does not normalise 60000 (~190 MB of floats).
Dataset load_fashion_mnist(const std::string& dir, bool train, std::int64_t limit = -1);

// The first `count` samples (count >= size(): the whole dataset).
Dataset take(const Dataset& dataset, std::int64_t count);

}  // namespace ferry
