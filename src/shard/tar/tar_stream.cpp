#include "shard/tar/tar_stream.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <optional>

#include "shard/tar/tar_header.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait::internal {
namespace {

// Large reads keep a stream of small members at disk speed instead of syscall speed (and at one
// request per MiB from an object store).
constexpr size_t kBufferSize = 1 << 20;
// Each read of the archive: generous, since a remote one may be slow; a stalled one is reported.
constexpr auto kReadTimeout = std::chrono::seconds(120);

// A plain tar through one buffer; skipped data is never read.
class SourceInput final : public TarInput {
 public:
  explicit SourceInput(std::shared_ptr<ByteSource> source)
      : source_(std::move(source)), size_(source_->size()) {}

  Result<size_t> read(std::span<std::byte> dst) override {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(dst.size(), size_ - pos_));
    size_t done = 0;
    while (done < n) {
      if (pos_ >= buffer_offset_ && pos_ < buffer_offset_ + buffer_.size()) {
        const size_t at = static_cast<size_t>(pos_ - buffer_offset_);
        const size_t take = std::min(n - done, buffer_.size() - at);
        std::memcpy(dst.data() + done, buffer_.data() + at, take);
        done += take;
        pos_ += take;
      } else if (n - done >= kBufferSize) {  // large member data: straight into the caller's bytes
        ZW_RETURN_IF_ERROR(
            source_->read_at(pos_, dst.subspan(done, n - done), Deadline::after(kReadTimeout)));
        pos_ += n - done;
        done = n;
      } else {
        buffer_.resize(static_cast<size_t>(std::min<uint64_t>(kBufferSize, size_ - pos_)));
        buffer_offset_ = pos_;
        ZW_RETURN_IF_ERROR(source_->read_at(pos_, buffer_, Deadline::after(kReadTimeout)));
      }
    }
    return n;
  }

  Result<uint64_t> skip(uint64_t n) override {
    n = std::min(n, size_ - pos_);
    pos_ += n;
    return n;
  }

  uint64_t position() const override { return pos_; }
  std::optional<uint64_t> known_size() const override { return size_; }

 private:
  std::shared_ptr<ByteSource> source_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::vector<std::byte> buffer_;
  uint64_t buffer_offset_ = 0;
};

// A gzip-compressed tar inflated with zlib as it is read (concatenated gzip members too): the
// uncompressed size is unknown until the end, and skipping means decompressing.
class GzipInput final : public TarInput {
 public:
  GzipInput(std::shared_ptr<ByteSource> source, std::string path)
      : compressed_(std::move(source)), path_(std::move(path)) {}
  ~GzipInput() override {
    if (initialised_) inflateEnd(&zs_);
  }
  GzipInput(const GzipInput&) = delete;
  GzipInput& operator=(const GzipInput&) = delete;

  Result<size_t> read(std::span<std::byte> dst) override {
    if (!initialised_) {
      if (inflateInit2(&zs_, 16 + MAX_WBITS) != Z_OK) return zlib_error("inflateInit2");
      initialised_ = true;
    }
    size_t done = 0;
    while (done < dst.size() && !ended_) {
      if (zs_.avail_in == 0) {
        ZW_ASSIGN_OR_RETURN(bool more, fill());
        if (!more) {
          return corrupt("gzip stream '" + path_ + "' is truncated at uncompressed offset " +
                         std::to_string(pos_ + done));
        }
      }
      const size_t want = std::min<size_t>(dst.size() - done, 1u << 30);
      zs_.next_out = reinterpret_cast<Bytef*>(dst.data() + done);
      zs_.avail_out = static_cast<uInt>(want);
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      done += want - zs_.avail_out;
      if (rc == Z_STREAM_END) {
        // Another gzip member may follow (as gzip -c a b > c makes); anything else after the
        // first member is ignored, as zlib's gzread ignores it.
        ZW_ASSIGN_OR_RETURN(bool another, another_member());
        if (!another) {
          ended_ = true;
        } else if (inflateReset(&zs_) != Z_OK) {
          return zlib_error("inflateReset");
        }
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        pos_ += done;
        return zlib_error(nullptr);
      }
    }
    pos_ += done;
    return done;
  }

  Result<uint64_t> skip(uint64_t n) override {
    if (scratch_.empty()) scratch_.resize(kBufferSize);
    uint64_t done = 0;
    while (done < n) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(n - done, scratch_.size()));
      ZW_ASSIGN_OR_RETURN(size_t got, read(std::span(scratch_).first(want)));
      done += got;
      if (got < want) break;
    }
    return done;
  }

  uint64_t position() const override { return pos_; }
  std::optional<uint64_t> known_size() const override { return std::nullopt; }

  Status finish() override {
    // GNU tar pads to 10 KiB records; whatever follows is read only for zlib's CRC check.
    ZW_ASSIGN_OR_RETURN(uint64_t rest, skip(std::numeric_limits<uint64_t>::max()));
    (void)rest;
    return Status::ok();
  }

 private:
  // Refills zlib's input from the archive after the first `kept` bytes of the buffer (already
  // in place); false when the archive had nothing more.
  Result<bool> fill(size_t kept = 0) {
    in_.resize(kBufferSize);
    ZW_ASSIGN_OR_RETURN(size_t got, compressed_.read(std::span(in_).subspan(kept)));
    zs_.next_in = reinterpret_cast<Bytef*>(in_.data());
    zs_.avail_in = static_cast<uInt>(kept + got);
    return got > 0;
  }

  // Whether the bytes after a gzip member start another one (its magic, 1f 8b).
  Result<bool> another_member() {
    if (zs_.avail_in == 0) {
      ZW_ASSIGN_OR_RETURN(bool more, fill());
      if (!more) return false;
    }
    if (zs_.avail_in == 1) {  // the magic's second byte, if any, is still in the archive
      in_[0] = static_cast<std::byte>(zs_.next_in[0]);
      ZW_RETURN_IF_ERROR(fill(1).status());
    }
    return zs_.avail_in >= 2 && zs_.next_in[0] == 0x1f && zs_.next_in[1] == 0x8b;
  }

  Status zlib_error(const char* call) {
    const std::string why = call != nullptr ? std::string(call) + " failed"
                            : zs_.msg != nullptr ? zs_.msg
                                                 : "damaged data";
    return corrupt("gzip stream '" + path_ + "' at uncompressed offset " + std::to_string(pos_) +
                   ": " + why);
  }

  SourceInput compressed_;
  std::string path_;
  z_stream zs_{};
  bool initialised_ = false;
  bool ended_ = false;
  uint64_t pos_ = 0;
  std::vector<std::byte> in_;
  std::vector<std::byte> scratch_;
};

class TarStreamImpl final : public TarStream {
 public:
  TarStreamImpl(std::unique_ptr<TarInput> input, const std::string& path)
      : input_(std::move(input)), walker_(input_.get(), path) {}

  Result<bool> next(TarMember* member) override { return walker_.next(member); }
  Status read_data(ByteBuffer* out) override { return walker_.read_data(out); }

 private:
  std::unique_ptr<TarInput> input_;
  TarWalker walker_;
};

}  // namespace

Result<std::unique_ptr<TarStream>> TarStream::open(const std::string& path) {
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> opened,
                      open_source(path, IoBackend::kPread, Deadline::after(kReadTimeout)));
  std::shared_ptr<ByteSource> source = std::move(opened);
  source->advise_sequential();
  std::byte magic[2] = {};
  if (source->size() >= 2) {
    ZW_RETURN_IF_ERROR(source->read_at(0, magic, Deadline::after(kReadTimeout)));
  }
  std::unique_ptr<TarInput> input;
  if (magic[0] == std::byte{0x1f} && magic[1] == std::byte{0x8b}) {
    input = std::make_unique<GzipInput>(std::move(source), path);
  } else {
    input = std::make_unique<SourceInput>(std::move(source));
  }
  return std::unique_ptr<TarStream>(std::make_unique<TarStreamImpl>(std::move(input), path));
}

}  // namespace zerowait::internal
