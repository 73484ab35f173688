// The S3 driver's Store: a prefix in a bucket, with the settings the AWS SDKs read (environment,
// ~/.aws files; docs/remote.md).
#pragma once

#include <memory>
#include <string>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/store.hpp"

namespace zerowait::internal {

// The store at "s3://BUCKET[/PREFIX]". Objects are spooled locally (unnamed temp files) and
// uploaded on sync/close (multipart from 64 MiB); publish copies on the server, the commit
// record last. `spool_dir`: where the spool files are made (empty: $TMPDIR, else /tmp).
// kInvalidArgument for another URL; kNotFound when no credentials are found.
Result<std::shared_ptr<Store>> open_s3_store(const std::string& url,
                                             const std::string& spool_dir = "");

}  // namespace zerowait::internal
