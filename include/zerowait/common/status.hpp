// Errors as values: every I/O path returns Status or Result<T>; exceptions appear only at the
// Python boundary and in the CLI's top level.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace zerowait {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,    // caller passed something unusable (bad option, out-of-range index)
  kNotFound,           // a path or key that does not exist
  kAlreadyExists,      // refusing to overwrite
  kIo,                 // the OS failed a call (message carries path, offset and strerror)
  kCorrupt,            // bytes on disk do not match the format or their checksum
  kUnsupported,        // a valid but unknown format version or feature
  kDeadlineExceeded,   // a read did not finish before its deadline
  kCancelled,          // work stopped on request
  kResourceExhausted,  // a memory budget or pool cannot hold what is asked
  kInternal,           // a bug in zerowait
};

// Returns a stable lower-case name ("corrupt", "io", ...) for messages and JSON.
const char* error_code_name(ErrorCode code);

// A success, or an error code with a message that names what failed, where, and why. A plain
// value (copyable, no shared state). Only the front ends turn it into something else: the CLI
// into "zerowait: error: ..." and an exit status, the Python bindings into exceptions.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns "<code>: <message>", or "ok".
  std::string to_string() const;

  // Returns a copy whose message is "<context>: <message>"; success stays success.
  Status with_context(const std::string& context) const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) {
  return {ErrorCode::kInvalidArgument, std::move(m)};
}
inline Status not_found(std::string m) { return {ErrorCode::kNotFound, std::move(m)}; }
inline Status corrupt(std::string m) { return {ErrorCode::kCorrupt, std::move(m)}; }
inline Status unsupported(std::string m) { return {ErrorCode::kUnsupported, std::move(m)}; }
inline Status io_error(std::string m) { return {ErrorCode::kIo, std::move(m)}; }

// Maps an errno value to a Status in exactly one place: "<what> '<path>'[ at offset N]:
// <strerror>". ENOENT becomes kNotFound, EEXIST kAlreadyExists, everything else kIo.
Status errno_status(int err, const std::string& what, const std::string& path,
                    long long offset = -1);

// A value or an error. Accessing value() of an error is a bug (asserted).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {  // NOLINT: implicit by design
    assert(!std::get<Status>(data_).is_ok() && "Result built from an ok Status");
  }

  bool is_ok() const { return std::holds_alternative<T>(data_); }
  explicit operator bool() const { return is_ok(); }

  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(data_);
  }
  T& value() & { return std::get<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace zerowait

// Propagates a failing Status from the enclosing function.
#define ZW_RETURN_IF_ERROR(expr)                \
  do {                                          \
    ::zerowait::Status zw_status_ = (expr);     \
    if (!zw_status_.is_ok()) return zw_status_; \
  } while (0)

#define ZW_CONCAT_INNER(a, b) a##b
#define ZW_CONCAT(a, b) ZW_CONCAT_INNER(a, b)

// `ZW_ASSIGN_OR_RETURN(auto x, f());` binds f()'s value or returns its error.
#define ZW_ASSIGN_OR_RETURN(decl, expr) \
  ZW_ASSIGN_OR_RETURN_IMPL(ZW_CONCAT(zw_result_, __LINE__), decl, expr)
#define ZW_ASSIGN_OR_RETURN_IMPL(tmp, decl, expr) \
  auto tmp = (expr);                              \
  if (!tmp.is_ok()) return tmp.status();          \
  decl = std::move(tmp).value()
