// tests/test_idx.cpp — idx files: gzip and plain round trips, every corruption, the Fashion-MNIST
// helpers (on the real files when installed), and load_fashion_mnist's normalised samples. Not here: the
// DataLoader.

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "ferry/dataset.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/idx.h"
#include "ferry/ops.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

// An idx file: magic 0x00 0x00, type code, rank, big-endian dims, then data.
std::vector<std::uint8_t> idx_bytes(const std::vector<std::uint32_t>& dims,
                                    const std::vector<std::uint8_t>& data,
                                    std::uint8_t type_code = 0x08) {
  std::vector<std::uint8_t> bytes = {0x00, 0x00, type_code, static_cast<std::uint8_t>(dims.size())};
  for (const std::uint32_t dim : dims)
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back((dim >> shift) & 0xFF);
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

std::vector<std::uint8_t> counting(std::size_t count) {
  std::vector<std::uint8_t> data(count);
  for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<std::uint8_t>(i * 7);
  return data;
}

void write_gz(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(file), Z_OK);
}

void write_plain(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::uint8_t> read_plain(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The FormatError message of parsing bytes with parse_idx ("" and a failure when none was thrown).
std::string parse_error_of(const std::vector<std::uint8_t>& bytes) {
  try {
    parse_idx(bytes.data(), bytes.size(), "bad.idx");
  } catch (const FormatError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a FormatError";
  return "";
}

#define EXPECT_CONTAINS(text, words) \
  EXPECT_NE(std::string(text).find(words), std::string::npos) << (text)

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           detail::concat("ferry-idx-", ::getpid(), "-", counter++, "-", test->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  std::string path(std::string_view name) const { return (dir_ / name).string(); }

  // The FormatError message of reading `bytes` gzip-compressed from a file.
  std::string read_error_of(const std::vector<std::uint8_t>& bytes) {
    const std::string file = path("bad-idx1-ubyte.gz");
    write_gz(file, bytes);
    try {
      read_idx_gz(file);
    } catch (const FormatError& error) {
      EXPECT_CONTAINS(error.what(), file);
      return error.what();
    }
    ADD_FAILURE() << "expected a FormatError";
    return "";
  }

  // Both readers reject bytes with the same words.
  void expect_rejected(const std::vector<std::uint8_t>& bytes, const std::string& words) {
    const std::string parsed = parse_error_of(bytes);
    EXPECT_CONTAINS(parsed, "bad.idx");
    EXPECT_CONTAINS(parsed, words);
    EXPECT_CONTAINS(read_error_of(bytes), words);
  }

  fs::path dir_;
};

// --- reading -------------------------------------------------------------------------------------

TEST_F(IdxTest, ReadsGzipImages) {
  const std::vector<std::uint8_t> data = counting(2 * 3 * 4);
  write_gz(path("images-idx3-ubyte.gz"), idx_bytes({2, 3, 4}, data));
  const IdxArray array = read_idx_gz(path("images-idx3-ubyte.gz"));
  EXPECT_EQ(array.shape, (std::vector<std::int64_t>{2, 3, 4}));
  EXPECT_EQ(array.data, data);
  EXPECT_EQ(array.numel(), 24);
}

TEST_F(IdxTest, ReadsGzipLabelsAndRankFour) {
  write_gz(path("labels.gz"), idx_bytes({5}, {0, 9, 3, 3, 1}));
  EXPECT_EQ(read_idx_gz(path("labels.gz")).data, (std::vector<std::uint8_t>{0, 9, 3, 3, 1}));
  write_gz(path("rank4.gz"), idx_bytes({1, 2, 3, 2}, counting(12)));
  EXPECT_EQ(read_idx_gz(path("rank4.gz")).shape, (std::vector<std::int64_t>{1, 2, 3, 2}));
}

TEST_F(IdxTest, ReadsPlainFilesWithoutGzSuffix) {
  const std::vector<std::uint8_t> bytes = idx_bytes({3, 2}, counting(6));
  write_plain(path("plain-idx2-ubyte"), bytes);
  const IdxArray array = read_idx_gz(path("plain-idx2-ubyte"));
  EXPECT_EQ(array.shape, (std::vector<std::int64_t>{3, 2}));
  EXPECT_EQ(array.data, counting(6));
}

TEST_F(IdxTest, ReadsDataLargerThanOneChunk) {
  const std::vector<std::uint8_t> data = counting(3 * 1500 * 1000);  // ~4.5 MB, over a 4 MiB chunk
  write_gz(path("large.gz"), idx_bytes({3, 1500, 1000}, data));
  const IdxArray array = read_idx_gz(path("large.gz"));
  EXPECT_EQ(array.data, data);
  // Reserved once, for what the header claims (the file could hold it): never moved while it grew.
  EXPECT_EQ(array.data.capacity(), data.size());
  write_plain(path("large-plain"), idx_bytes({3, 1500, 1000}, data));
  EXPECT_EQ(read_idx_gz(path("large-plain")).data.capacity(), data.size());
}

TEST_F(IdxTest, ParseIdxIsAPureFunctionOverABuffer) {
  const std::vector<std::uint8_t> bytes = idx_bytes({2, 2}, {1, 2, 3, 4});
  const IdxArray array = parse_idx(bytes.data(), bytes.size());
  EXPECT_EQ(array.shape, (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(array.data, (std::vector<std::uint8_t>{1, 2, 3, 4}));
}

// --- corruption: each rule, through parse_idx and through a .gz file ---------------------------

TEST_F(IdxTest, RejectsFileShorterThanTheMagic) {
  expect_rejected({0x00, 0x00, 0x08}, "holds only 3 bytes, shorter than the 4-byte idx magic");
  expect_rejected({}, "holds only 0 bytes");
}

TEST_F(IdxTest, RejectsBadMagic) {
  expect_rejected({0x01, 0x00, 0x08, 0x01, 0, 0, 0, 1, 5},
                  "bad magic: the file starts with 0x01 0x00");
  EXPECT_CONTAINS(parse_error_of({0x1f, 0x8b, 0x08, 0x00}), "start a gzip file");
}

TEST_F(IdxTest, RejectsOtherTypeCodesNamingThem) {
  expect_rejected(idx_bytes({1}, {0, 0, 0, 0}, 0x0D),
                  "unsupported type code 0x0d (float32); ferry reads only 0x08 (unsigned byte)");
  expect_rejected(idx_bytes({1}, {0}, 0x09), "unsupported type code 0x09 (signed byte)");
  expect_rejected(idx_bytes({1}, {0}, 0x07), "unknown type code 0x07");
}

TEST_F(IdxTest, RejectsRankOutsideOneToFour) {
  expect_rejected(idx_bytes({}, {}), "number of dimensions is 0; expected 1 to 4");
  expect_rejected(idx_bytes({1, 1, 1, 1, 1}, {7}), "number of dimensions is 5");
}

TEST_F(IdxTest, RejectsTruncatedHeader) {
  std::vector<std::uint8_t> bytes = idx_bytes({60000, 28, 28}, {});
  bytes.resize(10);
  expect_rejected(bytes, "truncated header: 3 dimensions need 16 bytes of header, found 10");
}

TEST_F(IdxTest, RejectsZeroDimension) {
  expect_rejected(idx_bytes({4, 0, 4}, {}), "dimension 1 is 0; every dimension must be > 0");
}

TEST_F(IdxTest, RejectsDimensionsWhoseProductOverflows) {
  expect_rejected(idx_bytes({0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {}),
                  "dimensions (4294967295, 4294967295, 4294967295, 4294967295) hold more elements");
  expect_rejected(idx_bytes({0xFFFFFFFF, 0xFFFFFFFF}, {}), "hold more elements than 64 bits count");
}

TEST_F(IdxTest, RejectsTruncatedData) {
  expect_rejected(idx_bytes({2, 3, 4}, counting(20)),
                  "truncated: expected 24 bytes of data, found 20");
}

TEST_F(IdxTest, RejectsHugeClaimsWithoutAllocatingThem) {
  // 64 GiB claimed, 10 bytes present: the reader must fail on the data, not on memory.
  expect_rejected(idx_bytes({65536, 65536, 16}, counting(10)),
                  "truncated: expected 68719476736 bytes of data, found 10");
}

TEST_F(IdxTest, RejectsExtraData) {
  expect_rejected(idx_bytes({2, 3}, counting(10)),
                  "4 bytes of extra data after the expected 6 bytes");
}

TEST_F(IdxTest, RejectsCorruptGzipWithZlibsMessage) {
  write_gz(path("good.gz"), idx_bytes({4, 100}, counting(400)));
  std::vector<std::uint8_t> gz = read_plain(path("good.gz"));
  ASSERT_GT(gz.size(), 20u);

  // A wrong CRC-32 in the 8-byte trailer.
  std::vector<std::uint8_t> bad_crc = gz;
  bad_crc[bad_crc.size() - 8] ^= 0xFF;
  write_plain(path("bad-crc.gz"), bad_crc);
  try {
    read_idx_gz(path("bad-crc.gz"));
    ADD_FAILURE() << "expected FormatError";
  } catch (const FormatError& error) {
    EXPECT_CONTAINS(error.what(), "gzip data is corrupt or truncated: incorrect data check");
    EXPECT_CONTAINS(error.what(), path("bad-crc.gz"));
  }

  // The compressed stream cut in half.
  std::vector<std::uint8_t> cut(gz.begin(),
                                gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2));
  write_plain(path("cut.gz"), cut);
  try {
    read_idx_gz(path("cut.gz"));
    ADD_FAILURE() << "expected FormatError";
  } catch (const FormatError& error) {
    EXPECT_CONTAINS(error.what(), "gzip data is corrupt or truncated: unexpected end of file");
  }

  // Garbage in the deflate stream: zlib's words vary with the byte, the error kind does not.
  for (std::size_t i = 10; i < gz.size() - 8; ++i) {
    std::vector<std::uint8_t> mangled = gz;
    mangled[i] ^= 0x5A;
    write_plain(path("mangled.gz"), mangled);
    try {
      read_idx_gz(path("mangled.gz"));  // a flip may, rarely, still decode to a valid file
    } catch (const FormatError&) {
    }
  }
}

TEST_F(IdxTest, RejectsGzNameOnAFileThatIsNotGzip) {
  write_plain(path("plain.gz"), idx_bytes({2}, {1, 2}));
  try {
    read_idx_gz(path("plain.gz"));
    ADD_FAILURE() << "expected FormatError";
  } catch (const FormatError& error) {
    EXPECT_CONTAINS(error.what(), "the name ends in .gz but the file is not gzip-compressed");
  }
}

TEST_F(IdxTest, MissingFileIsAnIoErrorNamingThePath) {
  try {
    read_idx_gz(path("absent.gz"));
    ADD_FAILURE() << "expected IoError";
  } catch (const IoError& error) {
    EXPECT_CONTAINS(error.what(), path("absent.gz"));
    EXPECT_CONTAINS(error.what(), "No such file or directory");
  }
  EXPECT_THROW(read_idx_gz(dir_.string()), IoError);  // a folder
}

TEST_F(IdxTest, NoInputCrashesParseIdx) {
  const std::vector<std::uint8_t> valid = idx_bytes({2, 3}, counting(6));
  const auto parses_or_rejects = [](const std::vector<std::uint8_t>& bytes) {
    const auto copy = std::make_unique<std::uint8_t[]>(bytes.size());  // exact size for sanitizers
    std::copy(bytes.begin(), bytes.end(), copy.get());
    try {
      parse_idx(copy.get(), bytes.size(), "mutant");
    } catch (const FormatError&) {
    }
  };
  for (std::size_t length = 0; length <= valid.size(); ++length)
    parses_or_rejects({valid.begin(), valid.begin() + static_cast<std::ptrdiff_t>(length)});
  for (std::size_t i = 0; i < valid.size(); ++i)
    for (int value = 0; value < 256; ++value) {
      std::vector<std::uint8_t> mutant = valid;
      mutant[i] = static_cast<std::uint8_t>(value);
      parses_or_rejects(mutant);
    }
}

// --- Fashion-MNIST -------------------------------------------------------------------------------

class FashionMnistTest : public IdxTest {
 protected:
  // A tiny stand-in for the real files: `count` images (count, rows, 28) and labels.
  void write_fake(const std::string& folder, std::uint32_t count, std::uint32_t labels,
                  std::uint32_t rows = 28, std::uint8_t label_value = 3) {
    fs::create_directories(folder);
    for (const char* prefix : {"train", "t10k"}) {
      write_gz(folder + "/" + prefix + "-images-idx3-ubyte.gz",
               idx_bytes({count, rows, 28}, counting(std::size_t{count} * rows * 28)));
      write_gz(folder + "/" + prefix + "-labels-idx1-ubyte.gz",
               idx_bytes({labels}, std::vector<std::uint8_t>(labels, label_value)));
    }
  }
};

TEST_F(FashionMnistTest, MissingFolderSaysHowToGetTheData) {
  try {
    find_fashion_mnist(path("nowhere"));
    ADD_FAILURE() << "expected IoError";
  } catch (const IoError& error) {
    EXPECT_CONTAINS(error.what(), path("nowhere"));
    EXPECT_CONTAINS(error.what(), "does not exist");
    EXPECT_CONTAINS(error.what(),
                    "install Debian's package dataset-fashion-mnist (apt-get install "
                    "dataset-fashion-mnist) or pass --data DIR");
  }
}

TEST_F(FashionMnistTest, MissingFileIsNamed) {
  write_fake(path("fmnist"), 5, 5);
  fs::remove(path("fmnist/t10k-labels-idx1-ubyte.gz"));
  try {
    find_fashion_mnist(path("fmnist"));
    ADD_FAILURE() << "expected IoError";
  } catch (const IoError& error) {
    EXPECT_CONTAINS(error.what(), "t10k-labels-idx1-ubyte.gz' is missing");
    EXPECT_CONTAINS(error.what(), "apt-get install dataset-fashion-mnist");
  }
}

TEST_F(FashionMnistTest, DirectoryInPlaceOfAFileIsNamedAsSuch) {
  write_fake(path("fmnist"), 5, 5);
  fs::remove(path("fmnist/t10k-labels-idx1-ubyte.gz"));
  fs::create_directory(path("fmnist/t10k-labels-idx1-ubyte.gz"));
  try {
    find_fashion_mnist(path("fmnist"));
    ADD_FAILURE() << "expected IoError";
  } catch (const IoError& error) {
    EXPECT_CONTAINS(error.what(), "t10k-labels-idx1-ubyte.gz' is not a regular file (it is a directory)");
    EXPECT_EQ(std::string(error.what()).find("install"), std::string::npos) << error.what();
  }
}

TEST_F(FashionMnistTest, LoadsBothSplitsOfSmallFiles) {
  write_fake(path("fmnist"), 5, 5);
  const FashionMnistFiles files = find_fashion_mnist(path("fmnist"));
  EXPECT_EQ(files.train_images, path("fmnist") + "/train-images-idx3-ubyte.gz");
  for (const bool train : {true, false}) {
    const RawDataset split = load_fashion_mnist_split(files, train);
    EXPECT_EQ(split.images.shape, (std::vector<std::int64_t>{5, 28, 28}));
    EXPECT_EQ(split.labels.shape, (std::vector<std::int64_t>{5}));
  }
}

// load_fashion_mnist: every pixel value normalised bit for bit as the ops would do it to the whole tensor, the
// labels widened to int64, and a limit that converts only the first samples (all of them when it asks for more).
TEST_F(FashionMnistTest, LoadsNormalisedSamplesUpToALimit) {
  write_fake(path("fmnist"), 5, 5);  // pixels 7 * i mod 256: all 256 values among the 5 * 784
  const RawDataset raw = load_fashion_mnist_split(find_fashion_mnist(path("fmnist")), true);
  Tensor pixels = empty({5, 1, 28, 28}, {.dtype = DType::UInt8});
  std::memcpy(pixels.data_ptr(), raw.images.data.data(), raw.images.data.size());
  const std::vector<float> expected =
      ((pixels.to(DType::Float32) * (1.0 / 255.0) - kFashionMnistMean) * (1.0 / kFashionMnistStd))
          .to_vector<float>();
  for (const auto& [limit, kept] : {std::pair{-1, 5}, {3, 3}, {9, 5}, {0, 0}}) {
    SCOPED_TRACE(limit);
    const Dataset dataset = load_fashion_mnist(path("fmnist"), true, limit);
    EXPECT_EQ(dataset.size(), kept);
    EXPECT_EQ(dataset.images.shape(), (Shape{kept, 1, 28, 28}));
    EXPECT_EQ(dataset.images.to_vector<float>(),
              std::vector<float>(expected.begin(), expected.begin() + std::ptrdiff_t{kept} * 28 * 28));
    EXPECT_EQ(dataset.labels.dtype(), DType::Int64);
    EXPECT_EQ(dataset.labels.to_vector<std::int64_t>(), std::vector<std::int64_t>(kept, 3));
  }
}

TEST_F(FashionMnistTest, LoadsUncompressedFiles) {
  // What `gunzip *.gz` (or torchvision's raw/ folder) leaves: the same idx files without .gz, here one split of each.
  write_fake(path("fmnist"), 5, 5);
  write_plain(path("fmnist/train-images-idx3-ubyte"), idx_bytes({5, 28, 28}, counting(5 * 28 * 28)));
  write_plain(path("fmnist/train-labels-idx1-ubyte"), idx_bytes({5}, std::vector<std::uint8_t>(5, 3)));
  fs::remove(path("fmnist/train-images-idx3-ubyte.gz"));
  fs::remove(path("fmnist/train-labels-idx1-ubyte.gz"));
  const FashionMnistFiles files = find_fashion_mnist(path("fmnist"));
  EXPECT_EQ(files.train_images, path("fmnist") + "/train-images-idx3-ubyte");
  EXPECT_EQ(files.test_images, path("fmnist") + "/t10k-images-idx3-ubyte.gz");
  const RawDataset plain = load_fashion_mnist_split(files, true);
  const RawDataset gzipped = load_fashion_mnist_split(files, false);
  EXPECT_EQ(plain.images.shape, (std::vector<std::int64_t>{5, 28, 28}));
  EXPECT_EQ(plain.images.data, gzipped.images.data);
  EXPECT_EQ(plain.labels.data, gzipped.labels.data);
}

TEST_F(FashionMnistTest, MissingFileNamesBothSpellings) {
  write_fake(path("fmnist"), 5, 5);
  fs::remove(path("fmnist/train-labels-idx1-ubyte.gz"));
  try {
    find_fashion_mnist(path("fmnist"));
    ADD_FAILURE() << "expected IoError";
  } catch (const IoError& error) {
    EXPECT_CONTAINS(error.what(), "train-labels-idx1-ubyte.gz' is missing (nor is there an uncompressed "
                                  "'train-labels-idx1-ubyte')");
  }
}

TEST_F(FashionMnistTest, FolderThatCannotBeReadIsNotCalledMissing) {
  // A symlink loop: stat fails with ELOOP, not ENOENT (and does so for root too).
  fs::create_symlink(path("loop"), path("loop"));
  try {
    find_fashion_mnist(path("loop"));
    ADD_FAILURE() << "expected IoError";
  } catch (const IoError& error) {
    EXPECT_CONTAINS(error.what(), "cannot read the Fashion-MNIST folder '" + path("loop") + "'");
    EXPECT_EQ(std::string(error.what()).find("does not exist"), std::string::npos) << error.what();
    EXPECT_EQ(std::string(error.what()).find("install"), std::string::npos) << error.what();
  }
}

TEST_F(FashionMnistTest, FolderWithoutPermissionIsNotCalledMissing) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any folder";
  write_fake(path("fmnist"), 5, 5);
  fs::permissions(path("fmnist"), fs::perms::none);
  std::string message;
  try {
    find_fashion_mnist(path("fmnist"));
  } catch (const IoError& error) {
    message = error.what();
  }
  fs::permissions(path("fmnist"), fs::perms::owner_all);
  EXPECT_CONTAINS(message, "cannot read the Fashion-MNIST folder");
  EXPECT_CONTAINS(message, std::strerror(EACCES));
}

TEST_F(FashionMnistTest, RejectsImagesAndLabelsThatDisagreeInCount) {
  write_fake(path("fmnist"), 5, 4);
  try {
    load_fashion_mnist_split(find_fashion_mnist(path("fmnist")), true);
    ADD_FAILURE() << "expected FormatError";
  } catch (const FormatError& error) {
    EXPECT_CONTAINS(error.what(), "hold 5 images but labels");
    EXPECT_CONTAINS(error.what(), "hold 4 labels; they must agree");
  }
}

TEST_F(FashionMnistTest, RejectsImagesThatAreNot28By28) {
  write_fake(path("fmnist"), 5, 5, 27);
  try {
    load_fashion_mnist_split(find_fashion_mnist(path("fmnist")), false);
    ADD_FAILURE() << "expected FormatError";
  } catch (const FormatError& error) {
    EXPECT_CONTAINS(error.what(), "have shape (5, 27, 28), expected (N, 28, 28)");
  }
}

TEST_F(FashionMnistTest, RejectsLabelsOutsideZeroToNine) {
  write_fake(path("fmnist"), 5, 5, 28, 10);
  try {
    load_fashion_mnist_split(find_fashion_mnist(path("fmnist")), true);
    ADD_FAILURE() << "expected FormatError";
  } catch (const FormatError& error) {
    EXPECT_CONTAINS(error.what(), "label 10 at index 0");
    EXPECT_CONTAINS(error.what(), "is outside 0..9");
  }
}

TEST_F(FashionMnistTest, LoadsTheRealDataWhenInstalled) {
  if (!fs::is_directory(kDefaultFashionMnistDir))
    GTEST_SKIP() << kDefaultFashionMnistDir
                 << " is absent (apt-get install dataset-fashion-mnist to run this test)";
  const FashionMnistFiles files = find_fashion_mnist();
  const RawDataset train = load_fashion_mnist_split(files, true);
  EXPECT_EQ(train.images.shape, (std::vector<std::int64_t>{60000, 28, 28}));
  EXPECT_EQ(train.labels.shape, (std::vector<std::int64_t>{60000}));
  ASSERT_EQ(train.images.data.size(), 60000u * 28 * 28);
  std::array<int, 10> per_class{};
  for (const std::uint8_t label : train.labels.data) {
    ASSERT_LT(label, 10);
    ++per_class[label];
  }
  for (int label = 0; label < 10; ++label) EXPECT_EQ(per_class[label], 6000) << "class " << label;

  const RawDataset test = load_fashion_mnist_split(files, false);
  EXPECT_EQ(test.images.shape, (std::vector<std::int64_t>{10000, 28, 28}));
  EXPECT_EQ(test.labels.shape, (std::vector<std::int64_t>{10000}));
  // Pixels use the whole byte range; the images are not blank.
  std::uint8_t brightest = 0;
  for (const std::uint8_t pixel : test.images.data) brightest = std::max(brightest, pixel);
  EXPECT_EQ(brightest, 255);
}

}  // namespace
}  // namespace ferry
