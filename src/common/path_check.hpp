// Local paths only where remote storage is not supported (yet): a path that starts with a URL
// scheme ("s3://bucket/x", "https://host/x", "file:///x") is refused instead of being taken for
// a relative folder named "s3:". Callers that do read some URLs (Dataset::open reads http(s) and
// s3) dispatch those first.
#pragma once

#include <filesystem>
#include <string_view>

#include "zerowait/common/status.hpp"

namespace zerowait::internal {

// The scheme of "scheme://rest" as written (RFC 3986: a letter, then letters, digits, '+', '-',
// '.'), or empty when `text` does not start with one.
std::string_view url_scheme(std::string_view text);

// ok for a local filesystem path; kInvalidArgument naming `what` ("checkpoint mirror",
// "dataset", ...) and `path` when `path` starts with `scheme://` (RFC 3986 scheme: a letter,
// then letters, digits, '+', '-', '.'). file:// is refused too: give the path itself.
Status require_local_path(const std::filesystem::path& path, std::string_view what);

}  // namespace zerowait::internal
