#pragma once
// tessel's one error policy: exceptions derived from tessel::Error, each naming the offending
// value and what was expected. Asynchronous failures are stored (std::exception_ptr) and rethrown.

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace tessel {

enum class ErrorKind {
  kInvalidArgument,  // a bad value from the caller: shape, dtype, flag, file contents
  kOutOfRange,       // an index or key outside what exists
  kTimeout,          // a blocking call passed its deadline
  kCommError,        // a transport or communicator failed
  kPeerLost,         // another rank or process went away
  kIoError,          // a file or socket operation failed
  kUnavailable,      // a backend or feature not built in, or a device not present
  kNotImplemented,   // a valid request this build does not support yet
  kInternal,         // a broken invariant inside tessel: a bug
  kOutOfMemory,      // an allocation the device (or host) could not satisfy
};

// "InvalidArgument", "Timeout", ... — the class name of each kind.
std::string_view error_kind_name(ErrorKind kind);

// Base of every exception tessel throws. what() is "<KindName>: <message>". The destructors
// are defined in error.cc, so each class's type information lives in libtessel_base alone.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message);
  ~Error() override;

  ErrorKind kind() const noexcept { return kind_; }
  // The message without the kind prefix.
  const std::string& message() const noexcept { return message_; }

 private:
  ErrorKind kind_;
  std::string message_;
};

#define TESSEL_DEFINE_ERROR(Name)                                                     \
  class Name : public Error {                                                         \
   public:                                                                            \
    explicit Name(const std::string& message) : Error(ErrorKind::k##Name, message) {} \
    ~Name() override;                                                                 \
  };
TESSEL_DEFINE_ERROR(InvalidArgument)
TESSEL_DEFINE_ERROR(OutOfRange)
TESSEL_DEFINE_ERROR(Timeout)
TESSEL_DEFINE_ERROR(CommError)
TESSEL_DEFINE_ERROR(PeerLost)
TESSEL_DEFINE_ERROR(IoError)
TESSEL_DEFINE_ERROR(Unavailable)
TESSEL_DEFINE_ERROR(NotImplemented)
TESSEL_DEFINE_ERROR(Internal)
TESSEL_DEFINE_ERROR(OutOfMemory)
#undef TESSEL_DEFINE_ERROR

// Throws the subclass of Error that matches `kind` (for errors that crossed a process or
// thread boundary as a kind and a message).
[[noreturn]] void throw_error(ErrorKind kind, const std::string& message);

// IoError for a failed system call: "<what>: <strerror(errnum)>".
[[noreturn]] void throw_system_error(std::string_view what, int errnum);

}  // namespace tessel

// TESSEL_CHECK(cond, ErrorType, "format {}", args...) throws ErrorType with the formatted
// message when cond is false. The message is built only on failure.
#define TESSEL_CHECK(cond, ErrorType, ...)                   \
  do {                                                       \
    if (!(cond)) [[unlikely]] {                              \
      throw ::tessel::ErrorType(::fmt::format(__VA_ARGS__)); \
    }                                                        \
  } while (0)
