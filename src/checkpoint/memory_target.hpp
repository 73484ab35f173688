#pragma once

#include <memory>
#include <string>

#include "zerowait/storage/store.hpp"

namespace zerowait {

// A store held in memory, described as "memory:<name>": the contract of an object store (no
// local path, nothing survives the process) for tests and tools. Files are visible while they
// are written, as on a filesystem; sync does nothing.
std::shared_ptr<Store> make_memory_store(const std::string& name);

}  // namespace zerowait
