// The library's own refusal of a URL where only a local path works, in the wording the
// checkpoint, pack and GPU-read messages have always used ("... is a URL (s3://), and remote
// storage is not supported yet: ..."). The public zerowait/storage/url.hpp refusal is the
// CLI's and Python's. Both are defined in storage/url.cpp, beside the one URL parser.
#pragma once

#include <filesystem>
#include <string_view>

#include "zerowait/common/status.hpp"

namespace zerowait::internal {

// ok for a local filesystem path; kInvalidArgument naming `what` ("checkpoint mirror",
// "dataset", ...) and `path` when `path` starts with `scheme://`. file:// is refused too: give
// the path itself.
Status require_local_path(const std::filesystem::path& path, std::string_view what);

}  // namespace zerowait::internal
