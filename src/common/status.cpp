#include "zerowait/common/status.hpp"

#include <cstring>

namespace zerowait {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kAlreadyExists:
      return "already_exists";
    case ErrorCode::kIo:
      return "io";
    case ErrorCode::kCorrupt:
      return "corrupt";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kDeadlineExceeded:
      return "deadline_exceeded";
    case ErrorCode::kCancelled:
      return "cancelled";
    case ErrorCode::kResourceExhausted:
      return "resource_exhausted";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(error_code_name(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& context) const {
  if (is_ok()) return *this;
  return Status(code_, context + ": " + message_);
}

Status errno_status(int err, const std::string& what, const std::string& path, long long offset) {
  std::string message = what + " '" + path + "'";
  if (offset >= 0) message += " at offset " + std::to_string(offset);
  message += ": ";
  message += strerror(err);
  switch (err) {
    case ENOENT:
      return Status(ErrorCode::kNotFound, message);
    case EEXIST:
      return Status(ErrorCode::kAlreadyExists, message);
    default:
      return Status(ErrorCode::kIo, message);
  }
}

}  // namespace zerowait
