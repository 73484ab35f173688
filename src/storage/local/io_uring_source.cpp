// IoBackend::kIoUring: a read() puts all its requests in flight at once on the calling thread's
// ring, so one call costs about one device round trip instead of one per request, and a read
// that hangs is cancelled at its deadline.
#include <vector>

#include "storage/local/file_sources.hpp"
#include "storage/local/read_engine.hpp"

namespace zerowait::internal {
namespace {

class IoUringSource final : public CachedFileSource {
 public:
  using CachedFileSource::CachedFileSource;

  Status read(std::span<const ReadRequest> requests, Deadline deadline) override {
    std::vector<RangeRead> ranges;
    ranges.reserve(requests.size());
    for (const ReadRequest& r : requests) {
      ZW_RETURN_IF_ERROR(check_range(name(), size(), r));
      if (!r.dst.empty()) ranges.push_back({r.offset, r.dst, r.dst.size(), &r});
    }
    return read_ranges(file(), ranges, deadline, /*direct=*/false);
  }
};

}  // namespace

std::unique_ptr<ByteSource> make_io_uring_source(File file, uint64_t size) {
  return std::make_unique<IoUringSource>(std::move(file), size);
}

}  // namespace zerowait::internal
