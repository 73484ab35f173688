// The registry: one line per scheme. A new driver is a folder under src/storage/ plus its line
// here; nothing else in the tree names a scheme.
#include "zerowait/storage/open.hpp"

#include <string_view>

#include "common/path_check.hpp"
#include "common/text.hpp"
#include "storage/local/file_sources.hpp"
#include "storage/memory/memory_store.hpp"
#include "storage/remote_object.hpp"
#include "storage/s3/s3_store.hpp"

namespace zerowait {
namespace {

using StoreOpener = Result<std::shared_ptr<Store>> (*)(const std::string& url,
                                                       const StoreOptions& options);
using SourceOpener = Result<std::unique_ptr<ByteSource>> (*)(const std::string& url,
                                                             IoBackend backend, Deadline deadline);

struct Driver {
  std::string_view scheme;
  StoreOpener store;  // nullptr: the scheme has objects to read but nowhere to write
  SourceOpener source;
};

Result<std::shared_ptr<Store>> open_local_store(const std::string& path, const StoreOptions&) {
  return make_local_store(path);
}

Result<std::shared_ptr<Store>> open_memory_store(const std::string& url, const StoreOptions&) {
  return internal::open_memory_store(url);
}

Result<std::shared_ptr<Store>> open_s3_store(const std::string& url, const StoreOptions& options) {
  return internal::open_s3_store(url, options.spool_dir);
}

Result<std::unique_ptr<ByteSource>> open_local_source(const std::string& path, IoBackend backend,
                                                      Deadline) {
  return open_file_source(path, backend);
}

Result<std::unique_ptr<ByteSource>> open_url_source(const std::string& url, IoBackend,
                                                    Deadline deadline) {
  return internal::open_remote_source(url, deadline);
}

constexpr Driver kLocal = {"", open_local_store, open_local_source};

// One line per scheme.
constexpr Driver kDrivers[] = {
    {"http", nullptr, open_url_source},
    {"https", nullptr, open_url_source},
    {"memory", open_memory_store, internal::open_memory_source},
    {"s3", open_s3_store, open_url_source},
};

// The driver of `url`: a plain path's is the local one; nullptr for a scheme with none.
const Driver* driver_of(const std::string& url) {
  const std::string scheme = internal::ascii_lower(internal::url_scheme(url));
  if (scheme.empty()) return &kLocal;
  for (const Driver& driver : kDrivers) {
    if (driver.scheme == scheme) return &driver;
  }
  return nullptr;
}

std::string known_schemes() {
  std::string known;
  for (const Driver& driver : kDrivers) known += std::string(driver.scheme) + "://, ";
  return known + "and local paths";
}

}  // namespace

Result<std::shared_ptr<Store>> open_store(const std::string& url, const StoreOptions& options) {
  const Driver* driver = driver_of(url);
  // No driver writes there: the local store refuses every call, naming the URL (it is never
  // taken for a folder named "https:").
  if (driver == nullptr || driver->store == nullptr) return make_local_store(url);
  return driver->store(url, options);
}

bool is_local_path(std::string_view url) { return driver_of(std::string(url)) == &kLocal; }

Status require_writable_store(const std::string& url, std::string_view what) {
  const Driver* driver = driver_of(url);
  if (driver != nullptr && driver->store != nullptr) return Status::ok();
  // A URL (no plain path lacks a driver): refused by name, with what can be given instead.
  return internal::require_local_path(url, what);
}

Result<std::unique_ptr<ByteSource>> open_source(const std::string& url, IoBackend backend,
                                                Deadline deadline) {
  const Driver* driver = driver_of(url);
  if (driver == nullptr) {
    return invalid_argument("cannot read '" + url + "': no storage driver serves " +
                            std::string(internal::url_scheme(url)) + ":// (there are " +
                            known_schemes() + ")");
  }
  return driver->source(url, backend, deadline);
}

}  // namespace zerowait
