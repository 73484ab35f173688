#include "checkpoint/file_digest.hpp"

#include <algorithm>
#include <string_view>

#include "checkpoint/safetensors.hpp"

namespace zerowait::internal {

void SegmentDigest::add(uint64_t segment_xxh3) {
  unsigned char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(segment_xxh3 >> (8 * i));
  combined_.update(bytes, sizeof(bytes));
}

FileDigest::FileDigest(const StoredFile& file, std::string name)
    : file_(file), name_(std::move(name)) {}

Status FileDigest::take_header() {
  ZW_ASSIGN_OR_RETURN(safetensors::Header header,
                      safetensors::decode_header(header_, file_.bytes, name_));
  segments_.add(XXH3_64bits(header_.data(), header_.size()));
  for (const safetensors::TensorEntry& t : header.tensors) {
    if (t.end > t.begin) ends_.push_back(header.data_start + t.end);
  }
  header_done_ = true;
  std::string().swap(header_);
  return Status::ok();
}

Status FileDigest::update(std::span<const std::byte> piece) {
  const auto* bytes = reinterpret_cast<const char*>(piece.data());
  if (file_.checksum == FileChecksum::kWholeFile) {
    whole_.update(bytes, piece.size());
    offset_ += piece.size();
    return Status::ok();
  }
  size_t used = 0;
  while (!header_done_) {
    uint64_t wanted = 8;  // the header's length, then the header
    if (header_.size() >= 8) {
      const std::string_view first8 = std::string_view(header_).substr(0, 8);
      ZW_ASSIGN_OR_RETURN(uint64_t length, safetensors::header_length(first8, name_));
      wanted = 8 + length;
      if (header_.size() == wanted) {
        ZW_RETURN_IF_ERROR(take_header());
        break;
      }
    }
    if (used == piece.size()) break;
    const size_t take = std::min<uint64_t>(wanted - header_.size(), piece.size() - used);
    header_.append(bytes + used, take);
    used += take;
  }
  while (used < piece.size()) {
    const uint64_t at = offset_ + used;
    if (segment_ >= ends_.size()) {
      return corrupt("'" + name_ + "' has bytes past its last tensor, at offset " +
                     std::to_string(at));
    }
    const size_t take = std::min<uint64_t>(ends_[segment_] - at, piece.size() - used);
    whole_.update(bytes + used, take);
    used += take;
    if (at + take == ends_[segment_]) {
      segments_.add(whole_.digest());
      whole_.reset();
      ++segment_;
    }
  }
  offset_ += piece.size();
  return Status::ok();
}

uint64_t FileDigest::digest() const {
  return file_.checksum == FileChecksum::kWholeFile ? whole_.digest() : segments_.digest();
}

}  // namespace zerowait::internal
