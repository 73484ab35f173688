// What the libraries loaded at run time share (libcudart, libcufile, NVML): opening the first
// of several sonames, a copy the process already holds first (a CUDA build of torch's, one the
// Python side preloaded), and typed dlsym. Handles are never closed: the entry points stay valid
// for the life of the process.
#pragma once

#include <dlfcn.h>

#include <initializer_list>
#include <string>

namespace zerowait::internal {

// dlerror() as text ("unknown dynamic linker error" when it has none).
std::string dl_error();

// The first of `names` already loaded in this process; else the first that dlopen (RTLD_NOW |
// RTLD_LOCAL) loads. `*opened` is set to its name; on failure returns nullptr and `*errors`
// lists each name's dlerror().
void* open_first_library(std::initializer_list<const char*> names, std::string* opened,
                         std::string* errors);

// `out` = the library's `name`, typed; false when it has none.
template <typename Function>
bool resolve(void* library, const char* name, Function& out) {
  out = reinterpret_cast<Function>(dlsym(library, name));
  return out != nullptr;
}

}  // namespace zerowait::internal
