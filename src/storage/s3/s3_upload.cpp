#include "storage/s3/s3_upload.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <string_view>

namespace zerowait::internal {
namespace {

constexpr uint64_t kPartBytes = 16ull << 20;
constexpr unsigned kUploadThreads = 4;

}  // namespace

Status upload_file_to_s3(S3Client& client, const std::string& bucket, const std::string& key,
                         int fd, uint64_t size, Deadline deadline) {
  void* mapped = nullptr;
  if (size > 0) {
    mapped = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
      return errno_status(errno, "cannot map the local copy of", "s3://" + bucket + "/" + key);
    }
  }
  const std::string_view body(static_cast<const char*>(mapped), size);
  Status status =
      size >= kS3MultipartFromBytes
          ? client.put_multipart(bucket, key, body, kPartBytes, kUploadThreads, deadline)
          : client.put(bucket, key, body, deadline);
  if (mapped != nullptr) ::munmap(mapped, size);
  return status;
}

}  // namespace zerowait::internal
