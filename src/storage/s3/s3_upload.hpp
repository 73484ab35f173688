// Uploads a whole local file to one S3 object, the way every writer to a bucket does it (pack's
// shards, checkpoint files): one PUT for a small file, a multipart upload with parts in parallel
// for a large one. The file is mapped, not read into memory.
#pragma once

#include <cstdint>
#include <string>

#include "storage/s3/s3_client.hpp"
#include "zerowait/common/status.hpp"

namespace zerowait::internal {

// From this size on, uploads are multipart (16 MiB parts, 4 at a time): one stalled request then
// costs a part, not the object, and parts overlap on the wire.
inline constexpr uint64_t kS3MultipartFromBytes = 64ull << 20;

// Uploads bytes [0, size) of the open file `fd` to s3://bucket/key within `deadline`. Errors name
// the object (S3Client's errors, or the mapping of `fd` that failed); a failed multipart upload is
// aborted by the client, so no parts are left behind. Thread-safe for distinct files.
Status upload_file_to_s3(S3Client& client, const std::string& bucket, const std::string& key,
                         int fd, uint64_t size, Deadline deadline);

}  // namespace zerowait::internal
