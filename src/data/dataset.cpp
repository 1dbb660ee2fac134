// dataset.cpp — Fashion-MNIST's idx files turned into normalised float tensors on the host.
#include "ferry/dataset.h"

#include <cstring>

#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/idx.h"
#include "ferry/ops.h"

namespace ferry {

Dataset load_fashion_mnist(const std::string& dir, bool train) {
  const FashionMnistFiles files = find_fashion_mnist(dir);
  const RawDataset raw = load_fashion_mnist_split(files, train);
  const std::int64_t n = raw.images.shape[0], h = raw.images.shape[1], w = raw.images.shape[2];
  Tensor pixels = empty({n, 1, h, w}, {.dtype = DType::UInt8});
  std::memcpy(pixels.data_ptr(), raw.images.data.data(), raw.images.data.size());
  Tensor labels = empty({n}, {.dtype = DType::UInt8});
  std::memcpy(labels.data_ptr(), raw.labels.data.data(), raw.labels.data.size());
  Dataset dataset;
  dataset.images = (pixels.to(DType::Float32) * (1.0 / 255.0) - kFashionMnistMean) * (1.0 / kFashionMnistStd);
  dataset.labels = labels.to(DType::Int64);
  return dataset;
}

Dataset take(const Dataset& dataset, std::int64_t count) {
  FERRY_CHECK(count >= 0, InvalidArgument, "take: expected a non-negative count, got ", count);
  if (count >= dataset.size()) return dataset;
  return {dataset.images.narrow(0, 0, count).contiguous(), dataset.labels.narrow(0, 0, count).contiguous()};
}

}  // namespace ferry
