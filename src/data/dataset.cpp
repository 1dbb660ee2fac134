// dataset.cpp — Fashion-MNIST's idx files turned into normalised float tensors on the host.
#include "ferry/dataset.h"

#include <algorithm>
#include <cstdint>

#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/idx.h"
#include "ferry/ops.h"

namespace ferry {

Dataset load_fashion_mnist(const std::string& dir, bool train, std::int64_t limit) {
  const FashionMnistFiles files = find_fashion_mnist(dir);
  const RawDataset raw = load_fashion_mnist_split(files, train);
  const std::int64_t h = raw.images.shape[1], w = raw.images.shape[2];
  const std::int64_t n = limit < 0 ? raw.images.shape[0] : std::min(limit, raw.images.shape[0]);
  // Each of the 256 pixel values normalised by the ops a whole image tensor would go through, then every pixel
  // looked up: bit for bit (x.to(float32) / 255 - mean) / std, in one pass and one buffer instead of four
  // tensors the size of the split.
  Tensor levels = empty({256}, {.dtype = DType::UInt8});
  std::uint8_t* level = levels.data<std::uint8_t>();
  for (int v = 0; v < 256; ++v) level[v] = static_cast<std::uint8_t>(v);
  const Tensor table = (levels.to(DType::Float32) * (1.0 / 255.0) - kFashionMnistMean) * (1.0 / kFashionMnistStd);
  const float* normalised = table.data<float>();
  Dataset dataset;
  dataset.images = empty({n, 1, h, w});
  float* images = dataset.images.data<float>();
  const std::uint8_t* pixels = raw.images.data.data();
  for (std::int64_t i = 0; i < n * h * w; ++i) images[i] = normalised[pixels[i]];
  dataset.labels = empty({n}, {.dtype = DType::Int64});
  std::int64_t* labels = dataset.labels.data<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) labels[i] = raw.labels.data[static_cast<std::size_t>(i)];
  return dataset;
}

Dataset take(const Dataset& dataset, std::int64_t count) {
  FERRY_CHECK(count >= 0, InvalidArgument, "take: expected a non-negative count, got ", count);
  if (count >= dataset.size()) return dataset;
  return {dataset.images.narrow(0, 0, count).contiguous(), dataset.labels.narrow(0, 0, count).contiguous()};
}

}  // namespace ferry
