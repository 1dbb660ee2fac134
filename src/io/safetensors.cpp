// src/io/safetensors.cpp — safetensors as bytes: the reference's validation rules, atomic writes.
// Not here: Tensor conversion (the core adapts tensors to SafetensorsEntry) or memory mapping.

#include "ferry/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "ferry/error.h"

namespace ferry {
namespace {

// ordered_json keeps the header's key order, which is the entries' file order.
using Json = nlohmann::ordered_json;

// A valid header nests three deep ({ "name": { "shape": [ 1 ] } }); deeper input is rejected early,
// which also bounds the parser's work and the JSON tree's destruction on hostile input.
constexpr int kMaxJsonDepth = 16;

// Every dtype the safetensors format defines; ferry reads and writes the ones with a DType.
struct SafetensorsDType {
  std::string_view name;
  std::optional<DType> dtype;  // nullopt: recognised but unsupported by ferry
};
constexpr SafetensorsDType kSafetensorsDTypes[] = {
    {"BOOL", DType::Bool},     {"U8", DType::UInt8},      {"I8", std::nullopt},
    {"I16", std::nullopt},     {"U16", std::nullopt},     {"F16", DType::Float16},
    {"BF16", DType::BFloat16},    {"I32", DType::Int32},     {"U32", std::nullopt},
    {"F32", DType::Float32},   {"F64", DType::Float64},   {"I64", DType::Int64},
    {"U64", std::nullopt},     {"C64", std::nullopt},     {"F8_E5M2", std::nullopt},
    {"F8_E4M3", std::nullopt}, {"F8_E8M0", std::nullopt}, {"F4", std::nullopt},
    {"F6_E2M3", std::nullopt}, {"F6_E3M2", std::nullopt},
};
constexpr std::string_view kSupportedDTypeList = "F32, F64, F16, BF16, I32, I64, U8, BOOL";

const SafetensorsDType* find_safetensors_dtype(std::string_view name) {
  for (const SafetensorsDType& entry : kSafetensorsDTypes)
    if (entry.name == name) return &entry;
  return nullptr;
}

std::string all_safetensors_dtype_names() {
  std::string names;
  for (const SafetensorsDType& entry : kSafetensorsDTypes) {
    if (!names.empty()) names += ", ";
    names += entry.name;
  }
  return names;
}

// A name or string from a file, quoted and cut short so that hostile input cannot flood a message;
// control bytes (a JSON "\n" in a name) are written as \xNN so that the message stays one line.
std::string quoted_name(std::string_view text) {
  constexpr std::size_t kMaxShown = 80;
  const std::string shown = "'" + detail::printable(text.substr(0, kMaxShown));
  if (text.size() <= kMaxShown) return shown + "'";
  return detail::concat(shown, "...' (", text.size(), " bytes)");
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Well-formed UTF-8 sequences (RFC 3629, table 3-7 of the Unicode standard): the lead byte fixes
// the length and the range of the first continuation byte; later ones are always 0x80..0xBF.
struct Utf8Sequence {
  unsigned char lead_min, lead_max;
  std::size_t length;
  unsigned char second_min, second_max;
};
constexpr Utf8Sequence kUtf8Sequences[] = {
    {0xC2, 0xDF, 2, 0x80, 0xBF},
    {0xE0, 0xE0, 3, 0xA0, 0xBF},  // no overlong forms
    {0xE1, 0xEC, 3, 0x80, 0xBF},
    {0xED, 0xED, 3, 0x80, 0x9F},  // no UTF-16 surrogates
    {0xEE, 0xEF, 3, 0x80, 0xBF},
    {0xF0, 0xF0, 4, 0x90, 0xBF},  // no overlong forms
    {0xF1, 0xF3, 4, 0x80, 0xBF},
    {0xF4, 0xF4, 4, 0x80, 0x8F},  // nothing above U+10FFFF
};

// The offset of the first byte that breaks UTF-8, or nullopt when text is valid.
std::optional<std::size_t> first_invalid_utf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t size = text.size();
  std::size_t i = 0;
  while (i < size) {
    if (bytes[i] < 0x80) {
      ++i;
      continue;
    }
    const Utf8Sequence* sequence = nullptr;
    for (const Utf8Sequence& candidate : kUtf8Sequences)
      if (bytes[i] >= candidate.lead_min && bytes[i] <= candidate.lead_max) sequence = &candidate;
    if (sequence == nullptr || size - i < sequence->length) return i;
    if (bytes[i + 1] < sequence->second_min || bytes[i + 1] > sequence->second_max) return i;
    for (std::size_t k = 2; k < sequence->length; ++k)
      if (bytes[i + k] < 0x80 || bytes[i + k] > 0xBF) return i;
    i += sequence->length;
  }
  return std::nullopt;
}

std::string hex_byte(unsigned char byte) {
  constexpr char kDigits[] = "0123456789abcdef";
  return std::string("0x") + kDigits[byte >> 4] + kDigits[byte & 0xF];
}

// How a JSON value looks in a message: numbers and booleans as written, anything else by its type.
std::string describe(const Json& value) {
  if (value.is_number() || value.is_boolean() || value.is_null()) return value.dump();
  return std::string("a JSON ") + value.type_name();
}

// Reads a JSON value as a non-negative integer that fits in 64 bits. On failure returns nullopt and
// says why in `why` ("is negative (-3)", "is not an integer (2.5)", ...).
std::optional<std::uint64_t> non_negative_integer(const Json& value, std::string& why) {
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  if (value.is_number_integer()) {
    const std::int64_t signed_value = value.get<std::int64_t>();
    if (signed_value >= 0) return static_cast<std::uint64_t>(signed_value);
    why = detail::concat("is negative (", signed_value, ")");
    return std::nullopt;
  }
  if (value.is_number_float())
    why = detail::concat("is not an integer (", value.dump(),
                         "); it must be a whole number below 2^64");
  else
    why = detail::concat("is ", describe(value), ", not an integer");
  return std::nullopt;
}

struct ParsedEntry {
  SafetensorsEntry entry;            // bytes filled last, once the layout is known to be valid
  std::uint64_t begin = 0, end = 0;  // data_offsets, relative to the data buffer
};

// Reads one tensor's header object; checks everything that does not need the other entries.
ParsedEntry parse_entry(const std::string& where, const std::string& name, const Json& value,
                        std::uint64_t data_size) {
  const std::string here = detail::concat(where, ": entry ", quoted_name(name));
  FERRY_CHECK(value.is_object(), FormatError, here,
              " must be a JSON object with \"dtype\", \"shape\" and \"data_offsets\", found ",
              describe(value));
  ParsedEntry parsed;
  parsed.entry.name = name;

  // dtype
  const auto dtype_it = value.find("dtype");
  FERRY_CHECK(dtype_it != value.end(), FormatError, here, " is missing \"dtype\"");
  FERRY_CHECK(dtype_it->is_string(), FormatError, here, ": \"dtype\" must be a string, found ",
              describe(*dtype_it));
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  const SafetensorsDType* known = find_safetensors_dtype(dtype_name);
  FERRY_CHECK(known != nullptr, FormatError, here, ": unknown dtype ", quoted_name(dtype_name),
              " (safetensors dtypes are ", all_safetensors_dtype_names(), ")");
  FERRY_CHECK(known->dtype.has_value(), FormatError, here, ": unsupported dtype ",
              quoted_name(dtype_name), " (a safetensors dtype, but ferry reads only ",
              kSupportedDTypeList, ")");
  parsed.entry.dtype = *known->dtype;

  // shape
  const auto shape_it = value.find("shape");
  FERRY_CHECK(shape_it != value.end(), FormatError, here, " is missing \"shape\"");
  FERRY_CHECK(shape_it->is_array(), FormatError, here,
              ": \"shape\" must be an array of non-negative integers, found ", describe(*shape_it));
  std::uint64_t element_count = 1;
  bool overflowed = false;
  for (std::size_t axis = 0; axis < shape_it->size(); ++axis) {
    std::string why;
    const std::optional<std::uint64_t> dim = non_negative_integer((*shape_it)[axis], why);
    FERRY_CHECK(dim.has_value(), FormatError, here, ": shape[", axis, "] ", why);
    FERRY_CHECK(*dim <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                FormatError, here, ": shape[", axis, "] = ", *dim,
                " is too large (above 2^63 - 1)");
    parsed.entry.shape.push_back(static_cast<std::int64_t>(*dim));
    // Multiplied in order, like the reference: a later 0 does not excuse an earlier overflow.
    overflowed = overflowed || __builtin_mul_overflow(element_count, *dim, &element_count);
  }
  const std::uint64_t item_size = element_size(parsed.entry.dtype);
  std::uint64_t byte_count = 0;
  overflowed = overflowed || __builtin_mul_overflow(element_count, item_size, &byte_count);
  FERRY_CHECK(!overflowed, FormatError, here, ": shape ", shape_string(parsed.entry.shape), " x ",
              item_size, " bytes per ", dtype_name, " element overflows 64 bits");

  // data_offsets
  const auto offsets_it = value.find("data_offsets");
  FERRY_CHECK(offsets_it != value.end(), FormatError, here, " is missing \"data_offsets\"");
  FERRY_CHECK(offsets_it->is_array() && offsets_it->size() == 2, FormatError, here,
              ": \"data_offsets\" must be an array of two integers [begin, end], found ",
              offsets_it->is_array() ? detail::concat("an array of ", offsets_it->size())
                                     : describe(*offsets_it));
  std::string why;
  const std::optional<std::uint64_t> begin = non_negative_integer((*offsets_it)[0], why);
  FERRY_CHECK(begin.has_value(), FormatError, here, ": data_offsets begin ", why);
  const std::optional<std::uint64_t> end = non_negative_integer((*offsets_it)[1], why);
  FERRY_CHECK(end.has_value(), FormatError, here, ": data_offsets end ", why);
  parsed.begin = *begin;
  parsed.end = *end;
  const std::string offsets = detail::concat("data_offsets [", *begin, ", ", *end, "]");
  FERRY_CHECK(*begin <= *end, FormatError, here, ": ", offsets, " have begin > end");
  FERRY_CHECK(*end - *begin == byte_count, FormatError, here, ": ", offsets, " hold ",
              *end - *begin, " bytes, but shape ", shape_string(parsed.entry.shape), " of ",
              dtype_name, " needs ", byte_count, " bytes");
  FERRY_CHECK(*end <= data_size, FormatError, here, ": ", offsets,
              " are out of the data buffer, which holds ", data_size, " bytes");
  return parsed;
}

// The header's JSON text (compact, keys in entries order, "__metadata__" first) padded with spaces
// to a multiple of 8 bytes. Throws InvalidArgument for a file that could not be read back.
std::string build_header(const SafetensorsFile& file) {
  Json header = Json::object();
  if (!file.metadata.empty()) {
    Json metadata = Json::object();
    for (const auto& [key, value] : file.metadata) {
      FERRY_CHECK(!first_invalid_utf8(key) && !first_invalid_utf8(value), InvalidArgument,
                  "safetensors metadata key ", quoted_name(key),
                  " or its value is not valid UTF-8");
      metadata[key] = value;
    }
    header["__metadata__"] = std::move(metadata);
  }
  std::set<std::string_view> names;
  std::uint64_t offset = 0;  // bytes into the data buffer
  for (const SafetensorsEntry& entry : file.entries) {
    FERRY_CHECK(entry.name != "__metadata__", InvalidArgument,
                "a safetensors tensor cannot be named \"__metadata__\" (the name is reserved)");
    FERRY_CHECK(!first_invalid_utf8(entry.name), InvalidArgument, "safetensors tensor name ",
                quoted_name(entry.name), " is not valid UTF-8");
    FERRY_CHECK(names.insert(entry.name).second, InvalidArgument, "safetensors tensor name ",
                quoted_name(entry.name), " appears twice");
    const std::int64_t count = entry.numel();
    FERRY_CHECK(count <= std::numeric_limits<std::int64_t>::max() / 8, InvalidArgument,
                "safetensors tensor ", quoted_name(entry.name), " has shape ",
                shape_string(entry.shape), ", too many elements to store");
    const std::uint64_t expected_bytes =
        static_cast<std::uint64_t>(count) * element_size(entry.dtype);
    FERRY_CHECK(entry.bytes.size() == expected_bytes, InvalidArgument, "safetensors tensor ",
                quoted_name(entry.name), " has shape ", shape_string(entry.shape), " of ",
                safetensors_dtype_name(entry.dtype), " (", expected_bytes, " bytes) but holds ",
                entry.bytes.size(), " bytes");
    Json info = Json::object();
    info["dtype"] = std::string(safetensors_dtype_name(entry.dtype));
    info["shape"] = entry.shape;
    info["data_offsets"] = Json::array({offset, offset + expected_bytes});
    header[entry.name] = std::move(info);
    offset += expected_bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  FERRY_CHECK(text.size() <= kSafetensorsMaxHeaderBytes, InvalidArgument,
              "safetensors header would be ", text.size(), " bytes, above the limit of ",
              kSafetensorsMaxHeaderBytes, " bytes that readers accept");
  return text;
}

std::array<std::byte, 8> little_endian_u64(std::uint64_t value) {
  std::array<std::byte, 8> bytes;
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<std::byte>((value >> (8 * i)) & 0xFF);
  return bytes;
}

std::string errno_text(int error_number) {
  return error_number == 0 ? std::string("unknown error")
                           : std::string(std::strerror(error_number));
}

std::vector<std::byte> read_whole_file(const std::string& path, std::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FERRY_CHECK(fd >= 0, IoError, "cannot read ", what, " '", path, "': ", errno_text(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info {};
  FERRY_CHECK(::fstat(fd, &info) == 0, IoError, "cannot read ", what, " '", path,
              "': ", errno_text(errno));
  FERRY_CHECK(!S_ISDIR(info.st_mode), IoError, "cannot read ", what, " '", path,
              "': ", errno_text(EISDIR));
  std::vector<std::byte> bytes(static_cast<std::size_t>(std::max<off_t>(info.st_size, 0)));
  std::size_t filled = 0;
  while (filled < bytes.size()) {
    const ssize_t got = ::read(fd, bytes.data() + filled, bytes.size() - filled);
    if (got < 0 && errno == EINTR) continue;
    FERRY_CHECK(got >= 0, IoError, "cannot read ", what, " '", path, "': ", errno_text(errno));
    if (got == 0) break;  // the file shrank while we read it: parse what is there
    filled += static_cast<std::size_t>(got);
  }
  bytes.resize(filled);
  return bytes;
}

// A temporary file that removes itself unless committed (renamed over its target).
class TemporaryFile {
 public:
  explicit TemporaryFile(std::string path) : path_(std::move(path)) {
    // "x": fail rather than reuse a file that happens to exist under this name.
    file_ = std::fopen(path_.c_str(), "wbx");
  }
  ~TemporaryFile() {
    if (file_ != nullptr) std::fclose(file_);
    if (!committed_) std::remove(path_.c_str());
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;

  std::FILE* file() const { return file_; }
  const std::string& path() const { return path_; }
  bool close() {
    std::FILE* file = file_;
    file_ = nullptr;
    return std::fclose(file) == 0;
  }
  void mark_committed() { committed_ = true; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  bool committed_ = false;
};

}  // namespace

std::int64_t SafetensorsEntry::numel() const {
  for (const std::int64_t dim : shape) {
    FERRY_CHECK(dim >= 0, InvalidArgument, "safetensors tensor ", quoted_name(name),
                " has a negative dimension in shape ", shape_string(shape));
  }
  // An empty entry, however large its other sizes (the parser accepts [30, 2^58, 0]: its byte count is 0).
  for (const std::int64_t dim : shape)
    if (dim == 0) return 0;
  std::int64_t count = 1;
  for (const std::int64_t dim : shape) {
    FERRY_CHECK(!__builtin_mul_overflow(count, dim, &count), InvalidArgument, "safetensors tensor ",
                quoted_name(name), " has shape ", shape_string(shape),
                " whose element count overflows 64 bits");
  }
  return count;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  for (const SafetensorsEntry& entry : entries)
    if (entry.name == name) return &entry;
  return nullptr;
}

SafetensorsEntry* SafetensorsFile::find(std::string_view name) {
  for (SafetensorsEntry& entry : entries)
    if (entry.name == name) return &entry;
  return nullptr;
}

const SafetensorsEntry& SafetensorsFile::at(std::string_view name) const {
  if (const SafetensorsEntry* entry = find(name)) return *entry;
  std::string listed;
  constexpr std::size_t kMaxListed = 8;
  for (std::size_t i = 0; i < entries.size() && i < kMaxListed; ++i)
    listed += (i ? ", " : "") + quoted_name(entries[i].name);
  if (entries.size() > kMaxListed) listed += ", ...";
  throw InvalidArgument(detail::concat("no tensor named ", quoted_name(name),
                                       " in the safetensors file; it holds ", entries.size(),
                                       " tensors", entries.empty() ? "" : ": ", listed));
}

std::string_view safetensors_dtype_name(DType dtype) {
  for (const SafetensorsDType& entry : kSafetensorsDTypes)
    if (entry.dtype == dtype) return entry.name;
  FERRY_ASSERT(false, "no safetensors name for dtype ", static_cast<int>(dtype));
  return {};
}

namespace {
// A BOOL tensor's bytes are 0 or 1 (safetensors and C++ both say so; any other byte read as a bool is undefined
// behaviour, and ferry's kernels would treat 2 as true but not equal to true).
void check_bool_bytes(const SafetensorsEntry& entry, const std::string& where) {
  if (entry.dtype != DType::Bool) return;
  for (std::size_t i = 0; i < entry.bytes.size(); ++i) {
    const auto byte = static_cast<unsigned>(entry.bytes[i]);
    FERRY_CHECK(byte <= 1, FormatError, where, ": BOOL tensor ", quoted_name(entry.name), " holds the byte ", byte,
                " at element ", i, " (a bool is 0 or 1)");
  }
}
}  // namespace

SafetensorsFile parse_safetensors(const std::byte* data, std::size_t size,
                                  std::string_view source_name) {
  const std::string where = detail::concat("safetensors file '", source_name, "'");

  // 8 bytes: the header length N.
  FERRY_CHECK(size >= 8, FormatError, where, ": file is ", size,
              " bytes, shorter than the 8-byte header length that starts every safetensors file");
  std::uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i)
    header_size = (header_size << 8) | static_cast<std::uint8_t>(data[i]);
  FERRY_CHECK(header_size <= kSafetensorsMaxHeaderBytes, FormatError, where, ": header length ",
              header_size, " bytes exceeds the limit of ", kSafetensorsMaxHeaderBytes, " bytes");
  FERRY_CHECK(header_size <= size - 8, FormatError, where, ": header length ", header_size,
              " bytes runs past the end of the file (", size, " bytes, so at most ", size - 8,
              " bytes of header)");

  // N bytes: a UTF-8 JSON object.
  const std::string_view header(reinterpret_cast<const char*>(data + 8), header_size);
  if (const std::optional<std::size_t> bad = first_invalid_utf8(header))
    throw FormatError(detail::concat(where, ": header is not valid UTF-8 (byte ",
                                     hex_byte(static_cast<unsigned char>(header[*bad])),
                                     " at header offset ", *bad, ")"));
  FERRY_CHECK(!header.empty() && header.front() == '{', FormatError, where,
              ": header is not a JSON object: it must start with '{', but ",
              header.empty()
                  ? std::string("it is empty")
                  : "starts with byte " + hex_byte(static_cast<unsigned char>(header[0])));

  // The parser keeps one value per repeated key; the callback notices the repeat instead.
  std::vector<std::set<std::string>> keys_per_open_object;
  std::string current_entry;  // the top-level key being parsed, for messages
  const auto watch = [&](int depth, Json::parse_event_t event, Json& parsed) {
    FERRY_CHECK(depth <= kMaxJsonDepth, FormatError, where, ": header nests deeper than ",
                kMaxJsonDepth, " levels; a safetensors header needs 3");
    if (event == Json::parse_event_t::object_start) {
      keys_per_open_object.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      keys_per_open_object.pop_back();
    } else if (event == Json::parse_event_t::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      const bool first_time = keys_per_open_object.back().insert(key).second;
      if (keys_per_open_object.size() == 1) {
        FERRY_CHECK(first_time, FormatError, where, ": duplicate tensor name ", quoted_name(key),
                    " (a name may appear once in the header)");
        current_entry = key;
      } else {
        FERRY_CHECK(first_time, FormatError, where, ": duplicate key ", quoted_name(key),
                    " inside the header object of ", quoted_name(current_entry));
      }
    }
    return true;
  };
  Json root;
  try {
    root = Json::parse(header.begin(), header.end(), watch, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const Json::exception& error) {  // parse_error, or out_of_range for a number like 1e999
    std::string reason = error.what();
    constexpr std::size_t kMaxReason = 300;
    if (reason.size() > kMaxReason) reason = reason.substr(0, kMaxReason) + "...";
    throw FormatError(detail::concat(where, ": header is not valid JSON: ", reason));
  }
  FERRY_CHECK(root.is_object(), FormatError, where, ": header is not a JSON object");

  // The rest: the data buffer, which the tensors must tile exactly.
  const std::uint64_t data_size = size - 8 - header_size;
  const std::byte* data_buffer = data + 8 + header_size;
  SafetensorsFile file;
  std::vector<ParsedEntry> parsed;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (value.is_null()) continue;  // the reference reads null as "no metadata"
      FERRY_CHECK(value.is_object(), FormatError, where,
                  ": __metadata__ must be an object of strings, found ", describe(value));
      for (const auto& [meta_key, meta_value] : value.items()) {
        FERRY_CHECK(meta_value.is_string(), FormatError, where,
                    ": __metadata__ must be an object of strings, but the value of ",
                    quoted_name(meta_key), " is ", describe(meta_value));
        file.metadata[meta_key] = meta_value.get<std::string>();
      }
      continue;
    }
    parsed.push_back(parse_entry(where, key, value, data_size));
  }

  std::vector<std::size_t> by_offset(parsed.size());
  std::iota(by_offset.begin(), by_offset.end(), std::size_t{0});
  std::sort(by_offset.begin(), by_offset.end(), [&](std::size_t a, std::size_t b) {
    return std::pair(parsed[a].begin, parsed[a].end) < std::pair(parsed[b].begin, parsed[b].end);
  });
  std::uint64_t covered = 0;  // bytes [0, covered) of the data buffer belong to a tensor
  const ParsedEntry* previous = nullptr;
  for (const std::size_t index : by_offset) {
    const ParsedEntry& entry = parsed[index];
    FERRY_CHECK(entry.begin <= covered, FormatError, where, ": bytes [", covered, ", ", entry.begin,
                ") of the data buffer belong to no tensor (a gap before ",
                quoted_name(entry.entry.name), "); tensors must tile the data buffer exactly");
    FERRY_CHECK(entry.begin == covered, FormatError, where, ": tensor ",
                quoted_name(entry.entry.name), " at data_offsets [", entry.begin, ", ", entry.end,
                "] overlaps tensor ", quoted_name(previous->entry.name), ", which ends at byte ",
                covered);
    covered = entry.end;
    previous = &entry;
  }
  FERRY_CHECK(covered == data_size, FormatError, where,
              ": trailing bytes: the tensors end at byte ", covered,
              " of the data buffer, but it holds ", data_size, " bytes (", data_size - covered,
              " bytes after the last tensor)");

  file.entries.reserve(parsed.size());
  for (ParsedEntry& entry : parsed) {
    entry.entry.bytes.assign(data_buffer + entry.begin, data_buffer + entry.end);
    check_bool_bytes(entry.entry, where);
    file.entries.push_back(std::move(entry.entry));
  }
  return file;
}

SafetensorsFile read_safetensors(const std::string& path) {
  const std::vector<std::byte> bytes = read_whole_file(path, "safetensors file");
  return parse_safetensors(bytes.data(), bytes.size(), path);
}

std::vector<std::byte> serialize_safetensors(const SafetensorsFile& file) {
  for (const SafetensorsEntry& entry : file.entries) check_bool_bytes(entry, "safetensors entry");
  const std::string header = build_header(file);
  std::size_t total = 8 + header.size();
  for (const SafetensorsEntry& entry : file.entries) total += entry.bytes.size();
  std::vector<std::byte> out;
  out.reserve(total);
  const std::array<std::byte, 8> length = little_endian_u64(header.size());
  out.insert(out.end(), length.begin(), length.end());
  const auto* header_bytes = reinterpret_cast<const std::byte*>(header.data());
  out.insert(out.end(), header_bytes, header_bytes + header.size());
  for (const SafetensorsEntry& entry : file.entries)
    out.insert(out.end(), entry.bytes.begin(), entry.bytes.end());
  return out;
}

std::string atomic_write_target(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path target = path;
  std::error_code error;
  // Follow links as the kernel would (at most 40 hops, its ELOOP limit); a relative link is relative to its folder.
  for (int hops = 0; fs::is_symlink(target, error); ++hops) {
    FERRY_CHECK(hops < 40, InvalidArgument, "'", detail::printable(path), "': too many levels of symbolic links");
    const fs::path next = fs::read_symlink(target, error);
    FERRY_CHECK(!error, IoError, "cannot read the symbolic link '", detail::printable(target.string()), "': ",
                error.message());
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  const fs::file_status status = fs::status(target, error);
  // A folder is left to rename(), which never replaces one (EISDIR): the write then fails as any failed rename does.
  if (!fs::exists(status) || fs::is_regular_file(status) || fs::is_directory(status)) return target.string();
  const char* kind = fs::is_character_file(status)      ? "a character device"
                     : fs::is_block_file(status)        ? "a block device"
                     : fs::is_fifo(status)              ? "a pipe"
                     : fs::is_socket(status)            ? "a socket"
                                                        : "not a regular file";
  throw InvalidArgument(detail::concat("'", detail::printable(path), "'",
                                       target == fs::path(path) ? "" : detail::concat(" (which leads to '",
                                           detail::printable(target.string()), "')"),
                                       " is ", kind, ": a checkpoint is written to a temporary file and renamed "
                                       "into place, which would replace it; give a file name"));
}

void write_safetensors(const std::string& requested_path, const SafetensorsFile& file) {
  const std::string header = build_header(file);  // argument errors surface before any disk work
  const std::string path = atomic_write_target(requested_path);

  static std::atomic<std::uint64_t> counter{0};
  TemporaryFile temporary(detail::concat(path, ".tmp.", ::getpid(), ".", counter++));
  const auto fail = [&](std::string_view step) {
    const int error_number = errno;
    throw IoError(detail::concat("cannot write safetensors file '", path, "': ", step, " '",
                                 temporary.path(), "' failed: ", errno_text(error_number)));
  };
  if (temporary.file() == nullptr) fail("creating the temporary file");

  const auto write = [&](const void* bytes, std::size_t count) {
    errno = 0;
    if (count > 0 && std::fwrite(bytes, 1, count, temporary.file()) != count)
      fail("writing the temporary file");
  };
  const std::array<std::byte, 8> length = little_endian_u64(header.size());
  write(length.data(), length.size());
  write(header.data(), header.size());
  for (const SafetensorsEntry& entry : file.entries) write(entry.bytes.data(), entry.bytes.size());
  if (std::fflush(temporary.file()) != 0) fail("flushing the temporary file");
  if (::fsync(::fileno(temporary.file())) != 0) fail("fsync of the temporary file");
  if (!temporary.close()) fail("closing the temporary file");
  if (std::rename(temporary.path().c_str(), path.c_str()) != 0) fail("renaming the temporary file");
  temporary.mark_committed();

  // Make the rename itself durable.
  std::string folder = std::filesystem::path(path).parent_path().string();
  if (folder.empty()) folder = ".";
  const int folder_fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  // EINVAL: this file system cannot fsync a folder; there is nothing more to do.
  const bool synced = folder_fd >= 0 && (::fsync(folder_fd) == 0 || errno == EINVAL);
  const int error_number = errno;
  if (folder_fd >= 0) ::close(folder_fd);
  FERRY_CHECK(synced, IoError, "wrote safetensors file '", path,
              "' but could not fsync its folder '", folder, "': ", errno_text(error_number));
}

}  // namespace ferry
