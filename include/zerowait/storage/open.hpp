// The one registry of URL schemes (src/storage/open.cpp): the only code that knows which driver
// serves which scheme. Everything above storage/ opens what a user names through it, so a local
// path, an object store prefix and a test's memory store are one code path there.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"
#include "zerowait/storage/store.hpp"

namespace zerowait {

// How a store is opened, for the drivers that use it.
struct StoreOptions {
  // Where a driver that spools objects before uploading them (s3) keeps its spool files (unnamed,
  // so nothing is left there after a crash); empty: $TMPDIR, else /tmp.
  std::string spool_dir;
};

// The Store at `url`: a plain path is a local directory; a URL goes to the driver registered for
// its scheme (the driver's own error for a bad one: no credentials, a bad bucket name). A URL no
// driver writes to gives a store whose every call fails with kInvalidArgument naming it.
Result<std::shared_ptr<Store>> open_store(const std::string& url,
                                          const StoreOptions& options = {});

// Whether `url` is a plain path that the local driver reads and writes (a file system, where the
// page cache keeps what was read and a file has an inode to stat), rather than a URL another
// driver serves.
bool is_local_path(std::string_view url);

// Whether a driver fetches `url`'s objects over the network (http(s)://, s3://): what a
// node-local cache in front of the reads pays for. False for local paths, memory:// and schemes
// no driver serves.
bool reads_over_network(std::string_view url);

// ok when open_store(`url`) writes somewhere: a local path, or a URL whose scheme has a driver
// that writes (s3://, memory://). Otherwise kInvalidArgument naming `what` ("pack output") and
// the URL, said before anything is made, rather than when the store's first call fails.
Status require_writable_store(const std::string& url, std::string_view what);

// ok when a driver reads `url`: a local path, or a URL whose scheme has one (http(s)://, s3://,
// memory://). Otherwise kInvalidArgument naming `what` ("dataset") and the URL, said before any
// request is made.
Status require_readable(const std::string& url, std::string_view what);

// What a caller already knows of an object (from a dataset's manifest): its size, and a version
// that changes with its content. Given these, a driver that would ask the server for them (a
// HEAD) opens the object without a request; a wrong size shows as a failed or corrupt read.
struct KnownObject {
  uint64_t size = 0;
  std::string version;
};

// The object at `url` for ranged reads: a local file read with `backend`, or the object a URL
// names, opened within `deadline` (`known`: see KnownObject; local files ignore it).
// kInvalidArgument naming the schemes there are for another.
Result<std::unique_ptr<ByteSource>> open_source(const std::string& url, IoBackend backend,
                                                Deadline deadline,
                                                const KnownObject* known = nullptr);

// The whole (small) object at `url`, a manifest or a list, within `deadline`: a local file or
// the object a URL names (one GET where the driver fetches). kNotFound when there is none.
Result<std::string> read_object(const std::string& url, Deadline deadline);

// How long opening what a user named may take (a manifest, a shard's footer and index, each read
// of a tar's scan) when the caller has no deadline of its own: generous for a remote object,
// finite for a hung one.
inline constexpr std::chrono::seconds kOpenTimeout{60};
inline Deadline open_deadline() { return Deadline::after(kOpenTimeout); }

}  // namespace zerowait
