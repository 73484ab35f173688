// The ByteSource the remote drivers share: one remote object read with one ranged GET per read
// request, in order. The driver (http/, s3/) does the GET; the range and deadline checks are the
// storage layer's, as for files. Knows no scheme.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "storage/local/file_sources.hpp"  // check_range, deadline_status: shared with files
#include "zerowait/storage/byte_source.hpp"
#include "zerowait/storage/open.hpp"  // KnownObject: what a manifest says of an object

namespace zerowait::internal {

// Fills `dst` with the object's bytes from `offset`, within `deadline`.
using FetchRange =
    std::function<Status(uint64_t offset, std::span<std::byte> dst, Deadline deadline)>;

class RangedGetSource final : public ByteSource {
 public:
  // `name` is the URL as errors show it; `version` the object's ETag ("" when it has none).
  RangedGetSource(std::string name, uint64_t size, std::string version, FetchRange fetch)
      : name_(std::move(name)),
        size_(size),
        version_(std::move(version)),
        fetch_(std::move(fetch)) {}
  const std::string& name() const override { return name_; }
  uint64_t size() const override { return size_; }
  std::string version() const override { return version_; }

  Status read(std::span<const ReadRequest> requests, Deadline deadline) override {
    for (size_t i = 0; i < requests.size(); ++i) {
      const ReadRequest& r = requests[i];
      if (r.dst.empty()) continue;
      ZW_RETURN_IF_ERROR(check_range(name_, size_, r));
      if (deadline.passed()) return deadline_status(name_, r.offset, requests.size() - i);
      ZW_RETURN_IF_ERROR(fetch_(r.offset, r.dst, deadline));
    }
    return Status::ok();
  }

 private:
  std::string name_;
  uint64_t size_;
  std::string version_;
  FetchRange fetch_;
};

}  // namespace zerowait::internal
