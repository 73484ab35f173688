// The one registry of URL schemes (src/storage/open.cpp): the only code that knows which driver
// serves which scheme. Everything above storage/ opens what a user names through it, so a local
// path, an object store prefix and a test's memory store are one code path there.
#pragma once

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

// ok when open_store(`url`) writes somewhere: a local path, or a URL whose scheme has a driver
// that writes (s3://, memory://). Otherwise kInvalidArgument naming `what` ("pack output") and
// the URL, said before anything is made, rather than when the store's first call fails.
Status require_writable_store(const std::string& url, std::string_view what);

// The object at `url` for ranged reads: a local file read with `backend`, or the object a URL
// names, opened within `deadline`. kInvalidArgument naming the schemes there are for another.
Result<std::unique_ptr<ByteSource>> open_source(const std::string& url, IoBackend backend,
                                                Deadline deadline);

}  // namespace zerowait
