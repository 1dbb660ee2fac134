// ferry/error.h — the typed errors ferry throws, and the FERRY_CHECK / FERRY_ASSERT macros.
// Libraries throw; only a program's main() turns these into exit codes (tools/ferry/main.cpp).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ferry {

// Base of every error ferry throws. what() is the whole message, ready for a user.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A bad argument from the user: a malformed string, a negative size, an unknown option value.
class InvalidArgument : public Error { using Error::Error; };
// Operands live on different devices (DESIGN.md invariant 4).
class DeviceMismatch : public Error { using Error::Error; };
// Operands have shapes that cannot be combined.
class ShapeMismatch : public Error { using Error::Error; };
// Operands have dtypes an op does not accept together.
class DTypeMismatch : public Error { using Error::Error; };
// A device was named that this machine does not have.
class DeviceUnavailable : public Error { using Error::Error; };
// An allocation could not be met; the message carries the numbers.
class OutOfMemory : public Error { using Error::Error; };
// A host sync or copy broke a policy or budget set by the user (ferry/ledger.h).
class SyncPolicyViolation : public Error { using Error::Error; };
// A file could not be read, or is malformed (checkpoints, datasets).
class FormatError : public Error { using Error::Error; };
class IoError : public Error { using Error::Error; };
// A device runtime (CUDA, cuBLAS, cuDNN, NCCL, MPI) reported a failure.
class BackendError : public Error { using Error::Error; };
// An optional capability (pinned memory, events) that a device does not have.
class NotSupported : public Error { using Error::Error; };
// Work inside a graph capture that cannot be captured (a host sync, a copy between devices, random numbers,
// freeing memory allocated before the capture), or a capture the device refused (ferry/graph.h).
class GraphCaptureError : public Error { using Error::Error; };
// A broken internal invariant: a bug in ferry, not a user mistake.
class InternalError : public Error { using Error::Error; };
// The user asked a long run to stop (Ctrl-C, or a scheduler's SIGTERM) and it stopped cleanly, its progress
// saved where it was asked to be. Not a failure of ferry's: main() exits 128 + signal, as a shell expects.
class Interrupted : public Error {
 public:
  Interrupted(const std::string& message, int signal) : Error(message), signal_(signal) {}
  int signal() const { return signal_; }  // the POSIX signal number (SIGINT 2, SIGTERM 15)

 private:
  int signal_;
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// Text from a user or a file as quoted in an error: control bytes written as \xNN, so that the message stays one
// line whatever the text holds (a newline in a --device string, in a checkpoint's metadata).
inline std::string printable(std::string_view text) {
  constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7F) {
      out += "\\x";
      out += kDigits[byte >> 4];
      out += kDigits[byte & 0xF];
    } else {
      out += c;
    }
  }
  return out;
}
}  // namespace detail

}  // namespace ferry

// FERRY_CHECK(cond, ErrorType, parts...): a user mistake; throws ErrorType with the parts joined.
//   FERRY_CHECK(n >= 0, InvalidArgument, "Expected a non-negative size, got ", n);
#define FERRY_CHECK(cond, ErrorType, ...)                                   \
  do {                                                                      \
    if (!(cond)) throw ::ferry::ErrorType(::ferry::detail::concat(__VA_ARGS__)); \
  } while (0)

// FERRY_ASSERT(cond, parts...): an internal invariant; a failure is a ferry bug.
#define FERRY_ASSERT(cond, ...)                                                        \
  do {                                                                                 \
    if (!(cond))                                                                       \
      throw ::ferry::InternalError(::ferry::detail::concat(                            \
          "ferry internal error at ", __FILE__, ":", __LINE__, ": ", #cond, " failed. " \
          __VA_OPT__(, ) __VA_ARGS__));                                                \
  } while (0)
