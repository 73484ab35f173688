#include "host/dynamic_library.hpp"

namespace zerowait::internal {

std::string dl_error() {
  const char* error = dlerror();
  return error != nullptr ? error : "unknown dynamic linker error";
}

void* open_first_library(std::initializer_list<const char*> names, std::string* opened,
                         std::string* errors) {
  for (const char* name : names) {
    if (void* library = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
      *opened = name;
      return library;
    }
  }
  errors->clear();
  for (const char* name : names) {
    if (void* library = dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
      *opened = name;
      return library;
    }
    *errors += (errors->empty() ? "" : "; ") + dl_error();
  }
  return nullptr;
}

}  // namespace zerowait::internal
