// What every Store driver shares: how a relative name becomes a full one.
#pragma once

#include <string>

#include "zerowait/common/status.hpp"

namespace zerowait::internal {

// `root` + "/" + `path` (`root` for ""): the full name of a store's object, for the store's own
// calls and every error. kInvalidArgument, naming both, for a path that is absolute or contains
// "..": it could leave the root.
Result<std::string> join_store_path(const std::string& root, const std::string& path);

}  // namespace zerowait::internal
