// The registry: one line per scheme. A new driver is a folder under src/storage/ plus its line
// here; nothing else in the tree maps a scheme to a driver.
#include "zerowait/storage/open.hpp"

#include <filesystem>
#include <span>
#include <string_view>

#include "common/text.hpp"
#include "storage/http/http_source.hpp"
#include "storage/local/file_sources.hpp"
#include "storage/local_path.hpp"
#include "storage/memory/memory_store.hpp"
#include "storage/s3/s3_source.hpp"
#include "storage/s3/s3_store.hpp"
#include "zerowait/storage/url.hpp"

namespace zerowait {
namespace {

using StoreOpener = Result<std::shared_ptr<Store>> (*)(const std::string& url,
                                                       const StoreOptions& options);
using SourceOpener = Result<std::unique_ptr<ByteSource>> (*)(const std::string& url,
                                                             IoBackend backend, Deadline deadline,
                                                             const KnownObject* known);
using ObjectReader = Result<std::string> (*)(const std::string& url, Deadline deadline);

struct Driver {
  std::string_view scheme;
  StoreOpener store;  // nullptr: the scheme has objects to read but nowhere to write
  SourceOpener source;
  ObjectReader read_object;
  bool over_network = false;  // what a node-local cache fronts
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
                                                      Deadline, const KnownObject*) {
  return open_file_source(path, backend);
}

// Through the local store of its directory, whose calls keep their deadline on a hung mount.
Result<std::string> read_local_object(const std::string& path, Deadline deadline) {
  const std::filesystem::path file(path);
  const std::filesystem::path directory = file.parent_path();
  return make_local_store(directory.empty() ? "." : directory)
      ->read(file.filename().string(), deadline);
}

Result<std::unique_ptr<ByteSource>> open_memory_source(const std::string& url, IoBackend backend,
                                                       Deadline deadline, const KnownObject*) {
  return internal::open_memory_source(url, backend, deadline);
}

Result<std::string> read_memory_object(const std::string& url, Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(auto source, internal::open_memory_source(url, IoBackend::kPread, deadline));
  std::string bytes(source->size(), '\0');
  ZW_RETURN_IF_ERROR(source->read_at(0, std::as_writable_bytes(std::span(bytes)), deadline));
  return bytes;
}

// A ranged-GET driver: the IoBackend is a local file's business.
template <Result<std::unique_ptr<ByteSource>> (*open)(const std::string&, Deadline,
                                                      const KnownObject*)>
Result<std::unique_ptr<ByteSource>> open_remote(const std::string& url, IoBackend,
                                                Deadline deadline, const KnownObject* known) {
  return open(url, deadline, known);
}

// The same driver under another scheme's name.
constexpr Driver served_as(std::string_view scheme, Driver driver) {
  driver.scheme = scheme;
  return driver;
}

constexpr Driver kLocal = {"", open_local_store, open_local_source, read_local_object};

constexpr Driver kHttp = {"http", nullptr, open_remote<internal::open_http_url>,
                          internal::read_http_object, /*over_network=*/true};
constexpr Driver kS3 = {"s3", open_s3_store, open_remote<internal::open_s3_url>,
                        internal::read_s3_object, /*over_network=*/true};

// One line per scheme.
constexpr Driver kDrivers[] = {
    kHttp,
    served_as("https", kHttp),
    {"memory", open_memory_store, open_memory_source, read_memory_object},
    kS3,
};

// The driver of `url`: a plain path's is the local one; nullptr for a scheme with none.
const Driver* driver_of(std::string_view url) {
  const std::string scheme = internal::ascii_lower(url_scheme(url));
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

Status no_driver(std::string_view verb, const std::string& url) {
  return invalid_argument("cannot " + std::string(verb) + " '" + url +
                          "': no storage driver serves " + std::string(url_scheme(url)) +
                          ":// (there are " + known_schemes() + ")");
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

bool reads_over_network(std::string_view url) {
  const Driver* driver = driver_of(url);
  return driver != nullptr && driver->over_network;
}

Status require_writable_store(const std::string& url, std::string_view what) {
  const Driver* driver = driver_of(url);
  if (driver != nullptr && driver->store != nullptr) return Status::ok();
  // A URL (no plain path lacks a driver): refused by name, with what can be given instead.
  return internal::require_local_path(url, what);
}

Status require_readable(const std::string& url, std::string_view what) {
  if (driver_of(url) != nullptr) return Status::ok();
  // A URL (every plain path has a driver): refused by name, as a local-only argument would be.
  return internal::require_local_path(url, what);
}

Result<std::unique_ptr<ByteSource>> open_source(const std::string& url, IoBackend backend,
                                                Deadline deadline, const KnownObject* known) {
  const Driver* driver = driver_of(url);
  if (driver == nullptr) return no_driver("read", url);
  return driver->source(url, backend, deadline, known);
}

Result<std::string> read_object(const std::string& url, Deadline deadline) {
  const Driver* driver = driver_of(url);
  if (driver == nullptr) return no_driver("read", url);
  return driver->read_object(url, deadline);
}

}  // namespace zerowait
