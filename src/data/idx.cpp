// src/data/idx.cpp — idx files (MNIST, Fashion-MNIST): validation, gzip reading, finding the files.
// Not here: tensors, shuffling or batching (the dataset and DataLoader build on these byte arrays).

#include "ferry/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <unistd.h>

#include "ferry/error.h"

namespace ferry {
namespace {

constexpr std::uint8_t kUnsignedByteType = 0x08;
constexpr int kMaxIdxRank = 4;

struct IdxTypeCode {
  std::uint8_t code;
  const char* name;
};
constexpr IdxTypeCode kIdxTypeCodes[] = {
    {0x08, "unsigned byte"}, {0x09, "signed byte"}, {0x0B, "int16"},
    {0x0C, "int32"},         {0x0D, "float32"},     {0x0E, "float64"},
};

std::string hex_byte(std::uint8_t byte) {
  constexpr char kDigits[] = "0123456789abcdef";
  return std::string("0x") + kDigits[byte >> 4] + kDigits[byte & 0xF];
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + ")";
}

std::string errno_text(int error_number) {
  return error_number == 0 ? std::string("unknown error")
                           : std::string(std::strerror(error_number));
}

// Checks the 4-byte prefix (magic, type code, rank) and returns the rank.
int parse_idx_prefix(const std::uint8_t* data, std::size_t size, const std::string& where) {
  FERRY_CHECK(size >= 4, FormatError, where, ": holds only ", size,
              " bytes, shorter than the 4-byte idx magic (0x00 0x00, type code, rank)");
  if (data[0] != 0x00 || data[1] != 0x00) {
    const bool looks_gzip = data[0] == 0x1F && data[1] == 0x8B;
    throw FormatError(
        detail::concat(where, ": bad magic: the file starts with ", hex_byte(data[0]), " ",
                       hex_byte(data[1]), ", an idx file with 0x00 0x00",
                       looks_gzip ? " (these bytes start a gzip file: name it .gz)" : ""));
  }
  const std::uint8_t type_code = data[2];
  if (type_code != kUnsignedByteType) {
    for (const IdxTypeCode& known : kIdxTypeCodes)
      FERRY_CHECK(known.code != type_code, FormatError, where, ": unsupported type code ",
                  hex_byte(type_code), " (", known.name, "); ferry reads only ",
                  hex_byte(kUnsignedByteType), " (unsigned byte)");
    throw FormatError(detail::concat(where, ": unknown type code ", hex_byte(type_code),
                                     " (idx type codes are 0x08, 0x09, 0x0b, 0x0c, 0x0d, 0x0e)"));
  }
  const int rank = data[3];
  FERRY_CHECK(rank >= 1 && rank <= kMaxIdxRank, FormatError, where, ": number of dimensions is ",
              rank, "; expected 1 to ", kMaxIdxRank);
  return rank;
}

struct IdxHeader {
  std::vector<std::int64_t> shape;
  std::size_t header_bytes = 0;  // 4 + 4 * rank
  std::size_t data_bytes = 0;    // product of shape (one byte per element)
};

// Parses the whole header from the first bytes of a file (data points at byte 0).
IdxHeader parse_idx_header(const std::uint8_t* data, std::size_t size, const std::string& where) {
  const int rank = parse_idx_prefix(data, size, where);
  IdxHeader header;
  header.header_bytes = 4 + 4 * static_cast<std::size_t>(rank);
  FERRY_CHECK(size >= header.header_bytes, FormatError, where, ": truncated header: ", rank,
              " dimensions need ", header.header_bytes, " bytes of header, found ", size);
  std::int64_t count = 1;
  bool overflowed = false;
  for (int axis = 0; axis < rank; ++axis) {
    const std::uint8_t* field = data + 4 + 4 * axis;
    const std::uint32_t dim = (std::uint32_t{field[0]} << 24) | (std::uint32_t{field[1]} << 16) |
                              (std::uint32_t{field[2]} << 8) | std::uint32_t{field[3]};
    FERRY_CHECK(dim > 0, FormatError, where, ": dimension ", axis,
                " is 0; every dimension must be > 0");
    header.shape.push_back(dim);
    overflowed = overflowed || __builtin_mul_overflow(count, std::int64_t{dim}, &count);
  }
  FERRY_CHECK(!overflowed && static_cast<std::uint64_t>(count) <= SIZE_MAX, FormatError, where,
              ": dimensions ", shape_string(header.shape),
              " hold more elements than 64 bits count");
  header.data_bytes = static_cast<std::size_t>(count);
  return header;
}

void check_data_size(const IdxHeader& header, std::size_t found, const std::string& where) {
  FERRY_CHECK(found >= header.data_bytes, FormatError, where, ": truncated: expected ",
              header.data_bytes, " bytes of data, found ", found, " (shape ",
              shape_string(header.shape), ")");
  FERRY_CHECK(found == header.data_bytes, FormatError, where, ": ", found - header.data_bytes,
              " bytes of extra data after the expected ", header.data_bytes, " bytes (shape ",
              shape_string(header.shape), ")");
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// A gzip (or plain) file read through zlib, with its errors turned into ferry's.
class GzipReader {
 public:
  GzipReader(const std::string& path, const std::string& where) : path_(path), where_(where) {
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    FERRY_CHECK(file_ != nullptr, IoError, "cannot read idx file '", path,
                "': ", errno_text(errno));
    gzbuffer(file_, 1 << 17);
  }
  ~GzipReader() { gzclose(file_); }
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  // Reads up to `count` bytes; fewer only at the end of the stream.
  std::size_t read(std::uint8_t* into, std::size_t count) {
    std::size_t filled = 0;
    while (filled < count) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(count - filled, 1u << 30));
      const int got = gzread(file_, into + filled, chunk);
      if (got < 0) throw_zlib_error();
      if (got == 0) {
        throw_zlib_error_if_any();  // a stream cut short ends in an error, not a clean end
        break;
      }
      filled += static_cast<std::size_t>(got);
    }
    return filled;
  }

  // Reads to the end of the stream and counts the bytes, keeping none.
  std::size_t skip_to_end() {
    std::vector<std::uint8_t> scratch(1 << 16);
    std::size_t total = 0;
    while (std::size_t got = read(scratch.data(), scratch.size())) total += got;
    return total;
  }

  bool is_gzip() { return gzdirect(file_) == 0; }

 private:
  void throw_zlib_error_if_any() {
    int error_code = Z_OK;
    gzerror(file_, &error_code);
    if (error_code != Z_OK) throw_zlib_error();
  }
  [[noreturn]] void throw_zlib_error() {
    const int saved_errno = errno;
    int error_code = Z_OK;
    const char* zlib_message = gzerror(file_, &error_code);
    if (error_code == Z_ERRNO) throw IoError(detail::concat(where_, ": ", errno_text(saved_errno)));
    // zlib writes "<path>: <message>"; the path is already in ours.
    std::string_view message = zlib_message != nullptr ? zlib_message : "unknown zlib error";
    const std::string prefix = path_ + ": ";
    if (message.substr(0, prefix.size()) == prefix) message.remove_prefix(prefix.size());
    throw FormatError(detail::concat(where_, ": gzip data is corrupt or truncated: ", message,
                                     " (zlib error ", error_code, ")"));
  }

  std::string path_;
  std::string where_;
  gzFile file_ = nullptr;
};

}  // namespace

std::int64_t IdxArray::numel() const {
  std::int64_t count = 1;
  for (const std::int64_t dim : shape)
    FERRY_CHECK(dim >= 0 && !__builtin_mul_overflow(count, dim, &count), InvalidArgument,
                "idx array shape ", shape_string(shape), " has a negative or too large dimension");
  return count;
}

IdxArray parse_idx(const std::uint8_t* data, std::size_t size, std::string_view source_name) {
  const std::string where = detail::concat("idx file '", source_name, "'");
  const IdxHeader header = parse_idx_header(data, size, where);
  check_data_size(header, size - header.header_bytes, where);
  IdxArray array;
  array.shape = header.shape;
  array.data.assign(data + header.header_bytes, data + size);
  return array;
}

IdxArray read_idx_gz(const std::string& path) {
  const std::string where = detail::concat("idx file '", path, "'");
  GzipReader reader(path, where);

  std::uint8_t header_bytes[4 + 4 * kMaxIdxRank];
  std::size_t got = reader.read(header_bytes, 4);
  if (ends_with(path, ".gz") && got > 0)
    FERRY_CHECK(
        reader.is_gzip(), FormatError, where,
        ": the name ends in .gz but the file is not gzip-compressed (it does not start with "
        "0x1f 0x8b)");
  const int rank = parse_idx_prefix(header_bytes, got, where);
  got += reader.read(header_bytes + 4, 4 * static_cast<std::size_t>(rank));
  const IdxHeader header = parse_idx_header(header_bytes, got, where);

  // Grow with the data that arrives, so a header that claims terabytes costs nothing up front: the
  // first read asks for 64 KiB, each later one for twice as much, up to 4 MiB at a time. Reserved at once:
  // what the header claims, but no more than the file could hold (its own size when plain; deflate expands
  // at most 1032 to 1) nor 64 MiB. So Fashion-MNIST's 47 MB of training images are never moved by a
  // reallocation (each move faulted in a fresh buffer's pages again: ~0.5 s of a short `ferry train`),
  // and a 12-byte file claiming 16 MB reserves 12 KB, not 16 MB (a slow input fuzz_idx once found).
  IdxArray array;
  array.shape = header.shape;
  constexpr std::size_t kMaxChunkBytes = std::size_t{1} << 22;
  constexpr std::uintmax_t kMaxReservedBytes = std::uintmax_t{1} << 26;
  constexpr std::uintmax_t kDeflateMaxRatio = 1032;
  std::error_code size_error;
  const std::uintmax_t file_bytes = std::filesystem::file_size(path, size_error);
  if (!size_error) {
    const std::uintmax_t capped = std::min(file_bytes, kMaxReservedBytes);
    const std::uintmax_t could_hold = reader.is_gzip() ? capped * kDeflateMaxRatio : capped;
    array.data.reserve(static_cast<std::size_t>(
        std::min({std::uintmax_t{header.data_bytes}, could_hold, kMaxReservedBytes})));
  }
  std::size_t chunk_bytes = std::size_t{1} << 16;
  while (array.data.size() < header.data_bytes) {
    const std::size_t already = array.data.size();
    const std::size_t want = std::min(chunk_bytes, header.data_bytes - already);
    array.data.resize(already + want);
    const std::size_t arrived = reader.read(array.data.data() + already, want);
    array.data.resize(already + arrived);
    if (arrived < want) break;
    chunk_bytes = std::min(2 * chunk_bytes, kMaxChunkBytes);
  }
  const std::size_t extra = array.data.size() == header.data_bytes ? reader.skip_to_end() : 0;
  check_data_size(header, array.data.size() + extra, where);
  return array;
}

FashionMnistFiles find_fashion_mnist(const std::string& dir) {
  namespace fs = std::filesystem;
  constexpr const char* kHint =
      "install Debian's package dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or "
      "pass --data DIR";
  std::error_code error;
  const fs::file_status folder = fs::status(dir, error);
  // A folder that is there but cannot be looked into (permissions, an I/O error) is not "missing": installing the
  // package would not help. Said with the system's reason.
  if (error && error != std::errc::no_such_file_or_directory) {
    throw IoError(detail::concat("cannot read the Fashion-MNIST folder '", dir, "': ", error.message()));
  }
  FERRY_CHECK(fs::is_directory(folder), IoError, "Fashion-MNIST folder '", dir, "' ",
              fs::exists(folder) ? "is not a folder" : "does not exist", "; ", kHint);
  // Files are looked up by name (stat), which needs the folder's search permission, not its read permission.
  if (access(dir.c_str(), X_OK) != 0) {
    const int saved_errno = errno;
    throw IoError(detail::concat("cannot read the Fashion-MNIST folder '", dir, "': ", errno_text(saved_errno)));
  }
  // Each file gzip-compressed, as Debian and the Fashion-MNIST repository ship them, or uncompressed (what
  // `gunzip *.gz` or torchvision's raw/ folder leaves): the .gz name first, then the plain one.
  const auto find = [&](const char* name) {
    const std::string gz = (fs::path(dir) / (std::string(name) + ".gz")).string();
    const std::string plain = (fs::path(dir) / name).string();
    for (const std::string* file : {&gz, &plain}) {
      const fs::file_status status = fs::status(*file, error);
      if (error && error != std::errc::no_such_file_or_directory) {
        throw IoError(detail::concat("cannot read Fashion-MNIST file '", *file, "': ", error.message()));
      }
      if (fs::is_regular_file(status)) return *file;
      // There but not a file (a folder of that name): installing the package would not help.
      FERRY_CHECK(!fs::exists(status), IoError, "Fashion-MNIST file '", *file, "' is not a regular file (it is ",
                  fs::is_directory(status) ? "a directory" : "a special file",
                  "); put the idx file there (gzip-compressed or not), or pass --data DIR");
    }
    throw IoError(detail::concat("Fashion-MNIST file '", gz, "' is missing (nor is there an uncompressed '", name,
                                 "'); ", kHint));
  };
  return {
      .train_images = find("train-images-idx3-ubyte"),
      .train_labels = find("train-labels-idx1-ubyte"),
      .test_images = find("t10k-images-idx3-ubyte"),
      .test_labels = find("t10k-labels-idx1-ubyte"),
  };
}

RawDataset load_fashion_mnist_split(const FashionMnistFiles& files, bool train) {
  const std::string& images_path = train ? files.train_images : files.test_images;
  const std::string& labels_path = train ? files.train_labels : files.test_labels;
  RawDataset dataset{.images = read_idx_gz(images_path), .labels = read_idx_gz(labels_path)};
  const std::vector<std::int64_t>& image_shape = dataset.images.shape;
  const std::vector<std::int64_t>& label_shape = dataset.labels.shape;
  FERRY_CHECK(image_shape.size() == 3 && image_shape[1] == 28 && image_shape[2] == 28, FormatError,
              "Fashion-MNIST images '", images_path, "' have shape ", shape_string(image_shape),
              ", expected (N, 28, 28)");
  FERRY_CHECK(label_shape.size() == 1, FormatError, "Fashion-MNIST labels '", labels_path,
              "' have shape ", shape_string(label_shape), ", expected (N)");
  FERRY_CHECK(image_shape[0] == label_shape[0], FormatError, "Fashion-MNIST images '", images_path,
              "' hold ", image_shape[0], " images but labels '", labels_path, "' hold ",
              label_shape[0], " labels; they must agree");
  for (std::size_t i = 0; i < dataset.labels.data.size(); ++i)
    FERRY_CHECK(dataset.labels.data[i] <= 9, FormatError, "Fashion-MNIST labels '", labels_path,
                "': label ", int{dataset.labels.data[i]}, " at index ", i, " is outside 0..9");
  return dataset;
}

}  // namespace ferry
