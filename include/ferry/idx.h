// ferry/idx.h — idx files (MNIST, Fashion-MNIST), gzip-compressed or plain, read into byte arrays.
// Not here: Tensor, batching or normalisation (the dataset and DataLoader build on these arrays).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

// idx format (http://yann.lecun.com/exdb/mnist/), all integers big-endian:
//   2 bytes   0x00 0x00
//   1 byte    type code: 0x08 unsigned byte (the only one ferry reads), 0x09 signed byte,
//             0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64
//   1 byte    number of dimensions, 1..4 here
//   4 bytes   per dimension, its size (u32, > 0 here)
//   the rest  the data, row-major: exactly the product of the dimensions, in elements

struct IdxArray {
  std::vector<std::int64_t> shape;  // e.g. (N, 28, 28) images or (N) labels
  std::vector<std::uint8_t> data;   // row-major, product(shape) bytes

  std::int64_t numel() const;  // product of shape
};

// Parses an uncompressed idx buffer. Pure: touches nothing but [data, data + size). source_name
// only labels error messages. Throws FormatError for anything but a valid unsigned-byte idx file.
IdxArray parse_idx(const std::uint8_t* data, std::size_t size,
                   std::string_view source_name = "<buffer>");

// Reads an idx file: gzip-compressed when path ends in ".gz" (anything else is read as is).
// IoError (path + strerror) when it cannot be opened; FormatError when it is malformed, including
// gzip corruption (with zlib's message). Memory grows with the data actually read, not the header's
// claims (what the file could hold, up to 64 MiB, is reserved at once; pages are mapped as data arrives).
IdxArray read_idx_gz(const std::string& path);

// --- Fashion-MNIST (https://github.com/zalandoresearch/fashion-mnist) ----------------------------

inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct FashionMnistFiles {  // full paths, each NAME.gz or (uncompressed) NAME
  std::string train_images;  // train-images-idx3-ubyte[.gz]  (60000, 28, 28)
  std::string train_labels;  // train-labels-idx1-ubyte[.gz]  (60000)
  std::string test_images;   // t10k-images-idx3-ubyte[.gz]   (10000, 28, 28)
  std::string test_labels;   // t10k-labels-idx1-ubyte[.gz]   (10000)
};

// The four files in dir, each the .gz name if present, else the uncompressed one. Throws IoError naming the first
// missing folder or file, and how to get them: Debian's package dataset-fashion-mnist, or --data DIR. A folder that
// cannot be read is said so with the system's reason; a name that is there but is no regular file (a directory) is
// named as such, without the package hint.
FashionMnistFiles find_fashion_mnist(const std::string& dir = kDefaultFashionMnistDir);

struct RawDataset {
  IdxArray images;  // (N, 28, 28) uint8, pixel values 0..255
  IdxArray labels;  // (N) uint8, class indices 0..9
};

// Loads the train (60000) or test (10000) split. Throws FormatError when images are not
// (N, 28, 28), labels are not (N) with the same N, or a label is outside 0..9.
RawDataset load_fashion_mnist_split(const FashionMnistFiles& files, bool train);

}  // namespace ferry
