#include "shard/tar/tar_stream.hpp"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>

#include "common/file.hpp"
#include "shard/tar/tar_header.hpp"

namespace zerowait::internal {
namespace {

// Large reads keep a stream of small members at disk speed instead of syscall speed.
constexpr size_t kBufferSize = 1 << 20;

// A plain tar through one buffer; skipped data is never read.
class FileInput final : public TarInput {
 public:
  FileInput(File file, uint64_t size) : file_(std::move(file)), size_(size) {}

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
        ZW_RETURN_IF_ERROR(file_.pread_exact(pos_, dst.subspan(done, n - done)));
        pos_ += n - done;
        done = n;
      } else {
        buffer_.resize(static_cast<size_t>(std::min<uint64_t>(kBufferSize, size_ - pos_)));
        buffer_offset_ = pos_;
        ZW_RETURN_IF_ERROR(file_.pread_exact(pos_, buffer_));
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
  File file_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::vector<std::byte> buffer_;
  uint64_t buffer_offset_ = 0;
};

// A gzip-compressed tar through zlib's gz* API: the uncompressed size is unknown until the end,
// and skipping means decompressing.
class GzipInput final : public TarInput {
 public:
  GzipInput(gzFile gz, std::string path) : gz_(gz), path_(std::move(path)) {}
  ~GzipInput() override { gzclose(gz_); }
  GzipInput(const GzipInput&) = delete;
  GzipInput& operator=(const GzipInput&) = delete;

  Result<size_t> read(std::span<std::byte> dst) override {
    size_t done = 0;
    while (done < dst.size()) {
      const unsigned want = static_cast<unsigned>(std::min<size_t>(dst.size() - done, 1u << 30));
      const int n = gzread(gz_, dst.data() + done, want);
      if (n < 0) return zlib_error();
      done += static_cast<size_t>(n);
      pos_ += static_cast<uint64_t>(n);
      if (n == 0 || static_cast<unsigned>(n) < want) break;
    }
    if (done < dst.size()) {
      // A short read is either the end of the stream or a truncated one; zlib knows which.
      int err = Z_OK;
      gzerror(gz_, &err);
      if (err != Z_OK && err != Z_STREAM_END) return zlib_error();
    }
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
  Status zlib_error() {
    int err = Z_OK;
    const char* message = gzerror(gz_, &err);
    if (err == Z_ERRNO) return errno_status(errno, "cannot read", path_);
    return corrupt("gzip stream '" + path_ + "' at uncompressed offset " + std::to_string(pos_) +
                   ": " + (message && *message ? message : "unknown zlib error"));
  }

  gzFile gz_;
  std::string path_;
  uint64_t pos_ = 0;
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
  ZW_ASSIGN_OR_RETURN(File file, File::open_read(path));
  ZW_ASSIGN_OR_RETURN(uint64_t size, file.size());
  std::byte magic[2] = {};
  if (size >= 2) ZW_RETURN_IF_ERROR(file.pread_exact(0, magic));
  std::unique_ptr<TarInput> input;
  if (magic[0] == std::byte{0x1f} && magic[1] == std::byte{0x8b}) {
    // gzdopen owns the descriptor it is given; `file` keeps (and closes) its own.
    const int fd = ::dup(file.fd());
    if (fd < 0) return errno_status(errno, "cannot dup the descriptor of", path);
    gzFile gz = gzdopen(fd, "rb");
    if (gz == nullptr) {
      ::close(fd);
      return io_error("cannot open gzip stream '" + path + "': out of memory");
    }
    gzbuffer(gz, kBufferSize);
    input = std::make_unique<GzipInput>(gz, path);
  } else {
    input = std::make_unique<FileInput>(std::move(file), size);
  }
  return std::unique_ptr<TarStream>(std::make_unique<TarStreamImpl>(std::move(input), path));
}

}  // namespace zerowait::internal
