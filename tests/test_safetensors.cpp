// tests/test_safetensors.cpp — safetensors: round trips, exact byte layout, one test per rule,
// atomic writes. Not here: Tensor conversion (tested with the core).

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <bit>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ferry/error.h"
#include "ferry/safetensors.h"
#include "test_helpers.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
static_assert(std::endian::native == std::endian::little, "the tests build little-endian bytes");

std::vector<std::byte> bytes_of(std::string_view text) {
  const auto* begin = reinterpret_cast<const std::byte*>(text.data());
  return {begin, begin + text.size()};
}

template <typename T>
std::vector<std::byte> bytes_of_values(const std::vector<T>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::string text_of(const std::vector<std::byte>& bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// A file from its parts: the 8-byte length of `header`, header, data.
std::vector<std::byte> file_from(std::string_view header, std::string_view data = {}) {
  std::string out;
  std::uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((length >> (8 * i)) & 0xFF));
  out.append(header);
  out.append(data);
  return bytes_of(out);
}

std::vector<std::byte> file_with_declared_length(std::uint64_t declared_length,
                                                 std::string_view rest) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((declared_length >> (8 * i)) & 0xFF));
  out.append(rest);
  return bytes_of(out);
}

// Parses bytes that must be rejected; returns the FormatError's message ("" when none was thrown).
std::string format_error_of(const std::vector<std::byte>& bytes) {
  try {
    parse_safetensors(bytes.data(), bytes.size(), "bad.safetensors");
  } catch (const FormatError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a FormatError";
  return "";
}

// Every rejection names the file and carries its rule's distinctive words.
#define EXPECT_REJECTED(bytes, words)                                         \
  do {                                                                        \
    const std::string message = format_error_of(bytes);                       \
    EXPECT_NE(message.find("bad.safetensors"), std::string::npos) << message; \
    EXPECT_NE(message.find(words), std::string::npos) << message;             \
  } while (0)

std::string entry_json(std::string_view name, std::string_view dtype, std::string_view shape,
                       std::string_view offsets) {
  return detail::concat("\"", name, "\":{\"dtype\":\"", dtype, "\",\"shape\":", shape,
                        ",\"data_offsets\":", offsets, "}");
}

// A header object from entry_json members: {member,member,...}.
std::string object_of(std::initializer_list<std::string> members) {
  std::string text = "{";
  for (const std::string& member : members) {
    if (text.size() > 1) text += ",";
    text += member;
  }
  text += "}";
  return text;
}

SafetensorsFile every_dtype_file() {
  SafetensorsFile file;
  file.metadata = {
      {"format", "pt"}, {"epoch", "3"}, {"note", "ünïcode \"quoted\"\n"}, {"ключ", "値😀"}};
  file.entries.push_back({"weights", DType::Float32, {2, 3},
                          bytes_of_values<float>({1.5f, -2.f, 3.25f, 0.f, -0.f, 1e30f})});
  file.entries.push_back(
      {"doubles", DType::Float64, {3}, bytes_of_values<double>({1e-300, 2., -3.})});
  file.entries.push_back(
      {"ints", DType::Int32, {2, 2}, bytes_of_values<std::int32_t>({1, -2, 3, -4})});
  file.entries.push_back(
      {"step", DType::Int64, {}, bytes_of_values<std::int64_t>({1234567890123})});
  file.entries.push_back({"empty", DType::UInt8, {0}, {}});
  file.entries.push_back({"empty_matrix", DType::Float32, {3, 0}, {}});
  file.entries.push_back(
      {"pixels", DType::UInt8, {5}, bytes_of_values<std::uint8_t>({0, 1, 127, 128, 255})});
  file.entries.push_back(
      {"mask", DType::Bool, {2, 2}, bytes_of_values<std::uint8_t>({1, 0, 0, 1})});
  return file;
}

void expect_same(const SafetensorsFile& expected, const SafetensorsFile& actual) {
  EXPECT_EQ(expected.metadata, actual.metadata);
  ASSERT_EQ(expected.entries.size(), actual.entries.size());
  for (std::size_t i = 0; i < expected.entries.size(); ++i) {
    SCOPED_TRACE(expected.entries[i].name);
    EXPECT_EQ(expected.entries[i].name, actual.entries[i].name);
    EXPECT_EQ(expected.entries[i].dtype, actual.entries[i].dtype);
    EXPECT_EQ(expected.entries[i].shape, actual.entries[i].shape);
    EXPECT_EQ(expected.entries[i].bytes, actual.entries[i].bytes);
  }
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           detail::concat("ferry-safetensors-", ::getpid(), "-", counter++, "-", test->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ignored);
    fs::remove_all(dir_, ignored);
  }
  std::string path(std::string_view name) const { return (dir_ / name).string(); }
  // Names in the folder that look like write_safetensors' temporary files.
  std::vector<std::string> leftover_temporaries(const fs::path& folder) const {
    std::vector<std::string> names;
    for (const auto& item : fs::directory_iterator(folder))
      if (item.path().filename().string().find(".tmp.") != std::string::npos)
        names.push_back(item.path().filename().string());
    return names;
  }
  static void write_text(const std::string& file_path, std::string_view text) {
    std::ofstream out(file_path, std::ios::binary);
    out << text;
  }

  fs::path dir_;
};

// --- round trips ---------------------------------------------------------------------------------

TEST_F(SafetensorsTest, RoundTripsEveryDTypeInMemory) {
  const SafetensorsFile file = every_dtype_file();
  const std::vector<std::byte> bytes = serialize_safetensors(file);
  expect_same(file, parse_safetensors(bytes.data(), bytes.size()));
}

TEST_F(SafetensorsTest, RoundTripsEveryDTypeThroughAFile) {
  const SafetensorsFile file = every_dtype_file();
  write_safetensors(path("model.safetensors"), file);
  expect_same(file, read_safetensors(path("model.safetensors")));
  EXPECT_TRUE(leftover_temporaries(dir_).empty());
}

TEST_F(SafetensorsTest, ZeroDimAndEmptyTensorsKeepTheirShapes) {
  SafetensorsFile file;
  file.entries.push_back({"scalar", DType::Float64, {}, bytes_of_values<double>({2.5})});
  file.entries.push_back({"nothing", DType::Int32, {0, 4}, {}});
  const std::vector<std::byte> bytes = serialize_safetensors(file);
  const std::string text = text_of(bytes);
  EXPECT_NE(text.find("\"scalar\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\"nothing\":{\"dtype\":\"I32\",\"shape\":[0,4],\"data_offsets\":[8,8]}"),
            std::string::npos)
      << text;
  const SafetensorsFile back = parse_safetensors(bytes.data(), bytes.size());
  expect_same(file, back);
  EXPECT_EQ(back.at("scalar").numel(), 1);
  EXPECT_EQ(back.at("nothing").numel(), 0);
}

TEST_F(SafetensorsTest, EmptyFileHasNoEntriesAndNoMetadata) {
  const std::vector<std::byte> bytes = serialize_safetensors(SafetensorsFile{});
  const SafetensorsFile back = parse_safetensors(bytes.data(), bytes.size());
  EXPECT_TRUE(back.entries.empty());
  EXPECT_TRUE(back.metadata.empty());
}

TEST_F(SafetensorsTest, LookupByName) {
  const SafetensorsFile file = every_dtype_file();
  ASSERT_NE(file.find("ints"), nullptr);
  EXPECT_EQ(file.find("ints")->dtype, DType::Int32);
  EXPECT_EQ(file.find("absent"), nullptr);
  EXPECT_EQ(file.at("mask").shape, (std::vector<std::int64_t>{2, 2}));
  try {
    file.at("absent");
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("'absent'"), std::string::npos) << error.what();
  }
}

// --- byte layout ---------------------------------------------------------------------------------

TEST_F(SafetensorsTest, HeaderLayoutIsByteExact) {
  // The reference implementation's own test vectors.
  SafetensorsFile file;
  file.entries.push_back({"attn.0",
                          DType::Float32,
                          {1, 2, 3},
                          bytes_of_values<float>({0.f, 1.f, 2.f, 3.f, 4.f, 5.f})});
  std::string expected("\x40\0\0\0\0\0\0\0", 8);
  expected += R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";  // 64 bytes
  expected += text_of(bytes_of_values<float>({0.f, 1.f, 2.f, 3.f, 4.f, 5.f}));
  EXPECT_EQ(text_of(serialize_safetensors(file)), expected);

  // A 65-byte header is padded with 7 spaces to 72.
  file.entries[0] = {"attn0", DType::Float32, {1, 1, 2, 3}, file.entries[0].bytes};
  expected = std::string("\x48\0\0\0\0\0\0\0", 8);
  expected += R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})";
  expected += "       ";
  expected += text_of(file.entries[0].bytes);
  EXPECT_EQ(text_of(serialize_safetensors(file)), expected);

  EXPECT_EQ(text_of(serialize_safetensors(SafetensorsFile{})),
            std::string("\x08\0\0\0\0\0\0\0{}      ", 16));

  SafetensorsFile metadata_only;
  metadata_only.metadata = {{"framework", "pt"}};
  EXPECT_EQ(
      text_of(serialize_safetensors(metadata_only)),
      std::string("\x28\0\0\0\0\0\0\0", 8) + R"({"__metadata__":{"framework":"pt"}})" + "     ");
}

TEST_F(SafetensorsTest, TensorsAreContiguousInGivenOrderAndMetadataComesFirst) {
  SafetensorsFile file;
  file.metadata = {{"b", "2"}, {"a", "1"}};
  file.entries.push_back({"z", DType::UInt8, {3}, bytes_of("xyz")});
  file.entries.push_back({"a", DType::Int64, {1}, bytes_of("12345678")});
  const std::string text = text_of(serialize_safetensors(file));
  const std::string header =
      R"({"__metadata__":{"a":"1","b":"2"},"z":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
      R"("a":{"dtype":"I64","shape":[1],"data_offsets":[3,11]}})";
  const std::size_t padded = (header.size() + 7) / 8 * 8;
  ASSERT_EQ(text.size(), 8 + padded + 11);
  EXPECT_EQ(static_cast<unsigned char>(text[0]), padded);
  EXPECT_EQ(text.substr(8, padded), header + std::string(padded - header.size(), ' '));
  EXPECT_EQ(text.substr(8 + padded), "xyz12345678");
  // Header order is file order.
  const SafetensorsFile back = parse_safetensors(bytes_of(text).data(), text.size());
  ASSERT_EQ(back.entries.size(), 2u);
  EXPECT_EQ(back.entries[0].name, "z");
  EXPECT_EQ(back.entries[1].name, "a");
}

TEST_F(SafetensorsTest, OutputIsDeterministic) {
  const SafetensorsFile file = every_dtype_file();
  EXPECT_EQ(serialize_safetensors(file), serialize_safetensors(file));
  write_safetensors(path("one.safetensors"), file);
  write_safetensors(path("two.safetensors"), file);
  EXPECT_EQ(testing::read_file(path("one.safetensors")), testing::read_file(path("two.safetensors")));
  EXPECT_EQ(testing::read_file(path("one.safetensors")), text_of(serialize_safetensors(file)));
}

TEST_F(SafetensorsTest, ReadsHeadersInAnyOrderWithWhitespace) {
  // Entries out of data order, spaces inside the JSON, no padding: all valid.
  const std::string header = R"({ "b" : {"data_offsets":[4,8],"shape":[1],"dtype":"I32"},)"
                             R"( "a" : {"dtype":"I32","shape":[1],"data_offsets":[0,4]} })";
  const std::vector<std::byte> bytes = file_from(header, "AAAABBBB");
  const SafetensorsFile back = parse_safetensors(bytes.data(), bytes.size());
  ASSERT_EQ(back.entries.size(), 2u);
  EXPECT_EQ(back.entries[0].name, "b");
  EXPECT_EQ(text_of(back.entries[0].bytes), "BBBB");
  EXPECT_EQ(text_of(back.entries[1].bytes), "AAAA");
}

TEST_F(SafetensorsTest, WriterRejectsFilesThatCouldNotBeReadBack) {
  SafetensorsFile wrong_size;
  wrong_size.entries.push_back({"w", DType::Float32, {2}, bytes_of("abc")});
  EXPECT_THROW(serialize_safetensors(wrong_size), InvalidArgument);
  EXPECT_THROW(write_safetensors(path("x.safetensors"), wrong_size), InvalidArgument);
  EXPECT_FALSE(fs::exists(path("x.safetensors")));

  SafetensorsFile duplicate;
  duplicate.entries.push_back({"w", DType::UInt8, {1}, bytes_of("a")});
  duplicate.entries.push_back({"w", DType::UInt8, {1}, bytes_of("b")});
  EXPECT_THROW(serialize_safetensors(duplicate), InvalidArgument);

  SafetensorsFile reserved;
  reserved.entries.push_back({"__metadata__", DType::UInt8, {1}, bytes_of("a")});
  EXPECT_THROW(serialize_safetensors(reserved), InvalidArgument);

  SafetensorsFile bad_utf8;
  bad_utf8.entries.push_back({"w\xff", DType::UInt8, {1}, bytes_of("a")});
  EXPECT_THROW(serialize_safetensors(bad_utf8), InvalidArgument);

  SafetensorsFile negative;
  negative.entries.push_back({"w", DType::UInt8, {-1}, {}});
  EXPECT_THROW(serialize_safetensors(negative), InvalidArgument);
}

// --- malformed files: one test per validation rule
// ------------------------------------------------

TEST_F(SafetensorsTest, RejectsFileShorterThan8Bytes) {
  EXPECT_REJECTED(bytes_of(std::string("\x02\0\0\0", 4)),
                  "is 4 bytes, shorter than the 8-byte header length");
  EXPECT_REJECTED(std::vector<std::byte>{}, "is 0 bytes");
}

TEST_F(SafetensorsTest, RejectsHeaderLengthAboveLimit) {
  EXPECT_REJECTED(file_with_declared_length(100'000'001, "{}"),
                  "header length 100000001 bytes exceeds the limit of 100000000 bytes");
  EXPECT_REJECTED(file_with_declared_length(~std::uint64_t{0}, "{}"), "exceeds the limit");
}

TEST_F(SafetensorsTest, RejectsHeaderLengthPastEndOfFile) {
  EXPECT_REJECTED(file_with_declared_length(100, "{}      "),
                  "header length 100 bytes runs past the end of the file (16 bytes");
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotUtf8) {
  EXPECT_REJECTED(file_from("{\"w\xff\":1}"),
                  "header is not valid UTF-8 (byte 0xff at header offset 3)");
  EXPECT_REJECTED(file_from("{\"\xed\xa0\x80\":1}"), "not valid UTF-8");  // a UTF-16 surrogate
  EXPECT_REJECTED(file_from("{\"\xc0\xaf\":1}"), "not valid UTF-8");      // an overlong '/'
  EXPECT_REJECTED(file_from("{\"\xe2\x82"), "not valid UTF-8");           // cut mid-character
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotJson) {
  EXPECT_REJECTED(file_from("{\"w\": "), "header is not valid JSON");
  EXPECT_REJECTED(file_from("{} trailing"), "header is not valid JSON");
  EXPECT_REJECTED(file_from("{/* comment */}"), "header is not valid JSON");
  EXPECT_REJECTED(file_from("{\"w\": 1e999}"), "header is not valid JSON");
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotAnObject) {
  EXPECT_REJECTED(file_from("[1, 2]  "),
                  "header is not a JSON object: it must start with '{', but starts with byte 0x5b");
  EXPECT_REJECTED(file_from("  {}    "), "header is not a JSON object");
  EXPECT_REJECTED(file_from(""),
                  "header is not a JSON object: it must start with '{', but it is empty");
}

TEST_F(SafetensorsTest, RejectsHeaderNestedTooDeep) {
  EXPECT_REJECTED(file_from("{\"w\":" + std::string(100000, '[') + std::string(100000, ']') + "}"),
                  "header nests deeper than 16 levels");
}

TEST_F(SafetensorsTest, RejectsEntryThatIsNotAnObject) {
  EXPECT_REJECTED(file_from(R"({"w":[0,4]})"), "entry 'w' must be a JSON object");
}

TEST_F(SafetensorsTest, RejectsMissingOrMistypedDType) {
  EXPECT_REJECTED(file_from(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "abcd"),
                  "entry 'w' is missing \"dtype\"");
  EXPECT_REJECTED(file_from(R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", "abcd"),
                  "entry 'w': \"dtype\" must be a string, found 4");
}

TEST_F(SafetensorsTest, RejectsUnknownDType) {
  EXPECT_REJECTED(file_from(object_of({entry_json("w", "F17", "[1]", "[0,4]")}), "abcd"),
                  "entry 'w': unknown dtype 'F17'");
  EXPECT_REJECTED(file_from(object_of({entry_json("w", "f32", "[1]", "[0,4]")}), "abcd"),
                  "unknown dtype 'f32'");
}

TEST_F(SafetensorsTest, RejectsRecognisedButUnsupportedDTypes) {
  for (const char* dtype :
       {"I8", "I16", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2"}) {
    SCOPED_TRACE(dtype);
    EXPECT_REJECTED(file_from(object_of({entry_json("w", dtype, "[2]", "[0,4]")}), "abcd"),
                    detail::concat("entry 'w': unsupported dtype '", dtype, "'"));
  }
}

TEST_F(SafetensorsTest, RejectsMissingOrMistypedShape) {
  EXPECT_REJECTED(file_from(R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", "a"),
                  "entry 'w' is missing \"shape\"");
  EXPECT_REJECTED(file_from(R"({"w":{"dtype":"U8","shape":1,"data_offsets":[0,1]}})", "a"),
                  "entry 'w': \"shape\" must be an array of non-negative integers, found 1");
  EXPECT_REJECTED(file_from(R"({"w":{"dtype":"U8","shape":["1"],"data_offsets":[0,1]}})", "a"),
                  "shape[0] is a JSON string, not an integer");
}

TEST_F(SafetensorsTest, RejectsNegativeDimension) {
  EXPECT_REJECTED(file_from(object_of({entry_json("w", "U8", "[2,-3]", "[0,6]")})),
                  "entry 'w': shape[1] is negative (-3)");
}

TEST_F(SafetensorsTest, RejectsNonIntegerDimension) {
  EXPECT_REJECTED(file_from(object_of({entry_json("w", "U8", "[2.5]", "[0,2]")}), "ab"),
                  "entry 'w': shape[0] is not an integer (2.5)");
  EXPECT_REJECTED(file_from(object_of({entry_json("w", "U8", "[18446744073709551616]", "[0,2]")})),
                  "shape[0] is not an integer");
}

TEST_F(SafetensorsTest, RejectsShapeTimesElementSizeOverflow) {
  EXPECT_REJECTED(
      file_from(object_of({entry_json("w", "U8", "[4294967296,4294967296]", "[0,0]")})),
      "entry 'w': shape [4294967296, 4294967296] x 1 bytes per U8 element overflows 64 bits");
  // The element count fits; times 8 bytes it does not.
  EXPECT_REJECTED(file_from(object_of({entry_json("w", "F64", "[4611686018427387904]", "[0,0]")})),
                  "x 8 bytes per F64 element overflows 64 bits");
}

TEST_F(SafetensorsTest, RejectsMissingOrMistypedDataOffsets) {
  EXPECT_REJECTED(file_from(R"({"w":{"dtype":"U8","shape":[1]}})", "a"),
                  "entry 'w' is missing \"data_offsets\"");
  EXPECT_REJECTED(
      file_from(object_of({entry_json("w", "U8", "[1]", "[0,1,2]")}), "a"),
      "\"data_offsets\" must be an array of two integers [begin, end], found an array of 3");
  EXPECT_REJECTED(file_from(object_of({entry_json("w", "U8", "[1]", "{}")}), "a"),
                  "\"data_offsets\" must be an array of two integers");
  EXPECT_REJECTED(file_from(object_of({entry_json("w", "U8", "[1]", "[-1,0]")}), "a"),
                  "data_offsets begin is negative (-1)");
  EXPECT_REJECTED(file_from(object_of({entry_json("w", "U8", "[1]", "[0,1.0]")}), "a"),
                  "data_offsets end is not an integer");
}

TEST_F(SafetensorsTest, RejectsBeginAfterEnd) {
  EXPECT_REJECTED(file_from(object_of({entry_json("w", "U8", "[4]", "[8,4]")}), "12345678"),
                  "entry 'w': data_offsets [8, 4] have begin > end");
}

TEST_F(SafetensorsTest, RejectsByteLengthThatDisagreesWithShape) {
  EXPECT_REJECTED(
      file_from(object_of({entry_json("w", "F32", "[2]", "[0,12]")}), "123456789abc"),
      "entry 'w': data_offsets [0, 12] hold 12 bytes, but shape [2] of F32 needs 8 bytes");
}

TEST_F(SafetensorsTest, RejectsOffsetsOutOfTheBuffer) {
  EXPECT_REJECTED(file_from(object_of({entry_json("w", "F32", "[2]", "[0,8]")}), "1234"),
                  "entry 'w': data_offsets [0, 8] are out of the data buffer, which holds 4 bytes");
  // An empty tensor placed far beyond the end.
  EXPECT_REJECTED(file_from(object_of({entry_json("w", "F32", "[0]", "[99,99]")})),
                  "are out of the data buffer");
}

// A bool is 0 or 1: any other byte is refused on reading and on writing (read as a bool it is undefined behaviour).
TEST_F(SafetensorsTest, RejectsBoolBytesOtherThanZeroAndOne) {
  EXPECT_REJECTED(file_from(object_of({entry_json("mask", "BOOL", "[2]", "[0,2]")}), std::string("\x02\xff", 2)),
                  "BOOL tensor 'mask' holds the byte 2 at element 0");
  SafetensorsFile file;
  SafetensorsEntry entry;
  entry.name = "mask";
  entry.dtype = DType::Bool;
  entry.shape = {2};
  entry.bytes = {std::byte{1}, std::byte{7}};
  file.entries.push_back(entry);
  EXPECT_THROW(serialize_safetensors(file), FormatError);
  file.entries[0].bytes[1] = std::byte{0};
  EXPECT_NO_THROW(serialize_safetensors(file));
}

TEST_F(SafetensorsTest, RejectsOverlappingTensors) {
  const std::string header =
      object_of({entry_json("a", "F32", "[2]", "[0,8]"), entry_json("b", "F32", "[2]", "[4,12]")});
  EXPECT_REJECTED(file_from(header, "123456789abc"),
                  "tensor 'b' at data_offsets [4, 12] overlaps tensor 'a', which ends at byte 8");
  const std::string same =
      object_of({entry_json("a", "F32", "[1]", "[0,4]"), entry_json("b", "F32", "[1]", "[0,4]")});
  EXPECT_REJECTED(file_from(same, "1234"), "overlaps tensor");
}

TEST_F(SafetensorsTest, RejectsGapsBetweenTensors) {
  const std::string header =
      object_of({entry_json("a", "F32", "[2]", "[0,8]"), entry_json("b", "F32", "[2]", "[12,20]")});
  EXPECT_REJECTED(file_from(header, "123456789abcdefghijk"),
                  "bytes [8, 12) of the data buffer belong to no tensor (a gap before 'b')");
  EXPECT_REJECTED(file_from(object_of({entry_json("a", "U8", "[4]", "[4,8]")}), "12345678"),
                  "bytes [0, 4) of the data buffer belong to no tensor");
}

TEST_F(SafetensorsTest, RejectsTrailingBytesAfterTheLastTensor) {
  EXPECT_REJECTED(
      file_from(object_of({entry_json("a", "F32", "[2]", "[0,8]")}), "123456789abc"),
      "trailing bytes: the tensors end at byte 8 of the data buffer, but it holds 12 bytes");
  EXPECT_REJECTED(file_from("{}", "x"), "trailing bytes");
}

TEST_F(SafetensorsTest, RejectsTruncatedFile) {
  // A whole file cut short: inside the length, inside the header, inside the data.
  const std::vector<std::byte> valid = serialize_safetensors(every_dtype_file());
  std::uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<std::uint8_t>(valid[i]);
  const auto cut = [&](std::size_t length) { return std::vector<std::byte>(valid.begin(), valid.begin() + length); };
  EXPECT_REJECTED(cut(5), "is 5 bytes, shorter than the 8-byte header length");
  EXPECT_REJECTED(cut(8 + header_size - 1), "runs past the end of the file");
  EXPECT_REJECTED(cut(8 + header_size), "are out of the data buffer, which holds 0 bytes");
  EXPECT_REJECTED(cut(valid.size() - 1), "are out of the data buffer");
}

TEST_F(SafetensorsTest, RejectsDuplicateNames) {
  const std::string header =
      object_of({entry_json("a", "U8", "[1]", "[0,1]"), entry_json("a", "U8", "[1]", "[1,2]")});
  EXPECT_REJECTED(file_from(header, "xy"), "duplicate tensor name 'a'");
  EXPECT_REJECTED(file_from(R"({"__metadata__":{},"__metadata__":{}})"),
                  "duplicate tensor name '__metadata__'");
  EXPECT_REJECTED(
      file_from(R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x"),
      "duplicate key 'dtype' inside the header object of 'a'");
  EXPECT_REJECTED(file_from(R"({"__metadata__":{"k":"1","k":"2"}})"),
                  "duplicate key 'k' inside the header object of '__metadata__'");
}

TEST_F(SafetensorsTest, RejectsMetadataThatIsNotAnObjectOfStrings) {
  EXPECT_REJECTED(file_from(R"({"__metadata__":["a"]})"),
                  "__metadata__ must be an object of strings, found a JSON array");
  EXPECT_REJECTED(file_from(R"({"__metadata__":{"epoch":3}})"),
                  "__metadata__ must be an object of strings, but the value of 'epoch' is 3");
  // null means "no metadata", as in the reference implementation.
  const std::vector<std::byte> null_metadata = file_from(R"({"__metadata__":null})");
  EXPECT_TRUE(parse_safetensors(null_metadata.data(), null_metadata.size()).metadata.empty());
}

TEST_F(SafetensorsTest, NoInputCrashesOrReadsOutOfBounds) {
  // Every prefix and every single-byte change of a valid file either parses or is a FormatError.
  const std::vector<std::byte> valid = serialize_safetensors(every_dtype_file());
  const auto parses_or_rejects = [](const std::vector<std::byte>& bytes) {
    // An exact-size heap copy, so that a sanitizer sees any read past the end.
    const auto copy = std::make_unique<std::byte[]>(bytes.size());
    std::copy(bytes.begin(), bytes.end(), copy.get());
    try {
      parse_safetensors(copy.get(), bytes.size(), "mutant");
    } catch (const FormatError&) {
    }
  };
  for (std::size_t length = 0; length <= valid.size(); ++length)
    parses_or_rejects({valid.begin(), valid.begin() + length});
  for (std::size_t i = 0; i < valid.size(); ++i) {
    for (const int value : {0x00, 0x01, 0x22, 0x2c, 0x5b, 0x7b, 0x7d, 0x80, 0xff}) {
      std::vector<std::byte> mutant = valid;
      mutant[i] = static_cast<std::byte>(value);
      parses_or_rejects(mutant);
    }
  }
}

// --- reading files -------------------------------------------------------------------------------

TEST_F(SafetensorsTest, MissingFileIsAnIoErrorNamingThePath) {
  try {
    read_safetensors(path("absent.safetensors"));
    ADD_FAILURE() << "expected IoError";
  } catch (const IoError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(path("absent.safetensors")), std::string::npos) << message;
    EXPECT_NE(message.find("No such file or directory"), std::string::npos) << message;
  }
  EXPECT_THROW(read_safetensors(dir_.string()), IoError);  // a folder
}

TEST_F(SafetensorsTest, MalformedFileOnDiskNamesThePath) {
  write_text(path("broken.safetensors"), "short");
  try {
    read_safetensors(path("broken.safetensors"));
    ADD_FAILURE() << "expected FormatError";
  } catch (const FormatError& error) {
    EXPECT_NE(std::string(error.what()).find(path("broken.safetensors")), std::string::npos);
  }
}

// --- atomic writes -------------------------------------------------------------------------------

TEST_F(SafetensorsTest, ExistingFileIsReplacedWhole) {
  SafetensorsFile large;
  large.entries.push_back(
      {"big", DType::Float64, {1000}, std::vector<std::byte>(8000, std::byte{7})});
  SafetensorsFile small;
  small.entries.push_back({"tiny", DType::UInt8, {2}, bytes_of("hi")});
  write_safetensors(path("model.safetensors"), large);
  write_safetensors(path("model.safetensors"), small);
  EXPECT_EQ(testing::read_file(path("model.safetensors")), text_of(serialize_safetensors(small)));
  expect_same(small, read_safetensors(path("model.safetensors")));
  EXPECT_TRUE(leftover_temporaries(dir_).empty());
}

TEST_F(SafetensorsTest, WriteInTheCurrentFolderWorks) {
  const fs::path previous = fs::current_path();
  fs::current_path(dir_);
  EXPECT_NO_THROW(write_safetensors("relative.safetensors", every_dtype_file()));
  fs::current_path(previous);
  expect_same(every_dtype_file(), read_safetensors(path("relative.safetensors")));
}

TEST_F(SafetensorsTest, FailedWriteLeavesTheOldFileIntact) {
  // The target's name fits (250 bytes) but its temporary file's name does not (> 255 bytes):
  // the write fails whoever runs the test, root included.
  const std::string target = path(std::string(250, 'm'));
  write_text(target, "old contents");
  try {
    write_safetensors(target, every_dtype_file());
    ADD_FAILURE() << "expected IoError";
  } catch (const IoError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(target), std::string::npos) << message;
    EXPECT_NE(message.find(std::strerror(ENAMETOOLONG)), std::string::npos) << message;
  }
  EXPECT_EQ(testing::read_file(target), "old contents");
  EXPECT_TRUE(leftover_temporaries(dir_).empty());
}

TEST_F(SafetensorsTest, WriteIntoReadOnlyFolderFailsCleanly) {
  const std::string target = path("model.safetensors");
  write_text(target, "old contents");
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
  {  // Root ignores folder permissions; then there is nothing to test here.
    std::ofstream probe(path("probe"));
    if (probe) {
      probe.close();
      fs::remove(path("probe"));
      GTEST_SKIP() << "running with privileges that ignore folder permissions (root?)";
    }
  }
  try {
    write_safetensors(target, every_dtype_file());
    ADD_FAILURE() << "expected IoError";
  } catch (const IoError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(target), std::string::npos) << message;
    EXPECT_NE(message.find(std::strerror(EACCES)), std::string::npos) << message;
  }
  EXPECT_EQ(testing::read_file(target), "old contents");
  EXPECT_TRUE(leftover_temporaries(dir_).empty());
}

TEST_F(SafetensorsTest, RenameFailureRemovesTheTemporaryFile) {
  // The target is a folder that is not empty: everything but the final rename succeeds.
  fs::create_directories(path("model.safetensors") + "/inside");
  try {
    write_safetensors(path("model.safetensors"), every_dtype_file());
    ADD_FAILURE() << "expected IoError";
  } catch (const IoError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("renaming"), std::string::npos) << message;
    EXPECT_NE(message.find(path("model.safetensors")), std::string::npos) << message;
  }
  EXPECT_TRUE(fs::is_directory(path("model.safetensors") + "/inside"));
  EXPECT_TRUE(leftover_temporaries(dir_).empty());
}

// In a child process: with files capped at 4 KiB, writing 1 MiB fails part way. Returns 0 when the
// failure was an IoError, the old file is intact and no temporary file is left.
int write_past_file_size_limit(const std::string& target, const fs::path& folder) {
  std::signal(SIGXFSZ, SIG_IGN);  // get EFBIG from write() instead of a signal
  const rlimit limit{4096, 4096};
  if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 10;
  SafetensorsFile big;
  big.entries.push_back({"big", DType::UInt8, {1 << 20}, std::vector<std::byte>(1 << 20)});
  try {
    write_safetensors(target, big);
    return 1;
  } catch (const IoError& error) {
    if (std::string(error.what()).find(std::strerror(EFBIG)) == std::string::npos) return 2;
  }
  if (testing::read_file(target) != "old contents") return 3;
  for (const auto& item : fs::directory_iterator(folder))
    if (item.path().filename().string().find(".tmp.") != std::string::npos) return 4;
  return 0;
}

TEST_F(SafetensorsTest, WriteThatFailsPartWayLeavesTheOldFileIntact) {
  const std::string target = path("model.safetensors");
  write_text(target, "old contents");
  EXPECT_EXIT(std::_Exit(write_past_file_size_limit(target, dir_)), ::testing::ExitedWithCode(0),
              "");
  EXPECT_EQ(testing::read_file(target), "old contents");
}

}  // namespace
}  // namespace ferry
