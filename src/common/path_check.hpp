// Kept only for the callers in src/shard/ and cli/commands/ckpt.cpp that still include it while
// they move onto Store and zerowait/storage/url.hpp; common/ itself knows no URL. Both functions
// are defined in storage/url.cpp (the URL parser's one home). Delete this header when nothing
// includes it.
#pragma once

#include <filesystem>
#include <string_view>

#include "zerowait/common/status.hpp"

namespace zerowait::internal {

// zerowait::url_scheme (zerowait/storage/url.hpp).
std::string_view url_scheme(std::string_view text);

// As declared in storage/local_path.hpp.
Status require_local_path(const std::filesystem::path& path, std::string_view what);

}  // namespace zerowait::internal
