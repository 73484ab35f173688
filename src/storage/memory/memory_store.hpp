// The memory driver (memory://NAME): a Store held in this process, for tests and tools.
#pragma once

#include <memory>
#include <string>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/store.hpp"

namespace zerowait::internal {

// The store "memory://NAME": made empty on first use, then the same one for every caller in
// this process. Objects are visible while they are written, as on a filesystem; sync does
// nothing. kInvalidArgument for a URL without a NAME or with a path.
Result<std::shared_ptr<Store>> open_memory_store(const std::string& url);

// Object PATH of store NAME ("memory://NAME/PATH") for ranged reads: a copy of its bytes.
Result<std::unique_ptr<ByteSource>> open_memory_source(const std::string& url, IoBackend backend,
                                                       Deadline deadline);

}  // namespace zerowait::internal
