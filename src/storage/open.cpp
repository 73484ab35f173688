// The registry: one line per scheme. A new driver is a folder under src/storage/ plus its line
// here; nothing else in the tree maps a scheme to a driver.
#include "zerowait/storage/open.hpp"

#include <string_view>

#include "common/text.hpp"
#include "storage/http/http_source.hpp"
#include "storage/local/file_sources.hpp"
#include "storage/local_path.hpp"
#include "storage/memory/memory_store.hpp"
#include "storage/remote_object.hpp"
#include "storage/s3/s3_source.hpp"
#include "storage/s3/s3_store.hpp"
#include "zerowait/storage/url.hpp"

namespace zerowait {
namespace {

using StoreOpener = Result<std::shared_ptr<Store>> (*)(const std::string& url,
                                                       const StoreOptions& options);
using SourceOpener = Result<std::unique_ptr<ByteSource>> (*)(const std::string& url,
                                                             IoBackend backend, Deadline deadline);
using RemoteOpener = Result<std::unique_ptr<ByteSource>> (*)(const std::string& url,
                                                             Deadline deadline,
                                                             const internal::KnownObject* known);
using ObjectReader = Result<std::string> (*)(const std::string& url, Deadline deadline);

struct Driver {
  std::string_view scheme;
  StoreOpener store;  // nullptr: the scheme has objects to read but nowhere to write
  SourceOpener source;
  // Set for drivers that fetch over the network (what is_remote_url answers, and so what the
  // node-local cache fronts): a ranged-GET source, without a HEAD when the object is known, and
  // a small object read whole.
  RemoteOpener remote_source = nullptr;
  ObjectReader read_object = nullptr;
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

template <RemoteOpener open>
Result<std::unique_ptr<ByteSource>> open_remote(const std::string& url, IoBackend,
                                                Deadline deadline) {
  return open(url, deadline, nullptr);
}

// The same driver under another scheme's name.
constexpr Driver served_as(std::string_view scheme, Driver driver) {
  driver.scheme = scheme;
  return driver;
}

constexpr Driver kLocal = {"", open_local_store, open_local_source};

constexpr Driver kHttp = {"http", nullptr, open_remote<internal::open_http_url>,
                          internal::open_http_url, internal::read_http_object};
constexpr Driver kS3 = {"s3", open_s3_store, open_remote<internal::open_s3_url>,
                        internal::open_s3_url, internal::read_s3_object};

// One line per scheme.
constexpr Driver kDrivers[] = {
    kHttp,
    served_as("https", kHttp),
    {"memory", open_memory_store, internal::open_memory_source},
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

Status no_driver(std::string_view verb, const std::string& url, std::string_view which) {
  return invalid_argument("cannot " + std::string(verb) + " '" + url + "': no " +
                          std::string(which) + "storage driver serves " +
                          std::string(url_scheme(url)) + ":// (there are " + known_schemes() + ")");
}

// The remote driver of `url`, or nullptr when none fetches it over the network.
const Driver* remote_driver_of(std::string_view url) {
  const Driver* driver = driver_of(url);
  return driver != nullptr && driver->remote_source != nullptr ? driver : nullptr;
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
  if (driver == nullptr) return no_driver("read", url, "");
  return driver->source(url, backend, deadline);
}

namespace internal {

bool is_remote_url(std::string_view path) { return remote_driver_of(path) != nullptr; }

bool is_s3_url(std::string_view path) {
  const Driver* driver = driver_of(path);
  return driver != nullptr && driver->scheme == kS3.scheme;
}

Result<std::unique_ptr<ByteSource>> open_remote_source(const std::string& url, Deadline deadline,
                                                       const KnownObject* known) {
  const Driver* driver = remote_driver_of(url);
  if (driver == nullptr) return no_driver("fetch", url, "remote ");
  return driver->remote_source(url, deadline, known);
}

Result<std::shared_ptr<ByteSource>> open_shard_source(const std::string& path, IoBackend backend,
                                                      const SourceWrapper& wrap,
                                                      const KnownObject* known) {
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> opened,
                      is_remote_url(path)
                          ? open_remote_source(path, Deadline::after(kRemoteOpenTimeout), known)
                          : open_file_source(path, backend));
  std::shared_ptr<ByteSource> source = std::move(opened);
  return wrap ? wrap(std::move(source)) : source;
}

Result<std::string> read_remote_object(const std::string& url, Deadline deadline) {
  const Driver* driver = remote_driver_of(url);
  if (driver == nullptr) return no_driver("fetch", url, "remote ");
  return driver->read_object(url, deadline);
}

}  // namespace internal
}  // namespace zerowait
