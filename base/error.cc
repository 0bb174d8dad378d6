#include "tessel/base/error.h"

#include <cstring>

namespace tessel {

std::string_view error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return "InvalidArgument";
    case ErrorKind::kOutOfRange:
      return "OutOfRange";
    case ErrorKind::kTimeout:
      return "Timeout";
    case ErrorKind::kCommError:
      return "CommError";
    case ErrorKind::kPeerLost:
      return "PeerLost";
    case ErrorKind::kIoError:
      return "IoError";
    case ErrorKind::kUnavailable:
      return "Unavailable";
    case ErrorKind::kNotImplemented:
      return "NotImplemented";
    case ErrorKind::kInternal:
      return "Internal";
    case ErrorKind::kOutOfMemory:
      return "OutOfMemory";
  }
  return "Error";
}

Error::Error(ErrorKind kind, const std::string& message)
    : std::runtime_error(fmt::format("{}: {}", error_kind_name(kind), message)),
      kind_(kind),
      message_(message) {}

Error::~Error() = default;
InvalidArgument::~InvalidArgument() = default;
OutOfRange::~OutOfRange() = default;
Timeout::~Timeout() = default;
CommError::~CommError() = default;
PeerLost::~PeerLost() = default;
IoError::~IoError() = default;
Unavailable::~Unavailable() = default;
NotImplemented::~NotImplemented() = default;
Internal::~Internal() = default;
OutOfMemory::~OutOfMemory() = default;

void throw_error(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      throw InvalidArgument(message);
    case ErrorKind::kOutOfRange:
      throw OutOfRange(message);
    case ErrorKind::kTimeout:
      throw Timeout(message);
    case ErrorKind::kCommError:
      throw CommError(message);
    case ErrorKind::kPeerLost:
      throw PeerLost(message);
    case ErrorKind::kIoError:
      throw IoError(message);
    case ErrorKind::kUnavailable:
      throw Unavailable(message);
    case ErrorKind::kNotImplemented:
      throw NotImplemented(message);
    case ErrorKind::kInternal:
      throw Internal(message);
    case ErrorKind::kOutOfMemory:
      throw OutOfMemory(message);
  }
  throw Internal(fmt::format("unknown error kind {} for: {}", static_cast<int>(kind), message));
}

void throw_system_error(std::string_view what, int errnum) {
  char buf[256];
  // GNU strerror_r returns the message pointer (possibly not buf).
  const char* text = strerror_r(errnum, buf, sizeof(buf));
  throw IoError(fmt::format("{}: {} (errno {})", what, text, errnum));
}

}  // namespace tessel
